"""Tenant weights as exact tag steps.

SFQ adds 1/w to a node's tag at every dispatch. In floats those sums drift
(three steps of 1/3 fall short of 1), and ties the rules break by arrival
would be broken by rounding instead. So every 1/w is written as an integer
number of units of 1/scale, where scale is the lcm of the weights' numerators,
and tags are integers. Weights are read as the decimals they were written as
(0.5 is 1/2, 2.5 is 5/2). Only weights whose scale would exceed 2^40 fall back
to float tags.

A pool that shares by cost or run time charges a dispatch more than one
step: `charge` quanta of 1/QUANTA_PER_UNIT of a unit (a thousandth of a cost
unit, a millisecond), each charged `step * charge / QUANTA_PER_UNIT` tag
units. Such a pool's scale is a multiple of each weight's numerator times
QUANTA_PER_UNIT, so every step is a multiple of QUANTA_PER_UNIT and that is
an exact integer too: ties between charged tags stay true ties.

One `Weights` serves every level of a pool's tenant tree: tags of all levels
are in the same units, and a weight is looked up by the node's full name.
"""

from __future__ import annotations

from fractions import Fraction
from math import lcm
from typing import Mapping, Union

Tag = Union[int, float]

# Beyond this the integer tags would turn into slow big numbers; use floats.
_MAX_SCALE = 1 << 40

QUANTA_PER_UNIT = 1000
"""Charges are whole thousandths of a unit: of a cost unit, or milliseconds of run time."""


def quantize(amount: float) -> int:
    """`amount` units as whole quanta (rounded to the nearest; never negative)."""
    return max(0, round(amount * QUANTA_PER_UNIT))


class Weights:
    """The node weights of one pool, with each 1/w as an exact tag step.

    `scale` is the number of tag units per dispatch of a weight-1 node (None
    when tags are floats). It only grows across reloads (each new scale is a
    multiple of the previous one), so existing tags convert exactly.
    `unit_step` is the step of weight 1: of untenanted tasks, and of a node's
    own tasks where they share with its children.
    """

    __slots__ = ("weights", "default", "scale", "steps", "default_step", "unit_step")

    def __init__(
        self, weights: Mapping[str, float], previous: Weights | None = None, default: float | None = None,
        charged: bool = False,
    ) -> None:
        self.weights = {tenant: float(w) for tenant, w in weights.items()}
        self.default = 1.0 if default is None else float(default)
        exact = {tenant: _as_fraction(w) for tenant, w in weights.items()}
        default_exact = _as_fraction(self.default if default is None else default)
        scale: int | None = 1 if previous is None else previous.scale
        if scale is not None:
            # Charged: every step must hold whole thousandths, so each numerator counts a thousand times over.
            per_unit = QUANTA_PER_UNIT if charged else 1
            for f in (*exact.values(), default_exact):
                scale = lcm(scale, f.numerator * per_unit)
                if scale > _MAX_SCALE:
                    scale = None
                    break
        self.scale = scale
        self.steps: dict[str, Tag]
        if scale is None:
            self.steps = {tenant: 1.0 / w for tenant, w in self.weights.items()}
            self.default_step: Tag = 1.0 / self.default
            self.unit_step: Tag = 1.0
        else:
            self.steps = {tenant: scale * f.denominator // f.numerator for tenant, f in exact.items()}
            self.default_step = scale * default_exact.denominator // default_exact.numerator
            self.unit_step = scale

    def weight(self, tenant: str | None) -> float:
        """The weight of node `tenant` (the default when unlisted, 1 when untenanted)."""
        return 1.0 if tenant is None else self.weights.get(tenant, self.default)

    def step(self, tenant: str | None) -> Tag:
        """1/w of node `tenant` in tag units."""
        return self.unit_step if tenant is None else self.steps.get(tenant, self.default_step)

    def advance(self, step: Tag, charge: int) -> Tag:
        """The tag units a node of step `step` is charged for `charge` quanta (exact with integer tags)."""
        if self.scale is None:
            return step * charge / QUANTA_PER_UNIT
        return step * charge // QUANTA_PER_UNIT

    def to_dispatches(self, tag: Tag) -> float:
        """A tag (or tag difference) in dispatches of a weight-1 node."""
        return float(tag) if self.scale is None else tag / self.scale


def _as_fraction(weight: float) -> Fraction:
    # Via the shortest decimal repr, so 0.1 is 1/10 and not the binary float's fraction.
    return Fraction(weight) if isinstance(weight, int) else Fraction(repr(float(weight)))
