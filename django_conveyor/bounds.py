"""The bounds every number django-conveyor takes must keep, and the one check of them.

Durations and delays are float seconds, at most `MAX_SECONDS` (ten years:
a PostgreSQL interval, `now()` plus it, a Python datetime and a Python
timer all hold it; anything longer is a mistake, such as milliseconds
passed as seconds). Counts are whole numbers up to `MAX_INT`, the largest
PostgreSQL `integer` (attempts, priorities, limits); ports go up to
`MAX_PORT`.

`breach()` says which bound a number breaks, and `is_count()` /
`is_number()` which values are numbers at all (never a bool). Every edge
checks with them (the settings in conf.py, the command flags in
management/arguments.py, the worker's options in worker/config.py, the
task options in backend.py) and words its own message from the answer,
so that each error names the option as its caller knows it.
"""

from __future__ import annotations

import enum

MAX_SECONDS = 10 * 365 * 24 * 3600.0
MAX_INT = 2**31 - 1
MAX_PORT = 65535


class Breach(enum.Enum):
    """Which bound a number breaks."""

    NOT_A_NUMBER = "not a number"  # NaN, which compares false with everything.
    BELOW = "below"  # Under the minimum (or at it, when the minimum is exclusive).
    ABOVE = "above"  # Over the maximum (infinity too).


def is_number(value: object) -> bool:
    """An int or a float; a bool is not a number here."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_count(value: object) -> bool:
    """A whole number; a bool is not one here."""
    return isinstance(value, int) and not isinstance(value, bool)


def breach(
    value: float,
    *,
    minimum: float | None = None,
    exclusive: bool = False,
    maximum: float | None = None,
) -> Breach | None:
    """Which bound the number `value` breaks (NaN first, then the minimum), or None."""
    if value != value:
        return Breach.NOT_A_NUMBER
    if minimum is not None and not (value > minimum if exclusive else value >= minimum):
        return Breach.BELOW
    if maximum is not None and not value <= maximum:
        return Breach.ABOVE
    return None


def seconds_breach(value: float, *, zero: bool = False) -> Breach | None:
    """A duration: more than zero (zero too, with `zero`), at most MAX_SECONDS."""
    return breach(value, minimum=0, exclusive=not zero, maximum=MAX_SECONDS)


def count_breach(value: int, low: int = 1, high: int = MAX_INT) -> Breach | None:
    """A count from `low` to `high`."""
    return breach(value, minimum=low, maximum=high)
