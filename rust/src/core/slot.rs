//! What the core holds of a task ([`Slot`]) and where it stands ([`State`]): the one vocabulary the
//! core and its queues share, below both.

use std::sync::Arc;

/// Where a task stands. Terminal states are reported, never held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Waiting in its class.
    Queued,
    /// Waiting for its delay (or retry backoff) to end.
    Delayed,
    /// Held by a worker.
    Running,
}

/// A task as the core holds it.
#[derive(Debug, Clone)]
pub struct Slot {
    /// The task's id.
    pub id: Arc<str>,
    pub(super) pool: usize,
    /// The tenant, if any.
    pub tenant: Option<Arc<str>>,
    /// The class number, 0 (critical) to 3 (low).
    pub priority: u8,
    /// Absolute deadline, on the caller's clock.
    pub deadline: Option<f64>,
    /// Not dispatched before this time.
    pub not_before: Option<f64>,
    /// Queued, delayed or running.
    pub state: State,
    /// Dispatches so far.
    pub attempts: u32,
    /// What it charges its tenant's share (None: 1) in a pool that shares by cost or run time.
    pub cost: Option<f64>,
    pub(super) worker: Option<usize>,
    pub(crate) seq: u64,
}
