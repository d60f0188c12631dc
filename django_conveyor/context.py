"""What a handler that takes `context` receives.

`JobContext` extends django.tasks' TaskContext with the fencing token, a
stable idempotency key for effects in other systems, a cooperative "is my
lease still held?" check, and `atomic()`: the guarded transaction that makes
database effects exactly-once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction

from . import ledger, protocol
from .compat import TaskContext
from .exceptions import LeaseLost
from .results import ConveyorTaskResult, result_from_job
from .serialization import checked_name, loaded, to_json

CHECKPOINT_PREFIX = "checkpoint:"  # A step's effect key in conveyor_ledger.
MAX_STEP_NAME_LENGTH = 200

if TYPE_CHECKING:
    from .worker.attempts import Attempt


@dataclass(frozen=True, slots=True, kw_only=True)
class JobContext(TaskContext):
    held: Attempt = field(repr=False)  # The attempt the worker holds, shared with its control loop.
    _loaded: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def dependency_results(self) -> dict[str, ConveyorTaskResult]:
        """The results of the jobs this one depends on, by result id, in id order.

        Read with one query, on first use, however many dependencies there
        are. A dependency's `return_value` is there when it completed; with
        `dependency_policy="run"`, check `status` (or `state`) first.
        """
        if "dependencies" not in self._loaded:
            self._loaded["dependencies"] = dependency_results(self.database, self.job_id)
        return self._loaded["dependencies"]

    @property
    def attempt(self) -> int:
        """This attempt's number, from 1 (a requeue starts again at 1)."""
        return self.held.lease.attempt

    @property
    def job_id(self) -> int:
        """The conveyor_job id (also task_result.id, as a string, outside shards)."""
        return self.held.lease.id

    @property
    def token(self) -> int:
        """The fencing token: this attempt's lease version."""
        return self.held.lease.version

    @property
    def worker_id(self) -> str:
        """The worker holding the lease (the token's owner)."""
        return self.held.lease.owner

    @property
    def database(self) -> str:
        """Django alias of conveyor_job; atomic() writes there."""
        return self.held.database

    @property
    def idempotency_key(self) -> str:
        """Stable across attempts of this job: pass it to remote systems."""
        return f"conveyor-job-{self.task_result.id}"  # `alias:id` for a sharded job

    def effect_key(self, name: str) -> str:
        """A stable key for one named effect of this job (several per job)."""
        return f"{self.idempotency_key}-{name}"

    def lease_held(self) -> bool:
        """False once the worker knows the lease is gone or the job cancelled: stop early."""
        return not self.held.lost

    @property
    def cancel_requested(self) -> bool:
        """True once the worker learnt that an operator cancelled this running job."""
        return self.held.cancel_requested

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """Run the block and complete the job in one commit, only under our token.

        The job row is locked first, guarded by owner and version, so the
        reaper (which skips locked rows) cannot take the job back while the
        block runs. Raises LeaseLost, with nothing committed, when the token
        no longer holds the job.

        The transaction is bounded by the worker's lease: PostgreSQL cancels a
        statement in it that runs longer than one lease, and ends the
        transaction (closing the connection) when the block goes a lease
        without a statement, so a worker frozen inside it cannot hold the job
        for ever. The job is then reaped and run again; the block's next
        statement, and its commit, fail with nothing committed.
        """
        held = self.held
        connection = connections[self.database]
        if _nested(connection, held.outer_atomic_blocks):
            raise RuntimeError(
                "context.atomic() must be the outermost transaction: inside another "
                "atomic block its commit would not be the job's commit."
            )
        if held.completed_in_atomic:
            raise RuntimeError("context.atomic() completes the job; use it once per attempt.")
        held.in_atomic = True
        try:
            yield from self._guarded(connection)
            held.completed_in_atomic = True
        finally:
            held.in_atomic = False

    def _guarded(self, connection: Any) -> Iterator[None]:
        with transaction.atomic(using=self.database):
            with connection.cursor() as cursor:
                self._lock(cursor)
            yield
            with connection.cursor() as cursor:
                done = protocol.complete(
                    cursor, owner=self.worker_id, done=[(self.job_id, self.token, None)]
                )
            if not done:  # Unreachable while we hold the row lock; fail safe anyway.
                raise LeaseLost(f"Job {self.job_id} could not be completed by token {self.token}.")

    def step_key(self, name: str) -> str:
        """The idempotency key of one checkpointed step, stable across attempts: pass it on."""
        return f"{self.idempotency_key}-checkpoint-{name}"

    def checkpoint(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run `fn(*args, **kwargs)` once for this job; return its (JSON) result.

        A step an earlier attempt recorded returns its recorded value, and `fn`
        does not run. Otherwise `fn` runs in one guarded transaction, as in
        `atomic()` (the job row locked under this attempt's token first), and
        its result is recorded in the ledger (CHECKPOINT) in the same commit as
        `fn`'s own writes; the job stays running. Raises LeaseLost, with
        nothing committed, when the token no longer holds the job.
        """
        key = _step_effect_key(name)
        held = self.held
        if held.in_atomic or held.completed_in_atomic:
            raise RuntimeError(
                "context.checkpoint() cannot run inside or after context.atomic(): the "
                "guarded transaction's commit completes the job."
            )
        connection = connections[self.database]
        if _nested(connection, held.outer_atomic_blocks):
            raise RuntimeError(
                "context.checkpoint() must be the outermost transaction: inside another "
                "atomic block its commit would not be the step's."
            )
        with connection.cursor() as cursor:
            found, value = protocol.recorded_step(cursor, job_id=self.job_id, key=key)
        if found:
            return value
        with transaction.atomic(using=self.database):
            with connection.cursor() as cursor:
                self._lock(cursor)
            value = fn(*args, **kwargs)
            text = to_json(value, f"the result of checkpoint {name!r}")
            with connection.cursor() as cursor:
                recorded = protocol.checkpoint(
                    cursor, job_id=self.job_id, owner=self.worker_id, version=self.token,
                    key=key, value=text,
                )  # fmt: skip
            if not recorded:  # Recorded since our read: roll fn's writes back, return that one.
                transaction.set_rollback(True, using=self.database)
        if recorded:
            return loaded(text)
        with connection.cursor() as cursor:
            return protocol.recorded_step(cursor, job_id=self.job_id, key=key)[1]

    def _lock(self, cursor: Any) -> None:
        """BOUND_TRANSACTION and LOCK_FOR_EFFECT; LeaseLost when the token lost the job."""
        protocol.bound_transaction(cursor, seconds=self.held.lease_seconds)
        if not protocol.lock_for_effect(
            cursor, job_id=self.job_id, owner=self.worker_id, version=self.token
        ):
            self.held.mark_lost("the guarded lock found another token")
            raise LeaseLost(
                f"Job {self.job_id} is no longer held by token {self.token} of worker "
                f"{self.worker_id}; nothing in this transaction was committed."
            )

    def record_effect(self, effect_key: str) -> Any:
        """Record an applied effect in the ledger; call it inside `atomic()`."""
        if not self.held.in_atomic:
            raise RuntimeError("record_effect() must run inside context.atomic().")
        return ledger.record_effect(
            database=self.database,
            job_id=self.job_id,
            lease_version=self.token,
            worker=self.worker_id,
            effect_key=effect_key,
        )


def _step_effect_key(name: Any) -> str:
    return CHECKPOINT_PREFIX + checked_name(name, "A checkpoint's name", MAX_STEP_NAME_LENGTH)


def _nested(connection: Any, outer_blocks: int) -> bool:
    """Inside an atomic block of the handler's own (those of a test around it do not count)."""
    if outer_blocks:
        return len(connection.atomic_blocks) > outer_blocks
    return connection.in_atomic_block


def dependency_results(database: str, job_id: int) -> dict[str, ConveyorTaskResult]:
    """The results of every job `job_id` depends on, by result id: one query."""
    from .models import Dependency, Job

    jobs = Job.objects.using(database).filter(
        pk__in=Dependency.objects.using(database).filter(job_id=job_id).values("depends_on_id")
    )
    results = (result_from_job(job, database=database) for job in jobs.order_by("id"))
    return {result.id: result for result in results}
