//! What holds a node of the tenant tree back, or puts it first: its ceiling, its rate and its
//! minimum, as the Python core's `ceilings.py` keeps them.
//!
//! A [`Ceiling`] counts the running tasks of one node's subtree in one pool (every class, with or
//! without a deadline), for every node that has a ceiling (`tenant_limits`, or
//! `default_tenant_limit` for a top-level node), a rate (`tenant_rates`) or a minimum
//! (`tenant_minimums`). At its ceiling the node is *capped*; out of rate tokens it is *limited*;
//! either way it is held back (`blocked`): its pool takes it out of every class's fair tree and
//! deadline order (its subtree keeps its tasks and tags and blocks nobody), and lets it go when a
//! task under it ends or its next token comes. A dispatch counts against, and takes a token from,
//! every node of its tenant's path.
//!
//! A rate is a token bucket of `max(1, rate)` tokens refilled at `rate` a second, kept as one number:
//! the generic cell rate algorithm's theoretical arrival time (`tat`). A dispatch takes a token
//! (`tat = max(tat, now) + 1/rate`); the tenant may start another task from `next_start(tat, rate)`
//! on. A minimum is a push, not a hold: while the tenant runs fewer tasks than its minimum, its class
//! serves it ahead of the fair order.

/// When a tenant whose bucket's theoretical arrival time is `tat` may start its next task: its
/// bucket holds `max(1, rate)` tokens, so it may run that many ahead of the steady pace.
pub fn next_start(tat: f64, rate: f64) -> f64 {
    let capacity = if rate > 1.0 { rate } else { 1.0 };
    tat - (capacity - 1.0) / rate
}

/// The ceiling, rate and minimum of one tenant of one pool (any may be unset), and its running count.
#[derive(Debug, Clone)]
pub struct Ceiling {
    /// At most this many of its tasks run at once.
    pub limit: Option<u32>,
    /// Its tasks running now, over every class.
    pub running: u32,
    /// At its ceiling.
    pub capped: bool,
    /// The `now` at which it was capped, while it is.
    pub since: Option<f64>,
    /// The most dispatches a second it may start.
    pub rate: Option<f64>,
    /// Its bucket's theoretical arrival time (-inf: the bucket is full).
    pub tat: f64,
    /// While out of tokens: when its next token comes.
    pub limited_until: Option<f64>,
    /// The running tasks it is guaranteed while it has work queued.
    pub minimum: Option<u32>,
}

impl Ceiling {
    /// A tenant's ceiling, rate and minimum, with nothing running and a full bucket.
    pub fn new(limit: Option<u32>, rate: Option<f64>, minimum: Option<u32>) -> Ceiling {
        Ceiling {
            limit,
            running: 0,
            capped: false,
            since: None,
            rate,
            tat: f64::NEG_INFINITY,
            limited_until: None,
            minimum,
        }
    }

    /// Held back: at its ceiling, or out of tokens.
    pub fn blocked(&self) -> bool {
        self.capped || self.limited_until.is_some()
    }

    /// Tokens in its bucket at `now` (0 without a rate).
    pub fn tokens(&self, now: f64) -> f64 {
        let Some(rate) = self.rate else { return 0.0 };
        let capacity = if rate > 1.0 { rate } else { 1.0 };
        if self.tat == f64::NEG_INFINITY {
            return capacity;
        }
        (capacity - (self.tat - now) * rate).clamp(0.0, capacity)
    }

    /// Whether it runs fewer tasks than its minimum.
    pub fn under_minimum(&self) -> bool {
        self.minimum.is_some_and(|m| self.running < m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_holds_one_seconds_worth_and_at_least_one_token() {
        // Rate 5: five at once (the fifth token's start is four steps before tat).
        assert_eq!(next_start(1.0, 5.0), 1.0 - 0.8);
        // Rate 0.5: one token, one start every two seconds.
        assert_eq!(next_start(2.0, 0.5), 2.0);
        let mut c = Ceiling::new(None, Some(5.0), None);
        assert_eq!(c.tokens(0.0), 5.0);
        c.tat = 0.2;
        assert!((c.tokens(0.0) - 4.0).abs() < 1e-9);
    }
}
