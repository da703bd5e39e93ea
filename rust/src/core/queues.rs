//! The queues of one priority class: deadline tasks by EDF, the rest by SFQ or in FIFO order.
//!
//! Entries name a task by its slot in the core's task table and by the arrival number (`seq`) it
//! got when it entered the queue. An entry is live while that slot still holds a queued task with
//! that `seq`: a task that left early (cancelled, expired) leaves a stale entry behind, skipped when
//! it reaches the front and dropped when the structure is compacted, before the stale entries
//! outnumber the live ones. This is the Python core's lazy deletion, with slot numbers for objects.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;

use super::slot::{Slot, State};
use super::weights::{Tag, Weights};

/// An f64 with a total order, for time keys (times are never NaN: the core refuses them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Time(pub f64);

impl Eq for Time {}
impl PartialOrd for Time {
    fn partial_cmp(&self, other: &Time) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Time {
    fn cmp(&self, other: &Time) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// (time key, arrival seq, slot): earliest first, ties by arrival.
pub type Timed = Reverse<(Time, u64, usize)>;

/// A task entry in a FIFO: (arrival seq, slot).
pub type Entry = (u64, usize);

pub(crate) fn is_live(tasks: &[Option<Slot>], (seq, slot): Entry, state: State) -> bool {
    matches!(&tasks[slot], Some(t) if t.seq == seq && t.state == state)
}

/// A min-heap of timed entries whose stale entries are dropped lazily.
#[derive(Debug, Default)]
pub struct TimerHeap {
    heap: BinaryHeap<Timed>,
    /// Entries known live (the rest are stale).
    pub live: usize,
}

impl TimerHeap {
    /// Add a live entry.
    pub fn push(&mut self, key: f64, seq: u64, slot: usize) {
        self.heap.push(Reverse((Time(key), seq, slot)));
        self.live += 1;
    }

    /// One live entry just went stale in place.
    pub fn stale(&mut self, tasks: &[Option<Slot>], state: State) {
        self.live -= 1;
        if self.heap.len() > 2 * self.live + 16 {
            let heap = std::mem::take(&mut self.heap);
            self.heap = heap.into_iter().filter(|Reverse((_, s, i))| is_live(tasks, (*s, *i), state)).collect();
        }
    }

    /// The smallest live key.
    pub fn peek_key(&mut self, tasks: &[Option<Slot>], state: State) -> Option<f64> {
        while let Some(Reverse((key, seq, slot))) = self.heap.peek() {
            if is_live(tasks, (*seq, *slot), state) {
                return Some(key.0);
            }
            self.heap.pop();
        }
        None
    }

    /// Remove and return the live entries whose key <= now, earliest first (they are no longer live).
    pub fn pop_due(&mut self, tasks: &[Option<Slot>], state: State, now: f64) -> Vec<usize> {
        let mut due = Vec::new();
        while let Some(Reverse((key, seq, slot))) = self.heap.peek() {
            if key.0 > now {
                break;
            }
            let (seq, slot) = (*seq, *slot);
            self.heap.pop();
            if is_live(tasks, (seq, slot), state) {
                self.live -= 1;
                due.push(slot);
            }
        }
        due
    }
}

/// A FIFO of tasks with lazy deletion.
#[derive(Debug, Default)]
pub struct Fifo {
    queue: VecDeque<Entry>,
    /// Queued tasks linked.
    pub live: usize,
    stale: usize,
}

impl Fifo {
    fn push(&mut self, entry: Entry) {
        self.queue.push_back(entry);
        self.live += 1;
    }

    fn skip_stale(&mut self, tasks: &[Option<Slot>]) {
        while let Some(&front) = self.queue.front() {
            if is_live(tasks, front, State::Queued) {
                break;
            }
            self.queue.pop_front();
            self.stale -= 1;
        }
    }

    fn compact(&mut self, tasks: &[Option<Slot>]) {
        self.queue.retain(|e| is_live(tasks, *e, State::Queued));
        self.stale = 0;
    }

    fn pop(&mut self, tasks: &[Option<Slot>]) -> Option<usize> {
        if self.live == 0 {
            return None;
        }
        self.skip_stale(tasks);
        let (_, slot) = self.queue.pop_front()?;
        self.live -= 1;
        if self.stale > self.live {
            self.compact(tasks);
        }
        Some(slot)
    }

    fn discard(&mut self, tasks: &[Option<Slot>]) {
        self.live -= 1;
        self.stale += 1;
        if self.stale > self.live {
            self.compact(tasks);
        }
    }
}

type Tenant = Option<Arc<str>>;

/// One tenant inside one fair class: its FIFO and its tags. While the flow is backlogged its front
/// entry is live and holds the start tag.
#[derive(Debug)]
struct Flow {
    chain: Fifo,
    step: Tag,
    /// Start tag S of the head (meaningful while backlogged).
    tag: Tag,
    /// F[t]: S of its last dispatch + 1/w (0 before the first); kept while idle.
    finish: Tag,
    /// Bumped whenever the flow's heap entry is replaced; older entries are stale.
    gen: u64,
    /// Arrival seq of the head, to tell whether a cancelled task was the head.
    head_seq: u64,
}

/// (start tag, arrival of the head, flow generation, tenant).
type HeadEntry = Reverse<(Tag, u64, u64, Tenant)>;

/// Weighted start-time fair queuing between the tenants of one class (docs/scheduling.md).
#[derive(Debug)]
pub struct FairQueue {
    weights: Arc<Weights>,
    flows: HashMap<Tenant, Flow>,
    heap: BinaryHeap<HeadEntry>,
    heap_stale: usize,
    vtime: Tag,
    nback: usize,
    sweep_at: usize,
}

const MIN_SWEEP: usize = 64;

impl FairQueue {
    fn new(weights: Arc<Weights>) -> FairQueue {
        let vtime = weights.zero();
        FairQueue {
            weights,
            flows: HashMap::new(),
            heap: BinaryHeap::new(),
            heap_stale: 0,
            vtime,
            nback: 0,
            sweep_at: MIN_SWEEP,
        }
    }

    fn push(&mut self, tenant: &Tenant, entry: Entry) {
        if let Some(flow) = self.flows.get_mut(tenant) {
            if flow.chain.live > 0 {
                flow.chain.push(entry);
                return;
            }
        } else {
            if self.flows.len() >= self.sweep_at {
                let vtime = self.vtime;
                self.flows.retain(|_, f| f.chain.live > 0 || f.finish > vtime);
                self.sweep_at = MIN_SWEEP.max(2 * self.flows.len());
            }
            let step = self.weights.step(tenant.as_deref());
            let zero = self.weights.zero();
            self.flows.insert(
                tenant.clone(),
                Flow { chain: Fifo::default(), step, tag: zero, finish: zero, gen: 0, head_seq: 0 },
            );
        }
        let vtime = self.vtime;
        let flow = self.flows.get_mut(tenant).expect("just made");
        flow.chain.push(entry);
        // Activate: a flow that banked nothing (F <= V) starts afresh at V.
        if flow.finish > vtime {
            flow.tag = flow.finish;
        } else {
            flow.tag = vtime;
            flow.finish = vtime.zero();
        }
        flow.gen += 1;
        flow.head_seq = entry.0;
        self.heap.push(Reverse((flow.tag, entry.0, flow.gen, tenant.clone())));
        self.nback += 1;
    }

    fn pop(&mut self, tasks: &[Option<Slot>]) -> Option<usize> {
        while let Some(Reverse((tag, _, gen, tenant))) = self.heap.peek() {
            let flow = self.flows.get_mut(tenant).expect("a heap entry's flow is kept while backlogged");
            if *gen != flow.gen {
                self.heap.pop();
                self.heap_stale -= 1;
                continue;
            }
            let tag = *tag;
            let tenant = tenant.clone();
            let (_, slot) = flow.chain.queue.pop_front().expect("a backlogged flow has a head");
            flow.chain.live -= 1;
            self.vtime = tag;
            // F[t] = S + 1/w; the flow's next head (if any) is tagged F, since V = S <= F.
            flow.finish = tag + flow.step;
            self.heap.pop();
            if flow.chain.live > 0 {
                flow.chain.skip_stale(tasks);
                if flow.chain.stale > flow.chain.live {
                    flow.chain.compact(tasks);
                }
                flow.tag = flow.finish;
                flow.head_seq = flow.chain.queue.front().expect("live").0;
                self.heap.push(Reverse((flow.tag, flow.head_seq, flow.gen, tenant)));
            } else {
                flow.chain = Fifo::default();
                self.nback -= 1;
            }
            return Some(slot);
        }
        None
    }

    fn discard(&mut self, tasks: &[Option<Slot>], tenant: &Tenant, seq: u64) {
        let flow = self.flows.get_mut(tenant).expect("a queued task's flow exists");
        flow.chain.live -= 1;
        flow.chain.stale += 1;
        if flow.chain.live == 0 {
            flow.gen += 1;
            flow.chain = Fifo::default();
            self.nback -= 1;
            self.entry_went_stale();
        } else if flow.head_seq == seq {
            // The successor inherits the head's tag: a cancelled task is never charged.
            flow.chain.skip_stale(tasks);
            flow.gen += 1;
            flow.head_seq = flow.chain.queue.front().expect("live").0;
            let entry = Reverse((flow.tag, flow.head_seq, flow.gen, tenant.clone()));
            self.heap.push(entry);
            self.entry_went_stale();
        } else if flow.chain.stale > flow.chain.live {
            flow.chain.compact(tasks);
        }
    }

    fn entry_went_stale(&mut self) {
        self.heap_stale += 1;
        if self.heap_stale * 2 > self.heap.len() {
            let flows = &self.flows;
            let heap = std::mem::take(&mut self.heap);
            self.heap = heap
                .into_iter()
                .filter(|Reverse((_, _, gen, t))| flows.get(t).is_some_and(|f| f.gen == *gen))
                .collect();
            self.heap_stale = 0;
        }
    }
}

/// The part of a class that is not ordered by deadline.
#[derive(Debug)]
pub enum Rest {
    /// Pools without fairness: submission order.
    Fifo(Fifo),
    /// Fair pools: SFQ between tenants.
    Fair(FairQueue),
}

impl Rest {
    /// An empty queue of the pool's kind.
    pub fn new(fair: Option<Arc<Weights>>) -> Rest {
        match fair {
            Some(w) => Rest::Fair(FairQueue::new(w)),
            None => Rest::Fifo(Fifo::default()),
        }
    }

    /// Whether anything is queued.
    pub fn any(&self) -> bool {
        match self {
            Rest::Fifo(f) => f.live > 0,
            Rest::Fair(q) => q.nback > 0,
        }
    }

    /// Queue a task (its seq already set).
    pub fn push(&mut self, tenant: &Tenant, entry: Entry) {
        match self {
            Rest::Fifo(f) => f.push(entry),
            Rest::Fair(q) => q.push(tenant, entry),
        }
    }

    /// The next task, if any.
    pub fn pop(&mut self, tasks: &[Option<Slot>]) -> Option<usize> {
        match self {
            Rest::Fifo(f) => f.pop(tasks),
            Rest::Fair(q) => q.pop(tasks),
        }
    }

    /// A task queued here has just left (its slot is already freed or changed).
    pub fn discard(&mut self, tasks: &[Option<Slot>], tenant: &Tenant, seq: u64) {
        match self {
            Rest::Fifo(f) => f.discard(tasks),
            Rest::Fair(q) => q.discard(tasks, tenant, seq),
        }
    }
}

/// One priority class of one pool: deadline tasks by EDF, then the rest.
#[derive(Debug)]
pub struct ClassQueue {
    edf: BinaryHeap<Timed>,
    /// Queued deadline tasks of this class (the heap may hold more entries: stale ones).
    edf_live: usize,
    /// The fair or FIFO part.
    pub rest: Rest,
    /// Tasks in state queued in this class.
    pub queued: usize,
}

impl ClassQueue {
    /// An empty class.
    pub fn new(fair: Option<Arc<Weights>>) -> ClassQueue {
        ClassQueue { edf: BinaryHeap::new(), edf_live: 0, rest: Rest::new(fair), queued: 0 }
    }

    /// Queue a task whose seq is set: by deadline if it has one.
    pub fn push(&mut self, tenant: &Tenant, deadline: Option<f64>, entry: Entry) {
        match deadline {
            Some(d) => {
                self.edf.push(Reverse((Time(d), entry.0, entry.1)));
                self.edf_live += 1;
            }
            None => self.rest.push(tenant, entry),
        }
        self.queued += 1;
    }

    /// Remove the next task of this class, never one whose deadline <= now.
    pub fn pop(&mut self, tasks: &[Option<Slot>], now: f64) -> Option<usize> {
        while let Some(Reverse((deadline, seq, slot))) = self.edf.pop() {
            if !is_live(tasks, (seq, slot), State::Queued) || deadline.0 <= now {
                continue; // stale, or overdue: it stays queued for expire() to report
            }
            self.edf_live -= 1;
            return Some(slot);
        }
        self.rest.pop(tasks)
    }

    /// The deadline of the task `pop(now)` would return (infinity for none), None if nothing is ready.
    pub fn peek_deadline(&mut self, tasks: &[Option<Slot>], now: f64) -> Option<f64> {
        while let Some(Reverse((deadline, seq, slot))) = self.edf.peek() {
            if is_live(tasks, (*seq, *slot), State::Queued) && deadline.0 > now {
                return Some(deadline.0);
            }
            self.edf.pop();
        }
        self.rest.any().then_some(f64::INFINITY)
    }

    /// A queued task of this class left without being popped (cancelled or expired).
    pub fn discard(&mut self, tasks: &[Option<Slot>], tenant: &Tenant, deadline: Option<f64>, seq: u64) {
        self.queued -= 1;
        if deadline.is_none() {
            self.rest.discard(tasks, tenant, seq);
            return;
        }
        self.edf_live -= 1;
        if self.edf.len() > 2 * self.edf_live + 16 {
            let heap = std::mem::take(&mut self.edf);
            self.edf = heap.into_iter().filter(|Reverse((_, s, i))| is_live(tasks, (*s, *i), State::Queued)).collect();
        }
    }
}
