"""JSON round trips: flat values are copied, everything else really round-trips."""

import math

import pytest

from django_conveyor.exceptions import ArgumentsNotSerializable
from django_conveyor.serialization import json_round_trip


@pytest.mark.parametrize(
    "value",
    [[1, "a", True, None], {"a": 1, "b": None}, [], {}],
)
def test_flat_values_come_back_equal_and_copied(value):
    copied = json_round_trip(value, "args")
    assert copied == value
    assert copied is not value


@pytest.mark.parametrize(
    ("value", "expected"),
    [((1, 2), [1, 2]), ([(1, 2)], [[1, 2]]), ({"a": (1,)}, {"a": [1]}), ([1.5], [1.5])],
)
def test_other_values_really_round_trip(value, expected):
    assert json_round_trip(value, "args") == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([{1: "a"}], r"args\[0\] key 1"),
        ({"a": {2: "b"}}, r"args\['a'\] key 2"),
        ([math.nan], "Out of range float"),
        ([object()], "object value"),
    ],
)
def test_values_that_would_change_or_fail_are_refused(value, message):
    with pytest.raises(ArgumentsNotSerializable, match=message):
        json_round_trip(value, "args")
