"""Job states and how they map onto `django.tasks` statuses (DESIGN §3)."""

from __future__ import annotations

from django.db import models

from .compat import TaskResultStatus


class JobState(models.TextChoices):
    BLOCKED = "blocked", "Blocked"
    AVAILABLE = "available", "Available"
    RUNNING = "running", "Running"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    DEAD = "dead", "Dead"
    CANCELLED = "cancelled", "Cancelled"


FINAL_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.DEAD, JobState.CANCELLED})
REQUEUEABLE_STATES = frozenset({JobState.FAILED, JobState.DEAD, JobState.CANCELLED})
CANCELLABLE_STATES = frozenset({JobState.BLOCKED, JobState.AVAILABLE})

TASK_STATUS = {
    JobState.BLOCKED: TaskResultStatus.READY,
    JobState.AVAILABLE: TaskResultStatus.READY,
    JobState.RUNNING: TaskResultStatus.RUNNING,
    JobState.COMPLETED: TaskResultStatus.SUCCESSFUL,
    JobState.FAILED: TaskResultStatus.FAILED,
    JobState.DEAD: TaskResultStatus.FAILED,
    JobState.CANCELLED: TaskResultStatus.FAILED,
}
