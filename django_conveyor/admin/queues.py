"""Queues: counts per queue, paused or running, pause and resume, and their limits.

Failed and dead counts above `queue_counts.EXACT_BELOW` are PostgreSQL's estimate,
shown as ≈N (`admin.stats`). Operators edit a queue's limits on its page; the
form validates them as `limits` does and writes them through
`limits.set_limits`, never by saving the row (docs/admin.md#queue-limits).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.safestring import mark_safe

from .. import limits, operations
from ..models import Queue
from . import overview
from .base import ConveyorDatabaseAdmin, actor_for

LIMIT_FIELDS = ("concurrency", "rate", "key_concurrency", "fair")

COUNTED = ("ready", "scheduled", "running_jobs", "failed", "dead")


class QueueChangeList(ChangeList):
    """The page's queues, each with its counts from one grouped query."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        counts = overview.queue_rows(queue.name for queue in self.result_list)
        for queue in self.result_list:
            queue.counts = counts.get(queue.name) or overview.QueueRow(name=queue.name)


class QueueLimitsForm(forms.ModelForm):
    """The four limits of a queue, each refused with the message `limits` gives."""

    concurrency = forms.CharField(
        required=False,
        widget=forms.NumberInput(attrs={"min": 1}),
        help_text="Jobs of the queue running at once, at most. Blank: no limit.",
    )
    rate = forms.CharField(
        required=False,
        help_text='Starts per second, minute or hour: "N/s", "N/m" or "N/h". Blank: no rate.',
    )
    key_concurrency = forms.CharField(
        required=False,
        widget=forms.NumberInput(attrs={"min": 1}),
        help_text="Jobs of one concurrency key running at once, at most. Blank: no limit.",
    )
    fair = forms.BooleanField(required=False, help_text="Keys take turns in every claim.")

    class Meta:
        model = Queue
        fields = ("name",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            current = limits.of(self.instance).declared()
            for name in LIMIT_FIELDS:
                if name in self.fields:
                    value = current[name]
                    self.initial[name] = "" if value is None else value

    def _limit(self, name: str) -> int | None:
        try:
            return limits.count_from_text(self.cleaned_data.get(name) or "", where=name)
        except limits.InvalidLimit as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_concurrency(self) -> int | None:
        return self._limit("concurrency")

    def clean_key_concurrency(self) -> int | None:
        return self._limit("key_concurrency")

    def clean_rate(self) -> limits.Rate | None:
        try:
            return limits.parse_rate(self.cleaned_data.get("rate") or None, where="rate")
        except limits.InvalidLimit as exc:
            raise forms.ValidationError(str(exc)) from None

    def wanted(self) -> limits.Limits:
        data = self.cleaned_data
        return limits.Limits(
            data.get("concurrency"), data.get("key_concurrency"), data.get("rate"),
            bool(data.get("fair")),
        )  # fmt: skip


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
    list_display = ("name", "status", "paused_at", "limits", *COUNTED)
    sortable_by = ("name", "status", "paused_at")
    actions = [pause_queues, resume_queues]
    form = QueueLimitsForm
    readonly_fields = ("paused", "paused_at", "limits", "limits_changed")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return super(ConveyorDatabaseAdmin, self).has_add_permission(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # The limits are the page's only writable part, and operators set them.
        return self.has_operate_permission(request)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if self.has_change_permission(request, obj):
            return ("name", "paused", "paused_at", *LIMIT_FIELDS, "limits_changed")
        return ("name", "paused", "paused_at", "limits", "limits_changed")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # A queue's name is its jobs' key: never renamed once it exists.
        return ("name", *self.readonly_fields) if obj is not None else self.readonly_fields

    def save_model(self, request: HttpRequest, obj: Queue, form: Any, change: bool) -> None:
        # Through set_limits, under the row's lock, never obj.save(): the row's
        # pause and the claim's own columns are not the form's to write.
        form.limits_change = limits.set_limits(obj.name, form.wanted(), actor=actor_for(request))

    def construct_change_message(
        self, request: HttpRequest, form: Any, formsets: Any, add: bool = False
    ) -> str:
        before, after = form.limits_change
        if before == after:
            return f"Limits unchanged: {after.describe()}."
        return f"Changed limits from {before.describe()} to {after.describe()}."

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

    @admin.display(description="limits")
    def limits(self, obj: Queue) -> str:
        return limits.of(obj).describe()

    @admin.display(description="limits changed")
    def limits_changed(self, obj: Queue) -> str:
        if obj.limits_changed_at is None:
            return "never"
        return f"{obj.limits_changed_at:%Y-%m-%d %H:%M:%S %Z} by {obj.limits_changed_by}"

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
