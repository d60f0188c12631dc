"""The one handler the fault runs enqueue: work, then apply its effect once."""

from __future__ import annotations

import time

from django.db import connection

from django_conveyor import Discard, task
from django_conveyor.context import JobContext
from tests.testapp.models import Effect

from .settings import QUEUE

EFFECT_KEY = "fault-effect"
TASK_PATH = "tests.faults.tasks.apply_effect"
# While a handler is inside its guarded transaction, its session's
# application_name reads "<prefix><worker id> <job> <token>" (SET LOCAL: it
# ends with the transaction), so the sigstop-atomic injector can find it.
IN_ATOMIC = "conveyor-atomic:"


@task(takes_context=True, queue_name=QUEUE)
def apply_effect(context: JobContext, work_seconds: float, inside_seconds: float) -> int:
    """Sleep (a window for faults), then write the effect, ledger entry and completion.

    Part of the time is spent inside the guarded transaction, holding the job
    row lock, so faults also land between the lock and the commit.
    """
    time.sleep(work_seconds)
    with context.atomic():
        with connection.cursor() as cursor:
            name = f"{IN_ATOMIC}{context.worker_id} {context.job_id} {context.token}"
            cursor.execute("SELECT set_config('application_name', %s, true)", [name])
        Effect.objects.create(
            job_id=context.job_id, token=context.token, worker=context.worker_id, label=EFFECT_KEY
        )
        context.record_effect(EFFECT_KEY)
        time.sleep(inside_seconds)
    return context.token


STEP_PATH = "tests.faults.tasks.workflow_step"


@task(takes_context=True, queue_name=QUEUE)
def workflow_step(
    context: JobContext, work_seconds: float, inside_seconds: float, workflow: int, step: str
) -> int:
    """One step of a fault run's workflow: `apply_effect`, after checking its dependencies.

    A step that finds a dependency not completed is discarded (`failed`), which
    the run counts as a failure: it would have run too early.
    """
    early = [r.id for r in context.dependency_results.values() if r.state != "completed"]
    if early:
        raise Discard(f"step {step} of workflow {workflow} ran before {early} completed")
    return apply_effect.func(context, work_seconds, inside_seconds)


GATED_STEP_PATH = "tests.faults.tasks.checkpointed_step"


def _step_effect(job_id: int, label: str) -> str:
    Effect.objects.create(job_id=job_id, token=0, worker="", label=label)
    return label


@task(takes_context=True, queue_name=QUEUE)
def checkpointed_step(
    context: JobContext, first_seconds: float, second_seconds: float, workflow: int
) -> int:
    """Two checkpointed steps with a window for faults after each, then the usual effect.

    Killed between the steps, a later attempt resumes after the last recorded
    one: each step's row (`step-one`, `step-two`) must be written once.
    """
    context.checkpoint("one", _step_effect, context.job_id, "step-one")
    time.sleep(first_seconds)
    context.checkpoint("two", _step_effect, context.job_id, "step-two")
    time.sleep(second_seconds)
    return apply_effect.func(context, 0.0, 0.0)
