"""Every delay that grows with failures: job retries, reconnects, restarts.

Job retries use exponential backoff with full jitter (DESIGN §5): the delay
after attempt n is uniform in [0, min(cap, base * 2^(n-1))], so jobs that
failed together do not retry together. The bounds are the task's
`backoff_base` / `backoff_cap`, else `CONVEYOR["BACKOFF_BASE_SECONDS"]` /
`CONVEYOR["BACKOFF_CAP_SECONDS"]`.

No delay is ever longer than `bounds.MAX_SECONDS` (ten years): a retry delay
or a snooze past it is capped (`capped_delay`), so every `run_after` is a
time PostgreSQL and Python can both hold.

Reconnects and restarts walk a short ladder of fixed delays, one step per
consecutive failure, and start again at the bottom after a success.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from ..bounds import MAX_SECONDS
from ..conf import conveyor_settings

# The control loop's connection (and its other errors) after each failure.
WORKER_RECONNECT_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0)
# The LISTEN connection: polling covers for it meanwhile, so it can wait longer.
LISTENER_RECONNECT_SECONDS = (0.5, 1.0, 2.0, 5.0)
# A --processes child that keeps dying quickly (one that ran for a while is
# restarted at once, and its ladder starts again).
RESTART_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0)


# 2^64 times any base past the smallest float is more than any cap: stop
# doubling there (2 ** 1024 would not even convert to a float).
_MAX_DOUBLINGS = 64


def full_jitter(attempt: int, base: float, cap: float) -> float:
    """Uniform in [0, min(cap, base * 2^(attempt-1))] seconds."""
    ceiling = min(cap, base * 2.0 ** min(max(attempt - 1, 0), _MAX_DOUBLINGS))
    return random.uniform(0, ceiling)


def capped_delay(seconds: float) -> tuple[float, bool]:
    """`seconds` as a delay the database can store, and whether it had to be capped.

    Past `MAX_SECONDS` (infinity included) it is `MAX_SECONDS`. NaN and
    negative values are not delays: callers refuse them before (see
    executor.classify); here they become 0 so that nothing unstorable passes.
    """
    if seconds > MAX_SECONDS:
        return MAX_SECONDS, True
    if not seconds >= 0:  # Negative, or NaN.
        return 0.0, True
    return seconds, False


def retry_delay(task: Any, attempt: int) -> float:
    """The wait before the attempt after `attempt`, from the task's bounds or the settings.

    `task` may be None (a task path that no longer imports): the settings apply.
    """
    settings = conveyor_settings()
    base = getattr(task, "backoff_base", None) or settings.BACKOFF_BASE_SECONDS
    cap = getattr(task, "backoff_cap", None) or settings.BACKOFF_CAP_SECONDS
    delay = full_jitter(attempt, base, cap)
    return delay if math.isfinite(delay) else MAX_SECONDS  # Bounds that slipped past checks.


@dataclass(slots=True)
class Ladder:
    """Fixed delays indexed by consecutive failures, capped at the last step."""

    steps: tuple[float, ...]
    failures: int = 0

    def next_delay(self) -> float:
        """Count one more failure and return how long to wait before trying again."""
        delay = self.steps[min(self.failures, len(self.steps) - 1)]
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0
