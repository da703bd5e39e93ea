//! The one error type of the crate, with the codes of the Python `CronoqError` tree.
//!
//! Every refusal a broker sends carries one of these codes (docs/protocol.md,
//! "Broker → client"); the embedded [`Scheduler`](crate::Scheduler) refuses
//! with the same ones, so code written against one works against the other.

use std::fmt;
use std::sync::Arc;

/// What went wrong. Match on the variant, or compare [`Error::code`] with the
/// Python client's `CronoqError.code` strings.
///
/// The variants from [`InvalidArgument`](Error::InvalidArgument) to
/// [`TaskFailed`](Error::TaskFailed) are the codes a broker (or the embedded scheduler) answers
/// with. The rest are this side's own ([`is_local`](Error::is_local)):
/// [`Connection`](Error::Connection) (the broker could not be reached, or was lost; code
/// `UNAVAILABLE`, as the Python client's), [`Timeout`](Error::Timeout),
/// [`Decode`](Error::Decode) and [`Encode`](Error::Encode) (with the serde error as
/// [`source`](std::error::Error::source)), [`WrongEndpoint`](Error::WrongEndpoint) and
/// [`MissingToken`](Error::MissingToken). New variants may come: the enum is `#[non_exhaustive]`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// A request was malformed: a wrong value, an oversized payload.
    InvalidArgument(String),
    /// The token was missing or unknown.
    Unauthenticated(String),
    /// The token's role or tenant does not allow this request.
    PermissionDenied(String),
    /// No such pool or task.
    NotFound(String),
    /// The request conflicts with the broker's state or config (a worker's pool settings disagree).
    FailedPrecondition(String),
    /// A limit was reached (backlog); nothing accepted was lost.
    ResourceExhausted(String),
    /// The task was not dispatched before its deadline and will never run.
    DeadlineExceeded(String),
    /// The task was cancelled before it ran.
    Cancelled(String),
    /// The broker answered `UNAVAILABLE` (it is stopping, or cannot serve this now), or sent an
    /// answer this crate cannot read; retrying may help. A broker this side cannot reach is
    /// [`Error::Connection`].
    Unavailable(String),
    /// A cluster member refused a pool another member owns (code `FAILED_PRECONDITION`): a client
    /// made with `.routing(false)` sees it; a routing client follows `member` by itself.
    NotOwner {
        /// The pool.
        pool: String,
        /// The member that owns it.
        member: String,
        /// What the member said.
        message: String,
    },
    /// The handler failed: the remote error's type, message and traceback (empty when it had none).
    TaskFailed {
        /// The handler's error type (a Python exception class, a Rust type name, or `WorkerLost`, ...).
        r#type: String,
        /// What the handler said went wrong.
        message: String,
        /// The handler's traceback, or `""`.
        traceback: String,
    },
    /// This side could not reach the broker, or lost it: no broker at the address (connection
    /// refused), a CURVE handshake that cannot succeed, no reply within the request timeout, the
    /// client closed, a socket that cannot be made. Code `UNAVAILABLE` (the Python client raises
    /// `cronoq.Unavailable`); retrying may help, unless the message names a mistake (a CURVE key).
    Connection {
        /// The broker's address(es), as given (`"A or B"` for a primary and its standby).
        address: String,
        /// What happened, naming the address.
        message: String,
    },
    /// Waiting for a result took longer than the caller allowed; the task itself goes on.
    /// (The Python client raises its built-in `TimeoutError` here.)
    Timeout(String),
    /// A payload or result did not decode into the type asked for (or was not msgpack): a mistake
    /// of this program's types, not of the request. `source` is the serde error.
    Decode {
        /// What was decoded, into which type.
        what: String,
        /// The decoder's error.
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// A value could not be encoded as msgpack (a map with non-string keys Python cannot read, a
    /// serializer's own error). `source` is the serde error.
    Encode {
        /// What was encoded.
        what: String,
        /// The encoder's error.
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// The address is the broker's other endpoint: a client given its worker endpoint, or a worker
    /// given its client endpoint. Code `INVALID_ARGUMENT`, as the broker refuses such messages.
    WrongEndpoint {
        /// The address given.
        address: String,
        /// What the broker said, naming the endpoint to use.
        message: String,
    },
    /// `token_env` named an environment variable that is not set. Code `UNAUTHENTICATED`.
    MissingToken {
        /// The variable's name.
        variable: String,
    },
    /// A code this version of the crate does not know, as the broker sent it.
    Other {
        /// The code as received.
        code: String,
        /// The broker's message.
        message: String,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The error's code: `INVALID_ARGUMENT`, `PERMISSION_DENIED`, `TASK_FAILED`, ... as in Python's
    /// `CronoqError.code`; `TIMEOUT` for [`Error::Timeout`], which has no wire code.
    #[must_use]
    pub fn code(&self) -> &str {
        match self {
            Error::InvalidArgument(_) => "INVALID_ARGUMENT",
            Error::Unauthenticated(_) => "UNAUTHENTICATED",
            Error::PermissionDenied(_) => "PERMISSION_DENIED",
            Error::NotFound(_) => "NOT_FOUND",
            Error::FailedPrecondition(_) | Error::NotOwner { .. } => "FAILED_PRECONDITION",
            Error::ResourceExhausted(_) => "RESOURCE_EXHAUSTED",
            Error::DeadlineExceeded(_) => "DEADLINE_EXCEEDED",
            Error::Cancelled(_) => "CANCELLED",
            Error::Unavailable(_) | Error::Connection { .. } => "UNAVAILABLE",
            Error::TaskFailed { .. } => "TASK_FAILED",
            Error::Timeout(_) => "TIMEOUT",
            Error::Decode { .. } => "DECODE",
            Error::Encode { .. } | Error::WrongEndpoint { .. } => "INVALID_ARGUMENT",
            Error::MissingToken { .. } => "UNAUTHENTICATED",
            Error::Other { code, .. } => code,
        }
    }

    /// The message for people (for `TaskFailed`, the handler's message; for `Decode`, `Encode` and
    /// `MissingToken`, what failed; the whole sentence is the `Display`).
    #[must_use]
    pub fn message(&self) -> &str {
        match self {
            Error::InvalidArgument(m)
            | Error::Unauthenticated(m)
            | Error::PermissionDenied(m)
            | Error::NotFound(m)
            | Error::FailedPrecondition(m)
            | Error::ResourceExhausted(m)
            | Error::DeadlineExceeded(m)
            | Error::Cancelled(m)
            | Error::Unavailable(m)
            | Error::Timeout(m) => m,
            Error::TaskFailed { message, .. }
            | Error::Other { message, .. }
            | Error::WrongEndpoint { message, .. }
            | Error::Connection { message, .. }
            | Error::NotOwner { message, .. } => message,
            Error::Decode { what, .. } | Error::Encode { what, .. } => what,
            Error::MissingToken { variable } => variable,
        }
    }

    /// Whether this side found the error, as opposed to the broker (or the embedded scheduler's
    /// same rules) answering with it: a connection that failed, a timeout, a decode or encode
    /// failure, a mistake in the address or the token variable.
    #[must_use]
    pub fn is_local(&self) -> bool {
        matches!(
            self,
            Error::Timeout(_)
                | Error::Connection { .. }
                | Error::Decode { .. }
                | Error::Encode { .. }
                | Error::WrongEndpoint { .. }
                | Error::MissingToken { .. }
        )
    }

    pub(crate) fn decode(what: impl Into<String>, source: impl std::error::Error + Send + Sync + 'static) -> Error {
        Error::Decode { what: what.into(), source: Arc::new(source) }
    }

    /// This side cannot reach (or lost) the broker at `address`.
    pub(crate) fn connection(address: impl Into<String>, message: impl Into<String>) -> Error {
        Error::Connection { address: address.into(), message: message.into() }
    }

    pub(crate) fn encode(what: impl Into<String>, source: impl std::error::Error + Send + Sync + 'static) -> Error {
        Error::Encode { what: what.into(), source: Arc::new(source) }
    }

    /// The error a broker's `error` reply stands for.
    #[must_use]
    pub fn from_code(code: &str, message: impl Into<String>) -> Error {
        let message = message.into();
        match code {
            "INVALID_ARGUMENT" => Error::InvalidArgument(message),
            "UNAUTHENTICATED" => Error::Unauthenticated(message),
            "PERMISSION_DENIED" => Error::PermissionDenied(message),
            "NOT_FOUND" => Error::NotFound(message),
            "FAILED_PRECONDITION" => Error::FailedPrecondition(message),
            "RESOURCE_EXHAUSTED" => Error::ResourceExhausted(message),
            "DEADLINE_EXCEEDED" => Error::DeadlineExceeded(message),
            "CANCELLED" => Error::Cancelled(message),
            "UNAVAILABLE" => Error::Unavailable(message),
            "TASK_FAILED" => Error::TaskFailed { r#type: String::new(), message, traceback: String::new() },
            _ => Error::Other { code: code.to_string(), message },
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::TaskFailed { r#type, message, .. } if !r#type.is_empty() => {
                write!(f, "TASK_FAILED: {type}: {message}", type = r#type)
            }
            Error::Decode { what, source } => write!(f, "DECODE: {what}: {source}"),
            Error::Encode { what, source } => write!(f, "INVALID_ARGUMENT: {what}: {source}"),
            Error::WrongEndpoint { address, message } => write!(f, "INVALID_ARGUMENT: {address}: {message}"),
            Error::MissingToken { variable } => write!(
                f,
                "UNAUTHENTICATED: the environment variable {variable} is not set; it should hold the token \
                 for the broker (or give the token itself with .token(...))"
            ),
            other => write!(f, "{}: {}", other.code(), other.message()),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Decode { source, .. } | Error::Encode { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}

/// Errors are equal when they say the same: the same variant, fields and (for `Decode` and
/// `Encode`) the same text of their source.
impl PartialEq for Error {
    fn eq(&self, other: &Error) -> bool {
        self.code() == other.code()
            && self.is_local() == other.is_local()
            && std::mem::discriminant(self) == std::mem::discriminant(other)
            && self.to_string() == other.to_string()
    }
}

impl Eq for Error {}

/// The error of a task that ended in `state` with these error fields (an `outcome` on the wire, or a
/// record of the embedded scheduler); `None` for `succeeded`.
pub(crate) fn outcome_error(
    task_id: &str,
    state: &str,
    error_type: &str,
    error_message: &str,
    traceback: &str,
) -> Option<Error> {
    match state {
        "succeeded" => None,
        "expired" => Some(Error::DeadlineExceeded(format!(
            "task {task_id} was not dispatched before its deadline and will never run"
        ))),
        "cancelled" => Some(Error::Cancelled(format!("task {task_id} was cancelled before it ran"))),
        "failed" => Some(Error::TaskFailed {
            r#type: error_type.to_string(),
            message: error_message.to_string(),
            traceback: traceback.to_string(),
        }),
        other => Some(Error::Other {
            code: "UNKNOWN".to_string(),
            message: format!("task {task_id} ended in unexpected state {other:?}"),
        }),
    }
}

/// The broker's words for a missing token name the Python API; a Rust user is told the Rust way.
pub(crate) fn for_rust(message: &str) -> String {
    if message.starts_with("this broker requires a token and none was sent") {
        "this broker requires a token and none was sent: give it with .token(...) on cronoq::connect or \
         Worker::new, or name the environment variable that holds it with .token_env(\"CRONOQ_TOKEN\")"
            .to_string()
    } else {
        message.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::Error;

    #[test]
    fn a_broker_this_side_cannot_reach_is_not_the_brokers_unavailable() {
        let lost = Error::connection("tcp://10.0.0.1:5555", "connection refused at tcp://10.0.0.1:5555");
        let said = Error::from_code("UNAVAILABLE", "the broker is stopping");
        assert_eq!((lost.code(), lost.is_local()), ("UNAVAILABLE", true));
        assert_eq!((said.code(), said.is_local()), ("UNAVAILABLE", false));
        assert!(matches!(said, Error::Unavailable(_)));
        assert_eq!(lost.to_string(), "UNAVAILABLE: connection refused at tcp://10.0.0.1:5555");
        assert_ne!(lost, Error::Unavailable("connection refused at tcp://10.0.0.1:5555".into()));
    }
}
