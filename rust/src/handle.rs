//! [`TaskHandle`]: a submitted task, and the way to its result.

use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::error::{outcome_error, Error, Result};
use crate::explain::Explanation;
use crate::task::{Payload, TaskInfo};
use crate::wire::NIL_BODY;

/// How a task ended: its state, its result (succeeded) or its error fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ended {
    pub state: String,
    pub body: Option<Vec<u8>>,
    pub error_type: String,
    pub error_message: String,
    pub traceback: String,
}

impl Ended {
    /// The handler's value, or the error the ending stands for.
    pub fn into_result(self, task_id: &str) -> Result<Payload> {
        match outcome_error(task_id, &self.state, &self.error_type, &self.error_message, &self.traceback) {
            None => Ok(Payload::from_msgpack(self.body.unwrap_or_else(|| NIL_BODY.to_vec()))),
            Some(error) => Err(error),
        }
    }
}

pub(crate) enum Source {
    Embedded(crate::embedded::Shared),
    Client(crate::client::Client, Option<std::sync::Arc<crate::client::Watch>>),
}

/// A submitted task: its id, and its result once it ends.
pub struct TaskHandle {
    pub(crate) id: String,
    pub(crate) duplicate: bool,
    pub(crate) source: Source,
}

impl std::fmt::Debug for TaskHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskHandle").field("id", &self.id).field("duplicate", &self.duplicate).finish()
    }
}

impl TaskHandle {
    /// The task's id (32 hex digits; a cluster member's name and a colon before them): any client
    /// may use it with `result`, `status`, `cancel` and `explain`.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether `submit` found an earlier task with the same key and returned it.
    pub fn duplicate(&self) -> bool {
        self.duplicate
    }

    /// Wait for the task to end and decode its value as `T` (`()` or `rmpv::Value` take anything).
    /// Errors: `TaskFailed { type, message, traceback }`, `DeadlineExceeded`, `Cancelled`, or the
    /// connection's (`Unavailable`, ...).
    pub async fn result<T: DeserializeOwned>(&self) -> Result<T> {
        self.payload(None).await?.decode()
    }

    /// Like [`result`](Self::result), giving up with [`Error::Timeout`] after `timeout` (the task
    /// itself goes on).
    pub async fn result_timeout<T: DeserializeOwned>(&self, timeout: Duration) -> Result<T> {
        self.payload(Some(timeout)).await?.decode()
    }

    /// A snapshot of the task: state, attempts, timings (as `status(id)` of the scheduler or client
    /// that made this handle).
    pub async fn status(&self) -> Result<TaskInfo> {
        match &self.source {
            Source::Embedded(shared) => shared.status(&self.id),
            Source::Client(client, _) => client.status(&self.id).await,
        }
    }

    /// Cancel the task if it was not dispatched yet; false if it runs or has finished (as
    /// `cancel(id)`).
    pub async fn cancel(&self) -> Result<bool> {
        match &self.source {
            Source::Embedded(shared) => shared.cancel(&self.id),
            Source::Client(client, _) => client.cancel(&self.id).await,
        }
    }

    /// Why the task is where it is: what stands before it while it waits, or how each attempt ended
    /// (as [`Client::explain`](crate::Client::explain) with this task's id, on the connection — in a
    /// cluster, the member — that accepted it). The embedded scheduler does not explain its tasks:
    /// `FailedPrecondition` for a handle of one.
    pub async fn explain(&self) -> Result<Explanation> {
        match &self.source {
            Source::Embedded(_) => Err(Error::FailedPrecondition(format!(
                "task {}: the embedded Scheduler does not explain its tasks; a broker does (Client::explain)",
                self.id
            ))),
            Source::Client(client, _) => client.explain(&self.id).await,
        }
    }

    /// Wait for the task to end; its value as msgpack.
    pub async fn payload(&self, timeout: Option<Duration>) -> Result<Payload> {
        let ended = match &self.source {
            Source::Embedded(shared) => shared.wait(&self.id, timeout).await?,
            Source::Client(client, watch) => client.wait_ended(&self.id, watch.as_ref(), timeout).await?,
        };
        ended.into_result(&self.id)
    }
}

pub(crate) fn timed_out(task_id: &str, timeout: Option<Duration>) -> Error {
    Error::Timeout(format!(
        "task {task_id} did not finish within {} s",
        timeout.map_or(f64::INFINITY, |t| t.as_secs_f64())
    ))
}
