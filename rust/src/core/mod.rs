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
//!              edf   heap (deadline, arrival) of queued deadline tasks
//!              rest  FairQueue (tenant flows, head tags by (S, arrival)) or Fifo
//! ```
//!
//! A dispatch walks a pool's classes from critical to low and takes the first task it finds: in a
//! class the EDF heap first (deadline tasks are not part of the fair share), then the fair or FIFO
//! part. The fair part is start-time fair queuing with exact integer tags (see `weights`): only the
//! head of each backlogged tenant holds a tag `S = max(V, F[t])`, `V` becomes the `S` dispatched and
//! `F[t] = S + 1/w`. Arrival numbers are given when a task enters its class (submit, a delay that
//! ends, a retry, a lost worker), and break every tie. Workers are served least recently ready
//! first; a worker serving several pools takes the best class, then the earliest deadline, then the
//! pools take turns.

pub mod queues;
mod slot;
pub mod weights;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::error::{Error, Result};
use queues::{ClassQueue, TimerHeap};
pub use slot::{Slot, State};
use weights::Weights;

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
}

/// How one pool schedules.
#[derive(Debug, Clone, Default)]
pub struct PoolSettings {
    /// The pool's name.
    pub name: String,
    /// Tenant weights (positive, finite); any makes the pool fair.
    pub tenant_weights: Vec<(String, f64)>,
    /// Equal shares between tenants.
    pub fair_share: bool,
    /// At most this many of the pool's tasks running at once.
    pub max_in_flight: Option<u32>,
}

impl PoolSettings {
    /// Whether tenants share the pool by SFQ.
    pub fn fair(&self) -> bool {
        self.fair_share || !self.tenant_weights.is_empty()
    }
}

#[derive(Debug)]
struct Pool {
    name: String,
    classes: [ClassQueue; 4],
    max_in_flight: Option<u32>,
    paused: bool,
    queued: usize,
    delayed: usize,
    running: usize,
}

impl Pool {
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
        for (tenant, w) in &p.tenant_weights {
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
    }
    Ok(())
}

impl Core {
    /// A core for these pools. InvalidArgument on a duplicate name or a bad setting.
    pub fn new(pools: &[PoolSettings]) -> Result<Core> {
        check_settings(pools)?;
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
        };
        for s in pools {
            let weights =
                s.fair().then(|| Arc::new(Weights::new(s.tenant_weights.iter().map(|(t, w)| (t.as_str(), *w)))));
            core.pool_index.insert(s.name.clone(), core.pools.len());
            core.pools.push(Pool {
                name: s.name.clone(),
                classes: std::array::from_fn(|_| ClassQueue::new(weights.clone())),
                max_in_flight: s.max_in_flight,
                paused: false,
                queued: 0,
                delayed: 0,
                running: 0,
            });
        }
        Ok(core)
    }

    fn pool_of(&self, name: &str) -> Result<usize> {
        self.pool_index.get(name).copied().ok_or_else(|| {
            let names: Vec<&str> = self.pools.iter().map(|p| p.name.as_str()).collect();
            Error::NotFound(format!("no pool named {name:?}; declared pools: {names:?}"))
        })
    }

    /// Names of the pools, in declaration order.
    pub fn pool_names(&self) -> Vec<String> {
        self.pools.iter().map(|p| p.name.clone()).collect()
    }

    /// Stop dispatching from `pool` (it still takes tasks; deadlines still expire).
    pub fn pause(&mut self, pool: &str) -> Result<()> {
        let p = self.pool_of(pool)?;
        self.pools[p].paused = true;
        Ok(())
    }

    /// Dispatch from `pool` again.
    pub fn resume(&mut self, pool: &str) -> Result<()> {
        let p = self.pool_of(pool)?;
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
            worker: None,
            seq: 0,
        };
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
        self.pools[pool].classes[priority].push(&tenant, deadline, (seq, at));
        self.pools[pool].queued += 1;
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
        slot
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

    /// The earliest time a delayed task becomes due or a queued or delayed task's deadline passes.
    pub fn next_wakeup(&mut self) -> Option<f64> {
        let timer = self.timers.peek_key(&self.tasks, State::Delayed);
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

    /// Forget a worker; its running tasks go back to their class (queued) and their ids are returned.
    pub fn remove_worker(&mut self, id: &str) -> Vec<Arc<str>> {
        let Some(at) = self.worker_index.remove(id) else { return Vec::new() };
        self.unready(at);
        let w = self.workers[at].take().expect("known");
        let mut back = Vec::new();
        for t in w.running {
            self.release(t);
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
        let mut out = Vec::new();
        'outer: while limit.is_none_or(|l| out.len() < l) {
            if self.pools.iter().all(|p| p.queued == 0) {
                break;
            }
            for pos in 0..self.ready.len() {
                let w = self.ready[pos];
                let Some(pool) = self.choose_pool(w, now) else { continue };
                let Some(t) = self.take(pool, now) else { continue };
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

    /// Pop the pool's next task by class, then EDF, then fair share or FIFO; count it running.
    fn take(&mut self, p: usize, now: f64) -> Option<usize> {
        let tasks = &self.tasks;
        let pool = &mut self.pools[p];
        for cls in pool.classes.iter_mut() {
            if cls.queued > 0 {
                if let Some(t) = cls.pop(tasks, now) {
                    cls.queued -= 1;
                    pool.queued -= 1;
                    pool.running += 1;
                    return Some(t);
                }
            }
        }
        None
    }

    fn lease(&self, id: &str, worker: &str, attempt: u32) -> Option<usize> {
        let &at = self.ids.get(id)?;
        let &w = self.worker_index.get(worker)?;
        let t = self.slot(at);
        (t.state == State::Running && t.attempts == attempt && t.worker == Some(w)).then_some(at)
    }

    fn release(&mut self, at: usize) {
        let t = self.slot_mut(at);
        let (pool, worker) = (t.pool, t.worker.take());
        if let Some(w) = worker {
            if let Some(worker) = self.workers[w].as_mut() {
                worker.running.retain(|&x| x != at);
            }
        }
        self.pools[pool].running -= 1;
    }

    /// Close the lease (id, attempt) of `worker`: the task is finished and forgotten. A stale lease
    /// returns None and changes nothing. Grants no slot.
    pub fn finish(&mut self, id: &str, worker: &str, attempt: u32) -> Option<Slot> {
        let at = self.lease(id, worker, attempt)?;
        self.release(at);
        Some(self.forget(at))
    }

    /// Send a running lease back: queued now, or delayed until `not_before`. It keeps its deadline
    /// and attempts and gets a fresh arrival. A stale lease returns false.
    pub fn requeue(&mut self, id: &str, now: f64, worker: &str, attempt: u32, not_before: Option<f64>) -> bool {
        let Some(at) = self.lease(id, worker, attempt) else { return false };
        self.release(at);
        if let Some(nb) = not_before {
            self.slot_mut(at).not_before = Some(nb);
        }
        match not_before {
            Some(nb) if nb > now => self.delay(at),
            _ => self.enqueue(at),
        }
        true
    }

    /// Queued, delayed and running tasks of `pool`.
    pub fn counts(&self, pool: &str) -> Result<(usize, usize, usize)> {
        let p = &self.pools[self.pool_of(pool)?];
        Ok((p.queued, p.delayed, p.running))
    }
}
