"""How the outcomes of attempts are written: one fenced statement per kind.

An `Outcome` (attempts.py) is what an attempt asks the database to do
when it ends. Every write a worker makes about a job it holds goes
through here: the control loop writes the pending outcomes in its next
cycle with one fenced statement per kind (`write`).

Each row is matched on its own owner and version, so a batch can mix fresh
and stale outcomes; a writer returns what became of the rows it wrote, and
a row missing from that was refused by the fence.

Isolation: what an outcome carries is made storable before SQL where that
is cheap (error text with NUL characters is escaped, delays past ten years
are capped and the cap recorded; return values were checked by the
executor). Should PostgreSQL still refuse a row, the whole batch fails, so
the loop writes the outcomes again one by one (`write_each`), each in a
savepoint: the row that is still refused becomes that job's own FAIL,
with an `OutcomeRefused` entry saying why, and every other row is written.

To add a kind: a constant in attempts.py, a writer here calling its
protocol statement, and an entry in `WRITERS`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
from django.db import DatabaseError as DjangoDatabaseError

from .. import protocol
from ..exceptions import OutcomeRefused
from ..observability import joblogs
from ..protocol import Cursor
from ..serialization import storable_text
from .attempts import (
    CANCEL_HELD,
    COMPLETE,
    DONE_IN_ATOMIC,
    FAIL,
    LOST,
    RELEASE,
    RETRY,
    SNOOZE,
    Outcome,
)
from .instrument import log_job

logger = logging.getLogger(__name__)

# A writer: one fenced statement for a batch of one kind -> {job id: what it became}.
Writer = Callable[[Cursor, str, list[Outcome]], dict[int, str]]


def _complete(cur: Cursor, owner: str, batch: list[Outcome]) -> dict[int, str]:
    done = [(o.lease.id, o.lease.version, o.return_value) for o in batch]
    written = dict.fromkeys(protocol.complete(cur, owner=owner, done=done), "completed")
    return _cancel_refused(cur, owner, batch, written)


def send_completions(cur: Cursor, owner: str, batch: list[Outcome]) -> bool:
    """COMPLETE of a batch, not read yet (the cycle's pipeline sends it with the claim)."""
    done = [(o.lease.id, o.lease.version, o.return_value) for o in batch]
    return protocol.send_complete(cur, owner=owner, done=done)


def completions_written(cur: Cursor, owner: str, batch: list[Outcome]) -> dict[int, str]:
    """What `send_completions` wrote, as `write` says it, with the same follow-ups
    (CANCEL_HELD of the refused, the attempts' logs), in the same transaction."""
    written = dict.fromkeys(protocol.written_ids(cur), "completed")
    written = _cancel_refused(cur, owner, batch, written)
    write_logs(cur, owner, batch, written)
    return written


def _cancel_refused(
    cur: Cursor, owner: str, batch: list[Outcome], written: dict[int, str]
) -> dict[int, str]:
    if len(written) < len(batch):
        # COMPLETE refuses a job an operator asked to cancel (its handler returned
        # before the heartbeat said so): the holder cancels it instead, now.
        refused = [(o.lease.id, o.lease.version) for o in batch if o.lease.id not in written]
        cancelled = protocol.cancel_held(cur, owner=owner, held=refused, actor=f"worker:{owner}")
        written.update(dict.fromkeys(cancelled, "cancelled"))
    return written


def _retry(cur: Cursor, owner: str, batch: list[Outcome]) -> dict[int, str]:
    failures = [(o.lease.id, o.lease.version, o.delay, o.error) for o in batch]
    states = protocol.retry(cur, owner=owner, failures=failures)
    return {i: "retried" if state == "available" else state for i, state in states.items()}


def _fail(cur: Cursor, owner: str, batch: list[Outcome]) -> dict[int, str]:
    failures = [(o.lease.id, o.lease.version, o.error) for o in batch]
    return dict.fromkeys(protocol.fail(cur, owner=owner, failures=failures), "failed")


def _snooze(cur: Cursor, owner: str, batch: list[Outcome]) -> dict[int, str]:
    snoozed = [(o.lease.id, o.lease.version, o.delay, o.note) for o in batch]
    done = protocol.snooze(cur, owner=owner, snoozed=snoozed, actor=f"worker:{owner}")
    return dict.fromkeys(done, "snoozed")


def _release(cur: Cursor, owner: str, batch: list[Outcome]) -> dict[int, str]:
    held = [(o.lease.id, o.lease.version) for o in batch]
    return dict.fromkeys(protocol.release(cur, owner=owner, held=held), "released")


def _record_result(cur: Cursor, owner: str, batch: list[Outcome]) -> dict[int, str]:
    # context.atomic() already completed these; store what they returned.
    done = [(o.lease.id, o.lease.version, o.return_value) for o in batch]
    protocol.record_result(cur, owner=owner, done=done)
    return {o.lease.id: "completed" for o in batch}


def _cancel_held(cur: Cursor, owner: str, batch: list[Outcome]) -> dict[int, str]:
    held = [(o.lease.id, o.lease.version) for o in batch]
    cancelled = protocol.cancel_held(cur, owner=owner, held=held, actor=f"worker:{owner}")
    return dict.fromkeys(cancelled, "cancelled")


def _nothing(cur: Cursor, owner: str, batch: list[Outcome]) -> dict[int, str]:
    return {}


WRITERS: dict[str, Writer] = {
    COMPLETE: _complete,
    RETRY: _retry,
    FAIL: _fail,
    SNOOZE: _snooze,
    RELEASE: _release,
    DONE_IN_ATOMIC: _record_result,
    LOST: _nothing,
    CANCEL_HELD: _cancel_held,
}


# Kinds whose writer may run more statements than its own (CANCEL_DEPENDENTS
# after an unsuccessful end, CANCEL_HELD after a refused COMPLETE): they need a
# transaction around them, even alone. (COMPLETE's UNBLOCK is in its statement.)
SEVERAL_STATEMENTS = frozenset({COMPLETE, RETRY, FAIL, CANCEL_HELD})


def statements(batch: Iterable[Outcome]) -> int:
    """How many statements writing `batch` may take: one per kind, two for the kinds
    whose writer may run a second one (SEVERAL_STATEMENTS)."""
    kinds = {o.kind for o in batch}
    return len(kinds) + len(kinds & SEVERAL_STATEMENTS)


def by_kind(outcomes: Iterable[Outcome]) -> dict[str, list[Outcome]]:
    batches: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        batches.setdefault(outcome.kind, []).append(outcome)
    return batches


def write(cur: Cursor, owner: str, batches: dict[str, list[Outcome]]) -> dict[int, str]:
    """Write every batch, one statement per kind; returns {job id: what it became}."""
    written: dict[int, str] = {}
    for kind, batch in batches.items():
        written.update(WRITERS[kind](cur, owner, batch))
    write_logs(cur, owner, (o for batch in batches.values() for o in batch), written)
    return written


def write_logs(
    cur: Cursor, owner: str, outcomes: Iterable[Outcome], written: dict[int, str]
) -> None:
    """The attempts' log records, for the outcomes the fence accepted (ATTEMPT_LOG)."""
    logs = [
        log
        for o in outcomes
        if o.attempt.log is not None
        and o.lease.id in written
        and (log := joblogs.row(o.attempt)) is not None
    ]
    protocol.attempt_log(cur, owner=owner, logs=logs)


# PostgreSQL refusing a value: a data exception (SQLSTATE class 22: bad text,
# JSON, numbers or times out of range) or a value past a limit (54000); on
# the client, a value the encoder refuses. Not a lost connection, a deadlock
# or a timeout: those are the database's state, not the row's, and are retried.
_REFUSED = (psycopg.DataError, psycopg.errors.ProgramLimitExceeded, ValueError, TypeError)


def refused_value(exc: BaseException) -> bool:
    """Whether `exc` says PostgreSQL (or the encoder) refused a value, rather than failed."""
    if isinstance(exc, DjangoDatabaseError) and exc.__cause__ is not None:
        exc = exc.__cause__  # Django's cursor wraps psycopg's errors.
    return isinstance(exc, _REFUSED)


Savepoint = Callable[[], AbstractContextManager[Any]]


@dataclass(slots=True)
class EachWritten:
    """What `write_each` did."""

    written: dict[int, str] = field(default_factory=dict)  # Job id -> what it became.
    replaced: dict[int, Outcome] = field(default_factory=dict)  # Refused -> what was written.
    abandoned: list[int] = field(default_factory=list)  # Even the FAIL refused: left to expire.


def write_each(
    cur: Cursor, owner: str, pending: Iterable[Outcome], savepoint: Savepoint
) -> EachWritten:
    """After a refused batch: each outcome alone, in a savepoint of the open transaction.

    A refused outcome becomes the job's FAIL, whose entry says why (text
    only, escaped: storable). If even that is refused the job is left to its
    lease, which expires, and the reaper takes it back (the attempt counts,
    so it ends `dead` at worst): never a batch that fails forever.
    """
    result = EachWritten()
    written, replaced = result.written, result.replaced
    for outcome in pending:
        try:
            with savepoint():
                written.update(WRITERS[outcome.kind](cur, owner, [outcome]))
            continue
        except Exception as exc:
            if not refused_value(exc):
                raise
            refusal = exc
        log_job(logger, logging.ERROR, outcome.lease, "%s outcome refused: %s", outcome.kind,
                _first_line(refusal))  # fmt: skip
        if outcome.kind == DONE_IN_ATOMIC:
            # The guarded commit completed the job: only its return value is lost.
            written[outcome.lease.id] = "completed"
            replaced[outcome.lease.id] = replace(outcome, return_value=None)
            continue
        failed = refused_outcome(outcome, refusal)
        try:
            with savepoint():
                written.update(_fail(cur, owner, [failed]))
            replaced[outcome.lease.id] = failed
        except Exception as exc:
            if not refused_value(exc):
                raise
            result.abandoned.append(outcome.lease.id)
            log_job(logger, logging.ERROR, outcome.lease,
                    "its failure was refused too (%s): the lease is left to expire",
                    _first_line(exc))  # fmt: skip
    try:
        with savepoint():
            write_logs(cur, owner, pending, written)
    except Exception as exc:  # The outcomes stand without their logs.
        if not refused_value(exc):
            raise
        logger.error("attempt logs refused: %s", _first_line(exc))
    return result


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines() or [""]
    return storable_text(f"{type(exc).__name__}: {lines[0]}")


def refused_outcome(outcome: Outcome, refusal: BaseException) -> Outcome:
    """The FAIL that records why PostgreSQL refused `outcome` (only plain, escaped text)."""
    sqlstate = getattr(refusal, "sqlstate", None) or getattr(refusal.__cause__, "sqlstate", None)
    lines = [
        f"django_conveyor.exceptions.OutcomeRefused: PostgreSQL refused to store this "
        f"attempt's {outcome.kind} outcome: {_first_line(refusal)}"
        + (f" (SQLSTATE {sqlstate})" if sqlstate else "")
        + ". The job failed instead, so that the other outcomes of its batch were written."
    ]
    if outcome.error:
        lines.append(
            f"The attempt's own error was {outcome.error.get('exception_class_path', '?')}:"
        )
        lines.append(str(outcome.error.get("traceback", ""))[-4000:])
    text = "\n".join(lines).encode("ascii", "backslashreplace").decode("ascii")
    error = {
        "exception_class_path": f"{OutcomeRefused.__module__}.{OutcomeRefused.__qualname__}",
        "traceback": text.replace("\x00", "\\x00"),
    }
    return Outcome(FAIL, outcome.attempt, error=error)
