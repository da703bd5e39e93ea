//! [`PoolConfig`] and [`Fairness`]: a pool's scheduling settings, as the Python `cronoq.Pool` has them.

use crate::core::PoolSettings;

/// How a fair pool shares its workers between tenants: start-time fair queuing by weight.
/// Mirrors the Python `Pool`'s `tenant_weights` and `fair_share`.
#[derive(Debug, Clone, PartialEq)]
pub struct Fairness {
    tenant_weights: Vec<(String, f64)>,
}

impl Fairness {
    /// Shares by weight (`tenant_weights`): with weights 3 and 1 and both tenants backlogged, the
    /// first gets three dispatches for each of the second's. Tenants not listed weigh 1. Each weight
    /// must be positive and finite (checked when the pool is used).
    pub fn weights<T: Into<String>>(weights: impl IntoIterator<Item = (T, f64)>) -> Fairness {
        Fairness { tenant_weights: weights.into_iter().map(|(t, w)| (t.into(), w)).collect() }
    }

    /// Equal shares between every tenant (`fair_share = true`).
    pub fn equal() -> Fairness {
        Fairness { tenant_weights: Vec::new() }
    }

    /// The weights listed (empty for equal shares).
    pub fn tenant_weights(&self) -> &[(String, f64)] {
        &self.tenant_weights
    }
}

/// A pool's name and scheduling settings. Fields left at their defaults carry no opinion: a
/// worker sends only the settings set here to the broker, which refuses the worker when one
/// disagrees with its config.
///
/// ```
/// use cronoq::{Fairness, PoolConfig};
/// let mut pool = PoolConfig::new("llm");
/// pool.fairness = Some(Fairness::weights([("acme", 3.0), ("globex", 1.0)]));
/// pool.max_in_flight = Some(8);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct PoolConfig {
    /// The pool's name.
    pub name: String,
    /// Fair sharing between tenants; `None`: tasks go in submission order.
    pub fairness: Option<Fairness>,
    /// At most this many of the pool's tasks run at once, over all workers.
    pub max_in_flight: Option<u32>,
}

impl PoolConfig {
    /// A pool named `name`, without fairness or cap.
    pub fn new(name: impl Into<String>) -> PoolConfig {
        PoolConfig { name: name.into(), fairness: None, max_in_flight: None }
    }

    /// The settings of the scheduling core.
    pub(crate) fn settings(&self) -> PoolSettings {
        PoolSettings {
            name: self.name.clone(),
            tenant_weights: self.fairness.as_ref().map(|f| f.tenant_weights.clone()).unwrap_or_default(),
            fair_share: self.fairness.as_ref().is_some_and(|f| f.tenant_weights.is_empty()),
            max_in_flight: self.max_in_flight,
        }
    }

    /// The settings set explicitly, as a worker's `ready` carries them (`tenant_weights`,
    /// `fair_share`, `max_in_flight`).
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
        out
    }
}
