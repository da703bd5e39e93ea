//! Tenant weights as exact tag steps, as the Python core's `weights.py` computes them.
//!
//! SFQ adds 1/w to a tenant's tag at each dispatch. In floats those sums drift (three steps of 1/3
//! fall short of 1) and ties would be broken by rounding instead of by arrival. So each 1/w is an
//! integer number of units of 1/scale, scale being the lcm of the weights' numerators, the weights
//! read as the decimals they were written as (0.5 is 1/2, 2.5 is 5/2: the shortest decimal that
//! reads back as the same f64, as Python's `repr` gives). Past a scale of 2^40 tags are floats,
//! exactly where the Python core switches too, so both cores order every task alike.
//!
//! A pool that shares by cost or run time charges a dispatch `charge` quanta of a thousandth of a
//! unit (of a cost unit, a millisecond): `step * charge / 1000` tag units. Its scale counts every
//! numerator a thousand times over, so every step is a multiple of 1000 and charged tags stay exact
//! integers: ties between them stay true ties. A reload keeps the previous scale as a factor (the
//! scale only grows), so existing tags convert exactly.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::ops::Add;

const MAX_SCALE: u128 = 1 << 40;

/// Charges are whole thousandths of a unit: of a cost unit, or milliseconds of run time.
pub const QUANTA_PER_UNIT: u64 = 1000;

/// `amount` units as whole quanta, rounded to the nearest (ties to even, as Python's `round`), never
/// negative.
pub fn quantize(amount: f64) -> u64 {
    let q = (amount * QUANTA_PER_UNIT as f64).round_ties_even();
    if q > 0.0 {
        q as u64
    } else {
        0
    }
}

/// A start or finish tag: an exact integer in units of 1/scale, or a float past the exact range.
/// One queue only ever holds tags of one kind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Tag {
    /// Units of 1/scale (a run-time correction may take a tag below zero).
    Exact(i128),
    /// Dispatches of a weight-1 tenant, as a float.
    Float(f64),
}

impl Tag {
    /// The zero of the same kind.
    pub fn zero(self) -> Tag {
        match self {
            Tag::Exact(_) => Tag::Exact(0),
            Tag::Float(_) => Tag::Float(0.0),
        }
    }
}

impl Add for Tag {
    type Output = Tag;
    fn add(self, other: Tag) -> Tag {
        match (self, other) {
            (Tag::Exact(a), Tag::Exact(b)) => Tag::Exact(a + b),
            (a, b) => Tag::Float(a.as_f64() + b.as_f64()),
        }
    }
}

impl Tag {
    /// The tag as a float (in tag units).
    pub fn as_f64(self) -> f64 {
        match self {
            Tag::Exact(a) => a as f64,
            Tag::Float(a) => a,
        }
    }

    /// The tag in the units of a scale `factor` times finer (exact), or as a float divided by the
    /// old scale (`Err(old)`) when the new weights have float tags.
    pub fn rescale(self, factor: std::result::Result<i128, i128>) -> Tag {
        match (self, factor) {
            (Tag::Exact(a), Ok(f)) => Tag::Exact(a * f),
            (Tag::Exact(a), Err(old)) => Tag::Float(a as f64 * (1.0 / old as f64)),
            (Tag::Float(a), _) => Tag::Float(a),
        }
    }
}

impl Eq for Tag {}

impl PartialOrd for Tag {
    fn partial_cmp(&self, other: &Tag) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Tag {
    fn cmp(&self, other: &Tag) -> Ordering {
        match (self, other) {
            (Tag::Exact(a), Tag::Exact(b)) => a.cmp(b),
            (a, b) => a.as_f64().total_cmp(&b.as_f64()),
        }
    }
}

/// The weights of one pool, each 1/w as a tag step.
#[derive(Debug, Clone)]
pub struct Weights {
    weights: HashMap<String, f64>,
    /// The weight of a tenant not listed (`default_weight`, 1 when unset).
    default: f64,
    steps: HashMap<String, Tag>,
    /// The step of a tenant not listed.
    default_step: Tag,
    /// The step of weight 1: of untenanted tasks, which weigh 1 whatever the default.
    unit_step: Tag,
    /// Tag units per dispatch of a weight-1 tenant; None when tags are floats.
    scale: Option<u128>,
}

fn gcd(a: u128, b: u128) -> u128 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// A positive finite f64 as the fraction of its shortest decimal form, reduced; None when it does
/// not fit in u128 (a weight like 1e300 or 1e-300), which sends the pool to float tags.
fn as_fraction(weight: f64) -> Option<(u128, u128)> {
    let text = format!("{weight:e}"); // shortest round-trip digits: "2.5e0", "1e-7"
    let (mantissa, exponent) = text.split_once('e')?;
    let exponent: i32 = exponent.parse().ok()?;
    let (whole, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits: u128 = format!("{whole}{frac}").parse().ok()?;
    let scale10 = exponent - frac.len() as i32;
    let (mut num, mut den) = if scale10 >= 0 {
        (digits.checked_mul(10u128.checked_pow(scale10 as u32)?)?, 1u128)
    } else {
        (digits, 10u128.checked_pow((-scale10) as u32)?)
    };
    let g = gcd(num, den);
    num /= g;
    den /= g;
    Some((num, den))
}

impl Weights {
    /// Weights for `tenant_weights` and `default` (the weight of unlisted tenants, 1 when None;
    /// each positive and finite: checked by the caller), in tags that count dispatches (`charged`
    /// false) or thousandths of a unit (`charged` true), at a scale that is a multiple of
    /// `previous`'s (a reload's previous weights).
    pub fn new<'a>(
        tenant_weights: impl IntoIterator<Item = (&'a str, f64)>,
        default: Option<f64>,
        previous: Option<&Weights>,
        charged: bool,
    ) -> Weights {
        let weights: HashMap<String, f64> = tenant_weights.into_iter().map(|(t, w)| (t.to_string(), w)).collect();
        let default = default.unwrap_or(1.0);
        let fractions: Option<Vec<(&String, (u128, u128))>> =
            weights.iter().map(|(t, w)| as_fraction(*w).map(|f| (t, f))).collect();
        let default_fraction = as_fraction(default);
        // Charged: every step must hold whole thousandths, so each numerator counts a thousand times over.
        let per_unit: u128 = if charged { QUANTA_PER_UNIT as u128 } else { 1 };
        let mut scale: Option<u128> = previous.map_or(Some(1), |p| p.scale);
        match (&fractions, default_fraction) {
            (Some(fractions), Some((default_num, _))) => {
                // The default weight (1 when unset) counts too, as the Python core's does: its
                // fraction, not only the listed ones', decides the scale.
                let numerators = fractions.iter().map(|(_, (num, _))| *num).chain([default_num]);
                for num in numerators {
                    let Some(s) = scale else { break };
                    let Some(unit) = num.checked_mul(per_unit) else {
                        scale = None;
                        break;
                    };
                    let l = s / gcd(s, unit) * unit;
                    if l > MAX_SCALE {
                        scale = None;
                        break;
                    }
                    scale = Some(l);
                }
            }
            _ => scale = None,
        }
        let exact_step =
            |scale: u128, (num, den): (u128, u128)| scale.checked_mul(den).map(|x| Tag::Exact((x / num) as i128));
        let (Some(scale), Some(fractions), Some(default_fraction)) = (scale, fractions, default_fraction) else {
            return Weights::floats(weights, default);
        };
        let mut steps = HashMap::new();
        for (t, fraction) in fractions {
            match exact_step(scale, fraction) {
                Some(step) => steps.insert(t.clone(), step),
                None => return Weights::floats(weights, default),
            };
        }
        let Some(default_step) = exact_step(scale, default_fraction) else {
            return Weights::floats(weights, default);
        };
        Weights { weights, default, steps, default_step, unit_step: Tag::Exact(scale as i128), scale: Some(scale) }
    }

    fn floats(weights: HashMap<String, f64>, default: f64) -> Weights {
        let steps = weights.iter().map(|(t, w)| (t.clone(), Tag::Float(1.0 / w))).collect();
        Weights {
            weights,
            default,
            steps,
            default_step: Tag::Float(1.0 / default),
            unit_step: Tag::Float(1.0),
            scale: None,
        }
    }

    /// The weight of `tenant` (the default when unlisted, 1 when untenanted).
    pub fn weight(&self, tenant: Option<&str>) -> f64 {
        match tenant {
            None => 1.0,
            Some(t) => self.weights.get(t).copied().unwrap_or(self.default),
        }
    }

    /// 1/w of `tenant` in tag units.
    pub fn step(&self, tenant: Option<&str>) -> Tag {
        match tenant {
            None => self.unit_step,
            Some(t) => self.steps.get(t).copied().unwrap_or(self.default_step),
        }
    }

    /// The tag units a tenant of step `step` is charged for `charge` quanta (a negative charge is a
    /// correction in its favour); exact with integer tags.
    pub fn advance(&self, step: Tag, charge: i64) -> Tag {
        match step {
            Tag::Exact(s) => Tag::Exact((s * charge as i128).div_euclid(QUANTA_PER_UNIT as i128)),
            Tag::Float(s) => Tag::Float(s * charge as f64 / QUANTA_PER_UNIT as f64),
        }
    }

    /// How tags of `self` convert to tags of `new`: `Ok(factor)` to multiply an exact tag by, or
    /// `Err(old scale)` when `new` has float tags; None when nothing changes.
    pub fn conversion(&self, new: &Weights) -> Option<std::result::Result<i128, i128>> {
        match (self.scale, new.scale) {
            (old, new) if old == new => None,
            (Some(old), Some(new)) => Some(Ok((new / old) as i128)),
            (Some(old), None) => Some(Err(old as i128)),
            (None, _) => None,
        }
    }

    /// 1/w of weight 1 in tag units: of untenanted tasks, and of a tenant's own tasks beside its
    /// sub-tenants.
    pub fn unit_step(&self) -> Tag {
        self.unit_step
    }

    /// The zero tag of this pool's kind.
    pub fn zero(&self) -> Tag {
        self.unit_step.zero()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_read_as_written() {
        assert_eq!(as_fraction(0.5), Some((1, 2)));
        assert_eq!(as_fraction(2.5), Some((5, 2)));
        assert_eq!(as_fraction(0.1), Some((1, 10)));
        assert_eq!(as_fraction(3.0), Some((3, 1)));
        assert_eq!(as_fraction(1e-7), Some((1, 10_000_000)));
    }

    #[test]
    fn steps_are_exact() {
        let w = Weights::new([("a", 3.0), ("b", 1.0), ("c", 0.5)], None, None, false);
        assert_eq!(w.step(Some("a")), Tag::Exact(1));
        assert_eq!(w.step(Some("b")), Tag::Exact(3));
        assert_eq!(w.step(Some("c")), Tag::Exact(6));
        assert_eq!(w.step(None), Tag::Exact(3));
    }

    #[test]
    fn the_default_weighs_unlisted_tenants_and_counts_into_the_scale() {
        // As Python's Weights({"a": 1}, default=2.5): the scale is lcm(1, 5) = 5, so an unlisted
        // tenant steps 5 * 2/5 = 2, a listed one of weight 1 steps 5, and untenanted tasks still
        // weigh 1: the unit step, 5.
        let w = Weights::new([("a", 1.0)], Some(2.5), None, false);
        assert_eq!(w.scale, Some(5));
        assert_eq!(w.step(Some("a")), Tag::Exact(5));
        assert_eq!(w.step(Some("other")), Tag::Exact(2));
        assert_eq!(w.step(None), Tag::Exact(5));
        assert_eq!(w.weight(Some("other")), 2.5);
        assert_eq!(w.weight(Some("a")), 1.0);
        assert_eq!(w.weight(None), 1.0);
    }

    #[test]
    fn a_default_past_the_exact_range_sends_the_pool_to_float_tags() {
        // Its numerator alone passes 2^40, as in Python, where the lcm then gives up on exact tags.
        let w = Weights::new([("a", 2.0)], Some(1e13), None, false);
        assert_eq!(w.scale, None);
        assert_eq!(w.step(Some("other")), Tag::Float(1e-13));
        assert_eq!(w.step(Some("a")), Tag::Float(0.5));
        assert_eq!(w.step(None), Tag::Float(1.0));
    }

    #[test]
    fn charged_defaults_hold_whole_thousandths_too() {
        let w = Weights::new([], Some(3.0), None, true);
        assert_eq!(w.step(Some("x")), Tag::Exact(1000));
        assert_eq!(w.step(None), Tag::Exact(3000));
    }
}

#[cfg(test)]
mod charged_tests {
    use super::*;

    #[test]
    fn charged_steps_hold_whole_thousandths() {
        let w = Weights::new([("a", 3.0), ("b", 1.0)], None, None, true);
        assert_eq!(w.step(Some("a")), Tag::Exact(1000));
        assert_eq!(w.step(Some("b")), Tag::Exact(3000));
        // A cost of 0.1 (100 quanta) is a tenth of a step, exactly.
        assert_eq!(w.advance(w.step(Some("a")), 100), Tag::Exact(100));
    }

    #[test]
    fn quantize_rounds_half_to_even_as_python_does() {
        assert_eq!(quantize(0.0005), 0);
        assert_eq!(quantize(0.0015), 2);
        assert_eq!(quantize(0.1), 100);
        assert_eq!(quantize(-3.0), 0);
    }
}
