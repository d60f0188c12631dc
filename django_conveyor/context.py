"""What a handler that takes `context` receives.

`JobContext` extends django.tasks' TaskContext with the fencing token, a
stable idempotency key for effects in other systems, a cooperative "is my
lease still held?" check, and `atomic()`: the guarded transaction that makes
database effects exactly-once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import connections, transaction

from . import protocol
from .compat import TaskContext
from .conf import DEFAULT_LEASE_SECONDS
from .exceptions import LeaseLost


@dataclass(slots=True)
class LeaseState:
    """Shared between the worker loop and the handler thread of one attempt."""

    owner: str
    version: int
    database: str  # The alias whose conveyor_job holds the job.
    # Bounds each statement, and each idle gap, of context.atomic() (seconds).
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    lost: threading.Event = field(default_factory=threading.Event)
    completed_in_atomic: bool = False  # The guarded commit wrote the outcome.
    in_atomic: bool = False  # Holding the row lock in context.atomic() right now.
    lost_reason: str = ""

    def mark_lost(self, reason: str) -> None:
        self.lost_reason = reason
        self.lost.set()


@dataclass(frozen=True, slots=True, kw_only=True)
class JobContext(TaskContext):
    job_id: int  # The conveyor_job id (also task_result.id as a string).
    token: int  # The fencing token: this attempt's lease version.
    worker_id: str  # The worker holding the lease.
    database: str  # Django alias of conveyor_job; atomic() writes there.
    lease_state: LeaseState = field(repr=False)

    @property
    def idempotency_key(self) -> str:
        """Stable across attempts of this job: pass it to remote systems."""
        return f"conveyor-job-{self.task_result.id}"  # `alias:id` for a sharded job

    def effect_key(self, name: str) -> str:
        """A stable key for one named effect of this job (several per job)."""
        return f"{self.idempotency_key}-{name}"

    def lease_held(self) -> bool:
        """False once the worker knows the lease is gone: stop work early."""
        return not self.lease_state.lost.is_set()

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
        state = self.lease_state
        connection = connections[self.database]
        if connection.in_atomic_block:
            raise RuntimeError(
                "context.atomic() must be the outermost transaction: inside another "
                "atomic block its commit would not be the job's commit."
            )
        if state.completed_in_atomic:
            raise RuntimeError("context.atomic() completes the job; use it once per attempt.")
        state.in_atomic = True
        try:
            yield from self._guarded(connection)
            state.completed_in_atomic = True
        finally:
            state.in_atomic = False

    def _guarded(self, connection: Any) -> Iterator[None]:
        state = self.lease_state
        with transaction.atomic(using=self.database):
            with connection.cursor() as cursor:
                protocol.bound_transaction(cursor, seconds=state.lease_seconds)
                if not protocol.lock_for_effect(
                    cursor, job_id=self.job_id, owner=self.worker_id, version=self.token
                ):
                    state.mark_lost("the guarded lock found another token")
                    raise LeaseLost(
                        f"Job {self.job_id} is no longer held by token {self.token} of worker "
                        f"{self.worker_id}; nothing in this transaction was committed."
                    )
            yield
            with connection.cursor() as cursor:
                done = protocol.complete(
                    cursor, owner=self.worker_id, done=[(self.job_id, self.token, None)]
                )
            if not done:  # Unreachable while we hold the row lock; fail safe anyway.
                raise LeaseLost(f"Job {self.job_id} could not be completed by token {self.token}.")

    def record_effect(self, effect_key: str) -> Any:
        """Record an applied effect in the ledger; call it inside `atomic()`."""
        from .ledger import record_effect

        return record_effect(self, effect_key)
