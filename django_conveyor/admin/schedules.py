"""The admin of periodic schedules (`conveyor_cron`).

Schedules declared in CONVEYOR["CRON"] are owned by settings: read-only
here except enable/disable. Schedules created here are edited here, with
the same validation as the system check. "Run now" enqueues an extra job
through `schedules.run_now`; tick jobs are only ever written by the
scheduler's CRON_ENQUEUE.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db import connections
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html

from ..conf import conveyor_settings
from ..models import Cron, Job
from ..periodic import expressions, schedules, ticks

FORM_FIELDS = {"task": "task_path", None: "name"}  # Problem.field -> form field.
SCHEDULE_FIELDS = ("schedule", "timezone", "task_path", "args", "kwargs", "queue", "priority")


class CronForm(forms.ModelForm):
    queue = forms.CharField(required=False, help_text="Empty: the task's queue.")
    priority = forms.IntegerField(required=False, help_text="Empty: the task's priority.")

    class Meta:
        model = Cron
        fields = ("name", *SCHEDULE_FIELDS, "missed", "enabled")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.errors or (self.instance.pk and self.instance.declared):
            return data  # A declared row's schedule fields are read-only here.
        entry = {
            "schedule": data.get("schedule"),
            "task": data.get("task_path"),
            "timezone": data.get("timezone") or schedules.DEFAULT_TIMEZONE,
            "args": data.get("args") if data.get("args") is not None else [],
            "kwargs": data.get("kwargs") if data.get("kwargs") is not None else {},
            "missed": data.get("missed") or schedules.DEFAULT_MISSED,
        }
        for key in ("queue", "priority"):
            if data.get(key) not in (None, ""):
                entry[key] = data[key]
        spec, problems = schedules.validate(data.get("name"), entry)
        for problem in problems:
            self.add_error(FORM_FIELDS.get(problem.field, problem.field), problem.detail)
        if spec is not None:
            database = conveyor_settings().database_for(spec.queue)
            if database != conveyor_settings().DATABASE:
                self.add_error(
                    "queue",
                    f"Queue {spec.queue!r} lives in database {database!r}; schedules of its "
                    "queues are declared in CONVEYOR['CRON'] (the admin edits those of "
                    f"{conveyor_settings().DATABASE!r}).",
                )
            data.update(spec.row_values())
        return data


def _when(instant: datetime | None, zone_name: str) -> str:
    if instant is None:
        return "-"
    try:
        local = instant.astimezone(expressions.zone(zone_name))
    except expressions.InvalidSchedule:
        local = instant
    utc = instant.astimezone(UTC)
    return f"{local:%Y-%m-%d %H:%M:%S %Z} ({utc:%Y-%m-%d %H:%M:%S} UTC)"


def _names(queryset: QuerySet[Cron]) -> list[str]:
    return list(queryset.values_list("name", flat=True))


@admin.action(permissions=["change"], description="Run selected schedules now (one extra job)")
def run_now(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Cron]) -> None:
    for name in _names(queryset):
        job = schedules.run_now(name, database=conveyor_settings().DATABASE)
        modeladmin.message_user(
            request, f"Enqueued job {job.id} for schedule {name!r}.", messages.SUCCESS
        )


def _set_enabled(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Cron], enabled: bool
) -> None:
    changed = sum(
        schedules.set_enabled(n, enabled, database=conveyor_settings().DATABASE)
        for n in _names(queryset)
    )
    verb = "Enabled" if enabled else "Disabled"
    modeladmin.message_user(request, f"{verb} {changed} schedule(s).", messages.SUCCESS)


@admin.action(permissions=["change"], description="Enable selected schedules")
def enable(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Cron]) -> None:
    _set_enabled(modeladmin, request, queryset, True)


@admin.action(permissions=["change"], description="Disable selected schedules")
def disable(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Cron]) -> None:
    _set_enabled(modeladmin, request, queryset, False)


@admin.register(Cron)
class CronAdmin(admin.ModelAdmin):
    form = CronForm
    list_display = (
        "name", "schedule", "timezone", "next_tick", "last_tick", "last_job", "enabled", "owner",
    )  # fmt: skip
    list_filter = ("enabled", "declared", "missed", "queue")
    search_fields = ("name", "task_path")
    actions = [run_now, enable, disable]
    status_fields = ("owner", "next_tick", "last_tick", "last_job", "created_at", "updated_at")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Cron]:
        return super().get_queryset(request).using(conveyor_settings().DATABASE)

    def get_readonly_fields(self, request: HttpRequest, obj: Cron | None = None) -> Any:
        if obj is not None and obj.declared:  # Settings own it: only enabled is editable.
            return ("name", *SCHEDULE_FIELDS, "missed", *self.status_fields)
        return self.status_fields

    def has_delete_permission(self, request: HttpRequest, obj: Cron | None = None) -> bool:
        return super().has_delete_permission(request, obj) and not (obj and obj.declared)

    def save_model(self, request: HttpRequest, obj: Cron, form: Any, change: bool) -> None:
        database = conveyor_settings().DATABASE
        enabled = obj.enabled
        if obj.declared:
            # Only `enabled` can change: through the same path as the actions.
            schedules.set_enabled(obj.name, enabled, database=database)
            return
        if (
            not change
            or obj.next_tick_at is None
            or {"schedule", "timezone"} & set(form.changed_data)
        ):
            with connections[database].cursor() as cursor:
                obj.next_tick_at = schedules.first_tick(obj, ticks.database_now(cursor))
        obj.save(using=database)

    def delete_model(self, request: HttpRequest, obj: Cron) -> None:
        obj.delete(using=conveyor_settings().DATABASE)

    @admin.display(description="owner")
    def owner(self, obj: Cron) -> str:
        return "settings" if obj.declared else "admin"

    @admin.display(description="next tick", ordering="next_tick_at")
    def next_tick(self, obj: Cron) -> str:
        if obj.next_tick_at is None:
            return "none (fix the expression)" if obj.enabled else "-"
        return _when(obj.next_tick_at, obj.timezone)

    @admin.display(description="last tick", ordering="last_tick_at")
    def last_tick(self, obj: Cron) -> str:
        return _when(obj.last_tick_at, obj.timezone)

    @admin.display(description="last tick's job")
    def last_job(self, obj: Cron) -> str:
        if obj.last_job_id is None:
            return "-"
        job = (
            Job.objects.using(conveyor_settings().DATABASE)
            .filter(pk=obj.last_job_id)
            .only("state")
            .first()
        )
        if job is None:
            return f"job {obj.last_job_id} (pruned)"
        try:
            url = reverse("admin:conveyor_job_change", args=[job.pk])
        except NoReverseMatch:
            return f"job {job.pk}: {job.state}"
        return format_html("<a href='{}'>job {}: {}</a>", url, job.pk, job.state)
