//! The one error type of the crate, with the codes of the Python `CronoqError` tree.
//!
//! Every refusal a broker sends carries one of these codes (docs/protocol.md,
//! "Broker → client"); the embedded [`Scheduler`](crate::Scheduler) refuses
//! with the same ones, so code written against one works against the other.

use std::fmt;

/// What went wrong. Match on the variant, or compare [`Error::code`] with the
/// Python client's `CronoqError.code` strings.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// The broker could not be reached in time, or the connection was closed; retrying may help.
    Unavailable(String),
    /// The handler failed: the remote error's type, message and traceback (empty when it had none).
    TaskFailed {
        /// The handler's error type (a Python exception class, a Rust type name, or `WorkerLost`, ...).
        r#type: String,
        /// What the handler said went wrong.
        message: String,
        /// The handler's traceback, or `""`.
        traceback: String,
    },
    /// Waiting for a result took longer than the caller allowed; the task itself goes on.
    /// (The Python client raises its built-in `TimeoutError` here.)
    Timeout(String),
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
    pub fn code(&self) -> &str {
        match self {
            Error::InvalidArgument(_) => "INVALID_ARGUMENT",
            Error::Unauthenticated(_) => "UNAUTHENTICATED",
            Error::PermissionDenied(_) => "PERMISSION_DENIED",
            Error::NotFound(_) => "NOT_FOUND",
            Error::FailedPrecondition(_) => "FAILED_PRECONDITION",
            Error::ResourceExhausted(_) => "RESOURCE_EXHAUSTED",
            Error::DeadlineExceeded(_) => "DEADLINE_EXCEEDED",
            Error::Cancelled(_) => "CANCELLED",
            Error::Unavailable(_) => "UNAVAILABLE",
            Error::TaskFailed { .. } => "TASK_FAILED",
            Error::Timeout(_) => "TIMEOUT",
            Error::Other { code, .. } => code,
        }
    }

    /// The message for people (for `TaskFailed`, the handler's message).
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
            Error::TaskFailed { message, .. } => message,
            Error::Other { message, .. } => message,
        }
    }

    /// The error a broker's `error` reply stands for.
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
            other => write!(f, "{}: {}", other.code(), other.message()),
        }
    }
}

impl std::error::Error for Error {}

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
