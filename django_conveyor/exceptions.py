"""Errors of django-conveyor, all under one root.

`Discard` and `Snooze` are instructions a handler raises; `LeaseLost` is the
event a handler meets when its lease was taken from it.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


class ConveyorError(Exception):
    """Base class for django-conveyor errors. Do not raise directly."""


class Discard(ConveyorError):
    """Fail this job now and never retry it (state `failed`)."""


class Snooze(ConveyorError):
    """Run this job again later without using an attempt.

    The delay must be a finite number of seconds, zero or more: the worker
    fails a job that asks for another (NaN, infinity, a negative delay), and
    caps one longer than ten years (`bounds.MAX_SECONDS`), saying so.
    """

    def __init__(self, seconds: float = 60.0, reason: str = "") -> None:
        self.seconds = float(seconds)
        super().__init__(reason or f"Snoozed for {self.seconds:g} seconds.")


class LeaseLost(ConveyorError):
    """This worker no longer holds the job's lease; its writes were refused."""


class Cancelled(ConveyorError):
    """The job was cancelled before it ran (recorded in its errors)."""


class DependencyFailed(ConveyorError):
    """A dependency ended failed, dead or cancelled, so this job was cancelled unrun."""


class InvalidDependencies(ConveyorError, ValueError):
    """A job's dependencies cannot be honoured; nothing was enqueued."""


class DependencyNotFound(InvalidDependencies):
    """A dependency names no job in the database the dependent would live in."""


class DependencyInOtherDatabase(InvalidDependencies):
    """A dependency lives in another database (shard) than its dependent."""


class DependencyCycle(InvalidDependencies):
    """The steps of one workflow depend on each other in a circle."""


class DependencyAlreadyFailed(InvalidDependencies):
    """A dependency already ended failed, dead or cancelled: the dependent could never run."""


class TooManyDependencies(InvalidDependencies):
    """A job names more dependencies than the documented limit."""


class EffectAlreadyApplied(ConveyorError):
    """The ledger already holds this effect for this job."""


class UnknownTask(ConveyorError):
    """A job's task path does not import, or names something that is not a task."""


class IdempotencyKeyReused(ConveyorError):
    """An idempotency key already names a job with another task, arguments or queue."""

    def __init__(self, message: str, *, job_id: int, key: str) -> None:
        super().__init__(message)
        self.job_id = job_id  # The job the key already names.
        self.key = key


class UniqueKeyContended(ConveyorError):
    """The jobs holding a call's unique key kept changing state; nothing was decided for it."""


class OutcomeRefused(ConveyorError):
    """PostgreSQL refused to store an attempt's outcome; the job failed instead."""


class UnreadableRow(ConveyorError):
    """A job's row holds a value Python cannot load; the job failed without running."""


class ArgumentsNotSerializable(ConveyorError, TypeError):
    """A task's arguments or return value cannot survive a JSON round trip."""


class GateError(ConveyorError):
    """A signal was refused: the gate does not wait for it now. Nothing was written."""


class GateNotFound(GateError):
    """No job has the gate's id."""


class NotAGate(GateError):
    """The job is an ordinary job, not a gate."""


class WrongSignal(GateError):
    """The gate waits for another signal, or is a timer or a condition."""


class GateNotReady(GateError):
    """The gate's upstream steps are not done: it does not wait yet."""


class GateAlreadyPassed(GateError):
    """The gate already completed: signalled, its condition met, or timed out with 'continue'."""


class GateClosed(GateError):
    """The gate ended failed (timed out, rejected) or was cancelled."""


class GateTimedOut(ConveyorError):
    """A gate's timeout passed with on_timeout='fail' (recorded in its errors)."""


class SignalRejected(ConveyorError):
    """A signal gate was rejected (recorded in its errors)."""


class ConditionInvalid(ConveyorError):
    """A stored wait_until condition could not be evaluated (recorded in its errors)."""


class InvalidCondition(ConveyorError, ValueError):
    """A wait_until() condition cannot be stored with its gate; nothing was enqueued."""


class ConveyorConfigurationError(ImproperlyConfigured):
    """The CONVEYOR setting or the TASKS entry is invalid."""
