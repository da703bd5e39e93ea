//! Why a task has not started yet: a pure reading of the core's state, as the Python core's
//! `core/explain.py` gives it for `explain` (no pinned caller).
//!
//! [`Core::explain`] looks at one queued or delayed task and says what stands before it, in the
//! order the rules apply: the queued tasks of higher classes, the deadline tasks of its class, its
//! tenant's place in the fair share (weight, share, lag, ceiling, rate, minimum) and its place in
//! its tenant's queue; then what holds the whole pool (paused, no worker, `max_in_flight`) and a
//! delay or retry back-off still pending. From the pool's dispatch rate, which the caller measures
//! (the core has no clock), it estimates when the task will start, or says why it cannot.
//!
//! The words of `estimate_note` are Python's, so a program that shows them reads the same from
//! either scheduler. Nothing here changes the core; the walks stop after [`EXPLAIN_SCAN`] entries
//! and then say "at least".

use super::queues::{ClassQueue, Rest, Tenant};
use super::{Core, Pool, State};

/// Entries a count looks at, at most, before it settles for a lower bound (as in Python).
pub const EXPLAIN_SCAN: usize = 1000;

/// Work ahead of a task arriving at this fraction of the pool's dispatch rate or more outruns the
/// pool: no estimate. (Not 1.0: both rates are counts over the same few seconds; see Python's.)
pub const OUTRUN: f64 = 0.95;

/// How fast tasks lately became queued in one class of a pool, per second, as the caller
/// measured it from [`Core::arrivals`]: all of them, and those with a deadline.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ClassRates {
    /// Tasks that became queued, per second.
    pub arrivals: f64,
    /// Those with a deadline, per second.
    pub deadline_arrivals: f64,
}

/// Work that goes before a task, arriving per second: of higher classes, and deadline tasks of
/// its class (for a task without a deadline).
#[derive(Debug, Clone, Copy)]
struct Arriving {
    higher: f64,
    deadlines: f64,
}

impl Arriving {
    fn total(self) -> f64 {
        self.higher + self.deadlines
    }
}

/// A node's ceiling, as [`NodeReading::ceiling`] gives it.
#[derive(Debug, Clone, PartialEq)]
pub struct CeilingReading {
    /// At most this many of its tasks run at once.
    pub limit: u64,
    /// How many run now.
    pub running: u64,
    /// At its limit.
    pub capped: bool,
    /// Since when (on the core's clock), while capped.
    pub capped_since: Option<f64>,
    /// For how many seconds, while capped.
    pub capped_for: Option<f64>,
}

/// One node of the task's tenant path (top first) as the fair share of its class sees it now.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeReading {
    /// The node's full name (`""` for tasks without a tenant).
    pub name: String,
    /// This node stands for its tenant's own tasks, one more child of the tenant's node beside its
    /// sub-tenants (named after it, of weight 1, never capped on its own).
    pub own_tasks: bool,
    /// Its weight.
    pub weight: f64,
    /// It has tasks queued in the class.
    pub backlogged: bool,
    /// The fraction of its parent's fair dispatches it gets now (of the class's, for a top-level
    /// node).
    pub share: f64,
    /// Dispatches it trails (+) or leads (-) its share by.
    pub lag: f64,
    /// Its ceiling, if it has one.
    pub ceiling: Option<CeilingReading>,
    /// Its most starts a second, if it has a rate.
    pub rate: Option<f64>,
    /// Seconds until its bucket lets it start again, while it may not.
    pub rate_limited_for: Option<f64>,
    /// The running tasks it is guaranteed, if any.
    pub minimum: Option<u64>,
    /// It runs fewer than its minimum.
    pub under_minimum: bool,
}

/// Why a queued or delayed task has not started (the fields of Python's `Waiting`).
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::struct_excessive_bools)]
pub struct Reading {
    /// Its class shares dispatches by tenant.
    pub fair: bool,
    /// Queued tasks of higher classes.
    pub higher_classes_ahead: u64,
    /// Deadline tasks of its class that go before it.
    pub deadline_ahead: u64,
    /// False: "at least".
    pub deadline_ahead_exact: bool,
    /// Tasks ahead of it in its own queue; None while delayed, or for a deadline task.
    pub queue_ahead: Option<u64>,
    /// False: "at least".
    pub queue_ahead_exact: bool,
    /// Its own queue's length.
    pub queue_length: u64,
    /// Its tenant's node (empty when the class shares nothing).
    pub nodes: Vec<NodeReading>,
    /// Its queue's share of the class's fair dispatches.
    pub tenant_share: Option<f64>,
    /// The pool is paused.
    pub paused: bool,
    /// Workers serving the pool.
    pub workers: u64,
    /// Those with a free slot.
    pub ready_workers: u64,
    /// The pool's running tasks.
    pub running: u64,
    /// The pool's cap on running tasks.
    pub max_in_flight: Option<u64>,
    /// The pool runs as many as its cap allows.
    pub at_max_in_flight: bool,
    /// Seconds of delay (or back-off) still to go.
    pub delayed_for: Option<f64>,
    /// The delay is a retry's back-off.
    pub retry: bool,
    /// The dispatch rate the caller gave.
    pub dispatch_rate: Option<f64>,
    /// How fast work that goes before it arrives, per second (None: not measured).
    pub arrival_rate_ahead: Option<f64>,
    /// Seconds until it starts, when that can be told.
    pub estimate: Option<f64>,
    /// Why there is no estimate, or what the figure assumes.
    pub estimate_note: String,
    /// What a fair dispatch charges: `dispatches`, `cost` or `seconds` (of run time).
    pub share_unit: &'static str,
}

impl Core {
    /// Why task `id` has not started; None if the core holds no such task or it runs.
    /// `dispatch_rate`: the pool's recent dispatches per second, and `arrival_rates` its classes'
    /// recent arrivals per second (highest first), as the caller measured them from
    /// [`dispatched`](Core::dispatched) and [`arrivals`](Core::arrivals) (None: not measured). Costs
    /// O(tenants of its class) plus walks of at most [`EXPLAIN_SCAN`] entries.
    pub fn explain(
        &self,
        id: &str,
        now: f64,
        dispatch_rate: Option<f64>,
        arrival_rates: Option<&[ClassRates; 4]>,
    ) -> Option<Reading> {
        let slot = self.get(id)?;
        if slot.state == State::Running {
            return None;
        }
        let pool = &self.pools[slot.pool];
        let class = &pool.classes[slot.priority as usize];
        let queued = slot.state == State::Queued;
        let higher = pool.classes[..slot.priority as usize].iter().map(|c| c.queued as u64).sum::<u64>();
        let deadlined = class.deadlined() as u64;
        let (deadline_ahead, deadline_exact) = match slot.deadline {
            None => (deadlined, true),
            Some(deadline) if queued => class.earlier_deadlines(&self.tasks, (deadline, slot.seq), now, EXPLAIN_SCAN),
            // Delayed: where it will stand is not known yet; those queued now, roughly.
            Some(_) => (deadlined, false),
        };
        let ahead_in = |chain: &super::queues::Fifo| chain.ahead_of(&self.tasks, slot.seq, EXPLAIN_SCAN);
        let mut nodes = Vec::new();
        let mut share = None;
        let (mut queue_ahead, mut queue_exact) = (None, true);
        let mut queue_length = match &class.rest {
            Rest::Fair(fair) => {
                // Its tenant's path from the top: what its queue gets is the product of the shares.
                let path = super::queues::tenant_path(&slot.tenant);
                for (name, reading) in path.iter().zip(fair.readings(&path)) {
                    nodes.push(node(pool, name, reading.as_ref(), now));
                }
                if let Some(own) = fair.own_reading(&path) {
                    nodes.push(own_tasks_node(&slot.tenant, own.as_ref()));
                }
                if slot.deadline.is_none() {
                    // A deadline task is outside the share: it goes by its deadline alone.
                    share = Some(nodes.iter().map(|n| n.share).product());
                }
                let chain = fair.chain(&path);
                if let (true, None, Some(chain)) = (queued, slot.deadline, chain) {
                    let (ahead, exact) = ahead_in(chain);
                    (queue_ahead, queue_exact) = (Some(ahead), exact);
                }
                chain.map_or(0, |c| c.live as u64)
            }
            Rest::Fifo(fifo) => {
                if queued && slot.deadline.is_none() {
                    let (ahead, exact) = ahead_in(fifo);
                    (queue_ahead, queue_exact) = (Some(ahead), exact);
                }
                fifo.live as u64
            }
        };
        if slot.deadline.is_some() {
            queue_length = deadlined;
        }
        let delayed_for = match (slot.state, slot.not_before) {
            (State::Delayed, Some(at)) => Some((at - now).max(0.0)),
            _ => None,
        };
        let arriving = arrival_rates.map(|rates| {
            let p = slot.priority as usize;
            Arriving {
                higher: rates[..p].iter().map(|r| r.arrivals).sum::<f64>().max(0.0),
                // A new deadline task goes before every task of its class without one.
                deadlines: if slot.deadline.is_none() { rates[p].deadline_arrivals.max(0.0) } else { 0.0 },
            }
        });
        let serving: Vec<_> = self.workers.iter().flatten().filter(|w| w.pools.contains(&slot.pool)).collect();
        let mut reading = Reading {
            fair: matches!(class.rest, Rest::Fair(_)),
            higher_classes_ahead: higher,
            deadline_ahead,
            deadline_ahead_exact: deadline_exact,
            queue_ahead,
            queue_ahead_exact: queue_exact,
            queue_length,
            nodes,
            tenant_share: share,
            paused: pool.paused,
            workers: serving.len() as u64,
            ready_workers: serving.iter().filter(|w| w.free > 0).count() as u64,
            running: pool.running as u64,
            max_in_flight: pool.max_in_flight.map(u64::from),
            at_max_in_flight: pool.max_in_flight.is_some_and(|cap| pool.running as u64 >= u64::from(cap)),
            delayed_for,
            retry: slot.state == State::Delayed && slot.attempts > 0,
            dispatch_rate,
            arrival_rate_ahead: arriving.map(Arriving::total),
            estimate: None,
            estimate_note: String::new(),
            share_unit: match pool.settings.share_by {
                super::ShareBy::Dispatches => "dispatches",
                super::ShareBy::Cost => "cost",
                super::ShareBy::Runtime => "seconds",
            },
        };
        let exact = deadline_exact && queue_exact;
        let ahead = higher + deadline_ahead;
        (reading.estimate, reading.estimate_note) =
            estimate(pool, class, &reading, slot.deadline, slot.attempts, ahead, arriving, exact, now);
        Some(reading)
    }
}

/// A node of the task's tenant path: its share of its parent's dispatches and its lag (none yet: nothing queued in the class), its
/// ceiling, rate and minimum.
fn node(pool: &Pool, tenant: &Tenant, flow: Option<&super::queues::FlowReading>, now: f64) -> NodeReading {
    let limits = pool.ceilings.get(tenant);
    let ceiling = limits.and_then(|c| {
        let limit = c.limit?;
        let since = if c.capped { c.since } else { None };
        Some(CeilingReading {
            limit: u64::from(limit),
            running: u64::from(c.running),
            capped: c.capped,
            capped_since: since,
            capped_for: since.map(|s| (now - s).max(0.0)),
        })
    });
    NodeReading {
        name: tenant.as_deref().unwrap_or("").to_string(),
        own_tasks: false,
        weight: pool.weights.weight(tenant.as_deref()),
        backlogged: flow.is_some_and(|f| f.live > 0),
        share: flow.map_or(0.0, |f| f.share),
        lag: flow.map_or(0.0, |f| f.lag),
        ceiling,
        rate: limits.and_then(|c| c.rate),
        rate_limited_for: limits.and_then(|c| c.limited_until).map(|until| (until - now).max(0.0)),
        minimum: limits.and_then(|c| c.minimum).map(u64::from),
        under_minimum: limits.is_some_and(super::ceilings::Ceiling::under_minimum),
    }
}

/// A tenant's own tasks where it has sub-tenants: one more child of its node, which carries no
/// ceiling, rate or minimum of its own (the tenant's node does).
fn own_tasks_node(tenant: &Tenant, flow: Option<&super::queues::FlowReading>) -> NodeReading {
    NodeReading {
        name: tenant.as_deref().unwrap_or("").to_string(),
        own_tasks: true,
        weight: flow.map_or(1.0, |f| f.weight),
        backlogged: flow.is_some_and(|f| f.live > 0),
        share: flow.map_or(0.0, |f| f.share),
        lag: flow.map_or(0.0, |f| f.lag),
        ceiling: None,
        rate: None,
        rate_limited_for: None,
        minimum: None,
        under_minimum: false,
    }
}

/// Seconds until the task starts, or None; and the sentence saying why or how (Python's
/// `_estimate`, without new work arriving ahead: the core is told no arrival rates).
#[allow(clippy::too_many_arguments)]
fn estimate(
    pool: &Pool,
    class: &ClassQueue,
    w: &Reading,
    deadline: Option<f64>,
    attempts: u32,
    ahead: u64,
    arriving: Option<Arriving>,
    exact: bool,
    now: f64,
) -> (Option<f64>, String) {
    let name = &pool.name;
    if w.paused {
        return (None, format!("pool '{name}' is paused: nothing starts until it is resumed"));
    }
    if w.workers == 0 {
        return (None, format!("no worker serves pool '{name}'"));
    }
    if let Some(delayed_for) = w.delayed_for {
        let why = if attempts > 0 { "its retry back-off" } else { "its delay" };
        return (None, format!("it may not start for another {delayed_for:.1} s ({why}); then it queues"));
    }
    let label = |n: &NodeReading| if n.name.is_empty() { "(no tenant)".to_string() } else { n.name.clone() };
    let capped: Vec<String> =
        w.nodes.iter().filter(|n| n.ceiling.as_ref().is_some_and(|c| c.capped)).map(label).collect();
    if !capped.is_empty() {
        return (
            None,
            format!(
                "{} at its ceiling: none of its tasks starts until one of its running tasks ends",
                capped.join(", ")
            ),
        );
    }
    let limited: Vec<&NodeReading> = w.nodes.iter().filter(|n| n.rate_limited_for.is_some()).collect();
    if !limited.is_empty() {
        // The slowest bucket on its path decides; the tasks ahead of it in its queue each take a token.
        let wait = limited.iter().filter_map(|n| n.rate_limited_for).fold(0.0, f64::max);
        let slowest = limited.iter().filter_map(|n| n.rate).fold(f64::INFINITY, f64::min);
        let names = limited.iter().map(|n| label(n)).collect::<Vec<_>>().join(", ");
        let queue_ahead = w.queue_ahead.unwrap_or(0);
        let seconds = wait + queue_ahead as f64 / slowest;
        let then = if queue_ahead > 0 {
            format!(", then {queue_ahead} ahead of it at {}/s", general(slowest, 6))
        } else {
            String::new()
        };
        return (Some(seconds), format!("{names} rate-limited: next start in {wait:.1} s{then}"));
    }
    let rate = match w.dispatch_rate {
        Some(rate) if rate > 0.0 => rate,
        Some(_) => {
            return (None, "unknown: the pool dispatched nothing recently, so there is no rate to go by".to_string())
        }
        // Python's caller always measures; one that does not is told so, not that nothing ran.
        None => {
            return (
                None,
                "unknown: the pool's dispatch rate is not measured here, so there is no rate to go by".into(),
            )
        }
    };
    let incoming = arriving.map_or(0.0, Arriving::total);
    if let Some(arriving) = arriving.filter(|_| incoming >= OUTRUN * rate) {
        return (None, outrun(arriving, rate));
    }
    let spare = rate - incoming; // what the pool serves beyond the work that keeps arriving ahead of it
    let fair = deadline.is_none() && matches!(class.rest, Rest::Fair(_));
    let share = w.tenant_share.unwrap_or(0.0);
    if fair && share <= 0.0 {
        return (None, "unknown: its tenant has no share of the pool right now".to_string());
    }
    let pace = if incoming > 0.0 {
        format!(
            "{}/s (the pool's {}/s less the {}/s of new work that goes before it)",
            general(spare, 3),
            general(rate, 3),
            general(incoming, 3)
        )
    } else {
        format!("the pool's {}/s", general(rate, 3))
    };
    let (seconds, mut how) = if fair {
        let mine = w.queue_ahead.unwrap_or(0) + 1;
        let seconds = ahead as f64 / spare + mine as f64 / (spare * share);
        let how = format!(
            "{} ahead at {pace}, then {} of its tenant's at its {:.0}% share of them",
            dispatches(ahead),
            dispatches(mine),
            share * 100.0
        );
        (seconds, how)
    } else {
        // By deadline, or first come first served: every task ahead takes one of those dispatches.
        let total = ahead + w.queue_ahead.unwrap_or(0) + 1;
        (total as f64 / spare, format!("{} at {pace}", dispatches(total)))
    };
    if deadline.is_some() && arriving.is_some() {
        how.push_str(" (deadline tasks still to come with an earlier deadline would go first too: not counted)");
    }
    let mut note = format!("{}{how}, if the rate and the shares hold", if exact { "" } else { "at least " });
    if deadline.is_some_and(|d| now + seconds > d) {
        note.push_str("; that is after its deadline: unless the pool speeds up, it expires first");
    }
    (Some(seconds), note)
}

/// The sentence for work ahead that arrives as fast as the pool serves it, naming what and how fast.
fn outrun(arriving: Arriving, rate: f64) -> String {
    let parts: Vec<(&str, f64)> =
        [("higher-class work", arriving.higher), ("deadline tasks of its class", arriving.deadlines)]
            .into_iter()
            .filter(|(_, per_second)| *per_second > 0.0)
            .collect();
    if let [(what, per_second)] = parts[..] {
        return format!(
            "cannot tell: {what} arrives at {}/s, as fast as the pool serves {}/s, so it may not start at all",
            general(per_second, 3),
            general(rate, 3)
        );
    }
    let what = parts.iter().map(|(what, r)| format!("{what} ({}/s)", general(*r, 3))).collect::<Vec<_>>().join(" and ");
    format!(
        "cannot tell: {what} arrive at {}/s together, as fast as the pool serves {}/s, so it may not start at all",
        general(arriving.total(), 3),
        general(rate, 3)
    )
}

fn dispatches(n: u64) -> String {
    format!("{n} dispatch{}", if n == 1 { "" } else { "es" })
}

/// `x` with `digits` significant digits, trailing zeros dropped, as Python's `{x:.{digits}g}`.
fn general(x: f64, digits: i32) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let exponent = x.abs().log10().floor() as i32;
    if exponent < -4 || exponent >= digits {
        let text = format!("{:.*e}", (digits - 1).max(0) as usize, x);
        let (mantissa, power) = text.split_once('e').unwrap_or((&text, "0"));
        let mantissa =
            if mantissa.contains('.') { mantissa.trim_end_matches('0').trim_end_matches('.') } else { mantissa };
        let power: i32 = power.parse().unwrap_or(0);
        return format!("{mantissa}e{}{:02}", if power < 0 { '-' } else { '+' }, power.abs());
    }
    let decimals = (digits - 1 - exponent).max(0) as usize;
    let text = format!("{x:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::{general, ClassRates};
    use crate::core::{Core, NewTask, PoolSettings};

    fn task(id: &str, priority: u8) -> NewTask {
        NewTask {
            id: id.into(),
            pool: "p".into(),
            tenant: None,
            priority,
            deadline: None,
            not_before: None,
            attempts: 0,
            cost: None,
        }
    }

    #[test]
    fn the_estimate_counts_the_work_that_keeps_arriving_ahead() {
        let mut core = Core::new(&[PoolSettings { name: "p".into(), ..PoolSettings::default() }]).unwrap();
        core.add_worker("w", &["p"], 0).unwrap();
        for id in ["a", "b", "c"] {
            core.submit(task(id, 2), 0.0).unwrap();
        }
        core.submit(task("urgent", 0), 0.0).unwrap();
        // Two ahead in its queue and one of a higher class: 4 dispatches at the pool's 2/s.
        let w = core.explain("c", 1.0, Some(2.0), None).unwrap();
        assert_eq!((w.higher_classes_ahead, w.queue_ahead, w.estimate), (1, Some(2), Some(2.0)));
        assert_eq!(w.estimate_note, "4 dispatches at the pool's 2/s, if the rate and the shares hold");
        // Critical work arriving at 1/s leaves it 1/s of the pool's 2/s.
        let mut rates = [ClassRates::default(); 4];
        rates[0].arrivals = 1.0;
        let w = core.explain("c", 1.0, Some(2.0), Some(&rates)).unwrap();
        assert_eq!((w.estimate, w.arrival_rate_ahead), (Some(4.0), Some(1.0)));
        assert!(w.estimate_note.starts_with("4 dispatches at 1/s (the pool's 2/s less the 1/s"), "{}", w.estimate_note);
        // Arriving as fast as the pool serves: it may never start.
        rates[0].arrivals = 1.95;
        let w = core.explain("c", 1.0, Some(2.0), Some(&rates)).unwrap();
        assert_eq!(w.estimate, None);
        assert_eq!(
            w.estimate_note,
            "cannot tell: higher-class work arrives at 1.95/s, as fast as the pool serves 2/s, so it may not start at all"
        );
        // No rate measured, or none to go by.
        assert!(core.explain("c", 1.0, None, None).unwrap().estimate_note.contains("not measured"));
        assert!(core.explain("c", 1.0, Some(0.0), None).unwrap().estimate_note.contains("dispatched nothing"));
    }

    #[test]
    fn numbers_read_as_pythons_general_format() {
        assert_eq!(general(2.0, 6), "2");
        assert_eq!(general(0.5, 6), "0.5");
        assert_eq!(general(1.23456, 3), "1.23");
        assert_eq!(general(12345.0, 3), "1.23e+04");
        assert_eq!(general(0.0001234, 3), "0.000123");
    }
}
