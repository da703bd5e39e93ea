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

/// How many `/`-separated levels a tenant name may have (Python's `MAX_TENANT_DEPTH`).
pub const MAX_TENANT_DEPTH: usize = 8;

/// A tenant's name in a pool (None: tasks without a tenant).
pub type Tenant = Option<Arc<str>>;

/// The nodes from the top of the tenant tree down to `tenant`: `acme`, `acme/search` for
/// `acme/search`; the tenant alone for a top-level one (or none). A name that is not a valid path
/// (an empty level, too many levels) is one opaque top-level name, as in the Python core's
/// `tenant_path`: `submit` refuses such names, so only a check-free caller could bring one.
pub fn tenant_path(tenant: &Tenant) -> Vec<Tenant> {
    let Some(name) = tenant.as_deref().filter(|name| name.contains('/')) else {
        return vec![tenant.clone()];
    };
    let levels: Vec<&str> = name.split('/').collect();
    if levels.iter().any(|level| level.is_empty()) || levels.len() > MAX_TENANT_DEPTH {
        return vec![tenant.clone()];
    }
    let mut path: Vec<Tenant> = name.match_indices('/').map(|(at, _)| Some(Arc::from(&name[..at]))).collect();
    path.push(tenant.clone());
    path
}

/// Whether `tenant` is `node` or a node below it.
pub fn is_within(tenant: &Tenant, node: &Tenant) -> bool {
    match (tenant.as_deref(), node.as_deref()) {
        (Some(t), Some(n)) => t == n || (t.len() > n.len() && t.starts_with(n) && t.as_bytes()[n.len()] == b'/'),
        (t, n) => t == n,
    }
}

/// What `explain` reads of one node of a tenant's path in a fair class (Python's `flow_share`,
/// `flow_lag`).
#[derive(Debug, Clone, Copy)]
pub(super) struct FlowReading {
    /// Queued tasks in its subtree.
    pub live: usize,
    /// The fraction of its parent's fair dispatches it gets now (0 while it cannot go).
    pub share: f64,
    /// Dispatches it trails (+) or leads (-) its share among its siblings by: `(V - S) / step`.
    pub lag: f64,
    /// Its weight among its siblings.
    pub weight: f64,
}

/// `a - b` in tag units, as a float (exact integer tags subtracted exactly first).
fn tag_difference(a: Tag, b: Tag) -> f64 {
    match (a, b) {
        (Tag::Exact(a), Tag::Exact(b)) => (a - b) as f64,
        (a, b) => a.as_f64() - b.as_f64(),
    }
}

/// What a fair dispatch charges, in quanta (thousandths of a unit), given the task's slot.
pub type ChargeOf<'a> = &'a dyn Fn(usize) -> i64;

/// Whether a node of the tenant tree is held back now (at its ceiling or out of rate tokens).
pub type Capped<'a> = &'a dyn Fn(&Tenant) -> bool;

type NodeId = usize;
type GroupId = usize;

/// The root group of a class's tree: the top-level tenants.
const ROOT: GroupId = 0;

/// One node of the tenant tree inside one fair class (Python's `Flow`): its tags, and either its
/// FIFO of tasks (a leaf) or the group of its children (`sub`), in which its own tasks, if any, are
/// one more child of weight 1 named after it. While a leaf is `on` (in its group's heap) the front
/// of its chain is live and holds the start tag.
#[derive(Debug)]
struct Node {
    /// Its full name: its key in its parent group.
    name: Tenant,
    weight: f64,
    step: Tag,
    /// Start tag S (meaningful while on).
    tag: Tag,
    /// S of its last dispatch; None before the first and once it forgot its past.
    last: Option<Tag>,
    /// F: S of its last dispatch + its charge/w (0 before the first); kept while idle.
    finish: Tag,
    /// The generation of its live heap entry: entries of older generations are stale. Drawn from
    /// one counter per queue, so an entry never matches a node made later in a reused place.
    gen: u64,
    /// The group it is a child of.
    parent: GroupId,
    /// The group of its children, once it has any (None for a leaf).
    sub: Option<GroupId>,
    /// Queued tasks in its subtree while it has children (its chain is empty then).
    nq: usize,
    /// The arrival in its current heap entry (kept for nodes with children).
    hseq: u64,
    /// Holds a live heap entry and counts in its group's `nback` and `wsum`.
    on: bool,
    /// Held back (at its ceiling or out of tokens): out of the heap although it may have tasks.
    capped: bool,
    /// Dispatched since its past was last forgotten (survives a forget by a ceiling): tells where
    /// its own tasks stand when it gets its first sub-tenant.
    served: bool,
    /// Charged pools: the quanta F is ahead of `last` (the last charge and corrections since).
    owed: i64,
    chain: Fifo,
}

impl Node {
    fn head_seq(&self) -> u64 {
        self.chain.queue.front().expect("a backlogged leaf has a head").0
    }

    fn backlogged(&self) -> bool {
        self.chain.live > 0 || self.nq > 0
    }
}

/// A node's place in its group's order: (start tag, arrival of the task it would hand out).
type TieKey = (Tag, u64);

/// (start tag, arrival of the task the node would hand out, generation, node).
type HeadEntry = Reverse<(Tag, u64, u64, NodeId)>;

/// Siblings sharing what their parent gets by SFQ (Python's `FairQueue`): the root group of a
/// class, or the children of one node (`owner`).
#[derive(Debug)]
struct Group {
    flows: HashMap<Tenant, NodeId>,
    heap: BinaryHeap<HeadEntry>,
    heap_stale: usize,
    /// V: the start tag of its last dispatch.
    vtime: Tag,
    /// Children with a live heap entry (backlogged and not held back), and their weights' sum.
    nback: usize,
    wsum: f64,
    /// Children with queued tasks in their subtree, held back or not, and their weights' sum.
    nbusy: usize,
    bsum: f64,
    sweep_at: usize,
    owner: Option<NodeId>,
}

impl Group {
    fn new(vtime: Tag, owner: Option<NodeId>) -> Group {
        Group {
            flows: HashMap::new(),
            heap: BinaryHeap::new(),
            heap_stale: 0,
            vtime,
            nback: 0,
            wsum: 0.0,
            nbusy: 0,
            bsum: 0.0,
            sweep_at: MIN_SWEEP,
            owner,
        }
    }
}

/// Hierarchical weighted start-time fair queuing over the tenant tree of one class
/// (docs/scheduling.md, "Tenant trees"), node for node the Python core's `FairQueue`.
///
/// Within every group of siblings only the children that can be dispatched from hold a start tag
/// `S = max(V, F[c])`; a dispatch walks down from the root by the smallest (S, arrival) at each
/// level, takes the leaf's oldest task, and walks back up advancing every group's V and re-tagging
/// every node on the way: O(depth × log siblings). A tenant without `/` is a top-level node, so a
/// pool of flat tenants takes the same paths with a depth of one.
///
/// What a dispatch charges is the pool's `share_by`: one step `1/w` (`charging` false), or the
/// quanta `ChargeOf` gives, `charge/w` at every level, exact in integer tags (weights.rs). In a
/// pool that shares by run time a run's charge is corrected when it ends (`correct`): a node in
/// its heap moves by the whole difference, even below V (it was overcharged while backlogged, so it
/// is owed that); V never goes back. A node held back (`block`) keeps its tasks and tags but no heap
/// entry, and a group whose children are all held back or idle leaves its own parent's heap the same
/// way; let go, a node rejoins at max(V, F), banking nothing. A node under its minimum
/// (`pop_needy`) is served ahead of the fair order, moving each V no further than the smallest tag
/// there.
///
/// Nodes and groups live in two tables indexed by number (freed places are reused), as the Python
/// core's objects point at each other.
#[derive(Debug)]
pub struct FairQueue {
    weights: Arc<Weights>,
    charging: bool,
    nodes: Vec<Option<Node>>,
    free_nodes: Vec<NodeId>,
    groups: Vec<Option<Group>>,
    free_groups: Vec<GroupId>,
    generation: u64,
    /// What the last fair dispatch charged, in quanta (charging pools).
    pub charged: i64,
}

const MIN_SWEEP: usize = 64;

/// One step of a node of tag step `step`: what `owed` quanta cost it when the pool charges by cost,
/// else the step itself.
fn one_step(weights: &Weights, charging: bool, step: Tag, owed: i64) -> Tag {
    if charging {
        weights.advance(step, owed)
    } else {
        step
    }
}

impl FairQueue {
    fn new(weights: Arc<Weights>, charging: bool) -> FairQueue {
        let root = Group::new(weights.zero(), None);
        FairQueue {
            weights,
            charging,
            nodes: Vec::new(),
            free_nodes: Vec::new(),
            groups: vec![Some(root)],
            free_groups: Vec::new(),
            generation: 0,
            charged: 0,
        }
    }

    // -- the tables ------------------------------------------------------------

    fn node(&self, id: NodeId) -> &Node {
        self.nodes[id].as_ref().expect("a live node")
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        self.nodes[id].as_mut().expect("a live node")
    }

    fn group(&self, id: GroupId) -> &Group {
        self.groups[id].as_ref().expect("a live group")
    }

    fn group_mut(&mut self, id: GroupId) -> &mut Group {
        self.groups[id].as_mut().expect("a live group")
    }

    fn new_group(&mut self, owner: NodeId) -> GroupId {
        let group = Group::new(self.weights.zero(), Some(owner));
        match self.free_groups.pop() {
            Some(id) => {
                self.groups[id] = Some(group);
                id
            }
            None => {
                self.groups.push(Some(group));
                self.groups.len() - 1
            }
        }
    }

    /// Drop a node and everything below it.
    fn free_node(&mut self, id: NodeId) {
        let node = self.nodes[id].take().expect("a live node");
        self.free_nodes.push(id);
        if let Some(sub) = node.sub {
            self.free_group(sub);
        }
    }

    fn free_group(&mut self, id: GroupId) {
        let group = self.groups[id].take().expect("a live group");
        self.free_groups.push(id);
        for child in group.flows.into_values() {
            self.free_node(child);
        }
    }

    /// A new generation for the node's heap entry: its older entries are stale from now on.
    fn renew(&mut self, id: NodeId) -> u64 {
        self.generation += 1;
        let gen = self.generation;
        self.node_mut(id).gen = gen;
        gen
    }

    fn is_current(&self, (_, _, gen, id): (Tag, u64, u64, NodeId)) -> bool {
        self.nodes.get(id).and_then(Option::as_ref).is_some_and(|n| n.gen == gen)
    }

    /// The live entry at the top of `group`'s heap, stale ones dropped on the way.
    fn top(&mut self, group: GroupId) -> Option<(Tag, u64, u64, NodeId)> {
        loop {
            let &Reverse(entry) = self.group(group).heap.peek()?;
            if self.is_current(entry) {
                return Some(entry);
            }
            let g = self.group_mut(group);
            g.heap.pop();
            g.heap_stale -= 1;
        }
    }

    fn push_entry(&mut self, group: GroupId, tag: Tag, seq: u64, id: NodeId) {
        let gen = self.node(id).gen;
        self.group_mut(group).heap.push(Reverse((tag, seq, gen, id)));
    }

    /// The node's live entry becomes stale (it stays in the heap until popped or compacted).
    fn drop_entry(&mut self, group: GroupId, id: NodeId) {
        self.renew(id);
        let g = self.groups[group].as_mut().expect("a live group");
        g.heap_stale += 1;
        if g.heap_stale * 2 > g.heap.len() {
            let nodes = &self.nodes;
            let heap = std::mem::take(&mut g.heap);
            g.heap = heap
                .into_iter()
                .filter(|Reverse((_, _, gen, id))| nodes[*id].as_ref().is_some_and(|n| n.gen == *gen))
                .collect();
            g.heap_stale = 0;
        }
    }

    /// The child of `group` named `name`, if it has one.
    fn child(&self, group: GroupId, name: &Tenant) -> Option<NodeId> {
        self.group(group).flows.get(name).copied()
    }

    /// The node at the end of `path`, if the tree holds it.
    fn find(&self, path: &[Tenant]) -> Option<NodeId> {
        let mut group = Some(ROOT);
        let mut node = None;
        for name in path {
            let id = self.child(group?, name)?;
            node = Some(id);
            group = self.node(id).sub;
        }
        node
    }

    fn new_flow(&mut self, group: GroupId, name: &Tenant, capped: Capped) -> NodeId {
        if self.group(group).flows.len() >= self.group(group).sweep_at {
            self.sweep(group);
        }
        let owner = self.group(group).owner;
        let (weight, step, capped) = if owner.is_some_and(|o| self.node(o).name == *name) {
            // The owner's own tasks: one more child, of weight 1, never held back on its own.
            (1.0, self.weights.unit_step(), false)
        } else {
            (self.weights.weight(name.as_deref()), self.weights.step(name.as_deref()), capped(name))
        };
        let zero = self.weights.zero();
        let node = Node {
            name: name.clone(),
            weight,
            step,
            tag: zero,
            last: None,
            finish: zero,
            gen: 0,
            parent: group,
            sub: None,
            nq: 0,
            hseq: 0,
            on: false,
            capped,
            served: false,
            owed: QUANTA_PER_UNIT as i64,
            chain: Fifo::default(),
        };
        let id = match self.free_nodes.pop() {
            Some(id) => {
                self.nodes[id] = Some(node);
                id
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        };
        self.group_mut(group).flows.insert(name.clone(), id);
        id
    }

    /// Forget the idle children whose F is not ahead of V (and their subtrees): V never goes back,
    /// so a fresh node would get the same tags. Done once the table has doubled since the last time,
    /// so churning tenants cost O(1) each.
    fn sweep(&mut self, group: GroupId) {
        let vtime = self.group(group).vtime;
        let gone: Vec<(Tenant, NodeId)> = self
            .group(group)
            .flows
            .iter()
            .filter(|(_, id)| {
                let n = self.node(**id);
                !(n.backlogged() || n.finish > vtime)
            })
            .map(|(name, &id)| (name.clone(), id))
            .collect();
        for (name, id) in gone {
            self.group_mut(group).flows.remove(&name);
            self.free_node(id);
        }
        let g = self.group_mut(group);
        g.sweep_at = MIN_SWEEP.max(2 * g.flows.len());
    }

    // -- joining and leaving a group's heap ----------------------------------------

    /// A child got queued tasks in its subtree after having none.
    fn busy(&mut self, group: GroupId, id: NodeId) {
        let weight = self.node(id).weight;
        let g = self.group_mut(group);
        g.nbusy += 1;
        g.bsum += weight;
    }

    /// A child has no queued task left in its subtree.
    fn idle(&mut self, group: GroupId, id: NodeId) {
        let weight = self.node(id).weight;
        let g = self.group_mut(group);
        g.nbusy -= 1;
        // Reset exactly at zero so float drift in the running sum cannot build up.
        g.bsum = if g.nbusy > 0 { g.bsum - weight } else { 0.0 };
    }

    fn count_off(&mut self, group: GroupId, id: NodeId) {
        let weight = self.node(id).weight;
        self.node_mut(id).on = false;
        let g = self.group_mut(group);
        g.nback -= 1;
        g.wsum = if g.nback > 0 { g.wsum - weight } else { 0.0 };
    }

    /// A top-level leaf became backlogged: forget its past if it banked nothing, and join.
    fn activate(&mut self, group: GroupId, id: NodeId) {
        self.busy(group, id);
        // Having banked nothing and owing nothing, it forgets its past as a fresh node would, so
        // that a reweight during this busy period cannot charge it for an earlier one.
        self.start_at_max_of_v_and_f(group, id, false);
        let node = self.node(id);
        if node.capped {
            return;
        }
        let seq = node.head_seq();
        self.enter(group, id, seq);
    }

    /// A leaf has nothing queued any more (its entry already gone).
    fn deactivate(&mut self, group: GroupId, id: NodeId) {
        self.node_mut(id).chain = Fifo::default(); // only cancelled tasks are left
        self.count_off(group, id);
        self.idle(group, id);
    }

    /// A backlogged child that can be dispatched from (again) joins the heap at max(V, F).
    fn join(&mut self, group: GroupId, id: NodeId) {
        // Having banked nothing, it forgets its past, but remembers that its own tasks were
        // served, which matters if it later gets children.
        self.start_at_max_of_v_and_f(group, id, true);
        let seq = match self.node(id).sub {
            None => self.node(id).head_seq(),
            Some(sub) => self.top(sub).expect("a group with work").1,
        };
        self.node_mut(id).hseq = seq;
        self.enter(group, id, seq);
    }

    /// The start tag of a node (re)joining `group`'s heap: its F while it banked service ahead of
    /// V; else V, its past forgotten (`served` kept only when `keep_served`).
    fn start_at_max_of_v_and_f(&mut self, group: GroupId, id: NodeId, keep_served: bool) {
        let vtime = self.group(group).vtime;
        let zero = self.weights.zero();
        let node = self.node_mut(id);
        if node.finish > vtime {
            node.tag = node.finish;
        } else {
            node.tag = vtime;
            node.served = keep_served && (node.served || node.last.is_some());
            node.last = None;
            node.finish = zero;
        }
    }

    /// Put the node in `group`'s heap at its start tag, its entry keyed by arrival `seq`, and count
    /// it among the group's backlogged children.
    fn enter(&mut self, group: GroupId, id: NodeId, seq: u64) {
        self.renew(id);
        let node = self.node_mut(id);
        node.on = true;
        let (tag, weight) = (node.tag, node.weight);
        self.push_entry(group, tag, seq, id);
        let g = self.group_mut(group);
        g.nback += 1;
        g.wsum += weight;
    }

    /// A child still backlogged (or just idle) leaves the heap.
    fn leave(&mut self, group: GroupId, id: NodeId) {
        self.drop_entry(group, id);
        self.count_off(group, id);
    }

    /// `group`'s heap changed: bring its owner's entry in its parent (and so on up) in line.
    fn settle(&mut self, mut group: GroupId) {
        while let Some(owner) = self.group(group).owner {
            let parent = self.node(owner).parent;
            let (on, capped, hseq, tag) = {
                let n = self.node(owner);
                (n.on, n.capped, n.hseq, n.tag)
            };
            let nback = self.group(group).nback;
            if on {
                if capped || nback == 0 {
                    self.leave(parent, owner);
                } else {
                    let seq = self.top(group).expect("a group with work").1;
                    if seq == hseq {
                        return;
                    }
                    // Same tag, new tie-break: the task the owner would hand out changed.
                    self.drop_entry(parent, owner);
                    self.node_mut(owner).hseq = seq;
                    self.push_entry(parent, tag, seq, owner);
                }
            } else if capped || nback == 0 {
                return;
            } else {
                self.join(parent, owner);
            }
            group = parent;
        }
    }

    // -- queueing ------------------------------------------------------------------

    /// Queue a task of the node at the end of `path` (tenant_path of its tenant).
    fn push(&mut self, path: &[Tenant], entry: Entry, capped: Capped) {
        // A top-level leaf first: flat tenants, the common case, never walk the tree.
        let tenant = path.last().expect("a path has a node");
        let top = self.child(ROOT, tenant);
        if let Some(id) = top {
            let node = self.node_mut(id);
            if node.chain.live > 0 {
                node.chain.push(entry);
                return;
            }
        }
        let id = match top {
            Some(id) if self.node(id).sub.is_none() => id,
            None if path.len() == 1 => self.new_flow(ROOT, tenant, capped),
            _ => return self.push_deep(path, entry, capped),
        };
        self.node_mut(id).chain.push(entry);
        self.activate(ROOT, id);
    }

    /// Queue a task of a sub-tenant, or of a tenant that has sub-tenants: route it down the tree.
    fn push_deep(&mut self, path: &[Tenant], entry: Entry, capped: Capped) {
        let leaf = path.last().expect("a path has a node");
        let mut group = ROOT;
        let mut id = 0;
        for name in path {
            id = match self.child(group, name) {
                Some(id) => id,
                None => self.new_flow(group, name, capped),
            };
            if !self.node(id).backlogged() {
                self.wake(group, id);
            }
            let sub = match self.node(id).sub {
                Some(sub) => sub,
                None if name == leaf => break, // a leaf: the task joins its chain
                None => self.split(id, capped),
            };
            self.node_mut(id).nq += 1;
            group = sub;
            if name == leaf {
                // A tenant with sub-tenants: its own tasks are the child named after it.
                id = match self.child(group, name) {
                    Some(id) => id,
                    None => self.new_flow(group, name, capped),
                };
                if self.node(id).chain.live == 0 {
                    self.wake(group, id);
                }
            }
        }
        let node = self.node_mut(id);
        node.chain.push(entry);
        if node.chain.live == 1 && !node.capped {
            // It had nothing queued: it joins (its group's owner may join above it in turn).
            self.join(group, id);
            self.settle(group);
        }
    }

    /// An idle child gets work: if it banked nothing, forget its whole past (and its subtree's).
    fn wake(&mut self, group: GroupId, id: NodeId) {
        self.busy(group, id);
        let vtime = self.group(group).vtime;
        let zero = self.weights.zero();
        let node = self.node_mut(id);
        if node.finish <= vtime {
            node.last = None;
            node.finish = zero;
            node.served = false;
            // Every node below is idle too: a fresh node is the same.
            if let Some(sub) = node.sub.take() {
                self.free_group(sub);
            }
        }
    }

    /// A leaf gets its first sub-tenant: its chain becomes its own child, of weight 1. That child
    /// takes over where the leaf's own tasks stood among themselves: if they were served since the
    /// leaf's past was last forgotten, the next one is one step behind the last one (V = 0, F = one
    /// weight-1 step), as if it had always been a child.
    fn split(&mut self, id: NodeId, capped: Capped) -> GroupId {
        let sub = self.new_group(id);
        let node = self.node_mut(id);
        node.sub = Some(sub);
        let served = node.served || node.last.is_some();
        let (live, owed, name) = (node.chain.live, node.owed, node.name.clone());
        if live == 0 && !served {
            return sub;
        }
        let own = self.new_flow(sub, &name, capped);
        if served {
            // Served at the new group's virtual time, one step of what its last own task was charged.
            let vtime = self.group(sub).vtime;
            self.charge_from(own, vtime, owed);
        }
        if live == 0 {
            return sub;
        }
        let chain = std::mem::take(&mut self.node_mut(id).chain);
        self.node_mut(own).chain = chain;
        self.busy(sub, own);
        self.node_mut(id).nq = live;
        self.join(sub, own);
        let seq = self.node(own).head_seq();
        self.node_mut(id).hseq = seq; // what its entry (if any) already says
        sub
    }

    // -- dispatching ---------------------------------------------------------------

    /// Hand out the head of leaf `id` of `group` and charge it: its new tag, or it retires.
    /// `replace`: the leaf's entry is the heap's top (replaced here); else it was already dropped.
    fn take_head(&mut self, tasks: &[Option<Slot>], group: GroupId, id: NodeId, charge: i64, replace: bool) -> Tag {
        let next = self.advanced(id, charge);
        let node = self.node_mut(id);
        node.tag = next;
        if node.chain.live > 0 {
            if node.chain.stale > 0 {
                node.chain.skip_stale(tasks); // cancelled tasks left behind the old head
                if node.chain.stale > node.chain.live {
                    node.chain.compact(tasks);
                }
            }
            let seq = node.head_seq();
            if replace {
                self.group_mut(group).heap.pop();
            }
            self.push_entry(group, next, seq, id);
        } else {
            if replace {
                self.group_mut(group).heap.pop();
            }
            self.deactivate(group, id);
        }
        next
    }

    /// Charge node `id` for the dispatch at its tag: `last = S`, `F = S + charge/w`; returns F.
    fn advanced(&mut self, id: NodeId, charge: i64) -> Tag {
        let tag = self.node(id).tag;
        self.charge_from(id, tag, charge)
    }

    /// Node `id` served at `start` for `charge` (kept as `owed` when the pool charges by cost):
    /// `last = start`, `F = start + charge/w` (one step when it does not); returns F.
    fn charge_from(&mut self, id: NodeId, start: Tag, charge: i64) -> Tag {
        let node = self.nodes[id].as_mut().expect("a live node"); // beside `self.weights`: no clone of it
        node.last = Some(start);
        if self.charging {
            node.owed = charge;
        }
        node.finish = start + one_step(&self.weights, self.charging, node.step, node.owed);
        node.finish
    }

    /// The first task of leaf `id`'s chain, taken off it.
    fn unlink_head(&mut self, id: NodeId) -> usize {
        let node = self.node_mut(id);
        let (_, slot) = node.chain.queue.pop_front().expect("a backlogged leaf has a head");
        node.chain.live -= 1;
        slot
    }

    fn charge(&mut self, slot: usize, charge_of: ChargeOf) -> i64 {
        if !self.charging {
            return 0;
        }
        let charge = charge_of(slot);
        self.charged = charge;
        charge
    }

    /// Remove and return the next task by (S, arrival) at every level, or None if none can go.
    fn pop(&mut self, tasks: &[Option<Slot>], charge_of: ChargeOf) -> Option<usize> {
        let mut group = ROOT;
        let (mut tag, _, _, mut id) = self.top(group)?;
        while let Some(sub) = self.node(id).sub {
            group = sub;
            (tag, _, _, id) = self.top(group).expect("a node in the heap has work below");
        }
        // The leaf: hand out its head, re-tag it in its group.
        let slot = self.unlink_head(id);
        let charge = self.charge(slot, charge_of);
        // Only a corrected tag can be below V: V never goes back.
        let g = self.group_mut(group);
        if tag > g.vtime {
            g.vtime = tag;
        }
        self.take_head(tasks, group, id, charge, true);
        // Then every node above it, up to the root: each was at the top of its group's heap.
        while let Some(owner) = self.group(group).owner {
            let below = group;
            group = self.node(owner).parent;
            let tag = self.node(owner).tag;
            let g = self.group_mut(group);
            if tag > g.vtime {
                g.vtime = tag;
            }
            let next = self.advanced(owner, charge);
            self.rise(group, below, owner, next, true);
        }
        Some(slot)
    }

    /// Node `id` of `group`, whose group of children `below` just handed out a task, takes its new
    /// tag `next` if work below can still go, or leaves the heap. `replace`: its entry is the heap's
    /// top (replaced here); else it was already dropped.
    fn rise(&mut self, group: GroupId, below: GroupId, id: NodeId, next: Tag, replace: bool) {
        let node = self.node_mut(id);
        node.nq -= 1;
        if node.nq == 0 {
            self.idle(group, id);
        }
        if replace {
            self.group_mut(group).heap.pop();
        }
        if self.group(below).nback > 0 {
            let seq = self.top(below).expect("a group with work").1;
            let node = self.node_mut(id);
            node.tag = next;
            node.hseq = seq;
            self.push_entry(group, next, seq, id);
        } else {
            // Out of work, or what is left is held back: out of the heap either way.
            self.count_off(group, id);
        }
    }

    /// The next task of the first of the nodes at `needy` (nodes under their minimum) that can be
    /// dispatched from, in the fair order among them: by (S, arrival) compared level by level down
    /// their paths. None if none of them can.
    fn pop_needy(&mut self, tasks: &[Option<Slot>], needy: &[Vec<Tenant>], charge_of: ChargeOf) -> Option<usize> {
        // The nodes down the best path so far, and their (S, arrival) keys.
        let mut best: Option<(Vec<NodeId>, Vec<TieKey>)> = None;
        'paths: for path in needy {
            let (mut ids, mut key) = (Vec::new(), Vec::new());
            let mut group = Some(ROOT);
            for name in path {
                let Some(id) = group.and_then(|g| self.child(g, name)) else { continue 'paths };
                let node = self.node(id);
                if !node.on {
                    continue 'paths;
                }
                ids.push(id);
                key.push((node.tag, if node.sub.is_none() { node.head_seq() } else { node.hseq }));
                group = node.sub;
            }
            if best.as_ref().is_none_or(|(_, best_key)| key < *best_key) {
                best = Some((ids, key));
            }
        }
        let (forced, _) = best?;
        Some(self.pop_along(tasks, forced, charge_of))
    }

    /// Pop down the `forced` nodes (each in its heap, the first a top-level one), then by the
    /// smallest (S, arrival) below the last, and re-tag every node on the way back up, moving each
    /// group's V no further than the smallest tag there (what a fair dispatch would have moved it to).
    fn pop_along(&mut self, tasks: &[Option<Slot>], mut path: Vec<NodeId>, charge_of: ChargeOf) -> usize {
        let mut leaf = *path.last().expect("a needy node");
        while let Some(sub) = self.node(leaf).sub {
            leaf = self.top(sub).expect("a node in the heap has work below").3;
            path.push(leaf);
        }
        let slot = self.unlink_head(leaf);
        let charge = self.charge(slot, charge_of);
        for &id in path.iter().rev() {
            let group = self.node(id).parent;
            let smallest = self.top(group).expect("the node is in the heap").0;
            let g = self.group_mut(group);
            if smallest > g.vtime {
                g.vtime = smallest;
            }
            self.drop_entry(group, id);
            match self.node(id).sub {
                None => {
                    self.take_head(tasks, group, id, charge, false);
                }
                Some(below) => {
                    let next = self.advanced(id, charge);
                    self.rise(group, below, id, next, false);
                }
            }
        }
        slot
    }

    // -- corrections, ceilings, cancels ----------------------------------------------

    /// A run of the node at `path` turned out to cost `charge` more quanta (fewer, if negative)
    /// than it was charged: move F, and the tag of a node in the heap, by that at every level of
    /// its path that still remembers its past.
    fn correct(&mut self, path: &[Tenant], charge: i64, capped: Capped) {
        let last = path.len() - 1;
        let mut group = Some(ROOT);
        let mut depth = 0;
        while let Some(g) = group {
            if depth > last + 1 {
                return;
            }
            let name = &path[depth.min(last)];
            let id = match self.child(g, name) {
                Some(id) => id,
                // Forgotten while idle: it banked nothing, and credit it is not owed.
                None if charge <= 0 || depth > last => return,
                None => self.new_flow(g, name, capped),
            };
            let amount = self.weights.advance(self.node(id).step, charge);
            self.correct_child(g, id, charge, amount);
            let sub = self.node(id).sub;
            if depth > last || (depth == last && sub.is_none()) {
                return;
            }
            group = sub;
            depth += 1;
        }
    }

    /// Move one child's F (and its tag, if it is in the heap) by `amount` tag units (`charge` quanta).
    fn correct_child(&mut self, group: GroupId, id: NodeId, charge: i64, amount: Tag) {
        let vtime = self.group(group).vtime;
        let node = self.node_mut(id);
        if node.on {
            if node.last.is_none() {
                // It joined at V having forgotten its past: that join is its last start now.
                node.last = Some(node.tag);
                node.owed = 0;
            }
            node.owed += charge;
            node.tag = node.tag + amount;
            node.finish = node.tag;
            let (tag, seq) = (node.tag, if node.sub.is_none() { node.head_seq() } else { node.hseq });
            self.drop_entry(group, id);
            self.push_entry(group, tag, seq, id);
            if self.group(group).owner.is_some() {
                self.settle(group);
            }
        } else if node.finish > vtime && node.last.is_some() {
            node.owed += charge;
            node.finish = node.finish + amount;
        } else if charge > 0 {
            // It owed nothing: it owes this from now on.
            node.last = Some(vtime);
            node.owed = charge;
            node.finish = vtime + amount;
        }
    }

    /// The node at `path` is held back: out of its parent's heap, its tasks and tags kept.
    fn block(&mut self, path: &[Tenant]) {
        let Some(id) = self.find(path) else { return };
        let node = self.node_mut(id);
        node.capped = true;
        if node.on {
            let group = node.parent;
            self.leave(group, id);
            self.settle(group);
        }
    }

    /// The node at `path` may go again: it rejoins at max(V, F) if it has work that can go.
    fn unblock(&mut self, path: &[Tenant]) {
        let Some(id) = self.find(path) else { return };
        let node = self.node_mut(id);
        node.capped = false;
        let (on, live, sub, group) = (node.on, node.chain.live, node.sub, node.parent);
        let work = live > 0 || sub.is_some_and(|sub| self.group(sub).nback > 0);
        if !on && work {
            self.join(group, id);
            self.settle(group);
        }
    }

    /// A queued task (arrival `seq`) of the node at `path` left without being popped.
    fn discard(&mut self, tasks: &[Option<Slot>], path: &[Tenant], seq: u64) {
        let last = path.len() - 1;
        let mut group = ROOT;
        let mut leaf = None;
        for (depth, name) in path.iter().enumerate() {
            let id = self.child(group, name).expect("a queued task's node exists");
            leaf = Some(id);
            let Some(sub) = self.node(id).sub else { break };
            let node = self.node_mut(id);
            node.nq -= 1;
            if node.nq == 0 {
                self.idle(group, id);
            }
            group = sub;
            if depth == last {
                leaf = self.child(group, name);
            }
        }
        let leaf = leaf.expect("a queued task's own tasks have a node");
        self.discard_from(tasks, group, leaf, seq);
    }

    /// A task (arrival `seq`) of leaf `id`, a child of `group`, left the queue.
    fn discard_from(&mut self, tasks: &[Option<Slot>], group: GroupId, id: NodeId, seq: u64) {
        let node = self.node_mut(id);
        let was_head = node.chain.queue.front().is_some_and(|e| e.0 == seq);
        node.chain.live -= 1;
        node.chain.stale += 1;
        if node.chain.live == 0 {
            if node.on {
                self.drop_entry(group, id);
                self.deactivate(group, id);
            } else {
                node.chain = Fifo::default(); // held back: only cancelled tasks are left
                self.idle(group, id);
            }
        } else if was_head {
            // The successor inherits the head's tag (a cancelled task is never charged); only the
            // tie-break changes, so the entry is replaced.
            node.chain.skip_stale(tasks);
            if !node.on {
                return;
            }
            let (tag, head) = (node.tag, node.head_seq());
            self.drop_entry(group, id);
            self.push_entry(group, tag, head, id);
        } else {
            if node.chain.stale > node.chain.live {
                node.chain.compact(tasks);
            }
            return;
        }
        if self.group(group).owner.is_some() {
            self.settle(group);
        }
    }

    // -- reloads ---------------------------------------------------------------------

    /// Take new weights (a reload): every backlogged node, at every level, is re-tagged as if its
    /// last dispatch had had its new weight, `max(V, S_last + charge/w_new)`; every heap is rebuilt.
    fn reweight(&mut self, weights: Arc<Weights>) {
        if let Some(conversion) = self.weights.conversion(&weights) {
            for group in self.groups.iter_mut().flatten() {
                group.vtime = group.vtime.rescale(conversion);
            }
            for node in self.nodes.iter_mut().flatten() {
                node.tag = node.tag.rescale(conversion);
                node.finish = node.finish.rescale(conversion);
                node.last = node.last.map(|t| t.rescale(conversion));
            }
        }
        self.weights = weights;
        self.retag(ROOT);
    }

    /// New weights for every node of `group` and below; heaps rebuilt bottom-up.
    fn retag(&mut self, group: GroupId) {
        let (vtime, owner) = (self.group(group).vtime, self.group(group).owner);
        let owner_name = owner.map(|o| self.node(o).name.clone());
        let children: Vec<(Tenant, NodeId)> = self.group(group).flows.iter().map(|(n, &id)| (n.clone(), id)).collect();
        let (mut wsum, mut bsum) = (0.0, 0.0);
        let mut entries = Vec::new();
        for (name, id) in children {
            let sub = self.node(id).sub;
            if let Some(sub) = sub {
                self.retag(sub);
            }
            let (weight, step) = if owner_name.as_ref() == Some(&name) {
                (1.0, self.weights.unit_step())
            } else {
                (self.weights.weight(name.as_deref()), self.weights.step(name.as_deref()))
            };
            let charging = self.charging;
            let node = self.nodes[id].as_mut().expect("a live node"); // beside `self.weights`: no clone of it
            if node.on {
                wsum += weight;
            }
            node.weight = weight;
            node.step = step;
            if !node.backlogged() {
                continue;
            }
            bsum += weight;
            if let Some(last) = node.last {
                node.finish = last + one_step(&self.weights, charging, step, node.owed);
            }
            if node.on {
                node.tag = if node.finish > vtime { node.finish } else { vtime };
                let tag = node.tag;
                let seq = match sub {
                    None => node.head_seq(),
                    Some(sub) => self.top(sub).expect("a node in the heap has work below").1,
                };
                let gen = self.renew(id);
                self.node_mut(id).hseq = seq;
                entries.push(Reverse((tag, seq, gen, id)));
            }
        }
        let g = self.group_mut(group);
        g.heap = BinaryHeap::from(entries);
        g.heap_stale = 0;
        g.wsum = wsum;
        g.bsum = bsum;
    }

    // -- readings ----------------------------------------------------------------------

    /// Whether a task can be popped (some child of the root can go).
    fn any(&self) -> bool {
        self.group(ROOT).nback > 0
    }

    fn entries(&self, tasks: &[Option<Slot>]) -> Vec<Entry> {
        self.nodes
            .iter()
            .flatten()
            .flat_map(|n| n.chain.queue.iter().copied())
            .filter(|e| is_live(tasks, *e, State::Queued))
            .collect()
    }

    /// Each node of `path` as `explain` sees it, top first; None from the first the class has not met.
    pub(super) fn readings(&self, path: &[Tenant]) -> Vec<Option<FlowReading>> {
        let mut out = Vec::with_capacity(path.len());
        let mut group = Some(ROOT);
        for name in path {
            let Some((g, id)) = group.and_then(|g| Some((g, self.child(g, name)?))) else {
                out.push(None);
                group = None;
                continue;
            };
            out.push(Some(self.reading(g, id)));
            group = self.node(id).sub;
        }
        out
    }

    /// Where the node at `path` has sub-tenants: the reading of its own tasks, one more child of it
    /// (None inside while that child has never had a task); None when it has no sub-tenants.
    pub(super) fn own_reading(&self, path: &[Tenant]) -> Option<Option<FlowReading>> {
        let node = self.node(self.find(path)?);
        let sub = node.sub?;
        Some(self.child(sub, &node.name).map(|own| self.reading(sub, own)))
    }

    fn reading(&self, g: GroupId, id: NodeId) -> FlowReading {
        let (node, g) = (self.node(id), self.group(g));
        let share = if node.on && g.wsum > 0.0 { node.weight / g.wsum } else { 0.0 };
        let live = node.chain.live + node.nq;
        let lag = if live == 0 {
            0.0
        } else {
            // A node out of the heap rejoins at max(V, F): its lead is kept, its trailing not banked.
            let start = if node.on { node.tag } else { node.finish.max(g.vtime) };
            tag_difference(g.vtime, start) / node.step.as_f64()
        };
        FlowReading { live, share, lag, weight: node.weight }
    }

    /// The queue of the node at `path`'s own tasks, if it has one.
    pub(super) fn chain(&self, path: &[Tenant]) -> Option<&Fifo> {
        let id = self.find(path)?;
        let node = self.node(id);
        match node.sub {
            None => Some(&node.chain),
            Some(sub) => self.child(sub, &node.name).map(|own| &self.node(own).chain),
        }
    }
}

/// The part of a class that is not ordered by deadline.
#[derive(Debug)]
pub enum Rest {
    /// Pools without fairness: submission order.
    Fifo(Fifo),
    /// Fair pools: hierarchical SFQ over the tenant tree.
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
            Rest::Fair(q) => q.any(),
        }
    }

    /// Queue a task (its seq already set) of the node at `path`; `capped` tells which nodes are
    /// held back now (for the nodes made here).
    pub fn push(&mut self, path: &[Tenant], entry: Entry, capped: Capped) {
        match self {
            Rest::Fifo(f) => f.push(entry),
            Rest::Fair(q) => q.push(path, entry, capped),
        }
    }

    /// The next task, if any.
    pub fn pop(&mut self, tasks: &[Option<Slot>], charge_of: ChargeOf) -> Option<usize> {
        match self {
            Rest::Fifo(f) => f.pop(tasks),
            Rest::Fair(q) => q.pop(tasks, charge_of),
        }
    }

    /// A task of the node at `path` queued here has just left (its slot is already freed or changed).
    pub fn discard(&mut self, tasks: &[Option<Slot>], path: &[Tenant], seq: u64) {
        match self {
            Rest::Fifo(f) => f.discard(tasks),
            Rest::Fair(q) => q.discard(tasks, path, seq),
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

/// The deadline tasks of one tenant with a ceiling, rate or minimum on its path, in one class:
/// passed over while a node of its path is held back.
#[derive(Debug, Default)]
struct EdfGroup {
    heap: BinaryHeap<Timed>,
    blocked: bool,
}

/// Whether a node of the tenant tree has a ceiling, rate or minimum, and if so whether it is held
/// back now.
pub type Held = Option<bool>;

/// [`Held`] of every node.
pub type HeldOf<'a> = &'a dyn Fn(&Tenant) -> Held;

/// Whether any node of `path` has a ceiling, rate or minimum, and if so whether any is held back:
/// a deadline task is passed over while any node above it is.
fn held_on(path: &[Tenant], held: HeldOf) -> Held {
    path.iter().map(held).fold(None, |all, one| match (all, one) {
        (None, one) => one,
        (all, None) => all,
        (Some(a), Some(b)) => Some(a || b),
    })
}

/// One priority class of one pool: deadline tasks by EDF, then the rest.
#[derive(Debug)]
pub struct ClassQueue {
    /// Deadline tasks of tenants with nothing on their path that holds them back.
    edf: BinaryHeap<Timed>,
    /// Deadline tasks of tenants with a ceiling, rate or minimum on their path, by tenant.
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

    /// Queue a task whose seq is set: by deadline if it has one. `held` tells what holds back
    /// each node of the tenant tree.
    pub fn push(&mut self, tenant: &Tenant, deadline: Option<f64>, entry: Entry, held: HeldOf) {
        let path = tenant_path(tenant);
        match deadline {
            Some(d) => {
                let item = Reverse((Time(d), entry.0, entry.1));
                match held_on(&path, held) {
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
            None => self.rest.push(&path, entry, &|node| held(node) == Some(true)),
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

    /// Places in the fair tree's node table: nodes held now (backlogged ones, idle ones not swept
    /// yet) and freed places waiting to be reused.
    #[cfg(test)]
    pub(super) fn tree_node_places(&self) -> usize {
        match &self.rest {
            Rest::Fair(q) => q.nodes.len(),
            Rest::Fifo(_) => 0,
        }
    }

    /// Groups of deadline tasks held now (one per tenant with a ceiling, rate or minimum that has
    /// queued deadline tasks, or stale entries of them).
    #[cfg(test)]
    pub(super) fn edf_groups(&self) -> usize {
        self.groups.len()
    }

    /// Remove the next task of this class, never one whose deadline <= now: deadline tasks first,
    /// then a node of `needy` (the paths of the nodes under their minimum), then the fair or FIFO order.
    pub fn pop(
        &mut self,
        tasks: &[Option<Slot>],
        now: f64,
        needy: &[Vec<Tenant>],
        charge_of: ChargeOf,
    ) -> Option<usize> {
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
            self.rest.discard(tasks, &tenant_path(tenant), seq);
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

    /// Node `node` is held back (`blocked`) or let go: the deadline tasks of its subtree are passed
    /// over, or not (unless another node above them is held: `held` says which are now), and it
    /// leaves or rejoins its parent's fair order.
    pub fn set_blocked(&mut self, node: &Tenant, blocked: bool, held: HeldOf) {
        for (tenant, group) in self.groups.iter_mut() {
            if is_within(tenant, node) {
                group.blocked = held_on(&tenant_path(tenant), held) == Some(true);
            }
        }
        if let Rest::Fair(q) = &mut self.rest {
            let path = tenant_path(node);
            if blocked {
                q.block(&path);
            } else {
                q.unblock(&path);
            }
        }
    }

    /// Re-sort the deadline tasks after the ceilings changed: `held` says, per node, whether it
    /// has a ceiling, rate or minimum now and whether it is held back.
    pub fn regroup(&mut self, tasks: &[Option<Slot>], held: HeldOf) {
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
            match held_on(&tenant_path(&tenant), held) {
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
        held: HeldOf,
    ) {
        if rebuild {
            let backlog = self.rest.entries_in_order(tasks);
            self.rest = Rest::new(fair);
            for entry in backlog {
                let tenant = &tasks[entry.1].as_ref().expect("live").tenant;
                self.rest.push(&tenant_path(tenant), entry, &|node| held(node) == Some(true));
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

    /// Correct what a run of `tenant` was charged by `charge` quanta at every level of its path
    /// (a fair class only); `capped` tells which nodes are held back now.
    pub fn correct(&mut self, tenant: &Tenant, charge: i64, capped: Capped) {
        if let Rest::Fair(q) = &mut self.rest {
            if charge != 0 {
                q.correct(&tenant_path(tenant), charge, capped);
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
