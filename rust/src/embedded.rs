//! [`Scheduler`]: the broker's scheduling in this process, with no broker and no sockets.
//!
//! The same rules as the Python core (the scheduling vectors hold both to the same decisions).
//! The only worker is this process, with `concurrency` slots; handlers run as tokio tasks.
//! Payloads and results go through msgpack as they would over the wire, so code written against
//! the embedded scheduler works against a broker.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::{oneshot, Notify};

use crate::answers::{AttemptEnd, Ended, Explanation, TaskInfo, TaskState};
use crate::core::explain::ClassRates;
use crate::core::{Core, NewTask};
use crate::error::{Error, Result};
use crate::handle::{self, timed_out, Answer, TaskHandle, TaskOutcome};
use crate::handler::{self, Failure, Handler};
use crate::pool::PoolConfig;
use crate::task::{Payload, Priority, Task};

const LOCAL_WORKER: &str = "local";
const RETRY_BACKOFF_BASE: f64 = 0.5;
const RETRY_BACKOFF_CAP: f64 = 60.0;

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

fn new_id() -> String {
    let mut bytes = [0u8; 16];
    getrandom::getrandom(&mut bytes).expect("the operating system's random source");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn jitter() -> f64 {
    let mut bytes = [0u8; 4];
    getrandom::getrandom(&mut bytes).expect("the operating system's random source");
    0.5 + 0.5 * (u32::from_le_bytes(bytes) as f64 / u32::MAX as f64)
}

struct Record {
    pool: String,
    tenant: Option<String>,
    priority: Priority,
    payload: Vec<u8>,
    max_retries: u32,
    deadline: Option<f64>,
    cost: Option<f64>,
    submitted_at: f64,
    started_at: Option<f64>,
    finished_at: Option<f64>,
    state: TaskState,
    attempts: u32,
    result: Option<Vec<u8>>,
    error_type: String,
    error_message: String,
    traceback: String,
    /// How its attempts that did not end it ended (retried), the last KEPT_ATTEMPT_ENDS.
    attempt_ends: VecDeque<AttemptEnd>,
}

/// How many retried attempts a task's record keeps for `explain`, the last ones (as Python's).
const KEPT_ATTEMPT_ENDS: usize = 16;

/// The most characters of a retried attempt's error `explain` shows (as Python's).
const ATTEMPT_ERROR_CHARS: usize = 500;

/// Seconds over which a pool's dispatch rate is measured for `explain` (as the Python scheduler).
const RATE_WINDOW: f64 = 10.0;

/// Seconds over which (at least) its classes' arrival rates are measured.
const ARRIVAL_WINDOW: f64 = 3.0;

/// Seconds between samples of the core's counts.
const RATE_SAMPLE_INTERVAL: f64 = 1.0;

/// The core's counts of one pool at one time: dispatches, and per class the tasks that became
/// queued (all, with a deadline).
type Counts = (u64, [(u64, u64); 4]);

/// Each pool's recent dispatch rate and its classes' arrival rates, from samples of the core's
/// counts taken as the scheduler runs (the core has no clock): what `explain` estimates a start by.
/// One sample a second over the window, a few counts per pool each.
#[derive(Default)]
struct Rates {
    samples: VecDeque<(f64, HashMap<String, Counts>)>,
}

impl Rates {
    /// Take the core's counts now if the last sample is a second old; older samples than the
    /// window go (but the one that starts it).
    fn sample(&mut self, core: &Core, now: f64) {
        if self.samples.back().is_some_and(|(at, _)| now - at < RATE_SAMPLE_INTERVAL) {
            return;
        }
        let counts = core
            .pool_names()
            .into_iter()
            .filter_map(|pool| Some((core.dispatched(&pool)?, core.arrivals(&pool)?)).map(|c| (pool, c)))
            .collect();
        self.samples.push_back((now, counts));
        while self.samples.len() > 2 && self.samples[1].0 <= now - RATE_WINDOW {
            self.samples.pop_front();
        }
    }

    /// The oldest sample, or with `window` the newest at least that old (the oldest if none is).
    fn since(&self, now: f64, window: Option<f64>) -> Option<&(f64, HashMap<String, Counts>)> {
        let mut then = self.samples.front()?;
        if let Some(window) = window {
            for sample in &self.samples {
                if sample.0 > now - window {
                    break;
                }
                then = sample;
            }
        }
        Some(then)
    }

    /// What `explain` goes by for `pool`, as the Python scheduler measures it: the higher of its
    /// dispatch rates over the whole window and over the last ARRIVAL_WINDOW seconds, and its
    /// classes' arrival rates over about ARRIVAL_WINDOW seconds; None where there is nothing yet.
    fn for_explain(&self, core: &Core, pool: &str, now: f64) -> (Option<f64>, Option<[ClassRates; 4]>) {
        let (Some(dispatched), Some(arrivals)) = (core.dispatched(pool), core.arrivals(pool)) else {
            return (None, None);
        };
        let per_second = |window: Option<f64>| {
            let (at, counts) = self.since(now, window)?;
            let elapsed = now - at;
            let (then, _) = counts.get(pool)?;
            (elapsed > 0.0).then(|| (dispatched - then) as f64 / elapsed)
        };
        let rate = match (per_second(None), per_second(Some(ARRIVAL_WINDOW))) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let classes = self.since(now, Some(ARRIVAL_WINDOW)).and_then(|(at, counts)| {
            let elapsed = now - at;
            let (_, then) = counts.get(pool)?;
            (elapsed > 0.0).then(|| {
                std::array::from_fn(|c| ClassRates {
                    arrivals: (arrivals[c].0 - then[c].0) as f64 / elapsed,
                    deadline_arrivals: (arrivals[c].1 - then[c].1) as f64 / elapsed,
                })
            })
        });
        (rate, classes)
    }
}

struct Inner {
    core: Core,
    rates: Rates,
    records: HashMap<String, Record>,
    keys: HashMap<(String, Option<String>, String), String>,
    finished: VecDeque<(f64, String)>,
    waiters: HashMap<String, Vec<oneshot::Sender<()>>>,
    handlers: HashMap<String, Handler>,
    running: usize,
    closed: bool,
    driver: bool,
}

/// The state a [`Scheduler`] and its handles share.
#[derive(Clone)]
pub(crate) struct Shared {
    inner: Arc<Mutex<Inner>>,
    wake: Arc<Notify>,
    idle: Arc<Notify>,
    result_ttl: f64,
}

/// Schedules and runs tasks in this process, with the broker's rules and no broker.
///
/// Made by [`Scheduler::builder`] (or [`Scheduler::new`] for pools without handlers yet):
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> cronoq::Result<()> {
/// use cronoq::{Fairness, Payload, PoolConfig, Scheduler, Task};
/// let mut pool = PoolConfig::new("llm");
/// pool.fairness = Some(Fairness::weights([("acme", 3.0), ("globex", 1.0)]));
/// let sched = Scheduler::builder(vec![pool])
///     .concurrency(4)
///     .handler("llm", |p: Payload| async move { Ok::<_, cronoq::Error>(p.decode::<String>()?.len()) })
///     .build()?;
/// let task = sched.submit(Task::new("hello").pool("llm").tenant("acme")).await?;
/// let n: usize = task.result().await?;
/// assert_eq!(n, 5);
/// # Ok(()) }
/// ```
pub struct Scheduler {
    shared: Shared,
    concurrency: u32,
    max_payload_bytes: usize,
    started: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.shared.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        f.debug_struct("Scheduler")
            .field("pools", &inner.core.pool_names())
            .field("handlers", &inner.handlers.keys().collect::<Vec<_>>())
            .field("concurrency", &self.concurrency)
            .field("max_payload_bytes", &self.max_payload_bytes)
            .field("tasks", &inner.records.len())
            .finish_non_exhaustive()
    }
}

/// How a [`Scheduler`] is made: its pools, then options and handlers in any order; nothing is
/// checked until [`build`](SchedulerBuilder::build), which names the first mistake.
#[must_use = "a SchedulerBuilder does nothing until built"]
pub struct SchedulerBuilder {
    pools: Vec<PoolConfig>,
    concurrency: u32,
    max_payload_bytes: usize,
    handlers: Vec<(String, Handler)>,
}

impl std::fmt::Debug for SchedulerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerBuilder")
            .field("pools", &self.pools)
            .field("concurrency", &self.concurrency)
            .field("max_payload_bytes", &self.max_payload_bytes)
            .field("handlers", &self.handlers.iter().map(|(pool, _)| pool).collect::<Vec<_>>())
            .finish()
    }
}

impl SchedulerBuilder {
    /// Run at most `n` tasks at once (default 4); `build` refuses 0.
    pub fn concurrency(mut self, n: u32) -> SchedulerBuilder {
        self.concurrency = n;
        self
    }

    /// The largest payload `submit` takes, as msgpack (default 1 MiB, as the broker's).
    pub fn max_payload_bytes(mut self, n: usize) -> SchedulerBuilder {
        self.max_payload_bytes = n;
        self
    }

    /// Run the tasks of `pool` with `f`: an async function of the [`Payload`] returning the value
    /// (any `Serialize`) or an error (any `Display + Debug`, reported as `TaskFailed`). Tasks of a
    /// pool without a handler wait, as they would for a worker. `build` refuses a pool not declared
    /// (`NotFound`, as a broker refuses a worker's).
    pub fn handler<F, Fut, T, E>(mut self, pool: impl Into<String>, f: F) -> SchedulerBuilder
    where
        F: Fn(Payload) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<T, E>> + Send + 'static,
        T: Serialize + 'static,
        E: std::fmt::Display + std::fmt::Debug + 'static,
    {
        let pool = pool.into();
        self.handlers.retain(|(p, _)| *p != pool);
        self.handlers.push((pool, handler::handler(f)));
        self
    }

    /// The scheduler. `InvalidArgument` for no pool, two pools of one name, a weight that is not
    /// positive, or a concurrency of 0; `NotFound` for a handler of a pool not declared.
    ///
    /// # Errors
    ///
    /// `InvalidArgument` or `NotFound`, as above.
    pub fn build(self) -> Result<Scheduler> {
        if self.concurrency == 0 {
            return Err(Error::InvalidArgument("concurrency must be a positive integer, got 0".into()));
        }
        let mut sched = Scheduler::new(self.pools)?;
        sched.concurrency = self.concurrency;
        sched.max_payload_bytes = self.max_payload_bytes;
        {
            let mut inner = sched.shared.inner.lock().unwrap();
            for (pool, handler) in self.handlers {
                if !inner.core.pool_names().contains(&pool) {
                    return Err(Error::NotFound(format!(
                        "no pool named {pool:?}; declared pools: {:?}",
                        inner.core.pool_names()
                    )));
                }
                inner.handlers.insert(pool, handler);
            }
        }
        Ok(sched)
    }
}

impl Scheduler {
    /// Start making a scheduler for these pools: add handlers and options, then `build()`.
    pub fn builder(pools: Vec<PoolConfig>) -> SchedulerBuilder {
        SchedulerBuilder { pools, concurrency: 4, max_payload_bytes: 1 << 20, handlers: Vec::new() }
    }

    /// A scheduler for these pools with no handler (4 slots, 1 MiB payloads): its tasks wait, as
    /// they would for a worker. [`Scheduler::builder`] adds handlers and options.
    /// InvalidArgument for no pool, two pools of one name, or a weight that is not positive.
    ///
    /// # Errors
    ///
    /// `InvalidArgument`, as above.
    pub fn new(pools: Vec<PoolConfig>) -> Result<Scheduler> {
        if pools.is_empty() {
            return Err(Error::InvalidArgument("Scheduler needs at least one PoolConfig".into()));
        }
        let settings: Vec<_> = pools.iter().map(PoolConfig::settings).collect();
        let core = Core::new(&settings)?;
        Ok(Scheduler {
            shared: Shared {
                inner: Arc::new(Mutex::new(Inner {
                    core,
                    rates: Rates::default(),
                    records: HashMap::new(),
                    keys: HashMap::new(),
                    finished: VecDeque::new(),
                    waiters: HashMap::new(),
                    handlers: HashMap::new(),
                    running: 0,
                    closed: false,
                    driver: false,
                })),
                wake: Arc::new(Notify::new()),
                idle: Arc::new(Notify::new()),
                result_ttl: 86400.0,
            },
            concurrency: 4,
            max_payload_bytes: 1 << 20,
            started: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn start(&self) {
        if self.started.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let mut inner = self.shared.inner.lock().unwrap();
        let served: Vec<String> = inner.handlers.keys().cloned().collect();
        if !served.is_empty() {
            inner.core.add_worker(LOCAL_WORKER, &served, self.concurrency).expect("handlers name known pools");
        }
        inner.driver = true;
        drop(inner);
        let shared = self.shared.clone();
        tokio::spawn(async move { shared.drive().await });
    }

    /// Queue a task; returns its handle at once. Refuses what the broker would: InvalidArgument for
    /// a bad field or a payload over the limit, NotFound for an unknown pool.
    ///
    /// # Errors
    ///
    /// `InvalidArgument`, `NotFound`, as above; `FailedPrecondition` once closed.
    pub async fn submit(&self, task: Task) -> Result<TaskHandle> {
        let body = task.check()?;
        if body.len() > self.max_payload_bytes {
            return Err(Error::InvalidArgument(format!(
                "payload is {} bytes, over max_payload_bytes = {}",
                body.len(),
                self.max_payload_bytes
            )));
        }
        self.start();
        let now = unix_now();
        let (id, duplicate) = {
            let mut inner = self.shared.inner.lock().unwrap();
            if inner.closed {
                return Err(Error::FailedPrecondition("this Scheduler is closed".into()));
            }
            if let Some(key) = &task.key {
                let scope = (task.pool.clone(), task.tenant.clone(), key.clone());
                if let Some(id) = inner.keys.get(&scope) {
                    if inner.records.contains_key(id) {
                        return Ok(TaskHandle::new(id.clone(), true, Arc::new(self.shared.clone())));
                    }
                }
            }
            let id = new_id();
            let deadline = task.deadline.map(|d| now + d.as_secs_f64());
            let not_before = task.delay.filter(|d| !d.is_zero()).map(|d| now + d.as_secs_f64());
            inner.core.submit(
                NewTask {
                    id: id.clone(),
                    pool: task.pool.clone(),
                    tenant: task.tenant.clone(),
                    priority: task.priority.class(),
                    deadline,
                    not_before,
                    attempts: 0,
                    cost: task.cost,
                },
                now,
            )?;
            let state = if inner.core.get(&id).is_some_and(|t| t.state == crate::core::State::Delayed) {
                TaskState::Delayed
            } else {
                TaskState::Queued
            };
            inner.records.insert(
                id.clone(),
                Record {
                    pool: task.pool.clone(),
                    tenant: task.tenant.clone(),
                    priority: task.priority,
                    payload: body.to_vec(),
                    max_retries: task.max_retries,
                    deadline,
                    cost: task.cost,
                    submitted_at: now,
                    started_at: None,
                    finished_at: None,
                    state,
                    attempts: 0,
                    result: None,
                    error_type: String::new(),
                    error_message: String::new(),
                    traceback: String::new(),
                    attempt_ends: VecDeque::new(),
                },
            );
            if let Some(key) = task.key {
                inner.keys.insert((task.pool, task.tenant, key), id.clone());
            }
            (id, false)
        };
        self.shared.wake.notify_one();
        Ok(TaskHandle::new(id, duplicate, Arc::new(self.shared.clone())))
    }

    /// Submit a task and wait for its value (as [`Client::call`](crate::Client::call): `submit`
    /// then `result`, for a caller that wants the value and not the id).
    ///
    /// # Errors
    ///
    /// What [`submit`](Self::submit) and [`result`](Self::result) return.
    pub async fn call<T: serde::de::DeserializeOwned>(&self, task: Task) -> Result<T> {
        self.submit(task).await?.result().await
    }

    /// Like [`call`](Self::call), giving up with `Timeout` after `timeout` (the task goes on).
    ///
    /// # Errors
    ///
    /// As [`call`](Self::call), and `Timeout` when `timeout` runs out first.
    pub async fn call_timeout<T: serde::de::DeserializeOwned>(&self, task: Task, timeout: Duration) -> Result<T> {
        let pool = task.pool.clone();
        match tokio::time::timeout(timeout, self.call(task)).await {
            Ok(value) => value,
            Err(_) => Err(handle::call_timed_out(&pool, timeout)),
        }
    }

    /// Wait for a task's value by id (see [`TaskHandle::result`]).
    ///
    /// # Errors
    ///
    /// The task's failure (`TaskFailed`, `Cancelled`, `DeadlineExceeded`), `NotFound`, `Decode` when
    /// the result is not a `T`.
    pub async fn result<T: serde::de::DeserializeOwned>(&self, task_id: &str) -> Result<T> {
        self.shared.wait(task_id, None).await?.into_result(task_id)?.decode()
    }

    /// A snapshot of a task. NotFound for an id this scheduler does not know.
    ///
    /// # Errors
    ///
    /// `NotFound` for an unknown task.
    pub async fn status(&self, task_id: &str) -> Result<TaskInfo> {
        self.shared.status(task_id)
    }

    /// Cancel a task not yet dispatched; false if it runs or has finished. NotFound for an unknown id.
    ///
    /// # Errors
    ///
    /// `NotFound` for an unknown task.
    pub async fn cancel(&self, task_id: &str) -> Result<bool> {
        self.shared.cancel(task_id)
    }

    /// Why a task is where it is (docs/scheduling.md, "Why is my task waiting?"): while it is
    /// queued or delayed, `waiting` says what stands before it — higher classes, earlier deadlines,
    /// its place in its tenant's queue, its tenant's weight, share and lag, a ceiling or rate that
    /// holds it, a paused pool — and when it may start; once it ran, `history` says how each
    /// attempt ended. The same fields as [`Client::explain`](crate::Client::explain).
    ///
    /// # Errors
    ///
    /// `NotFound` for an unknown task.
    pub async fn explain(&self, task_id: &str) -> Result<Explanation> {
        self.shared.explain(task_id)
    }

    /// Stop dispatching `pool`; it still takes tasks and their deadlines still pass.
    ///
    /// # Errors
    ///
    /// `NotFound` for an undeclared pool.
    pub async fn pause(&self, pool: &str) -> Result<()> {
        self.shared.inner.lock().unwrap().core.pause(pool)
    }

    /// Dispatch `pool` again.
    ///
    /// # Errors
    ///
    /// `NotFound` for an undeclared pool.
    pub async fn resume(&self, pool: &str) -> Result<()> {
        self.shared.inner.lock().unwrap().core.resume(pool)?;
        self.shared.wake.notify_one();
        Ok(())
    }

    /// Queued, delayed and running tasks of `pool`.
    ///
    /// # Errors
    ///
    /// `NotFound` for an undeclared pool.
    pub fn counts(&self, pool: &str) -> Result<(usize, usize, usize)> {
        self.shared.inner.lock().unwrap().core.counts(pool)
    }

    /// Stop dispatching and wait for the running tasks to finish.
    pub async fn close(&self) {
        loop {
            let idle = self.shared.idle.notified();
            {
                let mut inner = self.shared.inner.lock().unwrap();
                inner.closed = true;
                if inner.running == 0 {
                    break;
                }
            }
            idle.await;
        }
        self.shared.wake.notify_one();
    }
}

fn unknown(task_id: &str) -> Error {
    Error::NotFound(format!("no task with id {task_id:?}"))
}

/// End a task's record and wake whoever waits for it.
#[allow(clippy::too_many_arguments)]
fn finish(
    inner: &mut Inner,
    id: &str,
    state: TaskState,
    now: f64,
    result: Option<Vec<u8>>,
    error_type: &str,
    message: &str,
    trace: &str,
) {
    if let Some(r) = inner.records.get_mut(id) {
        r.state = state;
        r.finished_at = Some(now);
        r.result = result;
        r.error_type = error_type.to_string();
        r.error_message = message.to_string();
        r.traceback = trace.to_string();
        r.payload = Vec::new();
    }
    inner.finished.push_back((now, id.to_string()));
    for waiter in inner.waiters.remove(id).unwrap_or_default() {
        let _ = waiter.send(());
    }
}

impl Shared {
    /// A snapshot of a task. NotFound for an id this scheduler does not know.
    pub(crate) fn status(&self, task_id: &str) -> Result<TaskInfo> {
        let inner = self.inner.lock().unwrap();
        let r = inner.records.get(task_id).ok_or_else(|| unknown(task_id))?;
        Ok(TaskInfo {
            id: task_id.to_string(),
            pool: r.pool.clone(),
            tenant: r.tenant.clone(),
            priority: r.priority,
            state: r.state,
            attempts: r.attempts,
            submitted_at: r.submitted_at,
            started_at: r.started_at,
            finished_at: r.finished_at,
            deadline: r.deadline,
            error: (!r.error_type.is_empty()).then(|| format!("{}: {}", r.error_type, r.error_message)),
            cost: r.cost,
        })
    }

    /// Why the task is where it is: what stands before it while it waits (the core's reading), or
    /// how each attempt ended. NotFound for an id this scheduler does not know.
    pub(crate) fn explain(&self, task_id: &str) -> Result<Explanation> {
        let info = self.status(task_id)?;
        let now = unix_now();
        let mut guard = self.inner.lock().unwrap();
        let inner = &mut *guard;
        inner.rates.sample(&inner.core, now);
        let r = inner.records.get(task_id).ok_or_else(|| unknown(task_id))?;
        let slot = inner.core.get(task_id);
        let not_before = slot.filter(|_| info.state == TaskState::Delayed).and_then(|t| t.not_before);
        let (rate, arrivals) = inner.rates.for_explain(&inner.core, &r.pool, now);
        let waiting = inner.core.explain(task_id, now, rate, arrivals.as_ref()).map(crate::answers::Waiting::from);
        let mut history = Vec::new();
        for attempt in 1..=info.attempts {
            let kept = r.attempt_ends.iter().find(|end| end.attempt == attempt).cloned();
            let last = (attempt == info.attempts).then(|| match info.state {
                TaskState::Running => Some(AttemptEnd { attempt, ended: Ended::Running, at: None, error: None }),
                TaskState::Succeeded => {
                    Some(AttemptEnd { attempt, ended: Ended::Succeeded, at: info.finished_at, error: None })
                }
                TaskState::Failed => {
                    Some(AttemptEnd { attempt, ended: Ended::Failed, at: info.finished_at, error: info.error.clone() })
                }
                _ => None,
            });
            history.push(kept.or(last.flatten()).unwrap_or(AttemptEnd {
                attempt,
                ended: Ended::Unknown,
                at: None,
                error: None,
            }));
        }
        let max_retries = r.max_retries;
        drop(guard);
        Ok(Explanation::from_info(info, max_retries, not_before, history, waiting))
    }

    /// Cancel a task not yet dispatched; false if it runs or has finished. NotFound for an unknown id.
    pub(crate) fn cancel(&self, task_id: &str) -> Result<bool> {
        let mut inner = self.inner.lock().unwrap();
        if !inner.records.contains_key(task_id) {
            return Err(unknown(task_id));
        }
        if inner.core.cancel(task_id).is_none() {
            return Ok(false);
        }
        finish(&mut inner, task_id, TaskState::Cancelled, unix_now(), None, "Cancelled", "the task was cancelled", "");
        drop(inner);
        self.wake.notify_one();
        Ok(true)
    }

    /// Expire and dispatch what is due, start the handlers; returns the next wake-up.
    fn pump(&self) -> Option<f64> {
        let now = unix_now();
        let mut inner = self.inner.lock().unwrap();
        for t in inner.core.expire(now) {
            finish(
                &mut inner,
                &t.id,
                TaskState::Expired,
                now,
                None,
                "DeadlineExceeded",
                "the task's deadline passed before it was dispatched",
                "",
            );
        }
        // Forget finished records past their retention.
        while let Some((at, _)) = inner.finished.front() {
            if now - at < self.result_ttl {
                break;
            }
            let (_, id) = inner.finished.pop_front().unwrap();
            if let Some(r) = inner.records.remove(&id) {
                let _ = r;
            }
        }
        if !inner.closed {
            let inner = &mut *inner;
            inner.rates.sample(&inner.core, now);
            for a in inner.core.dispatch(now, None) {
                let id = a.task.to_string();
                let r = inner.records.get_mut(&id).expect("a dispatched task has a record");
                r.state = TaskState::Running;
                r.attempts = a.attempt;
                r.started_at = Some(now);
                let payload = Payload::from_msgpack(r.payload.clone());
                let pool = r.pool.clone();
                let handler = inner.handlers.get(&pool).expect("the local worker serves pools with handlers").clone();
                inner.running += 1;
                let shared = self.clone();
                let attempt = a.attempt;
                tokio::spawn(async move {
                    let outcome = handler::run(handler, payload).await;
                    shared.complete(&id, attempt, outcome);
                });
            }
        }
        inner.core.next_wakeup()
    }

    fn complete(&self, id: &str, attempt: u32, outcome: Result<Vec<u8>, Failure>) {
        let now = unix_now();
        let mut inner = self.inner.lock().unwrap();
        inner.running -= 1;
        let max_retries = inner.records.get(id).map_or(0, |r| r.max_retries);
        match outcome {
            Ok(body) => {
                // The lease is this scheduler's own and the run time its clock's: nothing to refuse.
                let _ = inner.core.finish(id, LOCAL_WORKER, attempt, now, None);
                finish(&mut inner, id, TaskState::Succeeded, now, Some(body), "", "", "");
            }
            Err(f) if attempt <= max_retries => {
                let backoff = (RETRY_BACKOFF_BASE * 2f64.powi(attempt as i32 - 1)).min(RETRY_BACKOFF_CAP) * jitter();
                let _ = inner.core.requeue(id, now, LOCAL_WORKER, attempt, Some(now + backoff), None);
                if let Some(r) = inner.records.get_mut(id) {
                    r.state = TaskState::Delayed;
                    let mut error = format!("{}: {}", f.r#type, f.message);
                    if error.chars().count() > ATTEMPT_ERROR_CHARS {
                        error = error.chars().take(ATTEMPT_ERROR_CHARS - 1).chain(['…']).collect();
                    }
                    if r.attempt_ends.len() == KEPT_ATTEMPT_ENDS {
                        r.attempt_ends.pop_front();
                    }
                    r.attempt_ends.push_back(AttemptEnd {
                        attempt,
                        ended: Ended::Retried,
                        at: Some(now),
                        error: Some(error),
                    });
                    r.error_type = f.r#type;
                    r.error_message = f.message;
                    r.traceback = f.traceback;
                }
            }
            Err(f) => {
                // The lease is this scheduler's own and the run time its clock's: nothing to refuse.
                let _ = inner.core.finish(id, LOCAL_WORKER, attempt, now, None);
                finish(&mut inner, id, TaskState::Failed, now, None, &f.r#type, &f.message, &f.traceback);
            }
        }
        inner.core.grant(LOCAL_WORKER, 1);
        if inner.running == 0 {
            self.idle.notify_waiters();
        }
        drop(inner);
        self.wake.notify_one();
    }

    /// The loop that dispatches whenever something changed or a time came.
    async fn drive(self) {
        loop {
            let wake = self.pump();
            if Arc::strong_count(&self.inner) == 1 {
                return; // the scheduler and every handle are gone
            }
            let sleep = match wake {
                Some(at) => Duration::from_secs_f64((at - unix_now()).clamp(0.0, 3600.0)),
                None => Duration::from_secs(1),
            };
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(sleep) => {}
            }
        }
    }

    /// Wait for a task to end.
    pub(crate) async fn wait(&self, task_id: &str, timeout: Option<Duration>) -> Result<TaskOutcome> {
        let receiver = {
            let mut inner = self.inner.lock().unwrap();
            let r = inner.records.get(task_id).ok_or_else(|| unknown(task_id))?;
            if r.state.is_terminal() {
                return Ok(TaskOutcome {
                    state: r.state.as_str().to_string(),
                    body: r.result.clone(),
                    error_type: r.error_type.clone(),
                    error_message: r.error_message.clone(),
                    traceback: r.traceback.clone(),
                });
            }
            let (tx, rx) = oneshot::channel();
            inner.waiters.entry(task_id.to_string()).or_default().push(tx);
            rx
        };
        match timeout {
            None => {
                let _ = receiver.await;
            }
            Some(t) => {
                if tokio::time::timeout(t, receiver).await.is_err() {
                    return Err(timed_out(task_id, timeout));
                }
            }
        }
        Box::pin(self.wait(task_id, Some(Duration::ZERO))).await
    }
}

impl handle::Source for Shared {
    fn status<'a>(&'a self, task_id: &'a str) -> Answer<'a, TaskInfo> {
        Box::pin(async move { Shared::status(self, task_id) })
    }

    fn cancel<'a>(&'a self, task_id: &'a str) -> Answer<'a, bool> {
        Box::pin(async move { Shared::cancel(self, task_id) })
    }

    fn explain<'a>(&'a self, task_id: &'a str) -> Answer<'a, Explanation> {
        Box::pin(async move { Shared::explain(self, task_id) })
    }

    fn wait<'a>(&'a self, task_id: &'a str, timeout: Option<Duration>) -> Answer<'a, TaskOutcome> {
        Box::pin(Shared::wait(self, task_id, timeout))
    }
}
