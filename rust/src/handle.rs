//! [`TaskHandle`]: a submitted task, and the way to its result.
//!
//! A handle asks whoever made it — a broker connection (src/client/connection.rs) or the embedded
//! scheduler (src/embedded.rs) — through [`Source`], which both implement: this module names
//! neither, so the dependency runs one way, from them to it.

use std::future::Future;
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::answers::{Explanation, TaskInfo};
use crate::error::{outcome_error, Error, Result};
use crate::task::Payload;
use crate::wire::NIL_BODY;

/// How a task ended: its state, its result (succeeded) or its error fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskOutcome {
    pub state: String,
    pub body: Option<Vec<u8>>,
    pub error_type: String,
    pub error_message: String,
    pub traceback: String,
}

impl TaskOutcome {
    /// The handler's value, or the error the ending stands for.
    pub fn into_result(self, task_id: &str) -> Result<Payload> {
        match outcome_error(task_id, &self.state, &self.error_type, &self.error_message, &self.traceback) {
            None => Ok(Payload::from_msgpack(self.body.unwrap_or_else(|| NIL_BODY.to_vec()))),
            Some(error) => Err(error),
        }
    }
}

/// A future a [`Source`] answers with.
pub(crate) type Answer<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// What made a handle, asked about its task by id. (Unwind-safe as the client and the scheduler
/// are, so a handle stays so.)
pub(crate) trait Source: Send + Sync + UnwindSafe + RefUnwindSafe {
    /// The task's snapshot.
    fn status<'a>(&'a self, task_id: &'a str) -> Answer<'a, TaskInfo>;
    /// Cancel it if not dispatched yet.
    fn cancel<'a>(&'a self, task_id: &'a str) -> Answer<'a, bool>;
    /// Why it is where it is.
    fn explain<'a>(&'a self, task_id: &'a str) -> Answer<'a, Explanation>;
    /// Wait for it to end (at most `timeout`: then [`Error::Timeout`], see [`timed_out`]).
    fn wait<'a>(&'a self, task_id: &'a str, timeout: Option<Duration>) -> Answer<'a, TaskOutcome>;
}

/// A submitted task: its id, and its result once it ends. Cheap to clone: clones ask the same
/// client (or scheduler).
///
/// Every method is cancel-safe: dropping its future (a `select!`, a `tokio::time::timeout`)
/// leaves nothing behind, and a `result()` dropped while it waits withdraws its wait at the broker.
#[derive(Clone)]
pub struct TaskHandle {
    id: String,
    duplicate: bool,
    source: Arc<dyn Source>,
}

impl std::fmt::Debug for TaskHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskHandle").field("id", &self.id).field("duplicate", &self.duplicate).finish()
    }
}

impl TaskHandle {
    /// The handle of task `id`, asking `source` about it; `duplicate`: submit returned an earlier
    /// task with the same key.
    pub(crate) fn new(id: String, duplicate: bool, source: Arc<dyn Source>) -> TaskHandle {
        TaskHandle { id, duplicate, source }
    }

    /// The task's id (32 hex digits; a cluster member's name and a colon before them): any client
    /// may use it with `result`, `status`, `cancel` and `explain`.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether `submit` found an earlier task with the same key and returned it.
    #[must_use]
    pub fn duplicate(&self) -> bool {
        self.duplicate
    }

    /// Wait for the task to end and decode its value as `T` (`()` or `rmpv::Value` take anything).
    /// Errors: `TaskFailed { type, message, traceback }`, `DeadlineExceeded`, `Cancelled`, or the
    /// connection's (`Connection`, ...).
    ///
    /// # Errors
    ///
    /// The task's failure (`TaskFailed`, `Cancelled`, `DeadlineExceeded`), `Decode` when the result is
    /// not a `T`, `Connection` when the connection fails.
    pub async fn result<T: DeserializeOwned>(&self) -> Result<T> {
        self.payload(None).await?.decode()
    }

    /// Like [`result`](Self::result), giving up with [`Error::Timeout`] after `timeout` (the task
    /// itself goes on).
    ///
    /// # Errors
    ///
    /// As [`result`](Self::result), and `Timeout` when `timeout` runs out first.
    pub async fn result_timeout<T: DeserializeOwned>(&self, timeout: Duration) -> Result<T> {
        self.payload(Some(timeout)).await?.decode()
    }

    /// A snapshot of the task: state, attempts, timings (as `status(id)` of the scheduler or client
    /// that made this handle).
    ///
    /// # Errors
    ///
    /// `NotFound` once the task is forgotten, `Connection`.
    pub async fn status(&self) -> Result<TaskInfo> {
        self.source.status(&self.id).await
    }

    /// Cancel the task if it was not dispatched yet; false if it runs or has finished (as
    /// `cancel(id)`).
    ///
    /// # Errors
    ///
    /// `NotFound`, `Connection` (a cancel is never re-sent).
    pub async fn cancel(&self) -> Result<bool> {
        self.source.cancel(&self.id).await
    }

    /// Why the task is where it is: what stands before it while it waits, or how each attempt ended
    /// (as [`Client::explain`](crate::Client::explain) with this task's id, on the connection — in a
    /// cluster, the member — that accepted it), or as [`Scheduler::explain`](crate::Scheduler::explain)
    /// for a handle of the embedded scheduler.
    ///
    /// # Errors
    ///
    /// `NotFound`, `Connection`.
    pub async fn explain(&self) -> Result<Explanation> {
        self.source.explain(&self.id).await
    }

    /// Wait for the task to end; its value as msgpack.
    ///
    /// # Errors
    ///
    /// As [`result_timeout`](Self::result_timeout), without decoding.
    pub async fn payload(&self, timeout: Option<Duration>) -> Result<Payload> {
        self.source.wait(&self.id, timeout).await?.into_result(&self.id)
    }
}

/// The error of a `call` (submit and wait in one) for `pool` that gave up after `timeout`: no id
/// came with it, so the message says how to keep one.
pub(crate) fn call_timed_out(pool: &str, timeout: Duration) -> Error {
    Error::Timeout(format!(
        "the task submitted to pool {pool:?} did not finish within {} s; it goes on (submit() and \
         result_timeout() give its id to wait on)",
        timeout.as_secs_f64()
    ))
}

/// The error of a wait for `task_id` that gave up after `timeout`.
pub(crate) fn timed_out(task_id: &str, timeout: Option<Duration>) -> Error {
    Error::Timeout(format!(
        "task {task_id} did not finish within {} s",
        timeout.map_or(f64::INFINITY, |t| t.as_secs_f64())
    ))
}
