"""JSON round trips for arguments and return values, with errors that point.

django.tasks requires arguments and return values to survive JSON; a bare
`TypeError` from deep inside a structure does not tell the user which value
broke it, so we find and name its path.
"""

from __future__ import annotations

import json
from typing import Any

from .exceptions import ArgumentsNotSerializable


def _find_bad(value: Any, path: str) -> tuple[str, Any] | None:
    if value is None or isinstance(value, str | bool | int | float):
        return None
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if found := _find_bad(item, f"{path}[{i}]"):
                return found
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} key {key!r}", key
            if found := _find_bad(item, f"{path}[{key!r}]"):
                return found
        return None
    return path, value


def to_json(value: Any, what: str) -> str:
    """Dump `value` strictly (no NaN, string keys only) or name the culprit."""
    bad = _find_bad(value, what)
    if bad is None:
        try:
            return json.dumps(value, separators=(",", ":"), allow_nan=False)
        except ValueError as exc:  # NaN or infinity
            raise ArgumentsNotSerializable(f"{what} is not JSON-serializable: {exc}.") from exc
    path, culprit = bad
    raise ArgumentsNotSerializable(
        f"{path} is not JSON-serializable: {type(culprit).__name__} value {culprit!r:.80}. "
        "Task arguments and return values must survive a JSON round trip; pass ids or "
        "plain data instead."
    )


# Values a JSON round trip gives back unchanged (floats may be NaN: not here).
_UNCHANGED = frozenset({type(None), str, int, bool})


def json_round_trip(value: Any, what: str) -> Any:
    """What the handler will receive: the value after a JSON dump and load."""
    kind = type(value)
    if kind in _UNCHANGED:
        return value  # The common return values of handlers, without the round trip.
    # Flat arguments (ids, names, flags) come back equal from a round trip:
    # copy them instead, as the round trip would have.
    if kind is list and all(type(item) in _UNCHANGED for item in value):
        return list(value)
    if kind is dict and all(
        type(key) is str and type(item) in _UNCHANGED for key, item in value.items()
    ):
        return dict(value)
    return json.loads(to_json(value, what))
