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
use super::weights::{Tag, Weights, QUANTA_PER_UNIT};

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

impl Fifo {
    /// Queued tasks before the one with arrival `seq`, looking at `scan` entries at most, and
    /// whether that is exact (the task was reached): `explain`'s "ahead of it in its queue".
    pub(super) fn ahead_of(&self, tasks: &[Option<Slot>], seq: u64, scan: usize) -> (u64, bool) {
        let mut ahead = 0;
        for entry in self.queue.iter().take(scan) {
            if entry.0 == seq {
                return (ahead, true);
            }
            if is_live(tasks, *entry, State::Queued) {
                ahead += 1;
            }
        }
        (ahead, false)
    }
}

/// What `explain` reads of one tenant's flow in a fair class (Python's `flow_share`, `flow_lag`).
#[derive(Debug, Clone, Copy)]
pub(super) struct FlowReading {
    /// Its queued tasks.
    pub live: usize,
    /// The fraction of the class's fair dispatches it gets now (0 while it cannot go).
    pub share: f64,
    /// Dispatches it trails (+) or leads (-) its share by: `(V - S) / step`.
    pub lag: f64,
}

/// `a - b` in tag units, as a float (exact integer tags subtracted exactly first).
fn tag_difference(a: Tag, b: Tag) -> f64 {
    match (a, b) {
        (Tag::Exact(a), Tag::Exact(b)) => (a - b) as f64,
        (a, b) => a.as_f64() - b.as_f64(),
    }
}

impl FairQueue {
    /// `tenant`'s flow as `explain` sees it, None when it has none.
    pub(super) fn reading(&self, tenant: &Tenant) -> Option<FlowReading> {
        let flow = self.flows.get(tenant)?;
        let wsum: f64 = self.flows.iter().filter(|(_, f)| f.on).map(|(t, _)| self.weights.weight(t.as_deref())).sum();
        let share = if flow.on && wsum > 0.0 { self.weights.weight(tenant.as_deref()) / wsum } else { 0.0 };
        let lag = if flow.chain.live == 0 {
            0.0
        } else {
            // A flow out of the heap rejoins at max(V, F): its lead is kept, its trailing not banked.
            let start = if flow.on { flow.tag } else { flow.finish.max(self.vtime) };
            tag_difference(self.vtime, start) / flow.step.as_f64()
        };
        Some(FlowReading { live: flow.chain.live, share, lag })
    }

    /// `tenant`'s queue, if it has one.
    pub(super) fn chain(&self, tenant: &Tenant) -> Option<&Fifo> {
        self.flows.get(tenant).map(|f| &f.chain)
    }
}

/// A tenant's name in a pool (None: tasks without a tenant).
pub type Tenant = Option<Arc<str>>;

/// What a fair dispatch charges, in quanta (thousandths of a unit), given the task's slot.
pub type ChargeOf<'a> = &'a dyn Fn(usize) -> i64;

/// One tenant inside one fair class: its FIFO and its tags. While the flow is `on` (in the heap)
/// its front entry is live and holds the start tag.
#[derive(Debug)]
struct Flow {
    chain: Fifo,
    step: Tag,
    /// Start tag S of the head (meaningful while on).
    tag: Tag,
    /// S of its last dispatch; None before the first and once it forgot its past.
    last: Option<Tag>,
    /// F[t]: S of its last dispatch + its charge/w (0 before the first); kept while idle.
    finish: Tag,
    /// Bumped whenever the flow's heap entry is replaced; older entries are stale.
    gen: u64,
    /// Holds a live heap entry (backlogged and not held back).
    on: bool,
    /// Held back (at its ceiling or out of tokens): out of the heap although it may have tasks.
    capped: bool,
    /// Charged pools: the quanta F is ahead of `last` (the last charge and corrections since).
    owed: i64,
}

impl Flow {
    fn head_seq(&self) -> u64 {
        self.chain.queue.front().expect("a backlogged flow has a head").0
    }

    /// Enter the heap's order at max(V, F): a flow ahead of V keeps its lead; one that banked
    /// nothing (F <= V) forgets its past and starts afresh at V (no banked credit).
    fn rejoin_at(&mut self, vtime: Tag) {
        if self.finish > vtime {
            self.tag = self.finish;
        } else {
            self.tag = vtime;
            self.last = None;
            self.finish = vtime.zero();
        }
    }
}

/// (start tag, arrival of the head, flow generation, tenant).
type HeadEntry = Reverse<(Tag, u64, u64, Tenant)>;

/// Weighted start-time fair queuing between the tenants of one class (docs/scheduling.md).
///
/// What a dispatch charges is the pool's `share_by`: one step `1/w` (`charging` false), or the
/// quanta `ChargeOf` gives, `charge/w`, exact in integer tags (weights.rs). In a pool that shares by
/// run time a run's charge is corrected when it ends (`correct`): a tenant in the heap moves by the
/// whole difference, even below V (it was overcharged while backlogged, so it is owed that); V never
/// goes back. A tenant held back (`block`) keeps its tasks and tags but no heap entry; let go, it
/// rejoins at max(V, F), banking nothing. A tenant under its minimum (`pop_needy`) is served ahead
/// of the fair order, moving V no further than the smallest tag there.
#[derive(Debug)]
pub struct FairQueue {
    weights: Arc<Weights>,
    charging: bool,
    flows: HashMap<Tenant, Flow>,
    heap: BinaryHeap<HeadEntry>,
    heap_stale: usize,
    vtime: Tag,
    nback: usize,
    sweep_at: usize,
    /// What the last fair dispatch charged, in quanta (charging pools).
    pub charged: i64,
}

const MIN_SWEEP: usize = 64;

impl FairQueue {
    fn new(weights: Arc<Weights>, charging: bool) -> FairQueue {
        let vtime = weights.zero();
        FairQueue {
            weights,
            charging,
            flows: HashMap::new(),
            heap: BinaryHeap::new(),
            heap_stale: 0,
            vtime,
            nback: 0,
            sweep_at: MIN_SWEEP,
            charged: 0,
        }
    }

    fn new_flow(&mut self, tenant: &Tenant, held: bool) {
        if self.flows.len() >= self.sweep_at {
            let vtime = self.vtime;
            self.flows.retain(|_, f| f.chain.live > 0 || f.finish > vtime);
            self.sweep_at = MIN_SWEEP.max(2 * self.flows.len());
        }
        let step = self.weights.step(tenant.as_deref());
        let zero = self.weights.zero();
        let flow = Flow {
            chain: Fifo::default(),
            step,
            tag: zero,
            last: None,
            finish: zero,
            gen: 0,
            on: false,
            capped: held,
            owed: QUANTA_PER_UNIT as i64,
        };
        self.flows.insert(tenant.clone(), flow);
    }

    /// Queue a task of `tenant` (`held`: the tenant is held back now, for a flow made here).
    fn push(&mut self, tenant: &Tenant, entry: Entry, held: bool) {
        match self.flows.get_mut(tenant) {
            Some(flow) if flow.chain.live > 0 => {
                flow.chain.push(entry);
                return;
            }
            Some(_) => {}
            None => self.new_flow(tenant, held),
        }
        let vtime = self.vtime;
        let flow = self.flows.get_mut(tenant).expect("just made");
        flow.chain.push(entry);
        flow.rejoin_at(vtime);
        if flow.capped {
            return;
        }
        flow.gen += 1;
        flow.on = true;
        self.heap.push(Reverse((flow.tag, entry.0, flow.gen, tenant.clone())));
        self.nback += 1;
    }

    /// Take the head of `tenant`'s flow (at the top of the heap, or forced by a minimum), charge it,
    /// and re-tag or retire the flow. `replace`: the flow's entry is the heap's top (popped here);
    /// else it is dropped as stale.
    fn hand_out(&mut self, tasks: &[Option<Slot>], tenant: &Tenant, charge_of: ChargeOf, replace: bool) -> usize {
        if replace {
            self.heap.pop(); // the flow's own entry: the caller found it at the top
        }
        let flow = self.flows.get_mut(tenant).expect("a flow in the heap");
        let (_, slot) = flow.chain.queue.pop_front().expect("a backlogged flow has a head");
        flow.chain.live -= 1;
        let tag = flow.tag;
        flow.last = Some(tag);
        let next = if self.charging {
            let charge = charge_of(slot);
            self.charged = charge;
            flow.owed = charge;
            tag + self.weights.advance(flow.step, charge)
        } else {
            tag + flow.step
        };
        flow.finish = next;
        if !replace {
            flow.gen += 1; // its entry, somewhere in the heap, is stale from now on
        }
        if flow.chain.live > 0 {
            flow.chain.skip_stale(tasks);
            if flow.chain.stale > flow.chain.live {
                flow.chain.compact(tasks);
            }
            flow.tag = next;
            self.heap.push(Reverse((next, flow.head_seq(), flow.gen, tenant.clone())));
        } else {
            flow.chain = Fifo::default();
            flow.on = false;
            self.nback -= 1;
        }
        if !replace {
            self.entry_went_stale();
        }
        slot
    }

    /// The live entry at the top of the heap, stale ones dropped on the way.
    fn top(&mut self) -> Option<(Tag, Tenant)> {
        while let Some(Reverse((tag, _, gen, tenant))) = self.heap.peek() {
            if self.flows.get(tenant).is_some_and(|f| f.gen == *gen) {
                return Some((*tag, tenant.clone()));
            }
            self.heap.pop();
            self.heap_stale -= 1;
        }
        None
    }

    fn pop(&mut self, tasks: &[Option<Slot>], charge_of: ChargeOf) -> Option<usize> {
        let (tag, tenant) = self.top()?;
        // Only a corrected tag can be below V: V never goes back.
        if tag > self.vtime {
            self.vtime = tag;
        }
        Some(self.hand_out(tasks, &tenant, charge_of, true))
    }

    /// The next task of the first of `needy` (tenants under their minimum) that can go, in the fair
    /// order among them (by tag, then arrival); None if none of them can.
    fn pop_needy(&mut self, tasks: &[Option<Slot>], needy: &[Tenant], charge_of: ChargeOf) -> Option<usize> {
        let mut best: Option<(Tag, u64, &Tenant)> = None;
        for tenant in needy {
            let Some(flow) = self.flows.get(tenant) else { continue };
            if !flow.on {
                continue;
            }
            let key = (flow.tag, flow.head_seq());
            if best.is_none_or(|(t, s, _)| key < (t, s)) {
                best = Some((key.0, key.1, tenant));
            }
        }
        let tenant = best?.2.clone();
        // A fair dispatch would have moved V to the smallest tag; this one moves it no further.
        let (smallest, _) = self.top().expect("a needy flow is in the heap");
        if smallest > self.vtime {
            self.vtime = smallest;
        }
        Some(self.hand_out(tasks, &tenant, charge_of, false))
    }

    /// A run of `tenant` turned out to cost `charge` more quanta (fewer, if negative) than it was
    /// charged: move its F, and its tag while it is in the heap, by that.
    fn correct(&mut self, tenant: &Tenant, charge: i64, held: bool) {
        if !self.flows.contains_key(tenant) {
            if charge <= 0 {
                return; // forgotten while idle: it banked nothing, and credit it is not owed
            }
            self.new_flow(tenant, held);
        }
        let vtime = self.vtime;
        let weights = self.weights.clone();
        let flow = self.flows.get_mut(tenant).expect("made");
        let amount = weights.advance(flow.step, charge);
        if flow.on {
            if flow.last.is_none() {
                // It joined at V having forgotten its past: that join is its last start now.
                flow.last = Some(flow.tag);
                flow.owed = 0;
            }
            flow.owed += charge;
            flow.tag = flow.tag + amount;
            flow.finish = flow.tag;
            flow.gen += 1;
            let entry = Reverse((flow.tag, flow.head_seq(), flow.gen, tenant.clone()));
            self.heap.push(entry);
            self.entry_went_stale();
        } else if flow.finish > vtime && flow.last.is_some() {
            flow.owed += charge;
            flow.finish = flow.finish + amount;
        } else if charge > 0 {
            // It owed nothing: it owes this from now on.
            flow.last = Some(vtime);
            flow.owed = charge;
            flow.finish = vtime + amount;
        }
    }

    /// `tenant` is held back: out of the heap, its tasks and tags kept.
    fn block(&mut self, tenant: &Tenant) {
        let Some(flow) = self.flows.get_mut(tenant) else { return };
        flow.capped = true;
        if flow.on {
            flow.on = false;
            flow.gen += 1;
            self.nback -= 1;
            self.entry_went_stale();
        }
    }

    /// `tenant` may go again: it rejoins at max(V, F) if it has work.
    fn unblock(&mut self, tenant: &Tenant) {
        let vtime = self.vtime;
        let Some(flow) = self.flows.get_mut(tenant) else { return };
        flow.capped = false;
        if flow.on || flow.chain.live == 0 {
            return;
        }
        flow.rejoin_at(vtime);
        flow.gen += 1;
        flow.on = true;
        let entry = Reverse((flow.tag, flow.head_seq(), flow.gen, tenant.clone()));
        self.heap.push(entry);
        self.nback += 1;
    }

    fn discard(&mut self, tasks: &[Option<Slot>], tenant: &Tenant, seq: u64) {
        let flow = self.flows.get_mut(tenant).expect("a queued task's flow exists");
        let was_head = flow.chain.queue.front().is_some_and(|e| e.0 == seq);
        flow.chain.live -= 1;
        flow.chain.stale += 1;
        if flow.chain.live == 0 {
            flow.chain = Fifo::default();
            if flow.on {
                flow.on = false;
                flow.gen += 1;
                self.nback -= 1;
                self.entry_went_stale();
            }
        } else if was_head {
            // The successor inherits the head's tag: a cancelled task is never charged.
            flow.chain.skip_stale(tasks);
            if flow.on {
                flow.gen += 1;
                let entry = Reverse((flow.tag, flow.head_seq(), flow.gen, tenant.clone()));
                self.heap.push(entry);
                self.entry_went_stale();
            }
        } else if flow.chain.stale > flow.chain.live {
            flow.chain.compact(tasks);
        }
    }

    /// Take new weights (a reload): every backlogged tenant is re-tagged as if its last dispatch had
    /// had its new weight, `max(V, S_last + charge/w_new)`; the heap is rebuilt.
    fn reweight(&mut self, weights: Arc<Weights>) {
        if let Some(conversion) = self.weights.conversion(&weights) {
            self.vtime = self.vtime.rescale(conversion);
            for flow in self.flows.values_mut() {
                flow.tag = flow.tag.rescale(conversion);
                flow.finish = flow.finish.rescale(conversion);
                flow.last = flow.last.map(|t| t.rescale(conversion));
            }
        }
        let vtime = self.vtime;
        let mut entries = Vec::new();
        for (tenant, flow) in self.flows.iter_mut() {
            flow.step = weights.step(tenant.as_deref());
            if flow.chain.live == 0 {
                continue;
            }
            if let Some(last) = flow.last {
                flow.finish = last + if self.charging { weights.advance(flow.step, flow.owed) } else { flow.step };
            }
            if flow.on {
                flow.tag = if flow.finish > vtime { flow.finish } else { vtime };
                flow.gen += 1;
                entries.push(Reverse((flow.tag, flow.head_seq(), flow.gen, tenant.clone())));
            }
        }
        self.weights = weights;
        self.heap = BinaryHeap::from(entries);
        self.heap_stale = 0;
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

    fn entries(&self, tasks: &[Option<Slot>]) -> Vec<Entry> {
        self.flows
            .values()
            .flat_map(|f| f.chain.queue.iter().copied())
            .filter(|e| is_live(tasks, *e, State::Queued))
            .collect()
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
    /// An empty queue of the pool's kind: FIFO, or fair with these weights, charging per `share_by`
    /// (`charging`: by cost or run time) or one step per dispatch.
    pub fn new(fair: Option<(Arc<Weights>, bool)>) -> Rest {
        match fair {
            Some((w, charging)) => Rest::Fair(FairQueue::new(w, charging)),
            None => Rest::Fifo(Fifo::default()),
        }
    }

    /// Whether anything can be popped.
    pub fn any(&self) -> bool {
        match self {
            Rest::Fifo(f) => f.live > 0,
            Rest::Fair(q) => q.nback > 0,
        }
    }

    /// Queue a task (its seq already set); `held`: its tenant is held back now.
    pub fn push(&mut self, tenant: &Tenant, entry: Entry, held: bool) {
        match self {
            Rest::Fifo(f) => f.push(entry),
            Rest::Fair(q) => q.push(tenant, entry, held),
        }
    }

    /// The next task, if any.
    pub fn pop(&mut self, tasks: &[Option<Slot>], charge_of: ChargeOf) -> Option<usize> {
        match self {
            Rest::Fifo(f) => f.pop(tasks),
            Rest::Fair(q) => q.pop(tasks, charge_of),
        }
    }

    /// A task queued here has just left (its slot is already freed or changed).
    pub fn discard(&mut self, tasks: &[Option<Slot>], tenant: &Tenant, seq: u64) {
        match self {
            Rest::Fifo(f) => f.discard(tasks),
            Rest::Fair(q) => q.discard(tasks, tenant, seq),
        }
    }

    /// Every queued task's entry, in arrival order.
    pub fn entries_in_order(&self, tasks: &[Option<Slot>]) -> Vec<Entry> {
        let mut out = match self {
            Rest::Fifo(f) => f.queue.iter().copied().filter(|e| is_live(tasks, *e, State::Queued)).collect(),
            Rest::Fair(q) => q.entries(tasks),
        };
        out.sort_unstable();
        out
    }
}

/// The deadline tasks of one tenant that has a ceiling, rate or minimum, in one class: passed over
/// while the tenant is held back.
#[derive(Debug, Default)]
struct EdfGroup {
    heap: BinaryHeap<Timed>,
    blocked: bool,
}

/// Whether a task's tenant has a ceiling, rate or minimum, and if so whether it is held back now.
pub type Held = Option<bool>;

/// One priority class of one pool: deadline tasks by EDF, then the rest.
#[derive(Debug)]
pub struct ClassQueue {
    /// Deadline tasks of tenants with nothing that holds them back.
    edf: BinaryHeap<Timed>,
    /// Deadline tasks of tenants that have a ceiling, rate or minimum, by tenant.
    groups: HashMap<Tenant, EdfGroup>,
    /// Queued deadline tasks of this class (the heaps may hold more entries: stale ones).
    edf_live: usize,
    /// The fair or FIFO part.
    pub rest: Rest,
    /// Tasks in state queued in this class.
    pub queued: usize,
}

/// A clean heap's top: stale and overdue entries dropped (an overdue one stays queued for expire).
fn clean_top(heap: &mut BinaryHeap<Timed>, tasks: &[Option<Slot>], now: f64) -> Option<(f64, u64)> {
    while let Some(Reverse((deadline, seq, slot))) = heap.peek() {
        if is_live(tasks, (*seq, *slot), State::Queued) && deadline.0 > now {
            return Some((deadline.0, *seq));
        }
        heap.pop();
    }
    None
}

impl ClassQueue {
    /// An empty class (see [`Rest::new`]).
    pub fn new(fair: Option<(Arc<Weights>, bool)>) -> ClassQueue {
        ClassQueue { edf: BinaryHeap::new(), groups: HashMap::new(), edf_live: 0, rest: Rest::new(fair), queued: 0 }
    }

    /// Queue a task whose seq is set: by deadline if it has one.
    pub fn push(&mut self, tenant: &Tenant, deadline: Option<f64>, entry: Entry, held: Held) {
        match deadline {
            Some(d) => {
                let item = Reverse((Time(d), entry.0, entry.1));
                match held {
                    None => self.edf.push(item),
                    Some(blocked) => self
                        .groups
                        .entry(tenant.clone())
                        .or_insert(EdfGroup { heap: BinaryHeap::new(), blocked })
                        .heap
                        .push(item),
                }
                self.edf_live += 1;
            }
            None => self.rest.push(tenant, entry, held == Some(true)),
        }
        self.queued += 1;
    }

    /// The heap (None: the root one) whose top is the earliest live deadline of a tenant not held back.
    fn best_edf(&mut self, tasks: &[Option<Slot>], now: f64) -> Option<(f64, Option<Tenant>)> {
        let mut best: Option<((f64, u64), Option<Tenant>)> = clean_top(&mut self.edf, tasks, now).map(|k| (k, None));
        let mut emptied = false;
        for (tenant, group) in self.groups.iter_mut() {
            if group.blocked {
                continue;
            }
            match clean_top(&mut group.heap, tasks, now) {
                Some(key) => {
                    if best.as_ref().is_none_or(|(b, _)| key.0 < b.0 || (key.0 == b.0 && key.1 < b.1)) {
                        best = Some((key, Some(tenant.clone())));
                    }
                }
                None => emptied |= group.heap.is_empty(),
            }
        }
        if emptied {
            self.drop_empty_groups();
        }
        best.map(|((d, _), at)| (d, at))
    }

    /// Forget the groups that hold no entry: with a default ceiling every tenant met has one, and
    /// this walk visits them all. A group made again on the tenant's next deadline task takes its
    /// held state then, the same one `set_blocked` would have kept.
    fn drop_empty_groups(&mut self) {
        self.groups.retain(|_, g| !g.heap.is_empty());
    }

    /// Groups of deadline tasks held now (one per tenant with a ceiling, rate or minimum that has
    /// queued deadline tasks, or stale entries of them).
    #[cfg(test)]
    pub(super) fn edf_groups(&self) -> usize {
        self.groups.len()
    }

    /// Remove the next task of this class, never one whose deadline <= now: deadline tasks first,
    /// then a tenant of `needy` (under its minimum), then the fair or FIFO order.
    pub fn pop(&mut self, tasks: &[Option<Slot>], now: f64, needy: &[Tenant], charge_of: ChargeOf) -> Option<usize> {
        if self.edf_live > 0 {
            if let Some((_, at)) = self.best_edf(tasks, now) {
                let heap = match &at {
                    None => &mut self.edf,
                    Some(tenant) => &mut self.groups.get_mut(tenant).expect("found").heap,
                };
                let Reverse((_, _, slot)) = heap.pop().expect("a clean top");
                if let Some(tenant) = at.filter(|_| heap.is_empty()) {
                    self.groups.remove(&tenant);
                }
                self.edf_live -= 1;
                return Some(slot);
            }
        }
        if !needy.is_empty() {
            if let Rest::Fair(q) = &mut self.rest {
                if let Some(slot) = q.pop_needy(tasks, needy, charge_of) {
                    return Some(slot);
                }
            }
        }
        self.rest.pop(tasks, charge_of)
    }

    /// The deadline of the task `pop(now)` would return (infinity for none), None if nothing is ready.
    pub fn peek_deadline(&mut self, tasks: &[Option<Slot>], now: f64) -> Option<f64> {
        if self.edf_live > 0 {
            if let Some((d, _)) = self.best_edf(tasks, now) {
                return Some(d);
            }
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
        let held: usize = self.edf.len() + self.groups.values().map(|g| g.heap.len()).sum::<usize>();
        if held > 2 * self.edf_live + 16 {
            let keep = |heap: &mut BinaryHeap<Timed>| {
                let old = std::mem::take(heap);
                *heap = old.into_iter().filter(|Reverse((_, s, i))| is_live(tasks, (*s, *i), State::Queued)).collect();
            };
            keep(&mut self.edf);
            for group in self.groups.values_mut() {
                keep(&mut group.heap);
            }
            self.groups.retain(|_, g| !g.heap.is_empty());
        }
    }

    /// `tenant` is held back (`blocked`) or let go: its deadline tasks are passed over, or not.
    pub fn set_blocked(&mut self, tenant: &Tenant, blocked: bool) {
        if let Some(group) = self.groups.get_mut(tenant) {
            group.blocked = blocked;
        }
        if let Rest::Fair(q) = &mut self.rest {
            if blocked {
                q.block(tenant);
            } else {
                q.unblock(tenant);
            }
        }
    }

    /// Re-sort the deadline tasks after the ceilings changed: `held` says, per tenant, whether it
    /// has a ceiling, rate or minimum now and whether it is held back.
    pub fn regroup(&mut self, tasks: &[Option<Slot>], held: &dyn Fn(&Tenant) -> Held) {
        let mut entries: Vec<Timed> = std::mem::take(&mut self.edf).into_vec();
        for (_, group) in self.groups.drain() {
            entries.extend(group.heap.into_vec());
        }
        for item in entries {
            let Reverse((_, seq, slot)) = item;
            if !is_live(tasks, (seq, slot), State::Queued) {
                continue;
            }
            let tenant = tasks[slot].as_ref().expect("live").tenant.clone();
            match held(&tenant) {
                None => self.edf.push(item),
                Some(blocked) => {
                    self.groups.entry(tenant).or_insert(EdfGroup { heap: BinaryHeap::new(), blocked }).heap.push(item)
                }
            }
        }
    }

    /// Take new weights (or a new kind of queue: `rebuild`, from V = 0, the backlog kept in arrival
    /// order); `held` as for [`regroup`](Self::regroup).
    pub fn reconfigure(
        &mut self,
        tasks: &[Option<Slot>],
        fair: Option<(Arc<Weights>, bool)>,
        rebuild: bool,
        held: &dyn Fn(&Tenant) -> Held,
    ) {
        if rebuild {
            let backlog = self.rest.entries_in_order(tasks);
            self.rest = Rest::new(fair);
            for entry in backlog {
                let tenant = tasks[entry.1].as_ref().expect("live").tenant.clone();
                self.rest.push(&tenant, entry, held(&tenant) == Some(true));
            }
        } else if let (Rest::Fair(q), Some((weights, _))) = (&mut self.rest, fair) {
            q.reweight(weights);
        }
    }

    /// Queued deadline tasks of this class.
    pub(super) fn deadlined(&self) -> usize {
        self.edf_live
    }

    /// Queued deadline tasks the EDF order puts before the one keyed `(deadline, seq)`, and whether
    /// that is exact: only the entries earlier than the key are visited (a heap's earlier entries
    /// form a subtree at its top), at most `scan`. Tenants held back are passed over, and so are
    /// tasks whose deadline is past (they are about to expire).
    pub(super) fn earlier_deadlines(
        &self,
        tasks: &[Option<Slot>],
        key: (f64, u64),
        now: f64,
        scan: usize,
    ) -> (u64, bool) {
        let heaps = std::iter::once(&self.edf).chain(self.groups.values().filter(|g| !g.blocked).map(|g| &g.heap));
        let (mut count, mut visits) = (0, 0);
        for heap in heaps {
            let entries = heap.as_slice();
            let mut work = vec![0usize];
            while let Some(at) = work.pop() {
                let Some(Reverse((deadline, seq, slot))) = entries.get(at) else { continue };
                if (deadline.0, *seq) >= key {
                    continue; // nothing below it in this heap is earlier either
                }
                visits += 1;
                if visits > scan {
                    return (count, false);
                }
                work.extend([2 * at + 1, 2 * at + 2]);
                if deadline.0 > now && is_live(tasks, (*seq, *slot), State::Queued) {
                    count += 1;
                }
            }
        }
        (count, true)
    }

    /// Correct what a run of `tenant` was charged by `charge` quanta (a fair class only).
    pub fn correct(&mut self, tenant: &Tenant, charge: i64, held: bool) {
        if let Rest::Fair(q) = &mut self.rest {
            if charge != 0 {
                q.correct(tenant, charge, held);
            }
        }
    }

    /// What the last fair dispatch of this class charged, in quanta (charging pools).
    pub fn charged(&self) -> Option<i64> {
        match &self.rest {
            Rest::Fair(q) if q.charging => Some(q.charged),
            _ => None,
        }
    }
}
