//! What a caller learns about a task: [`TaskInfo`] (`status`), [`Explanation`] (`explain`) and
//! the words they use ([`TaskState`], [`Ended`]), shared by the client, the embedded scheduler
//! and a handle.
//!
//! The fields a snapshot and an explanation share are written once, in `task_answer!`: both
//! structs are made by it, so a field added to a task's snapshot is in its explanation too.
//!
//! A broker's `explain` answer is a msgpack map that may grow keys (docs/protocol.md, "The explain
//! map"; docs/scheduling.md, "Why is my task waiting?"); this reads the keys it knows into typed
//! fields and ignores the rest, as the Python client does. A key it needs that is missing or of
//! the wrong type makes the whole answer unreadable: [`Explanation::from_value`] then says which
//! field, by its path in the map. No I/O here.

use rmpv::Value;

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
            $( $(#[$field_meta])* pub $field: $type, )*
        }

        impl $name {
            /// This answer: the task's snapshot, and the fields only this answer has.
            #[allow(dead_code)]
            pub(crate) fn from_info(info: TaskInfo, $($field: $type),*) -> $name {
                let TaskInfo {
                    id, pool, tenant, priority, state, attempts, submitted_at, started_at, finished_at, deadline, error,
                } = info;
                $name {
                    id, pool, tenant, priority, state, attempts, submitted_at, started_at, finished_at, deadline, error,
                    $($field),*
                }
            }
        }
    };
}

/// Where a task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

impl TaskState {
    /// The state named `name` on the wire.
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
    pub fn is_terminal(self) -> bool {
        matches!(self, TaskState::Succeeded | TaskState::Failed | TaskState::Cancelled | TaskState::Expired)
    }
}

task_answer! {
    /// A snapshot of a task, as `status` returns it. Times are Unix seconds.
    #[derive(Debug, Clone, PartialEq)]
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
        })
    }
}

task_answer! {
    /// Why a task is where it is: [`Client::explain`](crate::Client::explain) returns it.
    ///
    /// The task's fields as [`TaskInfo`] has them (times are Unix seconds), plus `max_retries`,
    /// `not_before`, how each attempt ended (`history`) and, while the task is queued or delayed,
    /// what stands before it (`waiting`).
    #[derive(Debug, Clone, PartialEq)]
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
#[derive(Debug, Clone, PartialEq)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
#[derive(Debug, Clone, PartialEq)]
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
}

/// One node of a task's tenant path, as the fair share of its class sees it now.
#[derive(Debug, Clone, PartialEq)]
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
}

/// A node's ceiling: its limit, its subtree's running tasks, and whether (since when) it is capped.
#[derive(Debug, Clone, PartialEq)]
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

impl Explanation {
    /// Read the value of the broker's `ok` answering `explain`; `Unavailable` naming the field
    /// when it cannot be read (a broker speaking another version of the map).
    pub fn from_value(value: &Value) -> Result<Explanation> {
        let task = wire::field(value, "id").and_then(Value::as_str);
        read_explanation(value).map_err(|why| {
            Error::Unavailable(format!(
                "the broker's explanation of task {} cannot be read: {why}",
                task.unwrap_or("?")
            ))
        })
    }
}

/// A map's fields, read by name; errors name the field by its path (`waiting.nodes[0].weight`).
struct Fields<'a> {
    path: String,
    map: &'a [(Value, Value)],
}

type Read<T> = std::result::Result<T, String>;

impl<'a> Fields<'a> {
    fn of(value: &'a Value, path: &str) -> Read<Fields<'a>> {
        match value {
            Value::Map(map) => Ok(Fields { path: path.to_string(), map }),
            other => Err(format!("{} must be a map, got {other}", if path.is_empty() { "the answer" } else { path })),
        }
    }

    fn name(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// The value under `key`; nil when it is left out.
    fn get(&self, key: &str) -> &'a Value {
        static NIL: Value = Value::Nil;
        self.map.iter().find(|(k, _)| k.as_str() == Some(key)).map_or(&NIL, |(_, v)| v)
    }

    fn has(&self, key: &str) -> bool {
        self.map.iter().any(|(k, _)| k.as_str() == Some(key))
    }

    fn missing(&self, key: &str) -> String {
        format!("{} is missing", self.name(key))
    }

    fn wrong(&self, key: &str, what: &str) -> String {
        format!("{} must be {what}, got {}", self.name(key), self.get(key))
    }

    fn string(&self, key: &str) -> Read<String> {
        self.opt_string(key)?.ok_or_else(|| if self.has(key) { self.wrong(key, "a string") } else { self.missing(key) })
    }

    fn opt_string(&self, key: &str) -> Read<Option<String>> {
        match self.get(key) {
            Value::Nil => Ok(None),
            Value::String(s) => s.as_str().map(|s| Some(s.to_string())).ok_or_else(|| self.wrong(key, "UTF-8")),
            _ => Err(self.wrong(key, "a string or nil")),
        }
    }

    fn int(&self, key: &str) -> Read<u64> {
        self.opt_int(key)?.ok_or_else(|| if self.has(key) { self.wrong(key, "an int") } else { self.missing(key) })
    }

    fn opt_int(&self, key: &str) -> Read<Option<u64>> {
        match self.get(key) {
            Value::Nil => Ok(None),
            Value::Integer(n) => n.as_u64().map(Some).ok_or_else(|| self.wrong(key, "an int of 0 or more")),
            _ => Err(self.wrong(key, "an int or nil")),
        }
    }

    fn count(&self, key: &str) -> Read<u32> {
        u32::try_from(self.int(key)?).map_err(|_| self.wrong(key, "an int that fits 32 bits"))
    }

    fn float(&self, key: &str) -> Read<f64> {
        self.opt_float(key)?.ok_or_else(|| if self.has(key) { self.wrong(key, "a float") } else { self.missing(key) })
    }

    /// A float or nil; an int is taken as the float it is (msgpack writers may shorten 2.0 to 2).
    fn opt_float(&self, key: &str) -> Read<Option<f64>> {
        match self.get(key) {
            Value::Nil => Ok(None),
            Value::F64(x) => Ok(Some(*x)),
            Value::F32(x) => Ok(Some(f64::from(*x))),
            Value::Integer(n) => Ok(n.as_f64()),
            _ => Err(self.wrong(key, "a float or nil")),
        }
    }

    fn bool(&self, key: &str) -> Read<bool> {
        match self.get(key) {
            Value::Boolean(b) => Ok(*b),
            Value::Nil if !self.has(key) => Err(self.missing(key)),
            _ => Err(self.wrong(key, "a bool")),
        }
    }

    /// The items of an array field; an empty list when it is left out (or nil).
    fn items(&self, key: &str) -> Read<&'a [Value]> {
        match self.get(key) {
            Value::Nil => Ok(&[]),
            Value::Array(items) => Ok(items),
            _ => Err(self.wrong(key, "an array")),
        }
    }
}

fn read_explanation(value: &Value) -> Read<Explanation> {
    let f = Fields::of(value, "")?;
    let history = f
        .items("history")?
        .iter()
        .enumerate()
        .map(|(i, item)| read_attempt(&Fields::of(item, &format!("history[{i}]"))?))
        .collect::<Read<Vec<_>>>()?;
    let waiting = match f.get("waiting") {
        Value::Nil => None,
        other => Some(read_waiting(&Fields::of(other, "waiting")?)?),
    };
    let info = read_task(&f)?;
    Ok(Explanation::from_info(info, f.count("max_retries")?, f.opt_float("not_before")?, history, waiting))
}

/// The fields every answer about a task has, from an answer's map.
fn read_task(f: &Fields<'_>) -> Read<TaskInfo> {
    Ok(TaskInfo {
        id: f.string("id")?,
        pool: f.string("pool")?,
        tenant: f.opt_string("tenant")?,
        priority: Priority::parse(&f.string("priority")?).map_err(|e| format!("priority: {}", e.message()))?,
        state: TaskState::parse(&f.string("state")?).map_err(|e| format!("state: {}", e.message()))?,
        attempts: f.count("attempts")?,
        submitted_at: f.float("submitted_at")?,
        started_at: f.opt_float("started_at")?,
        finished_at: f.opt_float("finished_at")?,
        deadline: f.opt_float("deadline")?,
        error: f.opt_string("error")?,
    })
}

fn read_attempt(f: &Fields<'_>) -> Read<AttemptEnd> {
    Ok(AttemptEnd {
        attempt: f.count("attempt")?,
        ended: Ended::parse(&f.string("ended")?),
        at: f.opt_float("at")?,
        error: f.opt_string("error")?,
    })
}

fn read_waiting(f: &Fields<'_>) -> Read<Waiting> {
    let nodes = f
        .items("nodes")?
        .iter()
        .enumerate()
        .map(|(i, item)| read_node(&Fields::of(item, &format!("{}[{i}]", f.name("nodes")))?))
        .collect::<Read<Vec<_>>>()?;
    Ok(Waiting {
        fair: f.bool("fair")?,
        higher_classes_ahead: f.int("higher_classes_ahead")?,
        deadline_ahead: f.int("deadline_ahead")?,
        deadline_ahead_exact: f.bool("deadline_ahead_exact")?,
        queue_ahead: f.opt_int("queue_ahead")?,
        queue_ahead_exact: f.bool("queue_ahead_exact")?,
        queue_length: f.int("queue_length")?,
        nodes,
        tenant_share: f.opt_float("tenant_share")?,
        paused: f.bool("paused")?,
        workers: f.int("workers")?,
        ready_workers: f.int("ready_workers")?,
        running: f.int("running")?,
        max_in_flight: f.opt_int("max_in_flight")?,
        delayed_for: f.opt_float("delayed_for")?,
        retry: f.bool("retry")?,
        dispatch_rate: f.opt_float("dispatch_rate")?,
        estimate: f.opt_float("estimate")?,
        estimate_note: f.string("estimate_note")?,
    })
}

fn read_node(f: &Fields<'_>) -> Read<NodeState> {
    let ceiling = match f.get("ceiling") {
        Value::Nil => None,
        other => {
            let c = Fields::of(other, &f.name("ceiling"))?;
            Some(CeilingState {
                limit: c.int("limit")?,
                running: c.int("running")?,
                capped: c.bool("capped")?,
                capped_since: c.opt_float("capped_since")?,
                capped_for: c.opt_float("capped_for")?,
            })
        }
    };
    Ok(NodeState {
        name: f.string("name")?,
        own_tasks: f.bool("own_tasks")?,
        weight: f.float("weight")?,
        backlogged: f.bool("backlogged")?,
        share: f.float("share")?,
        lag: f.float("lag")?,
        ceiling,
    })
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
        assert!(matches!(&error, Error::Unavailable(m) if m.contains("pool is missing")), "{error:?}");
    }
}
