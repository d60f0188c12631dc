"""Queues: counts per queue, paused or running, pause and resume.

Failed and dead counts above `queue_counts.EXACT_BELOW` are PostgreSQL's estimate,
shown as ≈N (`admin.stats`).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.safestring import mark_safe

from .. import operations
from ..models import Queue
from . import overview
from .base import ConveyorDatabaseAdmin

COUNTED = ("ready", "scheduled", "running_jobs", "failed", "dead")


class QueueChangeList(ChangeList):
    """The page's queues, each with its counts from one grouped query."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        counts = overview.queue_rows(queue.name for queue in self.result_list)
        for queue in self.result_list:
            queue.counts = counts.get(queue.name) or overview.QueueRow(name=queue.name)


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
    sortable_by = ("name", "status", "paused_at")
    actions = [pause_queues, resume_queues]
    fields = ("name", "paused", "paused_at")
    readonly_fields = ("paused", "paused_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return super(ConveyorDatabaseAdmin, self).has_add_permission(request)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # A queue's name is its jobs' key: never renamed once it exists.
        return ("name", *self.readonly_fields) if obj is not None else self.readonly_fields

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return QueueChangeList

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        operations.ensure_queues(operations.known_queues())
        return super().changelist_view(request, extra_context)

    @admin.display(description="status", ordering="paused")
    def status(self, obj: Queue) -> str:
        if obj.paused:
            return mark_safe("<span class='conveyor-paused'>paused</span>")
        return mark_safe("<span class='conveyor-running'>running</span>")

    @admin.display(description="ready")
    def ready(self, obj: Queue) -> int:
        return obj.counts.ready

    @admin.display(description="scheduled")
    def scheduled(self, obj: Queue) -> int:
        return obj.counts.scheduled

    @admin.display(description="running")
    def running_jobs(self, obj: Queue) -> int:
        return obj.counts.running

    @admin.display(description="failed")
    def failed(self, obj: Queue) -> str:
        return obj.counts.failed_display

    @admin.display(description="dead")
    def dead(self, obj: Queue) -> str:
        return obj.counts.dead_display
