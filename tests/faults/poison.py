"""The `poison` scenario: jobs that return, raise or ask for what cannot be stored.

A share of the run's jobs (`SHARE`) is replaced by poisoned ones, each of a
kind drawn with the run's seed. The workers keep serving the ordinary jobs:
each completes exactly once (the usual checks), every poisoned job ends as
its kind says with its reason recorded (`check`), no worker logs a control
loop error, and every worker stays alive until the harness stops it.

Two kinds reach PostgreSQL on purpose (the workers run with
CONVEYOR_TEST_UNCHECKED, tests/unchecked.py): their rows are refused, so
the batch they came with is written one by one and the refused row fails
its own job with an `OutcomeRefused` entry.

Three kinds are rows no django-conveyor code writes, corrupted by SQL after
the enqueue (`corrupt`): a timestamp of 1 BC in UTC, an infinite one, a
5,000-digit number in the arguments. PostgreSQL holds them, Python cannot
load them: each fails its own job, `UnreadableRow`, without running, and
the jobs claimed in its batch run as usual (the ordinary checks: each
completes exactly once).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import psycopg

SHARE = 0.1  # Of the run's jobs, this share is poisoned.
WORKER_ENV = {"CONVEYOR_TEST_UNCHECKED": "1"}  # The refused_* kinds reach PostgreSQL.
HUGE = "tests.testapp.tasks.huge_backoff"
POISON = "tests.testapp.tasks.poison"
UNCHECKED = "tests.testapp.tasks.unchecked_poison"
CAPPED = "is longer than the maximum of 315360000 seconds (ten years)"
REFUSED = "PostgreSQL refused to store this attempt's"


UNREADABLE = "this worker cannot load"


@dataclass(frozen=True, slots=True)
class Kind:
    task_path: str
    args: tuple[Any, ...]
    max_attempts: int | None  # None: the run's MAX_ATTEMPTS.
    state: str  # Where the job must end.
    reason: str  # Text its last error (or, for a capped snooze, its history) must hold.
    corrupt: str | None = None  # SET clause applied by SQL after the enqueue (`corrupt`).


KINDS = {
    "nul_return": Kind(POISON, ("nul_return",), None, "failed", "contains a NUL character"),
    "nul_exception": Kind(POISON, ("nul_discard",), None, "failed", "bad byte \\x00"),
    "nul_retried": Kind(POISON, ("nul_exception",), 2, "dead", "bad byte \\x00"),
    "nan_snooze": Kind(POISON, ("nan_snooze",), None, "failed", "Snooze(nan) asks for no delay"),
    "inf_snooze": Kind(POISON, ("inf_snooze",), None, "failed", "Snooze(inf) asks for no delay"),
    "huge_backoff": Kind(HUGE, (), 1, "dead", CAPPED),
    # Capped, not failed: it waits ten years, as asked (within reason), and says so.
    "huge_snooze": Kind(POISON, ("huge_snooze",), None, "available", CAPPED),
    "refused_return": Kind(UNCHECKED, ("nul_return",), None, "failed", f"{REFUSED} complete"),
    "refused_error": Kind(UNCHECKED, ("nul_exception",), None, "failed", f"{REFUSED} retry"),
    # Hook: the crash kind (a handler that calls os._exit) joins here once crash
    # containment is on main; it must end `dead` after its attempts, alone.
    # Rows Python cannot load (issue 21): their handler would be an unknown poison.
    "unreadable_time": Kind(POISON, ("never runs",), None, "failed", UNREADABLE,
                            "run_after = '0001-01-01 00:30+01', "
                            "enqueued_run_after = '0001-01-01 00:30+01'"),
    "infinite_time": Kind(POISON, ("never runs",), None, "failed", UNREADABLE,
                          "enqueued_at = 'infinity'"),
    "unreadable_number": Kind(POISON, ("never runs",), None, "failed", UNREADABLE,
                              "args = '[1e5000]'::jsonb"),
}  # fmt: skip
PARKED = {name for name, kind in KINDS.items() if kind.state == "available"}


def choose(rng: random.Random, jobs: int) -> dict[int, str]:
    """Which of the run's job positions are poisoned, and with which kind."""
    positions = rng.sample(range(jobs), max(len(KINDS), round(jobs * SHARE)) if jobs > 1 else 0)
    names = sorted(KINDS)
    # Every kind at least once, then drawn at random.
    return {p: names[i] if i < len(names) else rng.choice(names) for i, p in enumerate(positions)}


def corrupt(conn: psycopg.Connection, poisoned: dict[int, str]) -> None:
    """Write, by SQL, the values of the unreadable kinds into their jobs' rows."""
    for job_id, name in poisoned.items():
        if assignments := KINDS[name].corrupt:
            conn.execute(f"UPDATE conveyor_job SET {assignments} WHERE id = %s", [job_id])


ROWS = """
SELECT id, state, errors -> -1 ->> 'traceback', history -> -1 ->> 'detail'
FROM conveyor_job WHERE id = ANY(%(ids)s)
"""


def check(conn: psycopg.Connection, poisoned: dict[int, str]) -> tuple[dict[str, Any], list[str]]:
    """Every poisoned job (id -> kind) as its kind says: its figures, and what failed."""
    rows = {r[0]: r[1:] for r in conn.execute(ROWS, {"ids": list(poisoned)}).fetchall()}
    by_kind: dict[str, dict[str, int]] = {}
    failed: list[str] = []
    for job_id, name in sorted(poisoned.items()):
        kind = KINDS[name]
        state, error, note = rows[job_id]
        text = note if name in PARKED else error
        ok = state == kind.state and kind.reason in (text or "")
        tally = by_kind.setdefault(name, {"jobs": 0, "as_expected": 0})
        tally["jobs"] += 1
        tally["as_expected"] += ok
        if not ok and len(failed) < 10:
            failed.append(
                f"Poisoned job {job_id} ({name}) ended {state}, not {kind.state} with "
                f"{kind.reason!r}: {(text or '')[-300:]!r}"
            )
    wrong = sum(t["jobs"] - t["as_expected"] for t in by_kind.values())
    if wrong > len(failed):
        failed.append(f"{wrong} poisoned job(s) in all did not end as their kind says.")
    return {"poisoned_jobs": len(poisoned), "poisoned_by_kind": by_kind}, failed
