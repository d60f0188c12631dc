"""The Django admin: jobs, the dead-letter view, queues, the effect ledger and API keys.

Jobs are read-only here; requeue and cancel go through `operations`, which
goes through the protocol, like every other state change.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from . import apikeys, operations
from .conf import conveyor_settings
from .models import ApiKey, DeadLetter, Job, LedgerEntry, Queue
from .states import JobState

MAX_TASK_FILTER_CHOICES = 200


class TaskFilter(admin.SimpleListFilter):
    title = "task"
    parameter_name = "task"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        paths = (
            model_admin.get_queryset(request)
            .order_by()
            .values_list("task_path", flat=True)
            .distinct()[:MAX_TASK_FILTER_CHOICES]
        )
        return [(p, p.rsplit(".", 1)[-1] + f" ({p.rsplit('.', 1)[0]})") for p in sorted(paths)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        return queryset.filter(task_path=self.value()) if self.value() else queryset


class QueueFilter(admin.SimpleListFilter):
    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(q, q) for q in sorted(operations.known_queues())]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        return queryset.filter(queue=self.value()) if self.value() else queryset


@admin.action(
    permissions=["change"], description="Requeue selected jobs (failed, dead or cancelled)"
)
def requeue_jobs(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Job]
) -> None:
    ids = list(queryset.values_list("id", flat=True))
    changed = operations.requeue(ids)
    modeladmin.message_user(request, f"Requeued {len(changed)} job(s).", messages.SUCCESS)
    if skipped := len(ids) - len(changed):
        modeladmin.message_user(
            request,
            f"Skipped {skipped} job(s) that were not failed, dead or cancelled.",
            messages.WARNING,
        )


@admin.action(permissions=["change"], description="Cancel selected jobs (not yet started)")
def cancel_jobs(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Job]
) -> None:
    ids = list(queryset.values_list("id", flat=True))
    changed = operations.cancel(ids)
    modeladmin.message_user(request, f"Cancelled {len(changed)} job(s).", messages.SUCCESS)
    if skipped := len(ids) - len(changed):
        modeladmin.message_user(
            request,
            f"Skipped {skipped} job(s) that had already started or finished.",
            messages.WARNING,
        )


class LedgerInline(admin.TabularInline):
    model = LedgerEntry
    fields = ("effect_key", "lease_version", "worker", "applied_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def conveyor_database() -> str:
    return conveyor_settings().DATABASE


class ConveyorDatabaseAdmin(admin.ModelAdmin):
    """Reads from CONVEYOR["DATABASE"], where the actions write (no router needed)."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).using(conveyor_database())


class ReadOnlyAdmin(ConveyorDatabaseAdmin):
    """Visible, actionable, never edited by form: state changes need the protocol."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        hidden = set(self.exclude or ())
        fields = [f.name for f in self.model._meta.fields if f.name not in hidden]
        return fields + list(self.extra_readonly)

    extra_readonly: tuple[str, ...] = ()

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: Any = None,
        form_url: str = "",
        extra_context: Any = None,
    ) -> Any:
        extra_context = {
            **(extra_context or {}),
            "show_save": False,
            "show_save_and_continue": False,
        }
        return super().changeform_view(request, object_id, form_url, extra_context)


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "task_name",
        "queue",
        "state",
        "priority",
        "attempt",
        "max_attempts",
        "run_after",
        "enqueued_at",
        "finished_at",
    )
    list_filter = ("state", QueueFilter, TaskFilter)
    search_fields = ("=id", "task_path", "idempotency_key")
    actions = [requeue_jobs, cancel_jobs]
    inlines = [LedgerInline]
    extra_readonly = ("attempt_errors",)
    exclude = ("errors",)
    show_full_result_count = False

    @admin.display(description="task")
    def task_name(self, obj: Job) -> str:
        return obj.task_name

    @admin.display(description="errors, one per failed attempt")
    def attempt_errors(self, obj: Job) -> str:
        if not obj.errors:
            return "none"
        return format_html_join(
            "",
            "<div class='conveyor-error'><p><strong>attempt {}</strong> on {} at {} "
            "(token {}): <code>{}</code></p><pre>{}</pre></div>",
            (
                (
                    e.get("attempt"),
                    e.get("worker") or "no worker",
                    e.get("time"),
                    e.get("token"),
                    e.get("exception_class_path"),
                    e.get("traceback"),
                )
                for e in obj.errors
            ),
        )


@admin.register(DeadLetter)
class DeadLetterAdmin(JobAdmin):
    list_display = ("id", "task_name", "queue", "state", "attempt", "finished_at", "last_error")
    list_filter = ("state", QueueFilter, TaskFilter)
    actions = [requeue_jobs]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        return super().get_queryset(request).filter(state__in=[JobState.FAILED, JobState.DEAD])

    @admin.display(description="last error")
    def last_error(self, obj: Job) -> str:
        if not obj.errors:
            return ""
        return obj.errors[-1].get("exception_class_path", "")


@admin.action(permissions=["change"], description="Pause selected queues")
def pause_queues(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Queue]
) -> None:
    changed = operations.pause(queryset.values_list("name", flat=True))
    modeladmin.message_user(request, f"Paused {changed} queue(s).", messages.SUCCESS)


@admin.action(permissions=["change"], description="Resume selected queues")
def resume_queues(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Queue]
) -> None:
    changed = operations.resume(queryset.values_list("name", flat=True))
    modeladmin.message_user(request, f"Resumed {changed} queue(s).", messages.SUCCESS)


@admin.register(Queue)
class QueueAdmin(ConveyorDatabaseAdmin):
    list_display = ("name", "paused", "paused_at", "waiting", "running")
    actions = [pause_queues, resume_queues]
    readonly_fields = ("paused", "paused_at")

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        operations.ensure_queues(operations.known_queues())
        return super().changelist_view(request, extra_context)

    @admin.display(description="waiting")
    def waiting(self, obj: Queue) -> int:
        jobs = Job.objects.using(conveyor_database())
        return jobs.filter(queue=obj.name, state=JobState.AVAILABLE).count()

    @admin.display(description="running")
    def running(self, obj: Queue) -> int:
        jobs = Job.objects.using(conveyor_database())
        return jobs.filter(queue=obj.name, state=JobState.RUNNING).count()

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdmin):
    list_display = ("id", "job_link", "effect_key", "lease_version", "worker", "applied_at")
    search_fields = ("effect_key", "=job__id")
    list_select_related = ("job",)
    extra_readonly = ("job_link",)

    @admin.display(description="job")
    def job_link(self, obj: LedgerEntry) -> str:
        url = reverse("admin:conveyor_job_change", args=[obj.job_id])
        return format_html("<a href='{}'>job {}</a>", url, obj.job_id)


@admin.action(permissions=["change"], description="Revoke selected API keys")
def revoke_api_keys(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[ApiKey]
) -> None:
    revoked = [key for key in queryset if apikeys.revoke(key.prefix)]
    modeladmin.message_user(request, f"Revoked {len(revoked)} API key(s).", messages.SUCCESS)


@admin.register(ApiKey)
class ApiKeyAdmin(ReadOnlyAdmin):
    """Keys are created with `manage.py conveyor_api_key create`, which shows the key once."""

    list_display = ("name", "prefix", "scopes", "created_at", "last_used_at", "revoked_at")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    search_fields = ("name", "=prefix")
    exclude = ("secret_hash",)
    actions = [revoke_api_keys]
