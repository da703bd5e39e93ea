"""The common submission's one-condition check agrees with every check a submission gets.

`validate_submit` passes the common shape by `common_submission_class` and
sends anything else through `checked_submission_class`, whose errors say
what is wrong. The shortcut must never accept what the checks refuse, nor
give another priority class: Hypothesis draws submissions near every edge
the checks have (empty and overlong names, tenant paths, bools as
numbers, times out of range, payload sizes, unknown pools and priorities).
"""

from __future__ import annotations

import dataclasses
import math

from hypothesis import given, settings, strategies as st

from cronoq.book.submission import MAX_NAME_LENGTH, SubmitRequest, checked_submission_class, common_submission_class, validate_submit
from cronoq.errors import CronoqError

POOLS = frozenset({"default", "llm"})
MAX_PAYLOAD = 64


class NameSubclass(str):
    """A str that is not exactly a str: the shortcut leaves it to the checks."""


def names() -> st.SearchStrategy[object]:
    text = st.one_of(
        st.sampled_from(["", "default", "llm", "acme", "acme/search", "/acme", "acme/", "a//b", "x" * MAX_NAME_LENGTH,
                         "x" * (MAX_NAME_LENGTH + 1), "cronoq:tick:1"]),
        st.text(max_size=8),
    )
    return st.one_of(st.none(), text, text.map(NameSubclass), st.integers(-1, 1), st.booleans())


def seconds() -> st.SearchStrategy[object]:
    return st.one_of(st.none(), st.sampled_from([0, -1, 0.5, 30, math.inf, math.nan, True, "5"]),
                     st.floats(allow_nan=True))


EDGES: dict[str, st.SearchStrategy[object]] = {
    "payload": st.one_of(st.binary(max_size=8), st.binary(min_size=MAX_PAYLOAD - 1, max_size=MAX_PAYLOAD + 2)),
    "pool": st.one_of(st.sampled_from(sorted(POOLS)), names()),
    "tenant": names(),
    "priority": st.one_of(st.sampled_from(["critical", "high", "normal", "low", "urgent", ""]), st.integers(0, 2),
                          st.none()),
    "deadline": seconds(),
    "delay": seconds(),
    "key": names(),
    "max_retries": st.one_of(st.sampled_from([0, 3, 1000, 1001, -1, True, False, 2.0, "3"]), st.integers()),
    "submission": names(),
    "internal": st.booleans(),
}

# A common submission with a few of its fields drawn from their edges: one odd field among common ones is where
# a shortcut that forgets a check would show (fields all drawn at random are rarely common enough to take it).
common = st.builds(SubmitRequest, payload=st.binary(max_size=8), pool=st.sampled_from(sorted(POOLS)),
                   tenant=st.sampled_from([None, "acme"]), priority=st.sampled_from(["high", "normal", "low"]),
                   max_retries=st.integers(0, 1000), submission=st.sampled_from([None, "c1-17"]))


@st.composite
def submissions(draw: st.DrawFn) -> SubmitRequest:
    request = draw(common)
    odd = draw(st.lists(st.sampled_from(sorted(EDGES)), max_size=3, unique=True))
    return dataclasses.replace(request, **{field: draw(EDGES[field]) for field in odd})


@settings(max_examples=1000, deadline=None)
@given(submissions())
def test_the_shortcut_accepts_only_what_the_checks_accept_with_the_same_class(request: SubmitRequest) -> None:
    shortcut = common_submission_class(request, POOLS, MAX_PAYLOAD)
    try:
        checked: int | None = checked_submission_class(request, POOLS, MAX_PAYLOAD)
    except CronoqError:
        checked = None
    if shortcut is not None:
        assert shortcut == checked, request
    try:
        assert validate_submit(request, POOLS, MAX_PAYLOAD) == checked, request
    except CronoqError:
        assert checked is None, request


def test_the_common_submission_takes_the_shortcut() -> None:
    """The shortcut is taken for what clients send most: otherwise it would cost, not save."""
    plain = SubmitRequest(b"x", "llm", "acme", "normal", None, None, None, 3, "c1-17")
    assert common_submission_class(plain, POOLS, MAX_PAYLOAD) == checked_submission_class(plain, POOLS, MAX_PAYLOAD)
