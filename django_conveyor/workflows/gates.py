"""Gates: steps of a workflow that no handler runs, and the signals that end them.

A gate is a row of conveyor_job whose `gate` column holds what it waits for
(docs/workflows.md, *Workflows that wait*). The three tasks below only give
gates a task path (`django_conveyor.workflows.gates.signal`, `.sleep`,
`.condition`), so that their results, pages and metrics work like any job's;
a worker never runs them, since CLAIM never takes a gate. The steps that
make gates (`workflows.signal`, `.sleep`, `.wait_until`) are in the
package's `__init__`, beside `chain` and `group`.

`send_signal()` and `reject_signal()` end a signal gate's wait through
protocol.SIGNAL, in the caller's transaction on the gate's database.
"""

from __future__ import annotations

from typing import Any

from django.db import connections, transaction

from .. import protocol
from ..exceptions import (
    Discard,
    GateAlreadyPassed,
    GateClosed,
    GateNotFound,
    GateNotReady,
    NotAGate,
    WrongSignal,
)
from ..results import ConveyorTaskResult, parse_result_id, result_from_job
from ..serialization import checked_name, text_problem, to_json

KINDS = ("signal", "sleep", "condition")
MAX_SIGNAL_NAME_LENGTH = 100
MAX_PAYLOAD_BYTES = 65_536  # A signal's payload, encoded: an approval, a webhook's gist.
MAX_REASON_LENGTH = 1_000
RESERVED_KEY = "timed_out"  # The timeout marker's key (on_timeout="continue").
DEFAULT_ACTOR = "code"


def _never_run() -> None:
    raise Discard("A gate is not run by a worker: it ends by a signal, a condition or a timeout.")


def _gate_task(kind: str) -> Any:
    from ..tasks import task

    function = _never_run
    gate = type(_never_run)(function.__code__, function.__globals__, kind)
    gate.__qualname__ = kind
    gate.__module__ = __name__
    return task(gate, max_attempts=1)


def __getattr__(name: str) -> Any:
    # The gate tasks need django.tasks, which needs settings: built on first use.
    if name in KINDS:
        globals()[name] = built = _gate_task(name)
        return built
    raise AttributeError(name)


def gate_task(kind: str) -> Any:
    """The task a gate of this kind names (`django_conveyor.workflows.gates.<kind>`)."""
    return getattr(__import__(__name__, fromlist=[kind]), kind)


def check_signal_name(name: Any, what: str = "signal name") -> str:
    return checked_name(name, f"The {what}", MAX_SIGNAL_NAME_LENGTH)


def payload_json(payload: Any) -> str | None:
    """The payload as stored JSON text (None: no payload), or a clear refusal."""
    if payload is None:
        return None
    text = to_json(payload, "the signal's payload")
    if len(text.encode()) > MAX_PAYLOAD_BYTES:
        raise ValueError(
            f"The signal's payload is {len(text.encode())} bytes as JSON; at most "
            f"{MAX_PAYLOAD_BYTES} are allowed. Store large data in your tables and send its id."
        )
    if isinstance(payload, dict) and RESERVED_KEY in payload:
        raise ValueError(
            f"The signal's payload may not have the top-level key {RESERVED_KEY!r}: it marks a "
            "gate that timed out with on_timeout='continue'."
        )
    return text


def send_signal(
    gate: Any, name: str, payload: Any = None, *, actor: str = DEFAULT_ACTOR
) -> ConveyorTaskResult:
    """End the wait of the signal gate `gate` (a result, its id or a job id): completed.

    The payload becomes the gate's return value, which its dependents read
    in `context.dependency_results`. Runs in the caller's transaction (a
    savepoint) on the gate's database. Raises a GateError, with nothing
    written, when the gate does not wait for this signal now.
    """
    return _signal(gate, name, payload_json(payload), reject=False, reason=None, actor=actor)


def reject_signal(
    gate: Any, name: str, *, reason: str = "", actor: str = DEFAULT_ACTOR
) -> ConveyorTaskResult:
    """End the wait of the signal gate `gate` as failed (a rejected approval).

    Its dependents follow their dependency_policy (cancelled by default).
    """
    if not isinstance(reason, str) or len(reason) > MAX_REASON_LENGTH:
        raise ValueError(f"reason must be a string of at most {MAX_REASON_LENGTH} characters.")
    if problem := text_problem(reason):
        raise ValueError(f"reason {reason!r:.80} {problem}.")
    return _signal(gate, name, None, reject=True, reason=reason or None, actor=actor)


def _signal(
    gate: Any, name: str, payload: str | None, *, reject: bool, reason: str | None, actor: str
) -> ConveyorTaskResult:
    from ..models import Job

    check_signal_name(name)
    database, job_id = _gate_id(gate)
    with transaction.atomic(using=database), connections[database].cursor() as cursor:
        state = protocol.signal(
            cursor, gate_id=job_id, name=name, payload=payload, reject=reject,
            reason=reason, actor=actor,
        )  # fmt: skip
        if state is None:
            raise refusal(cursor, job_id, name)
    return result_from_job(Job.objects.using(database).get(pk=job_id), database=database)


def _gate_id(gate: Any) -> tuple[str, int]:
    """The (database, job id) of a gate given as a result, a result id or a job id."""
    from ..compat import TaskResultDoesNotExist
    from ..conf import conveyor_settings

    value = getattr(gate, "id", gate)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise GateNotFound(
            f"A gate is named by its result, result id or job id, not {value!r:.80}."
        )
    try:
        database, job_id = parse_result_id(value)
    except TaskResultDoesNotExist:
        raise GateNotFound(f"No job has the id {value!r:.80}.") from None
    if database not in conveyor_settings().databases():
        raise GateNotFound(f"No job has the id {value!r:.80}: no database {database!r}.")
    return database, job_id


def refusal(cursor: Any, job_id: int, name: str) -> Exception:
    """Why SIGNAL matched no row: the error to raise."""
    row = protocol.gate_state(cursor, gate_id=job_id)
    if row is None:
        return GateNotFound(f"No job has the id {job_id}.")
    state, pending, gate = row
    if gate is None:
        return NotAGate(f"Job {job_id} is not a gate; only gates take signals.")
    kind = gate.get("kind")
    if kind != "signal":
        return WrongSignal(f"Gate {job_id} is a {_kind_text(kind)}; it takes no signal.")
    if gate.get("signal") != name:
        return WrongSignal(
            f"Gate {job_id} waits for the signal {gate.get('signal')!r}, not {name!r}."
        )
    if state == "blocked":
        return GateNotReady(
            f"Gate {job_id} does not wait yet: {pending} of its upstream steps are not done. "
            "A signal is accepted once they complete."
        )
    if state == "completed":
        return GateAlreadyPassed(f"Gate {job_id} already passed: it takes one signal.")
    return GateClosed(
        f"Gate {job_id} is {state} ({_why_closed(state)}); it takes no more signals. "
        "Requeue it to wait again."
    )


def _kind_text(kind: str | None) -> str:
    return {"sleep": "timer", "condition": "row condition (wait_until)"}.get(kind or "", "gate")


def _why_closed(state: str) -> str:
    return {
        "failed": "it timed out, or its signal was rejected",
        "cancelled": "an upstream step failed, or an operator cancelled it",
    }.get(state, state)
