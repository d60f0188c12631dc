"""JSON round trips: flat values are copied, everything else really round-trips; what
PostgreSQL can store, and errors that point."""

import math

import pytest

from django_conveyor.exceptions import ArgumentsNotSerializable
from django_conveyor.serialization import (
    MAX_DEPTH,
    REPLACED_NOTE,
    json_round_trip,
    storable_text,
    text_problem,
)


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
        ([math.nan], r"args\[0\] is nan, which JSON cannot represent"),
        ([object()], "object value"),
    ],
)
def test_values_that_would_change_or_fail_are_refused(value, message):
    with pytest.raises(ArgumentsNotSerializable, match=message):
        json_round_trip(value, "args")


def nested(levels):
    value = 1
    for _ in range(levels):
        value = {"k": value}
    return value


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("a\x00b", "f() return value contains a NUL character (\\x00)"),
        (["ok", {"x": "\x00"}], "f() return value[1]['x'] contains a NUL character"),
        ("\udc80", "f() return value contains a lone surrogate"),
        (float("nan"), "f() return value is nan, which JSON cannot represent"),
        ({"a": -float("inf")}, "f() return value['a'] is -inf"),
        (nested(MAX_DEPTH + 2), "f() return value['k']"),
        (nested(100_000), "nests more than 100 levels of lists and dicts."),
        (object(), "f() return value is not JSON-serializable: object value"),
    ],
)
def test_unstorable_values_are_refused_by_path(value, message):
    with pytest.raises(ArgumentsNotSerializable) as raised:
        json_round_trip(value, "f() return value")
    assert message in str(raised.value)


class Sly(str):
    def __contains__(self, item):
        return False  # Hides its NUL from a naive check.


def test_a_str_subclass_cannot_hide_a_nul():
    with pytest.raises(ArgumentsNotSerializable, match="contains a NUL character"):
        json_round_trip([Sly("a\x00")], "f() return value")


def test_storable_values_come_back_as_json_gives_them():
    assert json_round_trip(("é", "😀", "\\u0000", 1.5), "v") == ["é", "😀", "\\u0000", 1.5]
    assert json_round_trip(nested(MAX_DEPTH), "v") == nested(MAX_DEPTH)


def test_error_text_is_made_storable_with_a_note():
    assert storable_text("plain") == "plain"
    text = storable_text("bad byte \x00 and \udc80")
    assert text == "bad byte \\x00 and \\udc80" + REPLACED_NOTE
    assert text_problem(text) is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (["ok", "a\x00b"], "args[1] contains a NUL character"),
        ({"note": "\x00"}, "args['note'] contains a NUL character"),
        ({"k\x00": 1}, "args key 'k\\x00' contains a NUL character"),
        (["\udc80"], "args[0] contains a lone surrogate"),
    ],
)
def test_flat_values_are_checked_too(value, message):
    with pytest.raises(ArgumentsNotSerializable) as raised:
        json_round_trip(value, "args")
    assert message in str(raised.value)
