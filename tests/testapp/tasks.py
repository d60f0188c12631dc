"""Task handlers the tests enqueue; each leaves an observable trace."""

import gc
import os
import threading
import time
from pathlib import Path

from django.db import transaction

from django_conveyor import Discard, Snooze, Unique, task

from .models import Effect


@task()
def noop():
    return None


@task()
def collector_state():
    """How the worker process set Python's garbage collector (tests/test_processes.py)."""
    return {"threshold": list(gc.get_threshold()), "frozen": gc.get_freeze_count()}


@task()
def add(a, b):
    return a + b


@task(queue_name="emails")
def send_email(to):
    return f"sent to {to}"


@task()
def record(label):
    """Not exactly-once: a plain write outside the guarded transaction."""
    Effect.objects.create(job_id=0, token=0, worker="", label=label)
    return label


@task(takes_context=True)
def apply_once(context, label):
    """The exactly-once pattern: effect, ledger entry and completion in one commit."""
    with context.atomic():
        Effect.objects.create(
            job_id=context.job_id, token=context.token, worker=context.worker_id, label=label
        )
        context.record_effect(label)
    return {"attempt": context.attempt, "token": context.token}


@task(takes_context=True)
def slow_apply_once(context, label, seconds):
    """Sleeps first (long enough to be frozen or killed), then applies once."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
    with context.atomic():
        Effect.objects.create(
            job_id=context.job_id, token=context.token, worker=context.worker_id, label=label
        )
        context.record_effect(label)
    return {"attempt": context.attempt, "pid": os.getpid()}


@task(takes_context=True)
def dwell_in_atomic(context, label, marker, seconds):
    """Applies once; its first attempt then stays `seconds` inside the guarded transaction.

    It writes `marker` when it is in there, so a test can freeze its worker at
    that moment, holding the job's row lock.
    """
    with context.atomic():
        Effect.objects.create(
            job_id=context.job_id, token=context.token, worker=context.worker_id, label=label
        )
        context.record_effect(label)
        if context.attempt == 1:
            Path(marker).write_text(str(os.getpid()))
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                time.sleep(0.05)
    return {"attempt": context.attempt, "pid": os.getpid()}


@task(max_attempts=3, backoff_base=0.05, backoff_cap=0.1)
def always_fails(message):
    raise ValueError(message)


@task(takes_context=True, max_attempts=5)
def fails_then_succeeds(context, failures):
    if context.attempt <= failures:
        raise RuntimeError(f"attempt {context.attempt} fails on purpose")
    return context.attempt


@task(backoff_base=30, backoff_cap=30)
def fails_slowly():
    raise RuntimeError("retry me in a while")


@task()
def discard_me(reason):
    raise Discard(reason)


@task(takes_context=True)
def snooze_once(context, seconds):
    if not Effect.objects.filter(label=f"snoozed-{context.job_id}").exists():
        Effect.objects.create(
            job_id=context.job_id, token=context.token, worker="", label=f"snoozed-{context.job_id}"
        )
        raise Snooze(seconds)
    return context.attempt


@task()
def started_then_sleeps(label, seconds):
    """Records that a slot started it (a plain write), then takes a while."""
    Effect.objects.create(job_id=0, token=0, worker="", label=label)
    time.sleep(seconds)
    return label


@task(takes_context=True)
def sleeper(context, seconds):
    """Sleeps cooperatively: stops early once it learns the lease is gone."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and context.lease_held():
        time.sleep(0.02)
    return context.lease_held()


@task(timeout=0.3, max_attempts=1)
def too_slow(seconds):
    time.sleep(seconds)


@task()
async def async_add(a, b):
    return a + b


@task(priority=10)
def important(label):
    Effect.objects.create(job_id=0, token=0, worker="", label=label)


@task()
def ordered(label):
    Effect.objects.create(job_id=0, token=0, worker="", label=label)


@task()
def returns_unserializable():
    return object()


@task()
def exits():
    raise SystemExit(3)


@task()
def in_transaction_enqueue(label):
    with transaction.atomic():
        Effect.objects.create(job_id=0, token=0, worker="", label=label)


@task(takes_context=True)
def effect_outside_atomic(context):
    with transaction.atomic():
        try:
            context.record_effect("unguarded")
        except RuntimeError as exc:
            raise Discard(str(exc)) from exc


@task(takes_context=True)
def report_keys(context):
    return {
        "key": context.idempotency_key,
        "effect": context.effect_key("charge"),
        "token": context.token,
        "held": context.lease_held(),
    }


@task(queue_name="emails", priority=5, max_attempts=3)
def nightly_report(full=False):
    return {"full": full}


not_a_task = "just a string"


@task(takes_context=True, max_attempts=1)
def cancellable(context, seconds):
    """Works in small steps until told to stop; records what it was told."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and context.lease_held():
        time.sleep(0.02)
    Effect.objects.create(
        job_id=context.job_id,
        token=context.token,
        worker=context.worker_id,
        label=f"stopped held={context.lease_held()} cancel_requested={context.cancel_requested}",
    )
    return "ran to the end"


@task(max_attempts=1)
async def async_sleeper(label, seconds):
    import asyncio

    from asgiref.sync import sync_to_async

    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        await sync_to_async(Effect.objects.create)(job_id=0, token=0, worker="", label=label)
        raise
    return "slept"


# -- poisoned handlers (issue 8): what they return, raise or ask for cannot be stored as is.

HUGE_SNOOZE_SECONDS = 1_700_000_000_000  # Milliseconds since 1970 passed as seconds.
POISONS = {
    "nul_return": "returns 'a\\x00b'",
    "nul_discard": "raises Discard('bad byte \\x00')",
    "nul_exception": "raises ValueError('bad byte \\x00')",
    "nan_snooze": "raises Snooze(nan)",
    "inf_snooze": "raises Snooze(inf)",
    "negative_snooze": "raises Snooze(-1)",
    "huge_snooze": f"raises Snooze({HUGE_SNOOZE_SECONDS})",
    "nan_return": "returns nan",
    "deep_return": "returns lists nested 1,000 deep",
}


@task()
def poison(kind):
    """Misbehave as `kind` says (POISONS)."""
    if kind == "nul_return":
        return "a\x00b"
    if kind == "nul_discard":
        raise Discard("bad byte \x00")
    if kind == "nul_exception":
        raise ValueError("bad byte \x00")
    if kind.endswith("_snooze"):
        seconds = {"nan": float("nan"), "inf": float("inf"), "negative": -1}
        raise Snooze(seconds.get(kind.removesuffix("_snooze"), HUGE_SNOOZE_SECONDS))
    if kind == "nan_return":
        return float("nan")
    if kind == "deep_return":
        value = []
        for _ in range(1000):
            value = [value]
        return value
    raise AssertionError(f"unknown poison {kind!r}")


@task(max_attempts=1)
def huge_backoff():
    raise ValueError("fails once, with a backoff no database can add to now()")


# A task option that escaped validation (a subclass, a bug): the worker must cap it still.
object.__setattr__(huge_backoff, "backoff_base", 1e300)
object.__setattr__(huge_backoff, "backoff_cap", 1e300)


@task()
def unchecked_poison(kind):
    """What the checks before SQL stop, sent to PostgreSQL anyway (tests/unchecked.py)."""
    if kind == "nul_return":
        return "a\x00b"
    raise ValueError("unchecked: bad byte \x00")


GATE = threading.Event()  # Opened by a test; in-process workers only.


@task()
def gated(label):
    """Waits until the test opens GATE, so the test can act while it runs."""
    GATE.wait(30)
    return label


@task()
def enqueues_next(label, left):
    """Records `label`, then enqueues itself until `left` reaches 0 (a chain of jobs)."""
    Effect.objects.create(job_id=0, token=0, worker="", label=label)
    if left:
        enqueues_next.enqueue(f"{label}+", left - 1)


@task(max_attempts=2)
def breaks_its_statement():
    """A statement PostgreSQL refuses: aborts the transaction it runs in."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT no_such_column FROM conveyor_job")


@task()
def enqueues_child(key):
    """Enqueues add(1, 2) under an idempotency key: a second run replays it."""
    return add.using(idempotency_key=key).enqueue(1, 2).id


def _wait_for_effect(label, seconds=60.0):
    deadline = time.monotonic() + seconds
    while not Effect.objects.filter(label=label).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {label!r} effect within {seconds}s")
        time.sleep(0.05)


@task(takes_context=True)
def wf_step(context, label):
    """A workflow step: refuses to run before its dependencies completed, then records itself."""
    seen = context.dependency_results
    unfinished = [r.id for r in seen.values() if r.state != "completed"]
    if unfinished:
        raise RuntimeError(f"{label} ran before its dependencies {unfinished} completed")
    Effect.objects.create(
        job_id=context.job_id, token=context.token, worker=context.worker_id, label=label
    )
    return {"label": label, "saw": sorted(r.return_value["label"] for r in seen.values())}


@task(takes_context=True, dependency_policy="run")
def wf_cleanup(context, label):
    """A run-anyway step: records the states its dependencies ended in."""
    states = sorted(r.state for r in context.dependency_results.values())
    Effect.objects.create(
        job_id=context.job_id, token=context.token, worker=context.worker_id, label=label
    )
    return {"label": label, "states": states}


@task(max_attempts=2, backoff_base=0.05, backoff_cap=0.1)
def wf_breaks(label):
    """Fails until a `fix:<label>` effect exists (an operator's repair)."""
    if not Effect.objects.filter(label=f"fix:{label}").exists():
        raise RuntimeError(f"{label} is broken")
    Effect.objects.create(job_id=0, token=0, worker="", label=label)
    return {"label": label}


@task(takes_context=True, max_attempts=2)
def wf_held(context, label):
    """Attempt 1 sleeps (to be frozen); later attempts wait for a `go:<label>` effect."""
    if context.attempt == 1:
        time.sleep(1.5)
    else:
        _wait_for_effect(f"go:{label}")
    return {"label": label, "attempt": context.attempt}


@task(takes_context=True, max_attempts=1)
def returns_once_cancel_requested(context):
    """Returns as soon as its row carries a cancel request: before any heartbeat tells it."""
    from django_conveyor.models import Job

    deadline = time.monotonic() + 60
    while not Job.objects.filter(pk=context.job_id, cancel_requested_at__isnull=False).exists():
        if time.monotonic() > deadline:
            raise TimeoutError("no cancel request within 60s")
        time.sleep(0.02)
    return "returned after the request"


# Unique jobs (docs/unique-jobs.md).
@task(unique=Unique())
def unique_add(a, b):
    return a + b


@task(unique=Unique(by=lambda account_id, **rest: account_id, on_duplicate="replace"))
def debounced(account_id, note=""):
    Effect.objects.create(job_id=0, token=0, worker="", label=f"debounced {account_id} {note}")
    return note


@task(unique=Unique(period=1, states=["blocked", "available", "running", "completed"]))
def once_a_second(label):
    return label


def _write_step(label, job_id):
    """A checkpointed step's business write: counted to prove it commits once."""
    Effect.objects.create(job_id=job_id, token=0, worker="", label=label)
    return label


@task(takes_context=True, max_attempts=5, backoff_base=0.01, backoff_cap=0.02)
def three_steps(context, fail_after):
    """Three checkpointed steps; raises after step `fail_after` on the first attempts."""
    done = []
    for step in ("one", "two", "three"):
        done.append(context.checkpoint(step, _write_step, step, context.job_id))
        if context.attempt <= fail_after and step == ("one", "two", "three")[fail_after - 1]:
            raise RuntimeError(f"failing after step {step} on attempt {context.attempt}")
    return done


@task(takes_context=True)
def reads_dependencies(context):
    """Returns the return values of its dependencies, in id order."""
    return [r.return_value for r in context.dependency_results.values()]


@task(takes_context=True)
def checkpoint_misuse(context):
    """Each misuse of context.checkpoint() raises a clear error; returns their starts."""
    messages = []
    try:
        with context.atomic():
            context.checkpoint("inside", _write_step, "inside", 0)
    except RuntimeError as exc:  # The guarded transaction rolled back; the attempt goes on.
        messages.append(str(exc)[:64])
    try:
        context.checkpoint("", _write_step, "x", 0)
    except ValueError as exc:
        messages.append(str(exc)[:46])
    try:
        context.checkpoint("bad", lambda: (_write_step("bad", 0), object())[1])
    except TypeError as exc:
        messages.append("is not JSON-serializable" if "JSON-serializable" in str(exc) else str(exc))
    return messages


@task(takes_context=True)
def fenced_once_then_apply(context, label):
    """Its first attempt finds its connection read-only (a fenced primary), as a handler would."""
    from django.db import connection

    if context.attempt == 1:
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION default_transaction_read_only = on")
    return apply_once.func(context, label)


@task(queue_name="emails", concurrency_key=lambda account, **kwargs: f"account:{account}")
def sync_account(account, bad_key=None):
    """Flow control: one key per account, computed from the call's arguments."""
    return account
