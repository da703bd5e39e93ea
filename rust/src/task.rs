//! What a caller submits ([`Task`]) and what a handler receives ([`Payload`]). What a caller
//! learns about a task afterwards is in src/answers.rs.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{Error, Result};

/// The longest pool, tenant or key name a broker takes, in characters.
pub const MAX_NAME_LENGTH: usize = 200;

/// The largest `cost` a task may declare: a billion units (tokens, pages; seconds in a pool that
/// shares by run time), as a broker checks it.
pub const MAX_COST: f64 = 1e9;

/// A task's priority class. Classes are strict: every ready `Critical` task goes before any `High`,
/// and so on, whatever the tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    /// Class 0.
    Critical,
    /// Class 1.
    High,
    /// Class 2, the default.
    #[default]
    Normal,
    /// Class 3.
    Low,
}

impl Priority {
    /// The name on the wire: `"critical"`, `"high"`, `"normal"` or `"low"`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }

    /// The class number, 0 (critical) to 3 (low).
    #[must_use]
    pub fn class(self) -> u8 {
        self as u8
    }

    /// The priority named `name` on the wire.
    ///
    /// # Errors
    ///
    /// `InvalidArgument` for a name that is no priority, naming the four.
    pub fn parse(name: &str) -> Result<Priority> {
        match name {
            "critical" => Ok(Priority::Critical),
            "high" => Ok(Priority::High),
            "normal" => Ok(Priority::Normal),
            "low" => Ok(Priority::Low),
            other => Err(Error::InvalidArgument(format!(
                "priority must be one of critical, high, normal, low, got {other:?}"
            ))),
        }
    }
}

/// A task to submit: its payload (any `serde::Serialize` value, sent as msgpack) and where and how
/// it runs. Build it with [`Task::new`] and the builder methods; every setting has the same default
/// as the Python `submit`.
///
/// ```
/// use std::time::Duration;
/// use cronoq::{Priority, Task};
/// let task = Task::new(("resize", 640))
///     .pool("images")
///     .tenant("acme")
///     .priority(Priority::High)
///     .deadline(Duration::from_secs(30))
///     .key("resize-42")
///     .max_retries(2)
///     .cost(3.5);
/// assert_eq!(task.pool_name(), "images");
/// ```
#[derive(Debug, Clone)]
#[must_use = "a Task does nothing until it is submitted"]
pub struct Task {
    pub(crate) body: std::result::Result<Vec<u8>, String>,
    pub(crate) pool: String,
    pub(crate) tenant: Option<String>,
    pub(crate) priority: Priority,
    pub(crate) deadline: Option<Duration>,
    pub(crate) delay: Option<Duration>,
    pub(crate) key: Option<String>,
    pub(crate) max_retries: u32,
    pub(crate) cost: Option<f64>,
}

impl Task {
    /// A task carrying `payload`, encoded as msgpack (structs as maps, as Python dicts read them).
    /// A payload that cannot be encoded is refused by `submit` with `InvalidArgument`.
    pub fn new<P: Serialize>(payload: P) -> Task {
        Task::from_body(encode(&payload).map_err(|e| e.message().to_string()))
    }

    /// A task whose payload is already msgpack (one document).
    pub fn from_msgpack(body: Vec<u8>) -> Task {
        Task::from_body(Ok(body))
    }

    fn from_body(body: std::result::Result<Vec<u8>, String>) -> Task {
        Task {
            body,
            pool: "default".to_string(),
            tenant: None,
            priority: Priority::Normal,
            deadline: None,
            delay: None,
            key: None,
            max_retries: 0,
            cost: None,
        }
    }

    /// The pool to run in (default `"default"`).
    pub fn pool(mut self, pool: impl Into<String>) -> Task {
        self.pool = pool.into();
        self
    }

    /// The tenant the task runs for; with a token pinned to a tenant it may be left out.
    pub fn tenant(mut self, tenant: impl Into<String>) -> Task {
        self.tenant = Some(tenant.into());
        self
    }

    /// The priority class (default `Normal`).
    pub fn priority(mut self, priority: Priority) -> Task {
        self.priority = priority;
        self
    }

    /// Run within this long from now, or never: a task not dispatched by its deadline expires and
    /// its result is `DeadlineExceeded`.
    pub fn deadline(mut self, deadline: Duration) -> Task {
        self.deadline = Some(deadline);
        self
    }

    /// Do not dispatch before this long from now.
    pub fn delay(mut self, delay: Duration) -> Task {
        self.delay = Some(delay);
        self
    }

    /// An idempotency key: a second submit with the same key (same pool and tenant), while the
    /// first task's record is kept, returns the first task.
    pub fn key(mut self, key: impl Into<String>) -> Task {
        self.key = Some(key.into());
        self
    }

    /// How many more times to run a task whose handler failed (0 to 1000; default 0).
    pub fn max_retries(mut self, max_retries: u32) -> Task {
        self.max_retries = max_retries;
        self
    }

    /// What the task charges its tenant's share in a pool that shares by cost (tokens of an LLM
    /// call, pages of a document; 1 when not given), and its first run-time estimate, in seconds, in
    /// one that shares by run time. A positive number, at most a billion (1e9); `submit` refuses
    /// another with `InvalidArgument`. Other pools ignore it.
    pub fn cost(mut self, cost: f64) -> Task {
        self.cost = Some(cost);
        self
    }

    /// The cost given with [`cost`](Self::cost), if any.
    #[must_use]
    pub fn cost_given(&self) -> Option<f64> {
        self.cost
    }

    /// The submit message's trailing `cost` field: nil when not given (the broker counts 1).
    pub(crate) fn wire_cost(&self) -> rmpv::Value {
        self.cost.map_or(rmpv::Value::Nil, rmpv::Value::F64)
    }

    /// The pool this task goes to.
    #[must_use]
    pub fn pool_name(&self) -> &str {
        &self.pool
    }

    /// Check what a broker would refuse, so the caller hears it before anything is sent.
    pub(crate) fn check(&self) -> Result<&[u8]> {
        let body = self
            .body
            .as_deref()
            .map_err(|e| Error::InvalidArgument(format!("the payload cannot be encoded as msgpack: {e}")))?;
        for (what, name) in [("pool", Some(&self.pool)), ("tenant", self.tenant.as_ref()), ("key", self.key.as_ref())] {
            if let Some(name) = name {
                let n = name.chars().count();
                if n == 0 || n > MAX_NAME_LENGTH {
                    return Err(Error::InvalidArgument(format!(
                        "{what} must be a non-empty string of at most {MAX_NAME_LENGTH} characters, got one of {n}"
                    )));
                }
            }
        }
        if self.key.as_deref().is_some_and(|k| k.starts_with("cronoq:")) {
            return Err(Error::InvalidArgument(format!(
                "key {:?} starts with \"cronoq:\": keys with that prefix are reserved for the broker's own tasks; choose another key",
                self.key.as_deref().unwrap_or_default()
            )));
        }
        if self.deadline == Some(Duration::ZERO) {
            return Err(Error::InvalidArgument("deadline must be more than 0 seconds from now, got 0 seconds".into()));
        }
        if let Some(cost) = self.cost {
            if !(cost.is_finite() && cost > 0.0) {
                return Err(Error::InvalidArgument(format!(
                    "cost must be a positive number (what the task charges its tenant's share in a pool with \
                     share_by = 'cost'), got {cost}"
                )));
            }
            if cost > MAX_COST {
                return Err(Error::InvalidArgument(format!("cost must be at most {MAX_COST:e}, got {cost}")));
            }
        }
        if self.max_retries > 1000 {
            return Err(Error::InvalidArgument(format!(
                "max_retries must be an integer from 0 to 1000, got {}",
                self.max_retries
            )));
        }
        Ok(body)
    }
}

/// Encode a value as one msgpack document, structs as maps.
///
/// # Errors
///
/// [`Error::Encode`] when the value cannot be msgpack (its serializer failed; `source` says why).
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    rmp_serde::to_vec_named(value).map_err(|e| Error::encode("cannot encode as msgpack", e))
}

/// A task's payload (or a result) as it travels: one msgpack document. Decode it into any
/// `serde::Deserialize` type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    bytes: Vec<u8>,
}

impl Payload {
    /// The payload of these msgpack bytes.
    #[must_use]
    pub fn from_msgpack(bytes: Vec<u8>) -> Payload {
        Payload { bytes }
    }

    /// Decode into `T`.
    ///
    /// # Errors
    ///
    /// [`Error::Decode`] says why it does not fit (its `source` is rmp-serde's error).
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T> {
        rmp_serde::from_slice(&self.bytes)
            .map_err(|e| Error::decode(format!("the payload does not decode as {}", std::any::type_name::<T>()), e))
    }

    /// The payload as a generic msgpack value.
    ///
    /// # Errors
    ///
    /// `InvalidArgument` when the bytes are not one msgpack document.
    pub fn value(&self) -> Result<rmpv::Value> {
        crate::wire::decode_value(&self.bytes)
    }

    /// The msgpack bytes.
    #[must_use]
    pub fn as_msgpack(&self) -> &[u8] {
        &self.bytes
    }
}
