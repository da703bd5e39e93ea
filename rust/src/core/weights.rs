//! Tenant weights as exact tag steps, as the Python core's `weights.py` computes them.
//!
//! SFQ adds 1/w to a tenant's tag at each dispatch. In floats those sums drift (three steps of 1/3
//! fall short of 1) and ties would be broken by rounding instead of by arrival. So each 1/w is an
//! integer number of units of 1/scale, scale being the lcm of the weights' numerators, the weights
//! read as the decimals they were written as (0.5 is 1/2, 2.5 is 5/2: the shortest decimal that
//! reads back as the same f64, as Python's `repr` gives). Past a scale of 2^40 tags are floats,
//! exactly where the Python core switches too, so both cores order every task alike.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::ops::Add;

const MAX_SCALE: u128 = 1 << 40;

/// A start or finish tag: an exact integer in units of 1/scale, or a float past the exact range.
/// One queue only ever holds tags of one kind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Tag {
    /// Units of 1/scale.
    Exact(u128),
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
    fn as_f64(self) -> f64 {
        match self {
            Tag::Exact(a) => a as f64,
            Tag::Float(a) => a,
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
    steps: HashMap<String, Tag>,
    default_step: Tag,
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
    /// Weights for `tenant_weights` (each positive and finite: checked by the caller).
    pub fn new<'a>(tenant_weights: impl IntoIterator<Item = (&'a str, f64)>) -> Weights {
        let weights: HashMap<String, f64> = tenant_weights.into_iter().map(|(t, w)| (t.to_string(), w)).collect();
        let fractions: Option<Vec<(&String, (u128, u128))>> =
            weights.iter().map(|(t, w)| as_fraction(*w).map(|f| (t, f))).collect();
        let mut scale: Option<u128> = Some(1);
        match &fractions {
            None => scale = None,
            Some(fractions) => {
                for (_, (num, _)) in fractions {
                    let s = scale.unwrap();
                    let l = s / gcd(s, *num) * num;
                    if l > MAX_SCALE {
                        scale = None;
                        break;
                    }
                    scale = Some(l);
                }
            }
        }
        let (steps, default_step) = match (scale, fractions) {
            (Some(scale), Some(fractions)) => {
                let mut steps = HashMap::new();
                for (t, (num, den)) in fractions {
                    match scale.checked_mul(den) {
                        Some(x) => steps.insert(t.clone(), Tag::Exact(x / num)),
                        None => return Weights::floats(weights),
                    };
                }
                (steps, Tag::Exact(scale))
            }
            _ => return Weights::floats(weights),
        };
        Weights { weights, steps, default_step }
    }

    fn floats(weights: HashMap<String, f64>) -> Weights {
        let steps = weights.iter().map(|(t, w)| (t.clone(), Tag::Float(1.0 / w))).collect();
        Weights { weights, steps, default_step: Tag::Float(1.0) }
    }

    /// The weight of `tenant` (1 when unlisted or untenanted).
    pub fn weight(&self, tenant: Option<&str>) -> f64 {
        tenant.and_then(|t| self.weights.get(t).copied()).unwrap_or(1.0)
    }

    /// 1/w of `tenant` in tag units.
    pub fn step(&self, tenant: Option<&str>) -> Tag {
        tenant.and_then(|t| self.steps.get(t).copied()).unwrap_or(self.default_step)
    }

    /// The zero tag of this pool's kind.
    pub fn zero(&self) -> Tag {
        self.default_step.zero()
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
        let w = Weights::new([("a", 3.0), ("b", 1.0), ("c", 0.5)]);
        assert_eq!(w.step(Some("a")), Tag::Exact(1));
        assert_eq!(w.step(Some("b")), Tag::Exact(3));
        assert_eq!(w.step(Some("c")), Tag::Exact(6));
        assert_eq!(w.step(None), Tag::Exact(3));
    }
}
