//! cronoq for Rust: submit to and work for a cronoq broker, or run the same
//! scheduling embedded, with no broker.
//!
//! - [`connect`] → [`Client`]: `submit` a [`Task`], await its [`TaskHandle::result`], `status`,
//!   `cancel`, `explain` (an [`Explanation`]), `pause`/`resume`.
//! - [`Worker`]: serves pools for a broker, each a [`PoolConfig`] and an async handler.
//! - Both take a broker's primary and its standbys ([`Addresses`]) and follow the one that serves.
//! - A client or worker given a cluster member's address serves the whole cluster.
//! - [`Scheduler`]: the broker's scheduling rules in this process.
//!
//! Errors are one [`Error`] enum whose codes are the Python `CronoqError` codes. See README.md.

#![warn(missing_docs)]

mod address;
mod client;
mod cluster;
pub mod core;
mod embedded;
mod error;
mod explain;
mod handle;
mod handler;
mod link;
mod pool;
mod task;
mod transport;
pub mod wire;
mod worker;

pub use address::Addresses;
pub use client::{connect, Client, Connect, DEFAULT_CLIENT_ADDRESS, DEFAULT_REQUEST_TIMEOUT};
pub use embedded::Scheduler;
pub use error::{Error, Result};
pub use explain::{AttemptEnd, CeilingState, Ended, Explanation, NodeState, Waiting};
pub use handle::TaskHandle;
pub use handler::Failure;
pub use pool::{Fairness, PoolConfig};
pub use rmpv::Value;
pub use task::{encode, Payload, Priority, Task, TaskInfo, TaskState, MAX_NAME_LENGTH};
pub use worker::{Stopper, Worker};
