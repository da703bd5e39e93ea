//! [`PoolConfig`], [`Fairness`] and [`ShareBy`]: a pool's scheduling settings, as the Python
//! `cronoq.Pool` has them.

use crate::core::PoolSettings;
pub use crate::core::ShareBy;

/// How a fair pool shares its workers between tenants: start-time fair queuing by weight.
/// Mirrors the Python `Pool`'s `tenant_weights` and `fair_share`.
#[derive(Debug, Clone, PartialEq)]
pub struct Fairness {
    tenant_weights: Vec<(String, f64)>,
}

impl Fairness {
    /// Shares by weight (`tenant_weights`): with weights 3 and 1 and both tenants backlogged, the
    /// first gets three dispatches for each of the second's. Tenants not listed weigh 1 (or the
    /// pool's [`default_weight`](PoolConfig::default_weight)). Each weight
    /// must be positive and finite (checked when the pool is used).
    pub fn weights<T: Into<String>>(weights: impl IntoIterator<Item = (T, f64)>) -> Fairness {
        Fairness { tenant_weights: weights.into_iter().map(|(t, w)| (t.into(), w)).collect() }
    }

    /// Equal shares between every tenant (`fair_share = true`).
    #[must_use]
    pub fn equal() -> Fairness {
        Fairness { tenant_weights: Vec::new() }
    }

    /// The weights listed (empty for equal shares).
    #[must_use]
    pub fn tenant_weights(&self) -> &[(String, f64)] {
        &self.tenant_weights
    }
}

/// A pool's name and scheduling settings. Fields left at their defaults carry no opinion: a
/// worker sends only the settings set here to the broker, which refuses the worker when one
/// disagrees with its config.
///
/// ```
/// use cronoq::{Fairness, PoolConfig, ShareBy};
/// let mut pool = PoolConfig::new("llm")
///     .share_by(ShareBy::Cost) // a task's share is its cost: Task::cost(tokens)
///     .tenant_rate("trial", 0.5) // at most one start every two seconds
///     .tenant_minimum("acme", 2) // two running tasks guaranteed while it has work
///     .tenant_limit("acme", 6) // and never more than six at once
///     .default_tenant_limit(4); // any other tenant: four at once
/// pool.fairness = Some(Fairness::weights([("acme", 3.0), ("globex", 1.0)]));
/// pool.max_in_flight = Some(8);
/// ```
///
/// A pool with a `share_by`, a default weight, a rate, a minimum or a ceiling (a default one
/// too) is fair (equal weights unless `fairness` gives some) even without `fairness`.
#[derive(Debug, Clone, PartialEq)]
#[must_use = "a PoolConfig does nothing until a Scheduler or a Worker is given it"]
pub struct PoolConfig {
    /// The pool's name.
    pub name: String,
    /// Fair sharing between tenants; `None`: tasks go in submission order.
    pub fairness: Option<Fairness>,
    /// At most this many of the pool's tasks run at once, over all workers.
    pub max_in_flight: Option<u32>,
    /// What a fair dispatch charges its tenant; `None`: no opinion (dispatches, when embedded).
    pub share_by: Option<ShareBy>,
    /// Ceilings: at most this many of a tenant's tasks run at once (`tenant_limits`).
    pub tenant_limits: Vec<(String, u32)>,
    /// Rates: at most this many of a tenant's tasks start a second (`tenant_rates`), a token
    /// bucket of one second's worth (at least one token).
    pub tenant_rates: Vec<(String, f64)>,
    /// Minimums: running tasks a tenant is guaranteed while it has work queued
    /// (`tenant_minimums`); it goes ahead of the fair order within its class until it has them.
    pub tenant_minimums: Vec<(String, u32)>,
    /// The weight of every tenant not listed in `fairness`' weights (`default_weight`; `None`:
    /// 1). Tasks without a tenant still weigh 1.
    pub default_weight: Option<f64>,
    /// The ceiling of every tenant not listed in `tenant_limits` (`default_tenant_limit`; `None`:
    /// no ceiling); the tasks without a tenant count as one such tenant.
    pub default_tenant_limit: Option<u32>,
}

/// Set `tenant`'s entry of a per-tenant list (a later call for the same tenant replaces it).
fn set<T>(list: &mut Vec<(String, T)>, tenant: String, value: T) {
    match list.iter_mut().find(|(t, _)| *t == tenant) {
        Some(entry) => entry.1 = value,
        None => list.push((tenant, value)),
    }
}

impl PoolConfig {
    /// A pool named `name`, without fairness or cap.
    pub fn new(name: impl Into<String>) -> PoolConfig {
        PoolConfig {
            name: name.into(),
            fairness: None,
            max_in_flight: None,
            share_by: None,
            tenant_limits: Vec::new(),
            tenant_rates: Vec::new(),
            tenant_minimums: Vec::new(),
            default_weight: None,
            default_tenant_limit: None,
        }
    }

    /// What one fair dispatch charges its tenant's share: one dispatch, the task's
    /// [`cost`](crate::Task::cost), or its run time (estimated, then corrected when it ends).
    pub fn share_by(mut self, share_by: ShareBy) -> PoolConfig {
        self.share_by = Some(share_by);
        self
    }

    /// At most `rate` of `tenant`'s tasks start a second (a positive number; below 1, one every
    /// `1/rate` seconds). Checked when the pool is used.
    pub fn tenant_rate(mut self, tenant: impl Into<String>, rate: f64) -> PoolConfig {
        set(&mut self.tenant_rates, tenant.into(), rate);
        self
    }

    /// `tenant` is guaranteed `minimum` running tasks while it has work queued (at least 1, no more
    /// than its ceiling; the minimums together no more than `max_in_flight`).
    pub fn tenant_minimum(mut self, tenant: impl Into<String>, minimum: u32) -> PoolConfig {
        set(&mut self.tenant_minimums, tenant.into(), minimum);
        self
    }

    /// At most `limit` of `tenant`'s tasks run at once (at least 1).
    pub fn tenant_limit(mut self, tenant: impl Into<String>, limit: u32) -> PoolConfig {
        set(&mut self.tenant_limits, tenant.into(), limit);
        self
    }

    /// Every tenant not given a weight in [`fairness`](PoolConfig::fairness) weighs `weight` (a
    /// positive number, checked when the pool is used): with `.default_weight(3.0)` and a tenant
    /// listed at 1, any other tenant gets three dispatches for each of the listed one's. Makes the
    /// pool fair; tasks without a tenant still weigh 1.
    pub fn default_weight(mut self, weight: f64) -> PoolConfig {
        self.default_weight = Some(weight);
        self
    }

    /// At most `limit` tasks of each top-level tenant not listed in `tenant_limits` run at once
    /// (at least 1), its sub-tenants' included (`acme/search` counts against `acme`'s), the tasks
    /// without a tenant counting as one such tenant; a [`tenant_limit`](Self::tenant_limit)
    /// overrides it. Makes the pool fair.
    pub fn default_tenant_limit(mut self, limit: u32) -> PoolConfig {
        self.default_tenant_limit = Some(limit);
        self
    }

    /// The settings of the scheduling core.
    pub(crate) fn settings(&self) -> PoolSettings {
        PoolSettings {
            name: self.name.clone(),
            tenant_weights: self.fairness.as_ref().map(|f| f.tenant_weights.clone()).unwrap_or_default(),
            fair_share: self.fairness.as_ref().is_some_and(|f| f.tenant_weights.is_empty()),
            max_in_flight: self.max_in_flight,
            share_by: self.share_by.unwrap_or_default(),
            tenant_limits: self.tenant_limits.clone(),
            tenant_rates: self.tenant_rates.clone(),
            tenant_minimums: self.tenant_minimums.clone(),
            default_weight: self.default_weight,
            default_tenant_limit: self.default_tenant_limit,
        }
    }

    /// The settings set explicitly, as a worker's `ready` carries them (`tenant_weights`,
    /// `fair_share`, `max_in_flight`, `share_by`, `tenant_limits`, `default_weight`,
    /// `default_tenant_limit`, `tenant_rates`, `tenant_minimums`): the broker refuses the worker
    /// when one disagrees with its config.
    pub(crate) fn explicit_settings(&self) -> Vec<(rmpv::Value, rmpv::Value)> {
        let mut out = Vec::new();
        if let Some(f) = &self.fairness {
            if f.tenant_weights.is_empty() {
                out.push(("fair_share".into(), true.into()));
            } else {
                let weights = f.tenant_weights.iter().map(|(t, w)| (t.as_str().into(), rmpv::Value::F64(*w))).collect();
                out.push(("tenant_weights".into(), rmpv::Value::Map(weights)));
            }
        }
        if let Some(cap) = self.max_in_flight {
            out.push(("max_in_flight".into(), rmpv::Value::from(cap)));
        }
        if let Some(share_by) = self.share_by {
            out.push(("share_by".into(), share_by.as_str().into()));
        }
        let ints = |list: &[(String, u32)]| {
            rmpv::Value::Map(list.iter().map(|(t, n)| (t.as_str().into(), rmpv::Value::from(*n))).collect())
        };
        if !self.tenant_limits.is_empty() {
            out.push(("tenant_limits".into(), ints(&self.tenant_limits)));
        }
        if let Some(weight) = self.default_weight {
            out.push(("default_weight".into(), rmpv::Value::F64(weight)));
        }
        if let Some(limit) = self.default_tenant_limit {
            out.push(("default_tenant_limit".into(), rmpv::Value::from(limit)));
        }
        if !self.tenant_rates.is_empty() {
            let rates = self.tenant_rates.iter().map(|(t, r)| (t.as_str().into(), rmpv::Value::F64(*r))).collect();
            out.push(("tenant_rates".into(), rmpv::Value::Map(rates)));
        }
        if !self.tenant_minimums.is_empty() {
            out.push(("tenant_minimums".into(), ints(&self.tenant_minimums)));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_reach_the_core_and_the_broker_only_when_set() {
        let plain = PoolConfig::new("p");
        assert!(plain.explicit_settings().is_empty());
        assert!(!plain.settings().fair());

        let pool = PoolConfig::new("p").default_weight(2.5).default_tenant_limit(5);
        let settings = pool.settings();
        assert_eq!((settings.default_weight, settings.default_tenant_limit), (Some(2.5), Some(5)));
        assert!(settings.fair(), "either default makes the pool fair, as in Python");
        assert_eq!(
            pool.explicit_settings(),
            vec![
                ("default_weight".into(), rmpv::Value::F64(2.5)),
                ("default_tenant_limit".into(), rmpv::Value::from(5u32)),
            ]
        );
    }
}
