"""Jobs, dead letters and the effect ledger in the admin.

The lists stay fast on tables of millions of rows: they fetch only the
columns they show (never args, errors or return values), their filters come
from the queue table and the task registry, each filter has an index in the
list's order, and counts past EXACT_COUNT_LIMIT are the planner's estimates.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import ChangeList
from django.db.models import Q, QuerySet
from django.db.models.expressions import RawSQL
from django.http import Http404, HttpRequest
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from .. import operations
from ..conf import conveyor_settings
from ..models import DeadLetter, Job, LedgerEntry, Worker, unique_key_is
from ..observability import search
from ..states import CANCELLABLE_STATES, REQUEUEABLE_STATES, JobState
from ..tasks import known_task_paths
from ..unique import KEY_FORMAT
from . import jobpage, workflow
from .actions import cancel_jobs, job_page_action, requeue_jobs
from .base import EstimatedCountPaginator, JobListPaginator, ReadOnlyAdmin, can_view_payloads

LIST_COLUMNS = (
    "id",
    "task_path",
    "queue",
    "state",
    "priority",
    "attempt",
    "max_attempts",
    "run_after",
    "enqueued_at",
    "finished_at",
    "lease_owner",
    "cancel_requested_at",
    "tags",
)


class TaskFilter(admin.SimpleListFilter):
    title = "task"
    parameter_name = "task"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        paths = set(known_task_paths())
        if self.value():
            paths.add(self.value())
        return [(p, f"{p.rsplit('.', 1)[-1]} ({p.rsplit('.', 1)[0]})") for p in sorted(paths)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        return queryset.filter(task_path=self.value()) if self.value() else queryset


class QueueFilter(admin.SimpleListFilter):
    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(q, q) for q in sorted(operations.known_queues())]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        return queryset.filter(queue=self.value()) if self.value() else queryset


class WorkerFilter(admin.SimpleListFilter):
    """The running jobs a worker holds (the workers page links here)."""

    title = "held by worker"
    parameter_name = "worker"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        live = Worker.objects.using(conveyor_settings().DATABASE).filter(stopped_at__isnull=True)
        names = set(live.values_list("id", flat=True))
        if self.value():
            names.add(self.value())
        return [(n, n) for n in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        if not self.value():
            return queryset
        # Running rows are few and indexed; lease_owner alone is not.
        return queryset.filter(state=JobState.RUNNING, lease_owner=self.value())


class LeanChangeList(ChangeList):
    """The list's rows without their payloads: args, errors, return values stay put."""

    def get_queryset(self, request: HttpRequest, *args: Any, **kwargs: Any) -> QuerySet[Any]:
        queryset = super().get_queryset(request, *args, **kwargs)
        return queryset.only(*self.model_admin.list_columns)

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        if isinstance(self.result_list, QuerySet):
            # One page, or "show all": Django would read the unsliced queryset,
            # which no index without running rows serves; read it in parts too.
            self.result_list = self.paginator.rows(0, self.result_count)


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


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "task_name",
        "queue",
        "state_label",
        "priority",
        "attempts",
        "run_after",
        "enqueued_at",
        "finished_at",
        "worker",
        "tag_chips",
    )
    list_columns = LIST_COLUMNS
    list_filter = ("state", QueueFilter, TaskFilter, WorkerFilter)
    search_fields = ("=id",)  # Shows the box; get_search_results decides.
    search_help_text = mark_safe(
        "<code>tag:tenant:42</code> <code>meta.request_id:ab12</code> "
        "<code>args.0:COFFEE-1KG</code> <code>kwargs.customer_id:42</code> "
        "<code>key:order-7</code>, or a job id, idempotency key, unique key or part of a "
        "task's path; "
        "all terms must match. See the search syntax in the observability docs."
    )
    sortable_by = ("id",)  # Sorting by anything else would sort the whole table.
    actions = [requeue_jobs, cancel_jobs]
    inlines = [LedgerInline]
    paginator = JobListPaginator
    show_full_result_count = False
    change_form_template = "admin/conveyor/job/change_form.html"

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return LeanChangeList

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        """The search syntax of docs/observability.md#search, on the filtered list."""
        term = search_term.strip()
        if KEY_FORMAT.fullmatch(term):  # A unique key: every job of it, through its two indexes.
            return queryset.filter(Q(idempotency_key=term) | unique_key_is(term)), False
        try:
            found = search.parse(search_term)
        except search.InvalidSearch as exc:
            messages.error(request, f"Search: {exc}")
            return queryset.none(), False
        if not found:
            return queryset, False
        sql, params = found.where(known_task_paths())
        database = conveyor_settings().DATABASE
        if found.windowed(database, request.GET.get("task")):
            rows = conveyor_settings().SEARCH_SCAN_ROWS
            floor = queryset.order_by("-id").values_list("id", flat=True)[rows - 1 : rows]
            if floor:  # More jobs than the window: look at the newest `rows` only.
                queryset = queryset.filter(id__gte=floor[0])
                messages.info(
                    request,
                    f"args. and kwargs. terms searched the newest {rows:,} jobs of this list; "
                    "narrow it with the state, queue or task filters to search further back.",
                )
        return queryset.extra(where=[sql], params=params), False

    def get_urls(self) -> list[Any]:
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        own = [
            path(
                "<path:object_id>/requeue/",
                self.admin_site.admin_view(self.requeue_view),
                name=f"{info}_requeue",
            ),
            path(
                "<path:object_id>/cancel/",
                self.admin_site.admin_view(self.cancel_view),
                name=f"{info}_cancel",
            ),
            path(
                "<path:object_id>/workflow/",
                self.admin_site.admin_view(self.workflow_view),
                name=f"{info}_workflow",
            ),
        ]
        return own + super().get_urls()

    def requeue_view(self, request: HttpRequest, object_id: str) -> Any:
        return job_page_action(self, request, object_id, "requeue")

    def cancel_view(self, request: HttpRequest, object_id: str) -> Any:
        return job_page_action(self, request, object_id, "cancel")

    def workflow_view(self, request: HttpRequest, object_id: str) -> Any:
        """The graph of the workflow a job belongs to, drawn on the server."""
        job = self.get_object(request, object_id)
        if job is None or not self.has_view_permission(request, job):
            raise Http404(f"No job has the id {object_id!r}.")
        graph = workflow.workflow_graph(job.pk, conveyor_settings().DATABASE)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "original": job,
            "title": f"Workflow of job {job.pk}",
            "graph_svg": workflow.svg(graph, job.pk),
            "graph": graph,
            "nodes": workflow.listed(graph),
            "node_limit": workflow.NODE_LIMIT,
            "states": list(workflow.STATE_COLOURS.items()),
        }
        return TemplateResponse(request, "admin/conveyor/job/workflow.html", context)

    # -- the job page ---------------------------------------------------------

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        payload = (
            ("args_json", "kwargs_json", "return_value_json")
            if can_view_payloads(request)
            else ("payload_hidden",)
        )
        return [
            (
                None,
                {
                    "fields": (
                        ("task_path", "queue", "state_label"),
                        ("priority", "attempts", "backend"),
                        ("enqueued_at", "run_after"),
                        ("started_at", "finished_at"),
                        ("idempotency_key", "concurrency_key"),
                        "tag_chips",
                        "meta_json",
                    )
                },
            ),
            (
                "Lease",
                {
                    "fields": (
                        "held_by",
                        ("lease_version", "lease_expires_at"),
                        "cancel_request",
                        "progress_bar",
                    )
                },
            ),
            ("Arguments and return value", {"fields": payload}),
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        names: list[str] = []
        for _, options in self.get_fieldsets(request, obj):
            for field in options["fields"]:
                names.extend(field if isinstance(field, tuple) else (field,))
        return names

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> Any:
        job = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if job is not None:
            context.update(
                attempts=jobpage.attempts(job, conveyor_settings().DATABASE),
                operator_history=jobpage.history(job),
                show_payloads=can_view_payloads(request),
                can_operate=self.has_operate_permission(request),
                can_requeue=job.state in REQUEUEABLE_STATES,
                can_cancel=job.state in CANCELLABLE_STATES
                or (job.state == JobState.RUNNING and job.cancel_requested_at is None),
                requeue_url=reverse("admin:conveyor_job_requeue", args=[job.pk]),
                workflow=workflow.neighbours(job, conveyor_settings().DATABASE),
                uniqueness=jobpage.uniqueness(job, conveyor_settings().DATABASE),
                jobs_with_key_url=reverse("admin:conveyor_job_changelist"),
                workflow_url=reverse("admin:conveyor_job_workflow", args=[job.pk]),
                cancel_url=reverse("admin:conveyor_job_cancel", args=[job.pk]),
            )
        return super().change_view(request, object_id, form_url, context)

    # -- columns --------------------------------------------------------------

    @admin.display(description="task")
    def task_name(self, obj: Job) -> str:
        return obj.task_name

    @admin.display(description="state", ordering="state")
    def state_label(self, obj: Job) -> str:
        if obj.state == JobState.RUNNING and obj.cancel_requested_at:
            return mark_safe(
                "<span class='conveyor-state conveyor-state-running'>running</span> "
                "<span class='conveyor-note'>cancel requested</span>"
            )
        return format_html(
            "<span class='conveyor-state conveyor-state-{}'>{}</span>", obj.state, obj.state
        )

    @admin.display(description="attempts")
    def attempts(self, obj: Job) -> str:
        return f"{obj.attempt} of {obj.max_attempts}"

    @admin.display(description="worker")
    def worker(self, obj: Job) -> str:
        """The worker holding a running job (linked to its row), or the one that completed it."""
        if obj.state == JobState.RUNNING and obj.lease_owner:
            url = reverse("admin:conveyor_worker_change", args=[quote(obj.lease_owner)])
            return format_html("<a href='{}' title='holds its lease'>{}</a>", url, obj.lease_owner)
        return obj.lease_owner or "-"

    @admin.display(description="held by")
    def held_by(self, obj: Job) -> str:
        if not obj.lease_owner or obj.state not in (JobState.RUNNING, JobState.COMPLETED):
            return "no worker"
        worker = (
            Worker.objects.using(conveyor_settings().DATABASE).filter(pk=obj.lease_owner).first()
        )
        verb = "completed by" if obj.state == JobState.COMPLETED else "held by"
        if worker is None:
            return format_html("{} {} (not registered)", verb, obj.lease_owner)
        from .workers import worker_status

        url = reverse("admin:conveyor_worker_change", args=[quote(worker.pk)])
        return format_html(
            "{} <a href='{}'>{}</a> ({})", verb, url, worker.pk, worker_status(worker)
        )

    @admin.display(description="cancel request")
    def cancel_request(self, obj: Job) -> str:
        if not obj.cancel_requested_at:
            return "none"
        return f"by {obj.cancel_requested_by} at {obj.cancel_requested_at:%Y-%m-%d %H:%M:%S}"

    @admin.display(description="tags")
    def tag_chips(self, obj: Job) -> str:
        """Each tag, linked to the list of the jobs that have it."""
        return jobpage.tag_chips(obj.tags, reverse("admin:conveyor_job_changelist"))

    @admin.display(description="meta")
    def meta_json(self, obj: Job) -> str:
        return jobpage.pretty_json(obj.meta) if obj.meta else "-"

    @admin.display(description="progress")
    def progress_bar(self, obj: Job) -> str:
        return jobpage.progress_bar(obj)

    @admin.display(description="args")
    def args_json(self, obj: Job) -> str:
        return jobpage.pretty_json(obj.args)

    @admin.display(description="kwargs")
    def kwargs_json(self, obj: Job) -> str:
        return jobpage.pretty_json(obj.kwargs)

    @admin.display(description="return value")
    def return_value_json(self, obj: Job) -> str:
        return jobpage.pretty_json(obj.return_value)

    @admin.display(description="payload")
    def payload_hidden(self, obj: Job) -> str:
        return (
            "Hidden: arguments, return values and tracebacks need the "
            "“Can see job arguments, return values and tracebacks” permission."
        )


@admin.register(DeadLetter)
class DeadLetterAdmin(JobAdmin):
    list_display = (
        "id",
        "task_name",
        "queue",
        "state_label",
        "attempts",
        "finished_at",
        "last_error",
        "tag_chips",
    )
    list_filter = ("state", QueueFilter, TaskFilter)
    actions = [requeue_jobs]
    operate_permissions = ("conveyor.change_job",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        return super().get_queryset(request).filter(state__in=[JobState.FAILED, JobState.DEAD])

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return DeadLetterChangeList

    @admin.display(description="last error")
    def last_error(self, obj: Job) -> str:
        return getattr(obj, "last_error_class", "") or ""


class DeadLetterChangeList(LeanChangeList):
    def get_queryset(self, request: HttpRequest, *args: Any, **kwargs: Any) -> QuerySet[Any]:
        # Only the last error's class crosses the wire, not every traceback.
        return (
            super()
            .get_queryset(request, *args, **kwargs)
            .annotate(last_error_class=RawSQL("errors -> -1 ->> 'exception_class_path'", ()))
        )


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdmin):
    list_display = ("id", "job_link", "effect_key", "lease_version", "worker", "applied_at")
    search_fields = ("effect_key", "=job__id")
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    readonly_fields = ("job_link", "effect_key", "lease_version", "worker", "applied_at")
    fields = readonly_fields

    @admin.display(description="job")
    def job_link(self, obj: LedgerEntry) -> str:
        url = reverse("admin:conveyor_job_change", args=[obj.job_id])
        return format_html("<a href='{}'>job {}</a>", url, obj.job_id)
