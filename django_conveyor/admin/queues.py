"""Queues: counts per queue, paused or running, pause and resume."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import Count, IntegerField, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce, Now
from django.http import HttpRequest
from django.utils.safestring import mark_safe

from .. import operations
from ..models import Job, Queue
from ..states import JobState
from .base import ConveyorDatabaseAdmin

COUNTED = {
    "ready": Q(state=JobState.AVAILABLE, run_after__lte=Now()),
    "scheduled": Q(state=JobState.AVAILABLE, run_after__gt=Now()),
    "running_jobs": Q(state=JobState.RUNNING),
    "failed": Q(state=JobState.FAILED),
    "dead": Q(state=JobState.DEAD),
}


def _count(condition: Q) -> Coalesce:
    # One index-only range of (state, id) per queue row and state: no table scan.
    jobs = (
        Job.objects.filter(condition, queue=OuterRef("name"))
        .order_by()
        .values("queue")
        .annotate(n=Count("*"))
        .values("n")
    )
    return Coalesce(Subquery(jobs, output_field=IntegerField()), 0)


@admin.action(permissions=["operate"], description="Pause selected queues")
def pause_queues(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Queue]
) -> None:
    names = list(queryset.values_list("name", flat=True))
    changed = operations.pause(names)
    modeladmin.message_user(request, f"Paused {changed} queue(s).", messages.SUCCESS)
    _log(modeladmin, request, queryset, "Paused.")


@admin.action(permissions=["operate"], description="Resume selected queues")
def resume_queues(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Queue]
) -> None:
    changed = operations.resume(queryset.values_list("name", flat=True))
    modeladmin.message_user(request, f"Resumed {changed} queue(s).", messages.SUCCESS)
    _log(modeladmin, request, queryset, "Resumed.")


def _log(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: Any, message: str) -> None:
    for queue in queryset:
        modeladmin.log_change(request, queue, message)


@admin.register(Queue)
class QueueAdmin(ConveyorDatabaseAdmin):
    list_display = ("name", "status", "paused_at", *COUNTED)
    actions = [pause_queues, resume_queues]
    fields = ("name", "paused", "paused_at")
    readonly_fields = ("paused", "paused_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return super(ConveyorDatabaseAdmin, self).has_add_permission(request)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # A queue's name is its jobs' key: never renamed once it exists.
        return ("name", *self.readonly_fields) if obj is not None else self.readonly_fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Queue]:
        return super().get_queryset(request).annotate(**{k: _count(q) for k, q in COUNTED.items()})

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        operations.ensure_queues(operations.known_queues())
        return super().changelist_view(request, extra_context)

    @admin.display(description="status", ordering="paused")
    def status(self, obj: Queue) -> str:
        if obj.paused:
            return mark_safe("<span class='conveyor-paused'>paused</span>")
        return mark_safe("<span class='conveyor-running'>running</span>")

    @admin.display(description="ready", ordering="ready")
    def ready(self, obj: Queue) -> int:
        return obj.ready

    @admin.display(description="scheduled", ordering="scheduled")
    def scheduled(self, obj: Queue) -> int:
        return obj.scheduled

    @admin.display(description="running", ordering="running_jobs")
    def running_jobs(self, obj: Queue) -> int:
        return obj.running_jobs

    @admin.display(description="failed", ordering="failed")
    def failed(self, obj: Queue) -> int:
        return obj.failed

    @admin.display(description="dead", ordering="dead")
    def dead(self, obj: Queue) -> int:
        return obj.dead
