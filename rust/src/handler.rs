//! Handlers: the async functions that run a pool's tasks, for a [`Worker`](crate::Worker) or the
//! embedded [`Scheduler`](crate::Scheduler).

use std::fmt::{Debug, Display};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::Serialize;

use crate::task::{encode, Payload};

/// Why a handler's run failed, as the task's outcome reports it (`TaskFailed` for the client).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The error's type: the Rust type's name without its module path.
    pub r#type: String,
    /// The error's `Display`.
    pub message: String,
    /// The error's `Debug` (with its chain of causes, for errors that print one), when it says more
    /// than the message; else `""`.
    pub traceback: String,
}

impl Failure {
    /// The failure of a handler that returned `error`.
    pub fn of<E: Display + Debug>(error: &E) -> Failure {
        let full = std::any::type_name::<E>();
        let base = full.split('<').next().unwrap_or(full);
        let r#type = base.rsplit("::").next().unwrap_or(base).to_string();
        let message = error.to_string();
        let debug = format!("{error:?}");
        let traceback = if debug == message || debug == format!("{message:?}") { String::new() } else { debug };
        Failure { r#type, message, traceback }
    }
}

pub(crate) type Outcome = Result<Vec<u8>, Failure>;
pub(crate) type BoxFuture = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// A handler with its types erased: payload in, msgpack result or failure out.
pub(crate) type Handler = Arc<dyn Fn(Payload) -> BoxFuture + Send + Sync>;

/// Wrap an async `Fn(Payload) -> Result<T, E>` as a [`Handler`]. A handler that panics fails its
/// task (type `panic`) and nothing else.
pub(crate) fn handler<F, Fut, T, E>(f: F) -> Handler
where
    F: Fn(Payload) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
    T: Serialize + 'static,
    E: Display + Debug + 'static,
{
    let f = Arc::new(f);
    Arc::new(move |payload| {
        let f = f.clone();
        Box::pin(async move {
            match f(payload).await {
                Ok(value) => encode(&value).map_err(|e| Failure {
                    r#type: "InvalidArgument".into(),
                    message: format!("the handler's result {}", e.message()),
                    traceback: String::new(),
                }),
                Err(error) => Err(Failure::of(&error)),
            }
        })
    })
}

/// Run a handler on its own tokio task, so that a panic fails only this task.
pub(crate) async fn run(handler: Handler, payload: Payload) -> Outcome {
    match tokio::spawn(handler(payload)).await {
        Ok(outcome) => outcome,
        Err(join) => {
            let message = match join.try_into_panic() {
                Ok(panic) => panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "the handler panicked".into()),
                Err(_) => "the handler was cancelled".into(),
            };
            Err(Failure { r#type: "panic".into(), message, traceback: String::new() })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Refused {
        why: &'static str,
    }

    impl std::fmt::Display for Refused {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.why)
        }
    }

    #[test]
    fn a_failure_names_the_error_type_without_its_path() {
        let f = Failure::of(&Refused { why: "no" });
        assert_eq!((f.r#type.as_str(), f.message.as_str()), ("Refused", "no"));
        assert_eq!(f.traceback, "Refused { why: \"no\" }");
        let plain = Failure::of(&"just text");
        assert_eq!((plain.r#type.as_str(), plain.traceback.as_str()), ("&str", ""));
    }
}
