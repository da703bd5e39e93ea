"""Charged tags stay exact integers whatever the weights: a thousandth of a unit at weight 2 is whole tag units."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from cronoq.core.weights import QUANTA_PER_UNIT, Weights


@settings(max_examples=200, deadline=None, derandomize=True)
@given(weights=st.dictionaries(st.sampled_from("abcd"), st.sampled_from([1, 2, 3, 0.5, 1.5, 0.25, 7, 2.5])),
       charge=st.integers(1, 5000))
def test_every_charge_is_an_exact_number_of_tag_units(weights, charge):
    w = Weights(weights, charged=True)
    for tenant in [*weights, "unlisted", None]:
        step = w.step(tenant)
        exact = Fraction(w.scale) / Fraction(repr(float(w.weight(tenant)))) * Fraction(charge, QUANTA_PER_UNIT)
        assert w.advance(step, charge) == exact
