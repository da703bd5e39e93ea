//! [`Stats`]: a broker's answer to `stats` (docs/protocol.md, "The stats map"), typed.
//!
//! Read with serde from the msgpack map, as the Python client reads it: keys this version does not
//! know are ignored, and keys a broker leaves out read as their defaults (an older broker has
//! fewer). In a cluster the client merges every member's answer (src/client/cluster.rs); the
//! merged map reads into the same type, with `cluster` and `members` filled in. No I/O here.

use std::collections::BTreeMap;

use rmpv::Value;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A broker's statistics: [`Client::stats`](crate::Client::stats) returns it (admin token).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct Stats {
    /// Each pool's figures, by name (in a cluster, every member's pools).
    pub pools: BTreeMap<String, PoolStats>,
    /// Workers registered (in a cluster, summed over the members).
    pub workers: u64,
    /// `done`s that came after the broker took their lease back, since it started.
    pub late_results: u64,
    /// The broker's cron schedules, by name.
    pub schedules: BTreeMap<String, ScheduleStats>,
    /// What the broker holds in memory.
    pub memory: Option<MemoryStats>,
    /// Its durable state and results store.
    pub store: Option<StoreStats>,
    /// On a cluster member: its name.
    pub member: Option<String>,
    /// Merged over a cluster: the map's version.
    pub cluster: Option<String>,
    /// Merged over a cluster: each member's own answer, by name.
    pub members: BTreeMap<String, MemberStats>,
}

/// One member's part of a cluster's merged [`Stats`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
#[non_exhaustive]
pub enum MemberStats {
    /// It did not answer in time, or refused: why.
    Unreachable {
        /// Why.
        unreachable: String,
    },
    /// Its own answer.
    Answered(Box<Stats>),
}

/// One pool's figures.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct PoolStats {
    /// Dispatching is paused.
    pub paused: bool,
    /// The broker drains it for another cluster member that owns it now.
    pub draining: bool,
    /// It shares dispatches between tenants.
    pub fair: bool,
    /// Its cap on running tasks, if any.
    pub max_in_flight: Option<u64>,
    /// Tasks waiting for a worker.
    pub queued: u64,
    /// Tasks waiting for a delay or a retry's back-off.
    pub delayed: u64,
    /// Tasks running.
    pub running: u64,
    /// Dispatches since the broker started.
    pub dispatched: u64,
    /// Workers serving it.
    pub workers: u64,
    /// Those with a free slot.
    pub ready_workers: u64,
    /// The same counts by priority class (`critical`, `high`, `normal`, `low`).
    pub classes: BTreeMap<String, ClassStats>,
    /// Its busiest tenants (at most 1,000; `""` for tasks without one).
    pub tenants: BTreeMap<String, TenantStats>,
    /// How many tenants it has in all.
    pub tenant_count: u64,
    /// The ceilings it has met (at most 1,000, the capped ones first), by tenant node.
    pub ceilings: BTreeMap<String, CeilingStats>,
    /// How many ceilings there are in all.
    pub ceiling_count: u64,
    /// Dispatches per second over about the last 10 s.
    pub dispatch_rate: f64,
    /// Merged over a cluster: the member the figures are from.
    pub member: Option<String>,
}

/// One priority class's counts in a pool.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct ClassStats {
    /// Waiting for a worker.
    pub queued: u64,
    /// Waiting for a delay.
    pub delayed: u64,
    /// Running.
    pub running: u64,
    /// Dispatched since the broker started.
    pub dispatched: u64,
}

/// One tenant's figures in a pool.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct TenantStats {
    /// Its weight in the fair share.
    pub weight: f64,
    /// Waiting for a worker.
    pub queued: u64,
    /// Waiting for a delay.
    pub delayed: u64,
    /// Running.
    pub running: u64,
    /// Dispatched since the broker started.
    pub dispatched: u64,
    /// Dispatches it trails (+) or leads (-) its share by.
    pub lag: f64,
}

/// A tenant node's ceiling in a pool.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct CeilingStats {
    /// At most this many of its subtree's tasks run at once.
    pub limit: u64,
    /// How many run now.
    pub running: u64,
    /// It is at its limit.
    pub capped: bool,
    /// Since when (Unix seconds).
    pub capped_since: Option<f64>,
    /// For how many seconds.
    pub capped_for: Option<f64>,
}

/// A cron schedule of the broker.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct ScheduleStats {
    /// Its cron expression.
    pub cron: String,
    /// The time zone it is read in.
    pub timezone: String,
    /// The pool its tasks go to.
    pub pool: String,
    /// Their tenant, if any.
    pub tenant: Option<String>,
    /// When it last fired (Unix seconds).
    pub last_fired: Option<f64>,
    /// When it fires next (Unix seconds).
    pub next_tick: Option<f64>,
}

/// What the broker holds in memory.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Task records.
    pub records: u64,
    /// Those of tasks not finished.
    pub live: u64,
    /// Those of finished tasks still answerable from memory.
    pub finished: u64,
    /// Their bytes.
    pub finished_bytes: u64,
}

/// The broker's durable state and results store.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct StoreStats {
    /// The journal's size.
    pub journal_bytes: u64,
    /// Snapshots written since the broker started.
    pub compactions: u64,
    /// A snapshot is being written.
    pub compacting: bool,
    /// The results store.
    pub results: Option<ResultsStats>,
}

/// The results store's figures.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct ResultsStats {
    /// Finished tasks stored.
    pub rows: u64,
    /// The database's size.
    pub bytes: u64,
    /// Journal position written to the store.
    pub archived_through: u64,
    /// Journal position shipped to the archiver.
    pub shipped_through: u64,
    /// Times the archiver process was started again.
    pub respawns: u64,
}

impl Stats {
    /// Read the value of the broker's `ok` answering `stats` (or the client's merged map).
    pub(crate) fn from_value(value: Value) -> Result<Stats> {
        rmpv::ext::from_value(value).map_err(|e| Error::decode("the broker's stats", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(entries: Vec<(&str, Value)>) -> Value {
        Value::Map(entries.into_iter().map(|(k, v)| (Value::from(k), v)).collect())
    }

    #[test]
    fn a_stats_map_reads_typed_ignoring_keys_it_does_not_know() {
        let pool = map(vec![
            ("paused", Value::from(true)),
            ("queued", Value::from(3)),
            ("max_in_flight", Value::Nil),
            ("dispatch_rate", Value::from(2)), // an int where a float is meant
            ("tenants", map(vec![("acme", map(vec![("weight", Value::from(3.0)), ("lag", Value::from(-1.5))]))])),
            ("a_key_from_a_newer_broker", Value::from("ignored")),
        ]);
        let merged = map(vec![
            ("pools", map(vec![("llm", pool)])),
            ("workers", Value::from(2)),
            ("members", map(vec![("b2", map(vec![("unreachable", Value::from("no answer within 5 s"))]))])),
        ]);
        let stats = Stats::from_value(merged).unwrap();
        let llm = &stats.pools["llm"];
        assert!(llm.paused);
        assert_eq!((llm.queued, llm.max_in_flight, llm.dispatch_rate), (3, None, 2.0));
        assert_eq!(llm.tenants["acme"].lag, -1.5);
        assert_eq!(stats.workers, 2);
        assert!(
            matches!(&stats.members["b2"], MemberStats::Unreachable { unreachable } if unreachable.contains("5 s"))
        );
        let wrong = Stats::from_value(map(vec![("workers", Value::from("many"))]));
        assert!(matches!(wrong, Err(Error::Decode { .. })), "{wrong:?}");
    }
}
