"""A running job's progress: what `context.set_progress()` takes, and what a job shows.

The handler's call only checks and remembers the value (`report`); the
worker's next heartbeat writes the latest one under the attempt's token
(`protocol.HEARTBEAT_PROGRESS`), adding the attempt and the database time,
so a job's `progress` column is `{current, total, message, attempt,
updated_at}`. `Progress.of()` reads it back for results, the API and the
admin; a malformed value (written by hand) reads as None, never an error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from ..serialization import text_problem

MAX_MESSAGE_LENGTH = 200


def _number(name: str, value: Any) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"set_progress(): {name} must be a number, not {type(value).__name__} "
                        f"{value!r:.40}.")  # fmt: skip
    if not math.isfinite(value) or abs(value) > 1e15:
        raise ValueError(f"set_progress(): {name} must be a finite number, not {value!r}.")
    return value


def report(current: Any, total: Any = None, message: Any = None) -> dict[str, Any]:
    """The JSON a heartbeat writes for these values; refuses what a job could not show."""
    current = _number("current", current)
    if current < 0:
        raise ValueError(f"set_progress(): current must be 0 or more, not {current!r}.")
    if total is not None:
        total = _number("total", total)
        if total <= 0:
            raise ValueError(f"set_progress(): total must be more than 0, not {total!r}.")
    if message is not None:
        if not isinstance(message, str):
            raise TypeError(f"set_progress(): message must be a string, not "
                            f"{type(message).__name__}.")  # fmt: skip
        if len(message) > MAX_MESSAGE_LENGTH:
            raise ValueError(f"set_progress(): message must be at most {MAX_MESSAGE_LENGTH} "
                             f"characters, not {len(message)}.")  # fmt: skip
        if problem := text_problem(message):
            raise ValueError(f"set_progress(): message {problem}.")
    return {"current": current, "total": total, "message": message}


@dataclass(frozen=True, slots=True)
class Progress:
    current: float | int
    total: float | int | None  # None: the handler did not say how much there is.
    message: str | None
    attempt: int | None  # The attempt that reported it.
    updated_at: datetime | None  # The heartbeat's database time.

    @property
    def fraction(self) -> float | None:
        """current / total, within 0..1; None without a total."""
        if not self.total:
            return None
        return max(0.0, min(1.0, self.current / self.total))

    @property
    def percent(self) -> int | None:
        fraction = self.fraction
        return None if fraction is None else round(fraction * 100)

    @classmethod
    def of(cls, value: Any) -> Progress | None:
        """The progress a job's column holds, or None (none reported, or unreadable)."""
        if not isinstance(value, dict):
            return None
        current, total, message = value.get("current"), value.get("total"), value.get("message")
        if isinstance(current, bool) or not isinstance(current, int | float):
            return None
        if total is not None and (isinstance(total, bool) or not isinstance(total, int | float)):
            total = None
        updated = value.get("updated_at")
        attempt = value.get("attempt")
        return cls(
            current=current,
            total=total,
            message=message if isinstance(message, str) else None,
            attempt=attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None,
            updated_at=parse_datetime(updated) if isinstance(updated, str) else None,
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "current": self.current,
            "total": self.total,
            "message": self.message,
            "attempt": self.attempt,
            "updated_at": self.updated_at,
        }
