//! What a caller learns about a task: [`TaskInfo`] (`status`), [`Explanation`] (`explain`) and
//! the words they use ([`TaskState`], [`Ended`]), shared by the client, the embedded scheduler
//! and a handle.
//!
//! The fields a snapshot and an explanation share are written once, in `task_answer!`: both
//! structs are made by it, so a field added to a task's snapshot is in its explanation too.
//!
//! A broker's `explain` answer is a msgpack map that may grow keys (docs/protocol.md, "The explain
//! map"; docs/scheduling.md, "Why is my task waiting?"); serde reads the keys it knows into the
//! typed fields (derived below) and ignores the rest, as the Python client does. A key it needs
//! that is missing or of the wrong type makes the whole answer unreadable:
//! [`Explanation::from_value`] then says which field, by its path in the map
//! (`serde_path_to_error`). The same derives write every answer out again, for a program that
//! logs or forwards it as JSON. No I/O here.

use rmpv::Value;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::task::Priority;
use crate::wire::{self, Header};

/// Defines a public answer about one task: the fields every such answer has (those of
/// [`TaskInfo`]), then the struct's own. Also gives it `from_info`, which builds it from a
/// [`TaskInfo`] and its own fields (the destructuring below names every shared field, so the
/// compiler holds the list and the struct to each other).
macro_rules! task_answer {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$field_meta:meta])* pub $field:ident: $type:ty, )*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            /// The task's id.
            pub id: String,
            /// Its pool.
            pub pool: String,
            /// Its tenant, if any.
            pub tenant: Option<String>,
            /// Its priority class.
            #[serde(with = "priority_name")]
            pub priority: Priority,
            /// Where it stands.
            pub state: TaskState,
            /// How many times it was dispatched (runs lost with their worker included).
            pub attempts: u32,
            /// When it was accepted.
            pub submitted_at: f64,
            /// When it last started running.
            pub started_at: Option<f64>,
            /// When it ended.
            pub finished_at: Option<f64>,
            /// The absolute time its deadline falls at.
            pub deadline: Option<f64>,
            /// The last failure, `"<error_type>: <error_message>"`.
            pub error: Option<String>,
            /// The cost it was submitted with (`None`: it counts 1); what it charges its tenant's
            /// share in a pool that shares by cost. `None` from a broker that does not say.
            #[serde(default)]
            pub cost: Option<f64>,
            $( $(#[$field_meta])* pub $field: $type, )*
        }

        impl $name {
            /// This answer: the task's snapshot, and the fields only this answer has.
            #[allow(dead_code)]
            pub(crate) fn from_info(info: TaskInfo, $($field: $type),*) -> $name {
                let TaskInfo {
                    id, pool, tenant, priority, state, attempts, submitted_at, started_at, finished_at, deadline, error,
                    cost,
                } = info;
                $name {
                    id, pool, tenant, priority, state, attempts, submitted_at, started_at, finished_at, deadline, error,
                    cost,
                    $($field),*
                }
            }
        }
    };
}

/// Where a task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "&'static str")]
#[non_exhaustive]
pub enum TaskState {
    /// Waiting for a worker.
    Queued,
    /// Waiting for its delay (or a retry's backoff) to end.
    Delayed,
    /// A worker is running it.
    Running,
    /// Its handler returned a value.
    Succeeded,
    /// Its handler failed on its last allowed run.
    Failed,
    /// Cancelled before it ran.
    Cancelled,
    /// Its deadline passed before it was dispatched.
    Expired,
}

impl TryFrom<String> for TaskState {
    type Error = Error;

    fn try_from(name: String) -> Result<TaskState> {
        TaskState::parse(&name)
    }
}

impl From<TaskState> for &'static str {
    fn from(state: TaskState) -> &'static str {
        state.as_str()
    }
}

/// A priority as its name on the wire (`"normal"`): msgpack maps carry names, not variant indexes.
mod priority_name {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::task::Priority;

    pub fn serialize<S: Serializer>(priority: &Priority, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(priority.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Priority, D::Error> {
        let name = String::deserialize(deserializer)?;
        Priority::parse(&name).map_err(|e| serde::de::Error::custom(e.message()))
    }
}

impl TaskState {
    /// The state named `name` on the wire.
    ///
    /// # Errors
    ///
    /// `InvalidArgument` for a name that is no state.
    pub fn parse(name: &str) -> Result<TaskState> {
        Ok(match name {
            "queued" => TaskState::Queued,
            "delayed" => TaskState::Delayed,
            "running" => TaskState::Running,
            "succeeded" => TaskState::Succeeded,
            "failed" => TaskState::Failed,
            "cancelled" => TaskState::Cancelled,
            "expired" => TaskState::Expired,
            other => return Err(Error::InvalidArgument(format!("unknown task state {other:?}"))),
        })
    }

    /// The name on the wire.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Queued => "queued",
            TaskState::Delayed => "delayed",
            TaskState::Running => "running",
            TaskState::Succeeded => "succeeded",
            TaskState::Failed => "failed",
            TaskState::Cancelled => "cancelled",
            TaskState::Expired => "expired",
        }
    }

    /// Whether the task will never change again.
    #[must_use]
    pub fn is_terminal(self) -> bool {
        matches!(self, TaskState::Succeeded | TaskState::Failed | TaskState::Cancelled | TaskState::Expired)
    }
}

task_answer! {
    /// A snapshot of a task, as `status` returns it. Times are Unix seconds.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[non_exhaustive]
    pub struct TaskInfo {}
}

impl TaskInfo {
    /// Read a broker's answer to `status` (its header, typed by the wire's schema).
    pub(crate) fn from_status(h: &Header) -> Result<TaskInfo> {
        Ok(TaskInfo {
            id: h.str("id").to_string(),
            pool: h.str("pool").to_string(),
            tenant: h.opt_str("tenant").map(str::to_string),
            priority: Priority::parse(h.str("priority"))?,
            state: TaskState::parse(h.str("state"))?,
            attempts: h.int("attempts").max(0) as u32,
            submitted_at: h.opt_float("submitted_at").unwrap_or(0.0),
            started_at: h.opt_float("started_at"),
            finished_at: h.opt_float("finished_at"),
            deadline: h.opt_float("deadline"),
            error: h.opt_str("error").map(str::to_string),
            cost: h.opt_float("cost"),
        })
    }
}

task_answer! {
    /// Why a task is where it is: [`Client::explain`](crate::Client::explain) returns it.
    ///
    /// The task's fields as [`TaskInfo`] has them (times are Unix seconds), plus `max_retries`,
    /// `not_before`, how each attempt ended (`history`) and, while the task is queued or delayed,
    /// what stands before it (`waiting`).
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[non_exhaustive]
    pub struct Explanation {
        /// How many more runs a failed run earns.
        pub max_retries: u32,
        /// When a delayed task may run.
        pub not_before: Option<f64>,
        /// How each attempt ended, first first.
        pub history: Vec<AttemptEnd>,
        /// What stands before the task while it is queued or delayed; `None` otherwise.
        pub waiting: Option<Waiting>,
    }
}

/// How one attempt (dispatch) of a task ended, as far as the broker knows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AttemptEnd {
    /// The attempt's number, from 1.
    pub attempt: u32,
    /// How it ended.
    pub ended: Ended,
    /// When it ended (Unix seconds), when known.
    pub at: Option<f64>,
    /// What the handler raised (`"<type>: <message>"`), when known.
    pub error: Option<String>,
}

/// How an attempt ended ([`AttemptEnd::ended`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
#[non_exhaustive]
pub enum Ended {
    /// The task's last attempt, and it succeeded.
    Succeeded,
    /// The task's last attempt, and it failed.
    Failed,
    /// The handler failed and the task was queued again.
    Retried,
    /// Its worker was lost (or the broker stopped) while it ran.
    WorkerLost,
    /// The attempt under way.
    Running,
    /// Not kept: how earlier attempts ended lives in the broker's memory only, and a restarted
    /// broker has lost it.
    Unknown,
    /// A word this version of the crate does not know, as the broker sent it.
    Other(String),
}

impl From<String> for Ended {
    fn from(word: String) -> Ended {
        Ended::parse(&word)
    }
}

impl From<Ended> for String {
    fn from(ended: Ended) -> String {
        ended.as_str().to_string()
    }
}

impl Ended {
    fn parse(word: &str) -> Ended {
        match word {
            "succeeded" => Ended::Succeeded,
            "failed" => Ended::Failed,
            "retried" => Ended::Retried,
            "worker_lost" => Ended::WorkerLost,
            "running" => Ended::Running,
            "unknown" => Ended::Unknown,
            other => Ended::Other(other.to_string()),
        }
    }

    /// The broker's word for it: `succeeded`, `failed`, `retried`, `worker_lost`, `running`, `unknown`.
    #[must_use]
    pub fn as_str(&self) -> &str {
        match self {
            Ended::Succeeded => "succeeded",
            Ended::Failed => "failed",
            Ended::Retried => "retried",
            Ended::WorkerLost => "worker_lost",
            Ended::Running => "running",
            Ended::Unknown => "unknown",
            Ended::Other(word) => word,
        }
    }
}

/// Why a queued or delayed task has not started. Every count is of queued tasks of its pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Waiting {
    /// Whether its class shares dispatches by tenant.
    pub fair: bool,
    /// Queued tasks of higher priority classes: they all go first.
    pub higher_classes_ahead: u64,
    /// Deadline tasks of its class that go before it.
    pub deadline_ahead: u64,
    /// False: `deadline_ahead` means "at least" (the broker's walk stopped).
    pub deadline_ahead_exact: bool,
    /// Tasks ahead of it in its own queue (its tenant's in a fair pool, its class's otherwise);
    /// `None` while it is delayed, or for a deadline task.
    pub queue_ahead: Option<u64>,
    /// False: `queue_ahead` means "at least".
    pub queue_ahead_exact: bool,
    /// The length of its own queue.
    pub queue_length: u64,
    /// Its tenant's path in the fair share, from the top (empty when the pool shares nothing).
    pub nodes: Vec<NodeState>,
    /// Its queue's share (0..1) of its class's fair dispatches now.
    pub tenant_share: Option<f64>,
    /// The pool is paused.
    pub paused: bool,
    /// Workers serving the pool.
    pub workers: u64,
    /// Those with a free slot.
    pub ready_workers: u64,
    /// Tasks of the pool running.
    pub running: u64,
    /// The pool's cap on running tasks, if any.
    pub max_in_flight: Option<u64>,
    /// Seconds of delay (or retry back-off, when `retry`) still to go.
    pub delayed_for: Option<f64>,
    /// `delayed_for` is a retry's back-off.
    pub retry: bool,
    /// The pool's dispatches per second over about the last 10 s.
    pub dispatch_rate: Option<f64>,
    /// Seconds until it starts, when that can be told.
    pub estimate: Option<f64>,
    /// Why there is no estimate, or what the figure assumes.
    pub estimate_note: String,
    /// How fast work that goes before it (higher classes; deadline tasks of its class, for a task
    /// without one) keeps arriving, per second; `None` when not measured.
    #[serde(default)]
    pub arrival_rate_ahead: Option<f64>,
    /// The pool runs as many tasks as its `max_in_flight` allows (false from a broker that does
    /// not say).
    #[serde(default)]
    pub at_max_in_flight: bool,
    /// What shares, lags and charges are counted in: `dispatches`, `cost` or `seconds` (of run
    /// time).
    #[serde(default = "dispatches")]
    pub share_unit: String,
}

fn dispatches() -> String {
    "dispatches".to_string()
}

/// One node of a task's tenant path, as the fair share of its class sees it now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct NodeState {
    /// The tenant's name (a path such as `acme/search` below the top).
    pub name: String,
    /// This node stands for the tenant's own tasks, sharing with its sub-tenants.
    pub own_tasks: bool,
    /// Its weight.
    pub weight: f64,
    /// It has tasks queued in the class.
    pub backlogged: bool,
    /// The fraction (0..1) of its parent's dispatches it gets now.
    pub share: f64,
    /// Dispatches it trails (+) or leads (-) its share by.
    pub lag: f64,
    /// Its ceiling, if it has one.
    pub ceiling: Option<CeilingState>,
    /// The caller's token is pinned to this tenant or one below it: `share` and `lag`, which
    /// depend on other tenants' work, are not told (they read 0).
    #[serde(default)]
    pub hidden: bool,
    /// Its most starts a second, if it has a rate.
    #[serde(default)]
    pub rate: Option<f64>,
    /// Seconds until its rate lets it start again, while it may not.
    #[serde(default)]
    pub rate_limited_for: Option<f64>,
    /// The running tasks its subtree is guaranteed, if any.
    #[serde(default)]
    pub minimum: Option<u64>,
    /// It runs fewer tasks than its minimum: its tasks go ahead of its class's fair order.
    #[serde(default)]
    pub under_minimum: bool,
}

/// A node's ceiling: its limit, its subtree's running tasks, and whether (since when) it is capped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CeilingState {
    /// At most this many of its subtree's tasks run at once.
    pub limit: u64,
    /// How many run now.
    pub running: u64,
    /// It is at its limit: its tasks are passed over.
    pub capped: bool,
    /// Since when (Unix seconds).
    pub capped_since: Option<f64>,
    /// For how many seconds.
    pub capped_for: Option<f64>,
}

impl From<crate::core::explain::Reading> for Waiting {
    fn from(r: crate::core::explain::Reading) -> Waiting {
        let nodes = r
            .nodes
            .into_iter()
            .map(|n| NodeState {
                name: n.name,
                own_tasks: n.own_tasks,
                weight: n.weight,
                backlogged: n.backlogged,
                share: n.share,
                lag: n.lag,
                ceiling: n.ceiling.map(|c| CeilingState {
                    limit: c.limit,
                    running: c.running,
                    capped: c.capped,
                    capped_since: c.capped_since,
                    capped_for: c.capped_for,
                }),
                hidden: false,
                rate: n.rate,
                rate_limited_for: n.rate_limited_for,
                minimum: n.minimum,
                under_minimum: n.under_minimum,
            })
            .collect();
        Waiting {
            fair: r.fair,
            higher_classes_ahead: r.higher_classes_ahead,
            deadline_ahead: r.deadline_ahead,
            deadline_ahead_exact: r.deadline_ahead_exact,
            queue_ahead: r.queue_ahead,
            queue_ahead_exact: r.queue_ahead_exact,
            queue_length: r.queue_length,
            nodes,
            tenant_share: r.tenant_share,
            paused: r.paused,
            workers: r.workers,
            ready_workers: r.ready_workers,
            running: r.running,
            max_in_flight: r.max_in_flight,
            delayed_for: r.delayed_for,
            retry: r.retry,
            dispatch_rate: r.dispatch_rate,
            arrival_rate_ahead: r.arrival_rate_ahead,
            estimate: r.estimate,
            estimate_note: r.estimate_note,
            at_max_in_flight: r.at_max_in_flight,
            share_unit: r.share_unit.to_string(),
        }
    }
}

impl Explanation {
    /// Read the value of the broker's `ok` answering `explain`; `Unavailable` naming the field
    /// by its path (`waiting.nodes[0].weight`) when it cannot be read (a broker speaking another
    /// version of the map).
    ///
    /// # Errors
    ///
    /// `Unavailable` when the map cannot be read, naming the field by its path.
    pub fn from_value(value: &Value) -> Result<Explanation> {
        let task = wire::field(value, "id").and_then(Value::as_str).unwrap_or("?");
        serde_path_to_error::deserialize(value.clone()).map_err(|e| {
            let path = e.path().to_string();
            let why = e.into_inner();
            Error::Unavailable(if path == "." {
                format!("the broker's explanation of task {task} cannot be read: {why}")
            } else {
                format!("the broker's explanation of task {task} cannot be read: {path}: {why}")
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(entries: Vec<(&str, Value)>) -> Value {
        Value::Map(entries.into_iter().map(|(k, v)| (Value::from(k), v)).collect())
    }

    fn ran(history: Vec<Value>) -> Value {
        map(vec![
            ("id", "t1".into()),
            ("pool", "work".into()),
            ("tenant", Value::Nil),
            ("priority", "normal".into()),
            ("state", "failed".into()),
            ("attempts", 2.into()),
            ("max_retries", 1.into()),
            ("submitted_at", Value::F64(1.7e9)),
            ("error", "ValueError: bad input".into()),
            ("history", Value::Array(history)),
            ("waiting", Value::Nil),
            ("a key of a later broker", 1.into()),
        ])
    }

    #[test]
    fn a_task_that_ran_lists_its_attempts_and_unknown_keys_are_ignored() {
        let e = Explanation::from_value(&ran(vec![
            map(vec![
                ("attempt", 1.into()),
                ("ended", "retried".into()),
                ("at", Value::F64(1.7e9)),
                ("error", "ValueError: bad input".into()),
            ]),
            map(vec![
                ("attempt", 2.into()),
                ("ended", "failed".into()),
                ("at", 1_700_000_001.into()),
                ("error", Value::Nil),
            ]),
        ]))
        .unwrap();
        assert_eq!((e.state, e.attempts, e.max_retries, e.waiting), (TaskState::Failed, 2, 1, None));
        assert_eq!(e.history[0].ended, Ended::Retried);
        assert_eq!(e.history[1].at, Some(1_700_000_001.0));
        assert_eq!(e.history[1].ended.as_str(), "failed");
    }

    #[test]
    fn a_field_of_the_wrong_type_is_named_by_its_path() {
        let bad = ran(vec![map(vec![("attempt", "one".into()), ("ended", "failed".into())])]);
        let error = Explanation::from_value(&bad).unwrap_err();
        assert!(
            matches!(&error, Error::Unavailable(m) if m.contains("task t1") && m.contains("history[0].attempt")),
            "{error:?}"
        );
        let error = Explanation::from_value(&map(vec![("id", "t2".into())])).unwrap_err();
        assert!(matches!(&error, Error::Unavailable(m) if m.contains("missing field `pool`")), "{error:?}");
    }
}
