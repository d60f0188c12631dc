"""Workers: live processes and those lost (no heartbeat for a lease).

A worker that exits cleanly marks its row stopped; the page hides stopped
rows unless asked (status filter), and the registry deletes them
`registry.STOPPED_RETENTION_SECONDS` after the stop.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode

from ..models import Worker
from .base import ReadOnlyAdmin
from .overview import lost_after_seconds

LIVE, LOST, STOPPED, ALL = "live", "lost", "stopped", "all"


def worker_status(worker: Worker) -> str:
    if worker.stopped_at is not None:
        return STOPPED
    cutoff = timezone.now() - timedelta(seconds=lost_after_seconds())
    return LIVE if worker.last_seen_at >= cutoff else LOST


class StatusFilter(admin.SimpleListFilter):
    """Live and lost workers by default; those that stopped cleanly on request."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            (LIVE, "live"),
            (LOST, "lost (missed heartbeats)"),
            (STOPPED, "stopped (clean exit)"),
            (ALL, "all, with stopped"),
        ]

    def choices(self, changelist: Any) -> Any:
        for choice in super().choices(changelist):
            if choice["query_string"] == changelist.get_query_string(remove=[self.parameter_name]):
                choice["display"] = "live and lost"  # What no choice shows.
            yield choice

    def queryset(self, request: HttpRequest, queryset: QuerySet[Worker]) -> QuerySet[Worker]:
        cutoff = timezone.now() - timedelta(seconds=lost_after_seconds())
        if self.value() == LIVE:
            return queryset.filter(stopped_at__isnull=True, last_seen_at__gte=cutoff)
        if self.value() == LOST:
            return queryset.filter(stopped_at__isnull=True, last_seen_at__lt=cutoff)
        if self.value() == STOPPED:
            return queryset.filter(stopped_at__isnull=False)
        if self.value() == ALL:
            return queryset
        return queryset.filter(stopped_at__isnull=True)


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "status_label",
        "host",
        "pid",
        "queue_names",
        "concurrency",
        "leases",
        "started_at",
        "last_seen_at",
        "version",
    )
    list_filter = (StatusFilter,)
    search_fields = ("id", "host")

    @admin.display(description="status")
    def status_label(self, obj: Worker) -> str:
        status = worker_status(obj)
        return format_html("<span class='conveyor-worker-{}'>{}</span>", status, status)

    @admin.display(description="queues")
    def queue_names(self, obj: Worker) -> str:
        return ", ".join(obj.queues)

    @admin.display(description="leases held")
    def leases(self, obj: Worker) -> str:
        url = reverse("admin:conveyor_job_changelist") + "?" + urlencode({"worker": obj.pk})
        return format_html("<a href='{}'>{}</a>", url, obj.leases_held)
