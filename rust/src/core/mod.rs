//! The scheduling core: the same rules as the Python `cronoq.core`, as a pure state machine.
//!
//! No I/O, no clock: every operation that depends on time takes `now` (seconds on any clock the
//! caller keeps, the same one its deadlines and delays are on). The embedded
//! [`Scheduler`](crate::Scheduler) drives it; the scheduling vectors in `docs/scheduling-vectors/`
//! drive it and the Python core alike and demand the same decisions.
//!
//! How it fits together (docs/scheduling.md states the rules):
//!
//! ```text
//! Core
//!   tasks    slot -> task (queued, delayed, running); ids -> slot
//!   timers   heap of delayed tasks by min(not_before, deadline)
//!   expiry   heap of queued tasks that have a deadline, by deadline
//!   ready    workers with a free slot, least recently ready first
//!   pools    classes[0..3]: critical, high, normal, low, in strict order
//!              edf   heap (deadline, arrival) of queued deadline tasks; those with a ceiling,
//!                    rate or minimum on their tenant's path in one heap per tenant
//!              rest  FairQueue (the tenant tree: per group of siblings, V and a heap of
//!                    (S, arrival) per node) or Fifo
//!            ceilings  node -> ceiling, rate bucket, minimum, running count of its subtree (ceilings.rs)
//!            refills   heap of (when, node) of the nodes out of rate tokens
//!   runs     running tasks of pools that share by run time: when dispatched, what charged
//!   overruns heap of those runs by when they pass what they were charged
//! ```
//!
//! A dispatch walks a pool's classes from critical to low and takes the first task it finds: in a
//! class the EDF heap first (deadline tasks are not part of the fair share), then the fair or FIFO
//! part. The fair part is start-time fair queuing with exact integer tags (see `weights`) over the
//! tenant tree: a tenant name is a path (`acme/search/alice` is a node under `acme/search` under
//! `acme`), and in every group of siblings only the backlogged children hold a tag
//! `S = max(V, F[c])`; a dispatch goes down by the smallest (S, arrival) at each level, and every
//! group on the way sets `V` to the `S` it chose and that child's `F[c] = S + 1/w`. A node that has
//! tasks of its own and children shares between them as if its own tasks were one more child, of
//! weight 1; a pool of flat tenants is a tree of depth one. Arrival numbers are given when a task
//! enters its class (submit, a delay that ends, a retry, a lost worker), and break every tie.
//! Workers are served least recently ready first; a worker serving several pools takes the best
//! class, then the earliest deadline, then the pools take turns.
//!
//! What a fair dispatch adds to the tags is the pool's [`ShareBy`]: one step `1/w`, or `charge/w`
//! for a charge in thousandths of a unit (the task's cost, or its estimated run time, corrected when
//! the run ends and raised while it runs past it), at every level of the tenant's path. Weights,
//! ceilings, rates and minimums may be set on any node and count its whole subtree
//! (`default_tenant_limit` caps each top-level node not listed). A node at its ceiling or out of
//! rate tokens is held back (out of the heaps, tags kept, so its subtree blocks nobody) until a
//! task under it ends or `expire`/`dispatch` reaches its refill time; a node under its minimum is
//! served ahead of its class's fair order. The tree, its forgetting rules and its reloads are the
//! Python core's (`fairqueue.py`) node for node, so both order every pool alike.

pub mod ceilings;
pub mod explain;
pub mod queues;
mod slot;
pub mod weights;

use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use crate::error::{Error, Result};
use ceilings::{next_start, Ceiling};
use queues::{tenant_path, ClassQueue, Held, Tenant, Time, TimerHeap, MAX_TENANT_DEPTH};
pub use slot::{Slot, State};
use weights::{quantize, Weights, QUANTA_PER_UNIT};

/// Seconds a task is estimated to run, in a pool that shares by run time, when neither it (no
/// cost), its tenant nor the pool has finished a task yet.
pub const FIRST_ESTIMATE: f64 = 1.0;

/// How much each finished run moves a tenant's (and the pool's) average run time: about its last 8.
pub const AVERAGE_WEIGHT: f64 = 1.0 / 8.0;

/// Seconds charged ahead, at least, each time a task of a pool that shares by run time runs past
/// what it was charged (it is charged its time so far plus this or an eighth of that, the larger).
pub const RECHARGE_MIN: f64 = 1.0;

/// Tenant counts of tenants with no task left are dropped once the table has doubled past this.
const KEEP_IDLE_TENANTS: usize = 1024;

/// What the caller hands `submit`.
#[derive(Debug, Clone)]
pub struct NewTask {
    /// A unique id among live tasks.
    pub id: String,
    /// The pool's name.
    pub pool: String,
    /// The tenant, if any.
    pub tenant: Option<String>,
    /// Class number 0 (critical) to 3 (low).
    pub priority: u8,
    /// Absolute deadline.
    pub deadline: Option<f64>,
    /// Absolute time before which the task is not dispatched.
    pub not_before: Option<f64>,
    /// Dispatches it already had (0 for a new task).
    pub attempts: u32,
    /// What it charges its tenant's share (None: 1) in a pool that shares by cost; its first
    /// run-time estimate, in seconds, in one that shares by run time.
    pub cost: Option<f64>,
}

/// What one fair dispatch charges its tenant's tags, and so what the shares that follow the
/// weights are shares *of* (the Python pool's `share_by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum ShareBy {
    /// One step per dispatch (the default): shares of dispatches.
    #[default]
    Dispatches,
    /// The task's cost (default 1): shares of the summed cost.
    Cost,
    /// Its run time, estimated at dispatch and corrected when it ends: shares of worker time.
    Runtime,
}

impl ShareBy {
    /// The name in a config file and on the wire: `"dispatches"`, `"cost"` or `"runtime"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ShareBy::Dispatches => "dispatches",
            ShareBy::Cost => "cost",
            ShareBy::Runtime => "runtime",
        }
    }

    /// The mode named `name`; InvalidArgument names the three.
    pub fn parse(name: &str) -> Result<ShareBy> {
        match name {
            "dispatches" => Ok(ShareBy::Dispatches),
            "cost" => Ok(ShareBy::Cost),
            "runtime" => Ok(ShareBy::Runtime),
            other => Err(Error::InvalidArgument(format!(
                "share_by must be one of 'dispatches', 'cost', 'runtime', got {other:?}"
            ))),
        }
    }
}

/// How one pool schedules.
#[derive(Debug, Clone, Default)]
pub struct PoolSettings {
    /// The pool's name.
    pub name: String,
    /// Tenant weights (positive, finite), of any node of the tenant tree by its full name; any
    /// makes the pool fair.
    pub tenant_weights: Vec<(String, f64)>,
    /// Equal shares between tenants.
    pub fair_share: bool,
    /// At most this many of the pool's tasks running at once.
    pub max_in_flight: Option<u32>,
    /// What a fair dispatch charges.
    pub share_by: ShareBy,
    /// Ceilings: at most this many running tasks in a node's subtree.
    pub tenant_limits: Vec<(String, u32)>,
    /// Rates: at most this many dispatches a second in a node's subtree (a bucket of one second's
    /// worth).
    pub tenant_rates: Vec<(String, f64)>,
    /// Minimums: running tasks a node's subtree is guaranteed while it has work queued.
    pub tenant_minimums: Vec<(String, u32)>,
    /// The weight of every tenant not in `tenant_weights` (positive, finite; None: 1); makes the
    /// pool fair. Untenanted tasks weigh 1 whatever it is.
    pub default_weight: Option<f64>,
    /// The ceiling of every top-level node not in `tenant_limits`, the untenanted tasks counting as
    /// one more such node (at least 1); makes the pool fair.
    pub default_tenant_limit: Option<u32>,
}

impl PoolSettings {
    /// Whether tenants share the pool by SFQ: any weight (a default one too), ceiling (a default
    /// one too), rate or minimum, equal shares, or a `share_by` other than dispatches.
    pub fn fair(&self) -> bool {
        self.fair_share
            || !self.tenant_weights.is_empty()
            || self.default_weight.is_some()
            || self.has_node_limits()
            || self.share_by != ShareBy::Dispatches
    }

    /// Whether any tenant has a ceiling, a rate or a minimum (a default ceiling gives every tenant one).
    pub fn has_node_limits(&self) -> bool {
        !(self.tenant_limits.is_empty()
            && self.default_tenant_limit.is_none()
            && self.tenant_rates.is_empty()
            && self.tenant_minimums.is_empty())
    }

    fn listed<T: Copy>(list: &[(String, T)], tenant: &Tenant) -> Option<T> {
        let name = tenant.as_deref()?;
        list.iter().find(|(t, _)| t == name).map(|(_, v)| *v)
    }

    /// The ceiling of node `tenant`: listed, else the default one for a top-level node (the
    /// untenanted tasks count as one more), as in Python's `PoolSettings.limit`.
    fn limit(&self, tenant: &Tenant) -> Option<u32> {
        Self::listed(&self.tenant_limits, tenant)
            .or_else(|| self.default_tenant_limit.filter(|_| tenant_path(tenant).len() == 1))
    }

    /// A new ceiling record for `tenant` if it has a ceiling, rate or minimum.
    fn ceiling(&self, tenant: &Tenant) -> Option<Ceiling> {
        let limit = self.limit(tenant);
        let rate = Self::listed(&self.tenant_rates, tenant);
        let minimum = Self::listed(&self.tenant_minimums, tenant);
        (limit.is_some() || rate.is_some() || minimum.is_some()).then(|| Ceiling::new(limit, rate, minimum))
    }
}

/// What the core keeps of one tenant of a pool that shares by run time (only there: a dispatch
/// elsewhere costs no look-up for it).
#[derive(Debug, Default)]
struct TenantStats {
    /// Its tasks queued, delayed or running (a record with none may be swept).
    live: usize,
    /// Its recent average run time.
    average: Option<f64>,
}

#[derive(Debug)]
struct Pool {
    index: usize,
    name: String,
    settings: PoolSettings,
    weights: Arc<Weights>,
    classes: [ClassQueue; 4],
    max_in_flight: Option<u32>,
    paused: bool,
    draining: bool,
    queued: usize,
    delayed: usize,
    running: usize,
    tenants: HashMap<Tenant, TenantStats>,
    tenants_sweep_at: usize,
    /// The pool's recent average run time (share_by runtime).
    average: Option<f64>,
    ceilings: HashMap<Tenant, Ceiling>,
    /// With a default ceiling every tenant met gets one: the table is swept of those nobody needs
    /// once it has doubled past KEEP_IDLE_TENANTS, as the Python core sweeps its own.
    ceilings_sweep_at: usize,
    /// (when, tenant) of the tenants out of tokens; stale entries allowed (an early wake-up).
    refills: BinaryHeap<Reverse<(Time, Tenant)>>,
    /// The tenants with a minimum.
    minimums: Vec<Tenant>,
    /// Tasks dispatched so far (re-dispatches included): sampled by the caller for `explain`'s rate.
    dispatched: u64,
    /// Per class: tasks that became queued so far, and those of them with a deadline.
    arrived: [(u64, u64); 4],
}

/// What a dispatch of `slot` charges in `share_by`, in quanta (at least one).
fn charge_of(share_by: ShareBy, slot: &Slot, tenants: &HashMap<Tenant, TenantStats>, pool_average: Option<f64>) -> i64 {
    match share_by {
        ShareBy::Dispatches => QUANTA_PER_UNIT as i64,
        ShareBy::Cost => slot.cost.map_or(QUANTA_PER_UNIT, |c| quantize(c).max(1)) as i64,
        ShareBy::Runtime => {
            let estimate = slot.cost.unwrap_or_else(|| {
                tenants.get(&slot.tenant).and_then(|t| t.average).or(pool_average).unwrap_or(FIRST_ESTIMATE)
            });
            quantize(estimate).max(1) as i64
        }
    }
}

impl Pool {
    fn new(settings: &PoolSettings, index: usize) -> Pool {
        let weights = Arc::new(Pool::weights_for(settings, None));
        let fair = Pool::fair_kind(settings, &weights);
        let mut pool = Pool {
            index,
            name: settings.name.clone(),
            settings: settings.clone(),
            weights,
            classes: std::array::from_fn(|_| ClassQueue::new(fair.clone())),
            max_in_flight: settings.max_in_flight,
            paused: false,
            draining: false,
            queued: 0,
            delayed: 0,
            running: 0,
            tenants: HashMap::new(),
            tenants_sweep_at: KEEP_IDLE_TENANTS,
            average: None,
            ceilings: HashMap::new(),
            ceilings_sweep_at: KEEP_IDLE_TENANTS,
            refills: BinaryHeap::new(),
            minimums: Vec::new(),
            dispatched: 0,
            arrived: [(0, 0); 4],
        };
        if settings.has_node_limits() {
            pool.apply_ceilings(&[], None);
        }
        pool
    }

    fn weights_for(settings: &PoolSettings, previous: Option<&Weights>) -> Weights {
        Weights::new(
            settings.tenant_weights.iter().map(|(t, w)| (t.as_str(), *w)),
            settings.default_weight,
            previous,
            settings.share_by != ShareBy::Dispatches,
        )
    }

    fn fair_kind(settings: &PoolSettings, weights: &Arc<Weights>) -> Option<(Arc<Weights>, bool)> {
        settings.fair().then(|| (weights.clone(), settings.share_by != ShareBy::Dispatches))
    }

    /// Queue a task of `tenant` whose seq is set into its class.
    fn push(&mut self, priority: usize, tenant: &Tenant, deadline: Option<f64>, entry: (u64, usize)) {
        let ceilings = &self.ceilings;
        let held = |node: &Tenant| -> Held { ceilings.get(node).map(Ceiling::blocked) };
        self.classes[priority].push(tenant, deadline, entry, &held);
    }

    /// The record of `tenant`, made on first use; records of tenants with no task are swept once
    /// the table has doubled past KEEP_IDLE_TENANTS (as the Python core sweeps its own, which it
    /// keeps in every mode: a pool of more tenants than that which turns to run time by a reload
    /// may sweep an average at another moment than Python's).
    fn tenant_stats(&mut self, tenant: &Tenant) -> &mut TenantStats {
        if !self.tenants.contains_key(tenant) && self.tenants.len() >= self.tenants_sweep_at {
            self.tenants.retain(|_, t| t.live > 0);
            self.tenants_sweep_at = KEEP_IDLE_TENANTS.max(2 * self.tenants.len());
        }
        self.tenants.entry(tenant.clone()).or_default()
    }

    /// Node `node` is held back (`blocked`) or let go, in every class.
    fn block(&mut self, node: &Tenant, blocked: bool) {
        let ceilings = &self.ceilings;
        let held = |n: &Tenant| -> Held { ceilings.get(n).map(Ceiling::blocked) };
        for cls in self.classes.iter_mut() {
            cls.set_blocked(node, blocked, &held);
        }
    }

    /// `tenant` has a task in this pool: give its top-level node its default ceiling if it has none
    /// yet (as the Python core makes a ceiling for a node first seen; listed nodes have theirs
    /// already). Every live task's top-level node keeps its ceiling: enqueue, dispatch and release
    /// look it up.
    fn meet(&mut self, tenant: &Tenant, tasks: &[Option<Slot>]) {
        if self.settings.default_tenant_limit.is_none() {
            return;
        }
        let top = tenant_path(tenant).swap_remove(0);
        if self.ceilings.contains_key(&top) {
            return;
        }
        if self.ceilings.len() >= self.ceilings_sweep_at {
            self.sweep_ceilings(tasks);
        }
        if let Some(c) = self.settings.ceiling(&top) {
            self.ceilings.insert(top, c);
        }
    }

    /// Forget the default ceilings of tenants with no task left in this pool: nothing runs
    /// against them, so they are not capped, and one made afresh when the tenant comes back is
    /// the same. Listed ones stay (a rate bucket remembers its spent tokens).
    fn sweep_ceilings(&mut self, tasks: &[Option<Slot>]) {
        let index = self.index;
        let live: HashSet<Tenant> =
            tasks.iter().flatten().filter(|t| t.pool == index).flat_map(|t| tenant_path(&t.tenant)).collect();
        let settings = &self.settings;
        let listed = |tenant: &Tenant| {
            PoolSettings::listed(&settings.tenant_limits, tenant).is_some()
                || PoolSettings::listed(&settings.tenant_rates, tenant).is_some()
                || PoolSettings::listed(&settings.tenant_minimums, tenant).is_some()
        };
        self.ceilings.retain(|tenant, c| c.running > 0 || live.contains(tenant) || listed(tenant));
        self.ceilings_sweep_at = KEEP_IDLE_TENANTS.max(2 * self.ceilings.len());
    }

    /// A task of `tenant` started: cap the nodes of its path that reach their ceiling, take a token
    /// from every rated one, and hold back those left without (top first, as Python's `_charge`).
    fn charge_ceiling(&mut self, tenant: &Tenant, now: f64) {
        if self.ceilings.is_empty() {
            return;
        }
        for node in tenant_path(tenant) {
            self.charge_node(&node, now);
        }
    }

    fn charge_node(&mut self, tenant: &Tenant, now: f64) {
        let Some(c) = self.ceilings.get_mut(tenant) else { return };
        c.running += 1;
        let was_blocked = c.blocked();
        if c.limit.is_some_and(|limit| c.running >= limit) && !c.capped {
            c.capped = true;
            c.since = Some(now);
        }
        if let Some(rate) = c.rate {
            c.tat = (if c.tat > now { c.tat } else { now }) + 1.0 / rate;
            let start = next_start(c.tat, rate);
            if start > now {
                c.limited_until = Some(start);
                self.refills.push(Reverse((Time(start), tenant.clone())));
            }
        }
        if !was_blocked && c.blocked() {
            self.block(tenant, true);
        }
    }

    /// A task of `tenant` stopped running: uncap the nodes of its path that it frees.
    fn uncharge_ceiling(&mut self, tenant: &Tenant) {
        if self.ceilings.is_empty() {
            return;
        }
        for node in tenant_path(tenant) {
            self.uncharge_node(&node);
        }
    }

    fn uncharge_node(&mut self, tenant: &Tenant) {
        let Some(c) = self.ceilings.get_mut(tenant) else { return };
        c.running -= 1;
        if c.capped && c.limit.is_some_and(|limit| c.running < limit) {
            c.capped = false;
            c.since = None;
            if c.limited_until.is_none() {
                self.block(tenant, false);
            }
        }
    }

    /// Let go the tenants whose bucket has a token again by `now`.
    fn refill(&mut self, now: f64) {
        while let Some(Reverse((due, _))) = self.refills.peek() {
            if due.0 > now {
                break;
            }
            let Some(Reverse((due, tenant))) = self.refills.pop() else { break };
            let Some(c) = self.ceilings.get_mut(&tenant) else { continue };
            if c.limited_until != Some(due.0) {
                continue; // stale: re-timed by a reload
            }
            c.limited_until = None;
            if !c.capped {
                self.block(&tenant, false);
            }
        }
    }

    /// (Re)build the ceilings, rates and minimums from the settings: recount, cap and uncap, carry
    /// each rated tenant's bucket over at its new rate, re-sort the deadline tasks.
    fn apply_ceilings(&mut self, tasks: &[Option<Slot>], now: Option<f64>) {
        let old = std::mem::take(&mut self.ceilings);
        let was_blocked: HashSet<Tenant> = old.iter().filter(|(_, c)| c.blocked()).map(|(t, _)| t.clone()).collect();
        let settings = &self.settings;
        let listed = settings
            .tenant_limits
            .iter()
            .map(|(t, _)| t)
            .chain(settings.tenant_rates.iter().map(|(t, _)| t))
            .chain(settings.tenant_minimums.iter().map(|(t, _)| t));
        for tenant in listed.map(|t| Some(Arc::from(t.as_str()))) {
            if let Some(c) = settings.ceiling(&tenant) {
                self.ceilings.insert(tenant, c);
            }
        }
        if settings.default_tenant_limit.is_some() {
            // Every top-level node with a task here has a ceiling now, not only the listed ones.
            for t in tasks.iter().flatten().filter(|t| t.pool == self.index) {
                if let Entry::Vacant(slot) = self.ceilings.entry(tenant_path(&t.tenant).swap_remove(0)) {
                    if let Some(c) = settings.ceiling(slot.key()) {
                        slot.insert(c);
                    }
                }
            }
        }
        self.ceilings_sweep_at = KEEP_IDLE_TENANTS.max(2 * self.ceilings.len());
        // Recount what runs under each node (a reload is rare; a dispatch keeps no count for it).
        for t in tasks.iter().flatten() {
            if t.pool == self.index && t.state == State::Running {
                for node in tenant_path(&t.tenant) {
                    if let Some(c) = self.ceilings.get_mut(&node) {
                        c.running += 1;
                    }
                }
            }
        }
        self.refills.clear();
        let mut blocked_now = HashSet::new();
        for (tenant, c) in self.ceilings.iter_mut() {
            let before = old.get(tenant);
            if c.limit.is_some_and(|limit| c.running >= limit) {
                c.capped = true;
                c.since = match before {
                    Some(b) if b.capped => b.since,
                    _ => now,
                };
            }
            if let (Some(rate), Some(b)) = (c.rate, before) {
                if let Some(old_rate) = b.rate {
                    // The bucket keeps the tokens it had spent, repaid at the new rate.
                    c.tat = b.tat;
                    if let Some(now) = now {
                        if b.tat > now {
                            c.tat = now + (b.tat - now) * old_rate / rate;
                        }
                    }
                    let start = next_start(c.tat, rate);
                    let limited = match now {
                        Some(now) => start > now,
                        None => b.limited_until.is_some(),
                    };
                    if limited {
                        c.limited_until = Some(start);
                        self.refills.push(Reverse((Time(start), tenant.clone())));
                    }
                }
            }
            if c.blocked() {
                blocked_now.insert(tenant.clone());
            }
        }
        self.minimums = self.ceilings.iter().filter(|(_, c)| c.minimum.is_some()).map(|(t, _)| t.clone()).collect();
        let ceilings = &self.ceilings;
        let held = |t: &Tenant| ceilings.get(t).map(Ceiling::blocked);
        for cls in self.classes.iter_mut() {
            for tenant in was_blocked.difference(&blocked_now) {
                cls.set_blocked(tenant, false, &held);
            }
            for tenant in blocked_now.difference(&was_blocked) {
                cls.set_blocked(tenant, true, &held);
            }
            cls.regroup(tasks, &held);
        }
    }

    /// Take new settings: new weights re-tag the backlog at once, a new kind of queue (or unit of
    /// tags) starts from V = 0 with the backlog in arrival order, new ceilings cap and uncap at once.
    fn apply(&mut self, tasks: &[Option<Slot>], settings: &PoolSettings, now: Option<f64>) {
        let (was_fair, had_limits, was_share_by) =
            (self.settings.fair(), self.settings.has_node_limits(), self.settings.share_by);
        if settings.share_by == ShareBy::Runtime && was_share_by != ShareBy::Runtime {
            // Tenants' tasks are counted only while the pool shares by run time: count them anew.
            self.tenants.values_mut().for_each(|t| t.live = 0);
            let index = self.index;
            for t in tasks.iter().flatten().filter(|t| t.pool == index) {
                self.tenant_stats(&t.tenant).live += 1;
            }
        }
        self.weights = Arc::new(Pool::weights_for(settings, Some(&self.weights)));
        self.settings = settings.clone();
        self.max_in_flight = settings.max_in_flight;
        let fair = Pool::fair_kind(settings, &self.weights);
        let rebuild = settings.fair() != was_fair || settings.share_by != was_share_by;
        let ceilings = &self.ceilings;
        let held = |t: &Tenant| ceilings.get(t).map(Ceiling::blocked);
        for cls in self.classes.iter_mut() {
            cls.reconfigure(tasks, fair.clone(), rebuild, &held);
        }
        if had_limits || settings.has_node_limits() {
            self.apply_ceilings(tasks, now);
        }
    }

    /// What the dispatch that just handed out `slot` charged its tenant, in quanta; None if it was
    /// not charged (a deadline task, or a pool that counts dispatches).
    fn charged(&self, slot: &Slot) -> Option<i64> {
        if slot.deadline.is_some() {
            return None;
        }
        self.classes[slot.priority as usize].charged()
    }

    /// `slot` was charged `charged` quanta for its run; charge it `charge` instead.
    fn correct(&mut self, slot: &Slot, charged: i64, charge: i64) {
        let ceilings = &self.ceilings;
        let capped = |node: &Tenant| ceilings.get(node).is_some_and(Ceiling::blocked);
        self.classes[slot.priority as usize].correct(&slot.tenant, charge - charged, &capped);
    }

    /// A run of `seconds` ended: move the tenant's and the pool's averages.
    fn observe(&mut self, tenant: &Tenant, seconds: f64) {
        let ts = self.tenant_stats(tenant);
        ts.average = Some(ts.average.map_or(seconds, |a| a + (seconds - a) * AVERAGE_WEIGHT));
        self.average = Some(self.average.map_or(seconds, |a| a + (seconds - a) * AVERAGE_WEIGHT));
    }

    fn dispatchable(&self) -> bool {
        self.queued > 0 && !self.paused && self.max_in_flight.is_none_or(|cap| (self.running as u64) < cap as u64)
    }
}

#[derive(Debug)]
struct Worker {
    id: Arc<str>,
    pools: Vec<usize>,
    free: u32,
    running: Vec<usize>,
    rr: usize,
    ready: bool,
}

/// A dispatch decision: which worker runs which task (now Running, attempts counted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// The worker's id.
    pub worker: Arc<str>,
    /// The task's id.
    pub task: Arc<str>,
    /// The lease's attempt number.
    pub attempt: u32,
}

/// The scheduler as a pure state machine. Call `expire(now)` then `dispatch(now)` with the same
/// `now` whenever something changes or `next_wakeup()` comes.
#[derive(Debug)]
pub struct Core {
    pools: Vec<Pool>,
    pool_index: HashMap<String, usize>,
    tasks: Vec<Option<Slot>>,
    free_slots: Vec<usize>,
    ids: HashMap<Arc<str>, usize>,
    workers: Vec<Option<Worker>>,
    worker_index: HashMap<String, usize>,
    ready: VecDeque<usize>,
    timers: TimerHeap,
    expiry: TimerHeap,
    seq: u64,
    /// The last `now` given to `expire` or `dispatch`, for a `configure` given none.
    last_now: Option<f64>,
    /// Running tasks of pools that share by run time: slot -> (the `now` of their dispatch, what
    /// their tenant is charged for the run so far, in quanta).
    runs: HashMap<usize, (f64, i64)>,
    /// (charged until, seq, slot) of those runs; re-charged at expire/dispatch (stale entries skipped).
    overruns: BinaryHeap<Reverse<(Time, u64, usize)>>,
}

/// What is wrong with `tenant` as a tenant name (a path of 1 to [`MAX_TENANT_DEPTH`] non-empty
/// `/`-separated levels), in the words of the Python core's `tenant_problem`; None if nothing.
fn tenant_problem(tenant: &str) -> Option<String> {
    if tenant.is_empty() {
        return Some("a tenant must be a non-empty string".into());
    }
    if !tenant.contains('/') {
        return None;
    }
    let levels = tenant.split('/');
    if levels.clone().any(str::is_empty) {
        return Some(format!(
            "tenant {tenant:?} has an empty segment: a tenant path is names separated by single '/', with no '/' \
             at either end (e.g. 'acme/search')"
        ));
    }
    let depth = levels.count();
    (depth > MAX_TENANT_DEPTH)
        .then(|| format!("tenant {tenant:?} has {depth} levels; at most {MAX_TENANT_DEPTH} are allowed"))
}

/// Check pool settings: names unique and non-empty, weights positive and finite, caps at least 1.
pub fn check_settings(pools: &[PoolSettings]) -> Result<()> {
    let mut names = std::collections::HashSet::new();
    for p in pools {
        if p.name.is_empty() {
            return Err(Error::InvalidArgument("a pool name must be a non-empty string".into()));
        }
        if !names.insert(p.name.as_str()) {
            return Err(Error::InvalidArgument(format!(
                "pool {:?} is declared twice; give each pool one entry",
                p.name
            )));
        }
        let node = |setting: &str, tenant: &str| -> Result<()> {
            match tenant_problem(tenant) {
                Some(problem) => Err(Error::InvalidArgument(format!("pool {:?}: {setting}: {problem}", p.name))),
                None => Ok(()),
            }
        };
        for (tenant, w) in &p.tenant_weights {
            node("tenant_weights", tenant)?;
            if !(w.is_finite() && *w > 0.0) {
                return Err(Error::InvalidArgument(format!(
                    "pool {:?}: the weight of tenant {tenant:?} must be a positive number, got {w}",
                    p.name
                )));
            }
        }
        if p.max_in_flight == Some(0) {
            return Err(Error::InvalidArgument(format!("pool {:?}: max_in_flight must be at least 1", p.name)));
        }
        if let Some(w) = p.default_weight {
            if !(w.is_finite() && w > 0.0) {
                return Err(Error::InvalidArgument(format!(
                    "pool {:?}: default_weight must be a positive number, got {w}",
                    p.name
                )));
            }
        }
        if p.default_tenant_limit == Some(0) {
            return Err(Error::InvalidArgument(format!(
                "pool {:?}: default_tenant_limit must be an int >= 1, got 0",
                p.name
            )));
        }
        for (tenant, limit) in &p.tenant_limits {
            node("tenant_limits", tenant)?;
            if *limit < 1 {
                return Err(Error::InvalidArgument(format!(
                    "pool {:?}: the ceiling of tenant {tenant:?} must be an int >= 1, got {limit}",
                    p.name
                )));
            }
        }
        for (tenant, rate) in &p.tenant_rates {
            node("tenant_rates", tenant)?;
            if !(rate.is_finite() && *rate > 0.0) {
                return Err(Error::InvalidArgument(format!(
                    "pool {:?}: the rate of tenant {tenant:?} must be a positive number of dispatches per second, \
                     got {rate}",
                    p.name
                )));
            }
        }
        for (tenant, minimum) in &p.tenant_minimums {
            node("tenant_minimums", tenant)?;
            if *minimum < 1 {
                return Err(Error::InvalidArgument(format!(
                    "pool {:?}: the minimum of tenant {tenant:?} must be an int >= 1, got {minimum}",
                    p.name
                )));
            }
            // The ceilings of its path, listed or default ones, as the Python core checks them.
            let node = Some(Arc::from(tenant.as_str()));
            for above in tenant_path(&node) {
                let Some(ceiling) = p.limit(&above) else { continue };
                if ceiling < *minimum {
                    let whose = if above == node {
                        "its own ceiling".to_string()
                    } else {
                        format!("the ceiling of {:?} above it", above.as_deref().unwrap_or_default())
                    };
                    return Err(Error::InvalidArgument(format!(
                        "pool {:?}: tenant {tenant:?} is guaranteed {minimum} running tasks but {whose} is {ceiling}; \
                         lower the minimum or raise the ceiling",
                        p.name
                    )));
                }
            }
        }
        // A minimum nested under another's is part of it: the outermost ones must fit.
        let outermost: Vec<&(String, u32)> = p
            .tenant_minimums
            .iter()
            .filter(|(t, _)| {
                let path = tenant_path(&Some(Arc::from(t.as_str())));
                !path[..path.len() - 1].iter().any(|above| PoolSettings::listed(&p.tenant_minimums, above).is_some())
            })
            .collect();
        let total: u64 = outermost.iter().map(|(_, m)| *m as u64).sum();
        if let Some(cap) = p.max_in_flight {
            if total > cap as u64 {
                let listed: Vec<String> = outermost.iter().map(|(t, m)| format!("{t}={m}")).collect();
                return Err(Error::InvalidArgument(format!(
                    "pool {:?}: tenant_minimums guarantee {total} running tasks ({}) but max_in_flight is {cap}; \
                     lower the minimums or raise max_in_flight",
                    p.name,
                    listed.join(", ")
                )));
            }
        }
    }
    Ok(())
}

impl Core {
    /// A core for these pools. InvalidArgument on a duplicate name or a bad setting.
    pub fn new(pools: &[PoolSettings]) -> Result<Core> {
        let mut core = Core {
            pools: Vec::new(),
            pool_index: HashMap::new(),
            tasks: Vec::new(),
            free_slots: Vec::new(),
            ids: HashMap::new(),
            workers: Vec::new(),
            worker_index: HashMap::new(),
            ready: VecDeque::new(),
            timers: TimerHeap::default(),
            expiry: TimerHeap::default(),
            seq: 0,
            last_now: None,
            runs: HashMap::new(),
            overruns: BinaryHeap::new(),
        };
        core.configure(pools, None)?;
        Ok(core)
    }

    /// Apply a (re)loaded list of pools. New pools appear; existing ones take their new settings at
    /// once: new weights re-tag the queued backlog, a changed `share_by` (or fairness) starts the
    /// fair state afresh with the backlog in arrival order, new ceilings cap and uncap, and each
    /// rated tenant keeps the tokens it had spent, repaid at its new rate (`now` stamps the change;
    /// None: the last `now` given to `expire` or `dispatch`). Pools left out drain: they take no new
    /// task or worker, and their backlog still runs. InvalidArgument, changing nothing, on a bad
    /// setting or a duplicate name.
    pub fn configure(&mut self, pools: &[PoolSettings], now: Option<f64>) -> Result<()> {
        check_settings(pools)?;
        let now = now.or(self.last_now);
        for s in pools {
            match self.pool_index.get(&s.name) {
                Some(&p) => {
                    let pool = &mut self.pools[p];
                    pool.draining = false;
                    pool.apply(&self.tasks, s, now);
                }
                None => {
                    self.pool_index.insert(s.name.clone(), self.pools.len());
                    self.pools.push(Pool::new(s, self.pools.len()));
                }
            }
        }
        for pool in self.pools.iter_mut() {
            pool.draining = !pools.iter().any(|s| s.name == pool.name);
        }
        Ok(())
    }

    fn pool_of(&self, name: &str) -> Result<usize> {
        match self.pool_index.get(name) {
            Some(&p) if !self.pools[p].draining => Ok(p),
            found => {
                let names: Vec<&str> = self.pools.iter().filter(|p| !p.draining).map(|p| p.name.as_str()).collect();
                Err(Error::NotFound(match found {
                    Some(_) => {
                        format!("pool {name:?} was removed from the config and is draining; use one of {names:?}")
                    }
                    None => format!("no pool named {name:?}; declared pools: {names:?}"),
                }))
            }
        }
    }

    /// A pool by name, draining or not.
    fn any_pool(&self, name: &str) -> Result<usize> {
        self.pool_index.get(name).copied().map_or_else(|| self.pool_of(name), Ok)
    }

    /// Names of the pools that take tasks, in declaration order.
    pub fn pool_names(&self) -> Vec<String> {
        self.pools.iter().filter(|p| !p.draining).map(|p| p.name.clone()).collect()
    }

    /// Stop dispatching from `pool` (it still takes tasks; deadlines still expire).
    pub fn pause(&mut self, pool: &str) -> Result<()> {
        let p = self.any_pool(pool)?;
        self.pools[p].paused = true;
        Ok(())
    }

    /// Dispatch from `pool` again.
    pub fn resume(&mut self, pool: &str) -> Result<()> {
        let p = self.any_pool(pool)?;
        self.pools[p].paused = false;
        Ok(())
    }

    // -- tasks ---------------------------------------------------------------

    /// Accept a task: delayed until `not_before` if that is later than `now`, else queued.
    /// NotFound for an unknown pool; InvalidArgument for a live duplicate id or a bad field.
    pub fn submit(&mut self, task: NewTask, now: f64) -> Result<()> {
        let pool = self.pool_of(&task.pool)?;
        if task.id.is_empty() {
            return Err(Error::InvalidArgument("a task id must be a non-empty string".into()));
        }
        if task.priority > 3 {
            return Err(Error::InvalidArgument(format!("priority must be a class number 0..3, got {}", task.priority)));
        }
        if task.tenant.as_deref() == Some("") {
            return Err(Error::InvalidArgument("tenant must be a non-empty string or None".into()));
        }
        if let Some(problem) = task.tenant.as_deref().and_then(tenant_problem) {
            return Err(Error::InvalidArgument(problem));
        }
        if let Some(cost) = task.cost {
            if !(cost.is_finite() && cost > 0.0) {
                return Err(Error::InvalidArgument(format!("cost must be a positive number or None (1), got {cost}")));
            }
        }
        for (what, t) in [("deadline", task.deadline), ("not_before", task.not_before)] {
            if t.is_some_and(f64::is_nan) {
                return Err(Error::InvalidArgument(format!("{what} must be a number, not NaN")));
            }
        }
        let id: Arc<str> = Arc::from(task.id.as_str());
        if self.ids.contains_key(&id) {
            return Err(Error::InvalidArgument(format!(
                "a task with id {:?} is already queued or running; use another id",
                task.id
            )));
        }
        let slot = Slot {
            id: id.clone(),
            pool,
            tenant: task.tenant.map(|t| Arc::from(t.as_str())),
            priority: task.priority,
            deadline: task.deadline,
            not_before: task.not_before,
            state: State::Queued,
            attempts: task.attempts,
            cost: task.cost,
            worker: None,
            seq: 0,
        };
        let tenant: Tenant = slot.tenant.clone();
        if self.pools[pool].settings.share_by == ShareBy::Runtime {
            self.pools[pool].tenant_stats(&tenant).live += 1;
        }
        let at = match self.free_slots.pop() {
            Some(at) => {
                self.tasks[at] = Some(slot);
                at
            }
            None => {
                self.tasks.push(Some(slot));
                self.tasks.len() - 1
            }
        };
        self.ids.insert(id, at);
        self.pools[pool].meet(&tenant, &self.tasks);
        match task.not_before {
            Some(nb) if nb > now => self.delay(at),
            _ => self.enqueue(at),
        }
        Ok(())
    }

    fn slot(&self, at: usize) -> &Slot {
        self.tasks[at].as_ref().expect("a live slot")
    }

    fn slot_mut(&mut self, at: usize) -> &mut Slot {
        self.tasks[at].as_mut().expect("a live slot")
    }

    /// Put a held task into its class as queued, with a fresh arrival number.
    fn enqueue(&mut self, at: usize) {
        self.seq += 1;
        let seq = self.seq;
        let t = self.slot_mut(at);
        t.seq = seq;
        t.state = State::Queued;
        let (pool, priority, deadline, tenant) = (t.pool, t.priority as usize, t.deadline, t.tenant.clone());
        self.pools[pool].push(priority, &tenant, deadline, (seq, at));
        self.pools[pool].queued += 1;
        let arrived = &mut self.pools[pool].arrived[priority];
        arrived.0 += 1;
        arrived.1 += u64::from(deadline.is_some());
        if let Some(d) = deadline {
            self.expiry.push(d, seq, at);
        }
    }

    /// Hold a task as delayed until its not_before (or its deadline, if that comes first).
    fn delay(&mut self, at: usize) {
        self.seq += 1;
        let seq = self.seq;
        let t = self.slot_mut(at);
        t.seq = seq;
        t.state = State::Delayed;
        let due = match (t.not_before, t.deadline) {
            (Some(nb), Some(d)) if d < nb => d,
            (Some(nb), _) => nb,
            (None, d) => d.unwrap_or(f64::NEG_INFINITY),
        };
        let pool = t.pool;
        self.timers.push(due, seq, at);
        self.pools[pool].delayed += 1;
    }

    /// Drop a task from the table (it reached a terminal state); returns it.
    fn forget(&mut self, at: usize) -> Slot {
        let slot = self.tasks[at].take().expect("a live slot");
        self.ids.remove(&slot.id);
        self.free_slots.push(at);
        if self.pools[slot.pool].settings.share_by == ShareBy::Runtime {
            if let Some(ts) = self.pools[slot.pool].tenants.get_mut(&slot.tenant) {
                ts.live = ts.live.saturating_sub(1);
            }
        }
        slot
    }

    /// Tasks of `pool` dispatched so far (re-dispatches included); None for an unknown pool.
    pub fn dispatched(&self, pool: &str) -> Option<u64> {
        self.pool_index.get(pool).map(|&p| self.pools[p].dispatched)
    }

    /// For each class of `pool`, highest first: tasks that became queued in it so far (submitted
    /// ready, ready after a delay or back-off, requeued), and those of them with a deadline.
    pub fn arrivals(&self, pool: &str) -> Option<[(u64, u64); 4]> {
        self.pool_index.get(pool).map(|&p| self.pools[p].arrived)
    }

    /// The live task with this id.
    pub fn get(&self, id: &str) -> Option<&Slot> {
        self.ids.get(id).map(|&at| self.slot(at))
    }

    /// Live tasks (queued, delayed, running).
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether no task is live.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Cancel a queued or delayed task and return it; None if it is running or unknown.
    pub fn cancel(&mut self, id: &str) -> Option<Slot> {
        let at = *self.ids.get(id)?;
        let t = self.slot(at);
        let (pool, priority, tenant, deadline, seq, state) =
            (t.pool, t.priority as usize, t.tenant.clone(), t.deadline, t.seq, t.state);
        match state {
            State::Running => None,
            State::Queued => {
                let slot = self.forget(at);
                self.pools[pool].queued -= 1;
                self.pools[pool].classes[priority].discard(&self.tasks, &tenant, deadline, seq);
                if deadline.is_some() {
                    self.expiry.stale(&self.tasks, State::Queued);
                }
                Some(slot)
            }
            State::Delayed => {
                let slot = self.forget(at);
                self.pools[pool].delayed -= 1;
                self.timers.stale(&self.tasks, State::Delayed);
                Some(slot)
            }
        }
    }

    /// Release delayed tasks that are due and expire every task whose deadline <= now; returns the
    /// expired tasks (no longer held).
    pub fn expire(&mut self, now: f64) -> Vec<Slot> {
        self.last_now = Some(now);
        self.catch_up(now);
        let mut expired = Vec::new();
        for at in self.timers.pop_due(&self.tasks, State::Delayed, now) {
            let t = self.slot(at);
            let (pool, overdue) = (t.pool, t.deadline.is_some_and(|d| d <= now));
            self.pools[pool].delayed -= 1;
            if overdue {
                expired.push(self.forget(at));
            } else {
                self.enqueue(at);
            }
        }
        for at in self.expiry.pop_due(&self.tasks, State::Queued, now) {
            let t = self.slot(at);
            let (pool, priority, tenant, deadline, seq) =
                (t.pool, t.priority as usize, t.tenant.clone(), t.deadline, t.seq);
            let slot = self.forget(at);
            self.pools[pool].queued -= 1;
            self.pools[pool].classes[priority].discard(&self.tasks, &tenant, deadline, seq);
            expired.push(slot);
        }
        expired
    }

    /// The earliest time a delayed task becomes due, a queued or delayed task's deadline passes,
    /// or a tenant out of rate tokens (with tasks queued in its pool) may start again.
    pub fn next_wakeup(&mut self) -> Option<f64> {
        let mut timer = self.timers.peek_key(&self.tasks, State::Delayed);
        for pool in &self.pools {
            if pool.queued == 0 {
                continue; // a tenant with nothing queued need not wake
            }
            if let Some(Reverse((refill, _))) = pool.refills.peek() {
                if timer.is_none_or(|t| refill.0 < t) {
                    timer = Some(refill.0);
                }
            }
        }
        let deadline = self.expiry.peek_key(&self.tasks, State::Queued);
        match (timer, deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    // -- workers -------------------------------------------------------------

    /// Register a worker (or replace a known one's pools and free slots, keeping its leases).
    pub fn add_worker(&mut self, id: &str, pools: &[impl AsRef<str>], free: u32) -> Result<()> {
        let mut wanted = Vec::new();
        for name in pools {
            let p = self.pool_of(name.as_ref())?;
            if !wanted.contains(&p) {
                wanted.push(p);
            }
        }
        let at = match self.worker_index.get(id) {
            Some(&at) => at,
            None => {
                self.workers.push(Some(Worker {
                    id: Arc::from(id),
                    pools: Vec::new(),
                    free: 0,
                    running: Vec::new(),
                    rr: 0,
                    ready: false,
                }));
                self.worker_index.insert(id.to_string(), self.workers.len() - 1);
                self.workers.len() - 1
            }
        };
        self.unready(at);
        let w = self.workers[at].as_mut().expect("known");
        w.pools = wanted;
        w.rr = 0;
        w.free = free;
        if free > 0 {
            self.make_ready(at);
        }
        Ok(())
    }

    /// The worker reports `slots` more free slots (unknown workers are ignored).
    pub fn grant(&mut self, id: &str, slots: u32) {
        let Some(&at) = self.worker_index.get(id) else { return };
        if slots == 0 {
            return;
        }
        let w = self.workers[at].as_mut().expect("known");
        let was_free = w.free;
        w.free += slots;
        if was_free == 0 {
            self.make_ready(at);
        }
    }

    /// Forget a worker; its running tasks go back to their class (queued) and their ids are
    /// returned. In a pool that shares by run time each lost run is charged from its dispatch to
    /// `now` (the slot was held that long).
    pub fn remove_worker(&mut self, id: &str, now: f64) -> Vec<Arc<str>> {
        let Some(at) = self.worker_index.remove(id) else { return Vec::new() };
        self.unready(at);
        let w = self.workers[at].take().expect("known");
        let mut back = Vec::new();
        for t in w.running {
            self.release(t, now, None);
            back.push(self.slot(t).id.clone());
            self.enqueue(t);
        }
        back
    }

    /// The free slots the core counts for a worker (0 if unknown).
    pub fn free_slots(&self, id: &str) -> u32 {
        self.worker_index.get(id).map_or(0, |&at| self.workers[at].as_ref().expect("known").free)
    }

    fn make_ready(&mut self, at: usize) {
        let w = self.workers[at].as_mut().expect("known");
        if !w.ready {
            w.ready = true;
            self.ready.push_back(at);
        }
    }

    fn unready(&mut self, at: usize) {
        let w = self.workers[at].as_mut().expect("known");
        if w.ready {
            w.ready = false;
            if let Some(pos) = self.ready.iter().position(|&x| x == at) {
                self.ready.remove(pos);
            }
        }
    }

    // -- dispatch and leases ---------------------------------------------------

    /// Hand out tasks to workers with free slots, at most `limit` (None: as many as possible).
    /// Each goes to the least recently ready worker that has a task to take; that worker then
    /// becomes the most recently ready.
    pub fn dispatch(&mut self, now: f64, limit: Option<usize>) -> Vec<Assignment> {
        self.last_now = Some(now);
        self.catch_up(now);
        let mut out = Vec::new();
        'outer: while limit.is_none_or(|l| out.len() < l) {
            if self.pools.iter().all(|p| p.queued == 0) {
                break;
            }
            for pos in 0..self.ready.len() {
                let w = self.ready[pos];
                let Some(pool) = self.choose_pool(w, now) else { continue };
                let Some(t) = self.take(pool, now) else { continue };
                self.pools[pool].dispatched += 1;
                let worker = self.workers[w].as_mut().expect("known");
                worker.free -= 1;
                worker.running.push(t);
                let worker_id = worker.id.clone();
                let still_free = worker.free > 0;
                let slot = self.slot_mut(t);
                slot.state = State::Running;
                slot.worker = Some(w);
                slot.attempts += 1;
                let (task, attempt, deadline) = (slot.id.clone(), slot.attempts, slot.deadline);
                if deadline.is_some() {
                    self.expiry.stale(&self.tasks, State::Queued);
                }
                if self.pools[pool].settings.share_by == ShareBy::Runtime {
                    self.watch_run(pool, t, now);
                }
                self.ready.remove(pos);
                if still_free {
                    self.ready.push_back(w);
                } else {
                    self.workers[w].as_mut().expect("known").ready = false;
                }
                out.push(Assignment { worker: worker_id, task, attempt });
                continue 'outer;
            }
            break;
        }
        out
    }

    /// Of the worker's pools, the one whose next task has the best class, then the earliest
    /// deadline; ties go round-robin, starting after the pool taken last.
    fn choose_pool(&mut self, w: usize, now: f64) -> Option<usize> {
        let worker = self.workers[w].as_ref().expect("known");
        if worker.pools.len() == 1 {
            let p = worker.pools[0];
            return self.pools[p].dispatchable().then_some(p);
        }
        let (pools, rr) = (worker.pools.clone(), worker.rr);
        let n = pools.len();
        let mut best: Option<((usize, f64), usize, usize)> = None;
        for i in 0..n {
            let at = (rr + i) % n;
            let p = pools[at];
            if !self.pools[p].dispatchable() {
                continue;
            }
            if let Some(key) = self.peek_key(p, now) {
                if best.is_none_or(|(b, _, _)| key.0 < b.0 || (key.0 == b.0 && key.1 < b.1)) {
                    best = Some((key, p, at));
                }
            }
        }
        let (_, p, at) = best?;
        self.workers[w].as_mut().expect("known").rr = at + 1;
        Some(p)
    }

    /// (class, deadline or infinity) of the task `take(now)` would return.
    fn peek_key(&mut self, p: usize, now: f64) -> Option<(usize, f64)> {
        let tasks = &self.tasks;
        for (number, cls) in self.pools[p].classes.iter_mut().enumerate() {
            if cls.queued > 0 {
                if let Some(d) = cls.peek_deadline(tasks, now) {
                    return Some((number, d));
                }
            }
        }
        None
    }

    /// Pop the pool's next task by class, then EDF, then a tenant under its minimum, then fair
    /// share or FIFO; count it running, and against its tenant's ceiling and rate.
    fn take(&mut self, p: usize, now: f64) -> Option<usize> {
        let tasks = &self.tasks;
        let pool = &mut self.pools[p];
        let ceilings = &pool.ceilings;
        let needy: Vec<Vec<Tenant>> = pool
            .minimums
            .iter()
            .filter(|t| ceilings.get(*t).is_some_and(|c| c.under_minimum() && !c.blocked()))
            .map(tenant_path)
            .collect();
        let (share_by, tenants, average) = (pool.settings.share_by, &pool.tenants, pool.average);
        let charge = |slot: usize| charge_of(share_by, tasks[slot].as_ref().expect("queued"), tenants, average);
        let mut taken = None;
        for cls in pool.classes.iter_mut() {
            if cls.queued > 0 {
                if let Some(t) = cls.pop(tasks, now, &needy, &charge) {
                    cls.queued -= 1;
                    taken = Some(t);
                    break;
                }
            }
        }
        let t = taken?;
        pool.queued -= 1;
        pool.running += 1;
        let tenant = tasks[t].as_ref().expect("queued").tenant.clone();
        pool.charge_ceiling(&tenant, now);
        Some(t)
    }

    /// A task of a pool that shares by run time started: remember when, and what it was charged.
    fn watch_run(&mut self, p: usize, at: usize, now: f64) {
        let slot = self.slot(at);
        if let Some(charged) = self.pools[p].charged(slot) {
            let seq = slot.seq;
            self.runs.insert(at, (now, charged));
            self.overruns.push(Reverse((Time(now + charged as f64 / QUANTA_PER_UNIT as f64), seq, at)));
        }
    }

    /// Let go the tenants whose rate bucket has refilled by `now`, and charge the running tasks of
    /// pools that share by run time for the time they have run past their charge.
    fn catch_up(&mut self, now: f64) {
        for pool in self.pools.iter_mut() {
            if !pool.settings.tenant_rates.is_empty() && pool.refills.peek().is_some_and(|Reverse((t, _))| t.0 <= now) {
                pool.refill(now);
            }
        }
        while let Some(&Reverse((due, seq, at))) = self.overruns.peek() {
            if due.0 >= now {
                break;
            }
            self.overruns.pop();
            let live = matches!(&self.tasks[at], Some(t) if t.state == State::Running && t.seq == seq);
            let Some(&(started, charged)) = self.runs.get(&at) else { continue };
            if !live || started + charged as f64 / QUANTA_PER_UNIT as f64 != due.0 {
                continue; // ended, re-dispatched or re-charged since: stale
            }
            let p = self.slot(at).pool;
            if self.pools[p].settings.share_by != ShareBy::Runtime {
                continue; // a reload changed what the pool charges: its tags are no longer in seconds
            }
            let ran = quantize(now - started) as i64;
            let charge = ran + (quantize(RECHARGE_MIN) as i64).max(ran / 8);
            let slot = self.tasks[at].as_ref().expect("running");
            self.pools[p].correct(slot, charged, charge);
            self.runs.insert(at, (started, charge));
            self.overruns.push(Reverse((Time(started + charge as f64 / QUANTA_PER_UNIT as f64), seq, at)));
        }
    }

    /// Seconds the running task `id`'s tenant is charged for its run so far, in a pool that shares
    /// by run time (its estimate, or more once it has run longer); None for any other task.
    pub fn charged_for(&self, id: &str) -> Option<f64> {
        let at = self.ids.get(id)?;
        self.runs.get(at).map(|(_, charged)| *charged as f64 / QUANTA_PER_UNIT as f64)
    }

    fn lease(&self, id: &str, worker: &str, attempt: u32) -> Option<usize> {
        let &at = self.ids.get(id)?;
        let &w = self.worker_index.get(worker)?;
        let t = self.slot(at);
        (t.state == State::Running && t.attempts == attempt && t.worker == Some(w)).then_some(at)
    }

    /// A running task leaves its worker: uncount it, and in a pool that shares by run time charge
    /// its run: `ran_for` seconds, or from the `now` of its dispatch to `now`.
    fn release(&mut self, at: usize, now: f64, ran_for: Option<f64>) {
        let run = self.runs.remove(&at);
        let t = self.tasks[at].as_mut().expect("a live slot");
        let (pool, worker, tenant) = (t.pool, t.worker.take(), t.tenant.clone());
        if let Some((started, charged)) = run {
            if self.pools[pool].settings.share_by == ShareBy::Runtime {
                let seconds = ran_for.unwrap_or((now - started).max(0.0));
                let slot = self.tasks[at].as_ref().expect("a live slot");
                self.pools[pool].correct(slot, charged, quantize(seconds) as i64);
                self.pools[pool].observe(&tenant, seconds);
            }
        }
        if let Some(w) = worker {
            if let Some(worker) = self.workers[w].as_mut() {
                worker.running.retain(|&x| x != at);
            }
        }
        let pool = &mut self.pools[pool];
        pool.running -= 1;
        pool.uncharge_ceiling(&tenant);
    }

    fn check_ran_for(ran_for: Option<f64>) -> Result<()> {
        match ran_for {
            Some(r) if r.is_nan() || r < 0.0 => {
                Err(Error::InvalidArgument(format!("ran_for must be a number of seconds >= 0 or None, got {r}")))
            }
            _ => Ok(()),
        }
    }

    /// Close the lease (id, attempt) of `worker` at `now`: the task is finished and forgotten. A
    /// stale lease returns None and changes nothing. Grants no slot. In a pool that shares by run
    /// time its tenant is charged the run's time: `ran_for` seconds, or `now` less the `now` it was
    /// dispatched at. InvalidArgument for a negative or NaN `ran_for`.
    pub fn finish(
        &mut self,
        id: &str,
        worker: &str,
        attempt: u32,
        now: f64,
        ran_for: Option<f64>,
    ) -> Result<Option<Slot>> {
        Core::check_ran_for(ran_for)?;
        let Some(at) = self.lease(id, worker, attempt) else { return Ok(None) };
        self.release(at, now, ran_for);
        Ok(Some(self.forget(at)))
    }

    /// Send a running lease back: queued now, or delayed until `not_before`. It keeps its deadline
    /// and attempts and gets a fresh arrival; its run is charged as `finish` charges it. A stale
    /// lease returns false.
    pub fn requeue(
        &mut self,
        id: &str,
        now: f64,
        worker: &str,
        attempt: u32,
        not_before: Option<f64>,
        ran_for: Option<f64>,
    ) -> Result<bool> {
        Core::check_ran_for(ran_for)?;
        let Some(at) = self.lease(id, worker, attempt) else { return Ok(false) };
        self.release(at, now, ran_for);
        if let Some(nb) = not_before {
            self.slot_mut(at).not_before = Some(nb);
        }
        match not_before {
            Some(nb) if nb > now => self.delay(at),
            _ => self.enqueue(at),
        }
        Ok(true)
    }

    /// Queued, delayed and running tasks of `pool`.
    pub fn counts(&self, pool: &str) -> Result<(usize, usize, usize)> {
        let p = &self.pools[self.any_pool(pool)?];
        Ok((p.queued, p.delayed, p.running))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(name: &str) -> PoolSettings {
        PoolSettings { name: name.into(), ..PoolSettings::default() }
    }

    fn task(id: &str, pool: &str) -> NewTask {
        NewTask {
            id: id.into(),
            pool: pool.into(),
            tenant: None,
            priority: 2,
            deadline: None,
            not_before: None,
            attempts: 0,
            cost: None,
        }
    }

    #[test]
    fn a_pool_left_out_of_a_reload_drains() {
        let mut core = Core::new(&[settings("a"), settings("b")]).unwrap();
        core.submit(task("t", "b"), 0.0).unwrap();
        core.configure(&[settings("a")], Some(1.0)).unwrap();
        let refused = core.submit(task("u", "b"), 1.0);
        assert!(matches!(&refused, Err(Error::NotFound(m)) if m.contains("draining")), "{refused:?}");
        assert!(matches!(core.add_worker("w", &["b"], 1), Err(Error::NotFound(_))));
        core.add_worker("w", &["a"], 1).unwrap();
        assert_eq!(core.pool_names(), vec!["a".to_string()]);
        // Declared again, it takes tasks again; its backlog was kept.
        core.configure(&[settings("a"), settings("b")], Some(2.0)).unwrap();
        core.add_worker("w2", &["b"], 1).unwrap();
        assert_eq!(core.dispatch(2.0, None).iter().map(|a| a.task.to_string()).collect::<Vec<_>>(), ["t"]);
    }

    #[test]
    fn a_bad_reload_changes_nothing() {
        let mut core = Core::new(&[settings("a")]).unwrap();
        let mut bad = settings("a");
        bad.tenant_minimums = vec![("x".into(), 3)];
        bad.max_in_flight = Some(2);
        assert!(matches!(core.configure(&[bad], None), Err(Error::InvalidArgument(_))));
        core.submit(task("t", "a"), 0.0).unwrap();
        assert_eq!(core.counts("a").unwrap(), (1, 0, 0));
    }

    fn of(tenant: Option<&str>, id: &str) -> NewTask {
        NewTask { tenant: tenant.map(String::from), ..task(id, "p") }
    }

    fn dispatched(core: &mut Core, now: f64) -> Vec<String> {
        core.dispatch(now, None).iter().map(|a| a.task.to_string()).collect()
    }

    #[test]
    fn a_default_ceiling_caps_each_unlisted_tenant_and_the_untenanted_tasks_as_one() {
        let mut p = settings("p");
        p.default_tenant_limit = Some(1);
        p.tenant_limits = vec![("big".into(), 3)];
        assert!(p.fair(), "a default ceiling makes the pool fair");
        let mut core = Core::new(&[p]).unwrap();
        for n in 0..3 {
            for tenant in [Some("a"), Some("big"), None] {
                core.submit(of(tenant, &format!("{}{n}", tenant.unwrap_or("none"))), 0.0).unwrap();
            }
        }
        core.add_worker("w", &["p"], 9).unwrap();
        // One of a, one untenanted, three of big (its listed ceiling overrides the default).
        assert_eq!(dispatched(&mut core, 0.0), ["a0", "big0", "none0", "big1", "big2"]);
        // a's task ends: a runs its next one, and no more.
        core.finish("a0", "w", 1, 1.0, None).unwrap().unwrap();
        assert_eq!(dispatched(&mut core, 1.0), ["a1"]);
    }

    #[test]
    fn default_ceilings_of_tenants_gone_are_swept_and_made_again() {
        let mut p = settings("p");
        p.default_tenant_limit = Some(1);
        let mut core = Core::new(&[p]).unwrap();
        core.add_worker("w", &["p"], 1).unwrap();
        let many = 3 * KEEP_IDLE_TENANTS;
        for n in 0..many {
            let id = format!("t{n}");
            core.submit(of(Some(&format!("tenant-{n}")), &id), n as f64).unwrap();
            assert_eq!(dispatched(&mut core, n as f64), [id.as_str()]);
            core.finish(&id, "w", 1, n as f64, None).unwrap().unwrap();
            core.grant("w", 1);
        }
        assert!(core.pools[0].ceilings.len() <= 2 * KEEP_IDLE_TENANTS, "{}", core.pools[0].ceilings.len());
        // A tenant met again gets its ceiling back.
        core.submit(of(Some("tenant-0"), "x"), 1e6).unwrap();
        core.submit(of(Some("tenant-0"), "y"), 1e6).unwrap();
        core.grant("w", 1);
        assert_eq!(dispatched(&mut core, 1e6), ["x"]);
    }

    #[test]
    fn sub_tenants_that_come_and_go_are_swept_and_their_places_reused() {
        let mut p = settings("p");
        p.fair_share = true;
        let mut core = Core::new(&[p]).unwrap();
        // A steady sibling keeps the parent's V moving past each sub-tenant that came and went.
        for n in 0..5000 {
            core.submit(of(Some("parent/steady"), &format!("s{n}")), 0.0).unwrap();
        }
        core.add_worker("w", &["p"], 1).unwrap();
        for n in 0..5000 {
            core.submit(of(Some(&format!("parent/child-{n}")), &format!("c{n}")), 0.0).unwrap();
            for _ in 0..2 {
                let id = dispatched(&mut core, 0.0).pop().expect("a task");
                assert!(core.finish(&id, "w", 1, 0.0, None).unwrap().is_some());
                core.grant("w", 1);
            }
        }
        let places = core.pools[0].classes[2].tree_node_places();
        assert!(places < 300, "{places} node places for 5000 sub-tenants that came and went");
    }

    #[test]
    fn deadline_groups_of_tenants_with_no_deadline_task_left_are_dropped() {
        let mut p = settings("p");
        p.default_tenant_limit = Some(1);
        let mut core = Core::new(&[p]).unwrap();
        for n in 0..100 {
            let mut due = of(Some(&format!("tenant-{n}")), &format!("t{n}"));
            due.deadline = Some(100.0);
            core.submit(due, 0.0).unwrap();
        }
        assert_eq!(core.pools[0].classes[2].edf_groups(), 100);
        core.add_worker("w", &["p"], 100).unwrap();
        assert_eq!(dispatched(&mut core, 0.0).len(), 100);
        assert_eq!(core.pools[0].classes[2].edf_groups(), 0);
    }

    #[test]
    fn a_reload_gives_every_tenant_with_tasks_the_default_ceiling() {
        let mut core = Core::new(&[settings("p")]).unwrap();
        for n in 0..3 {
            core.submit(of(Some("a"), &format!("a{n}")), 0.0).unwrap();
        }
        core.add_worker("w", &["p"], 2).unwrap();
        assert_eq!(dispatched(&mut core, 0.0), ["a0", "a1"]);
        let mut capped = settings("p");
        capped.default_tenant_limit = Some(2);
        core.configure(&[capped], Some(1.0)).unwrap();
        core.finish("a0", "w", 1, 1.0, None).unwrap().unwrap();
        core.grant("w", 2);
        // Two running counted against the new ceiling: one ends, one more starts, not two.
        assert_eq!(dispatched(&mut core, 1.0), ["a2"]);
    }

    #[test]
    fn bad_defaults_are_refused_naming_the_pool_and_the_setting() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let mut p = settings("p");
            p.default_weight = Some(bad);
            let refused = Core::new(&[p]);
            assert!(
                matches!(&refused, Err(Error::InvalidArgument(m)) if m.contains("\"p\"") && m.contains("default_weight")),
                "{refused:?}"
            );
        }
        let mut p = settings("p");
        p.default_tenant_limit = Some(0);
        let refused = Core::new(&[p]);
        assert!(
            matches!(&refused, Err(Error::InvalidArgument(m)) if m.contains("\"p\"") && m.contains("default_tenant_limit")),
            "{refused:?}"
        );
        // A minimum above the default ceiling can never be met.
        let mut p = settings("p");
        p.default_tenant_limit = Some(2);
        p.tenant_minimums = vec![("a".into(), 3)];
        assert!(matches!(Core::new(&[p]), Err(Error::InvalidArgument(m)) if m.contains("ceiling")));
    }
}
