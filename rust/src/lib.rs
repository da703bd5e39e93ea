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
//! Errors are one [`Error`] enum whose codes are the Python `CronoqError` codes. Every future is
//! cancel-safe (a dropped `result()` withdraws its wait at the broker). Events and spans go to
//! [`tracing`](https://docs.rs/tracing). The README (below, compiled as doc-tests) shows more.
//!
//! ```
//! use cronoq::{Payload, PoolConfig, Scheduler, Task};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> cronoq::Result<()> {
//! let sched = Scheduler::builder(vec![PoolConfig::new("default")])
//!     .handler("default", |p: Payload| async move { Ok::<_, cronoq::Error>(p.decode::<u32>()? * 2) })
//!     .build()?;
//! let task = sched.submit(Task::new(21u32)).await?;
//! assert_eq!(task.result::<u32>().await?, 42);
//!
//! // Against a broker, the same calls on a Client:
//! // let sched = cronoq::connect("tcp://127.0.0.1:5555").await?;
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! The modules (all private but `core` and `wire`, which are hidden and unstable: the vector tests
//! and benchmarks use them; the public names are re-exported here) in
//! layers, each using modules of its own layer or below, never above:
//!
//! 1. `error`, `address` (a broker's addresses), `wire` (the protocol's messages, one schema each),
//!    `libzmq` (the libzmq calls, linked by build.rs), `link` and `transport` (a ZeroMQ DEALER on tokio, and what its monitor says), `core` (the
//!    scheduling rules: no I/O, no clock).
//! 2. `task` ([`Task`], [`Payload`]), `answers` ([`TaskInfo`], [`Explanation`]: the fields they
//!    share are written once), `clustermap` (the cluster map and task ids), `channel` (a broker
//!    endpoint: the socket set up once for client and worker), `pool`, `handler`.
//! 3. `handle` ([`TaskHandle`]): asks whoever made it through a trait, naming neither.
//! 4. `client::connection` (one broker: its primary and standbys, requests, re-sends),
//!    `worker::session` (one broker's worker endpoint: credit, heartbeats), `embedded`
//!    ([`Scheduler`]).
//! 5. `client::cluster` and `worker::cluster`: routers over a connection or session per member.
//! 6. `client` ([`connect`], [`Client`]) and `worker` ([`Worker`]).
//!
//! No module imports one above it, and there is no cycle (tests/rust/test_layout.py holds it).

#![warn(missing_docs)]
// The pedantic lints chosen for the public API: what a caller drops by mistake, and what a
// fallible call can fail with. (`cargo clippy --all-targets -- -D warnings` holds them.)
#![warn(clippy::must_use_candidate, clippy::return_self_not_must_use, clippy::missing_errors_doc)]

mod address;
mod answers;
mod channel;
mod client;
mod clustermap;
// The scheduling core, public for this crate's vector tests and benchmarks only: hidden, and
// not a stable API; it changes without notice in any release.
#[doc(hidden)]
#[allow(clippy::must_use_candidate, clippy::return_self_not_must_use, clippy::missing_errors_doc)]
pub mod core;
mod embedded;
mod error;
mod handle;
mod handler;
mod libzmq;
mod link;
mod pool;
mod stats;
mod task;
mod transport;
// The wire protocol's messages, public for this crate's vector tests only: hidden, and not a
// stable API; it changes without notice in any release.
#[doc(hidden)]
#[allow(clippy::must_use_candidate, clippy::return_self_not_must_use, clippy::missing_errors_doc)]
pub mod wire;
mod worker;

pub use address::Addresses;
pub use answers::{AttemptEnd, CeilingState, Ended, Explanation, NodeState, TaskInfo, TaskState, Waiting};
pub use client::{connect, Client, Connect, DEFAULT_CLIENT_ADDRESS, DEFAULT_REQUEST_TIMEOUT};
pub use clustermap::{ClusterMap, ClusterMember};
pub use embedded::{Scheduler, SchedulerBuilder};
pub use error::{Error, Result};
pub use handle::TaskHandle;
pub use handler::Failure;
pub use pool::{Fairness, PoolConfig, ShareBy};
pub use rmpv::Value;
pub use stats::{
    CeilingStats, ClassStats, MemberStats, MemoryStats, PoolStats, ResultsStats, ScheduleStats, Stats, StoreStats,
    TenantStats,
};
pub use task::{encode, Payload, Priority, Task, MAX_NAME_LENGTH};
pub use worker::{Stopper, Worker};

// Every `rust` block of README.md is compiled (and the runnable ones run) with the doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
