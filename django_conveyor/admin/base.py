"""What the console's pages share: the database, permissions, audit, counts."""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import cached_property
from typing import Any

from django.contrib import admin
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.paginator import Page, Paginator
from django.db.models import Q, QuerySet
from django.http import HttpRequest

from ..conf import conveyor_settings
from ..models import NOT_RUNNING, Job
from ..queue_counts import EXACT_BELOW
from ..states import JobState

OPERATE_PERMISSION = "conveyor.operate"
VIEW_PAYLOADS_PERMISSION = "conveyor.view_payloads"
EXACT_COUNT_LIMIT = EXACT_BELOW  # Above this a list shows the planner's estimate.
LOG_BATCH = 1000


def actor_for(request: HttpRequest) -> str:
    """How the job history names an admin user."""
    return f"admin:{request.user.get_username()}"


def can_view_payloads(request: HttpRequest) -> bool:
    return request.user.has_perm(VIEW_PAYLOADS_PERMISSION)


def log_job_changes(request: HttpRequest, ids: Iterable[int], message: str) -> None:
    """One LogEntry per changed job, on the job's own admin history."""
    content_type = ContentType.objects.get_for_model(Job)
    entries = [
        LogEntry(
            user_id=request.user.pk,
            content_type_id=content_type.pk,
            object_id=str(id_),
            object_repr=f"job {id_}",
            action_flag=CHANGE,
            change_message=message,
        )
        for id_ in ids
    ]
    LogEntry.objects.bulk_create(entries, batch_size=LOG_BATCH)


class ConveyorDatabaseAdmin(admin.ModelAdmin):
    """Reads from CONVEYOR["DATABASE"], where the actions write (no router needed)."""

    show_facets = admin.ShowFacets.NEVER  # Facets count every choice over the table.
    # Acting on top of viewing: the model's change permission, or "operate".
    operate_permissions: tuple[str, ...] = ()

    class Media:
        css = {"all": ("conveyor/admin.css",)}

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).using(conveyor_settings().DATABASE)

    def has_operate_permission(self, request: HttpRequest) -> bool:
        opts = self.opts
        change = f"{opts.app_label}.change_{opts.model_name}"
        return any(
            request.user.has_perm(p)
            for p in (OPERATE_PERMISSION, change, *self.operate_permissions)
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyAdmin(ConveyorDatabaseAdmin):
    """Visible, actionable, never edited by form: state changes need the protocol.

    Without the change permission Django renders the change page as a view
    and refuses any POST to it, so no form can rewrite a row.
    """

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class EstimatedCountPaginator(Paginator):
    """Counts exactly up to EXACT_COUNT_LIMIT, then takes the planner's estimate.

    An exact COUNT(*) over a table of millions of finished jobs would cost
    every page view a scan; the list says when its count is an estimate.
    """

    estimated = False

    def parts(self) -> list[QuerySet[Any]]:
        """The reads the list is made of, counted each on its own: here the list itself."""
        return [self.object_list]

    @cached_property
    def count(self) -> int:
        parts = [part.order_by() for part in self.parts()]
        exact = sum(part[: EXACT_COUNT_LIMIT + 1].count() for part in parts)
        if exact <= EXACT_COUNT_LIMIT:
            return exact
        self.estimated = True
        plans = [json.loads(part.explain(format="json")) for part in parts]
        return max(sum(int(plan[0]["Plan"]["Plan Rows"]) for plan in plans), exact)


class JobListPaginator(EstimatedCountPaginator):
    """Pages of jobs read in two parts merged by id: the running jobs and the others.

    The queue, task and list indexes leave running rows out (migration
    0016), so a list filtered by queue or task is one range of them only
    for the rows that are not running; the running ones (as many as the
    leases held) come from conveyor_job_reap_idx. Each part keeps the
    list's order and stops at the page's end, so a page reads at most
    twice its offset and length, whatever the table's size.
    """

    PARTS = (NOT_RUNNING, Q(state=JobState.RUNNING))

    def parts(self) -> list[QuerySet[Any]]:
        return [self.object_list.filter(part) for part in self.PARTS]

    def rows(self, bottom: int, top: int) -> list[Any]:
        """The list's rows from `bottom` up to `top` (exclusive), in its id order."""
        ordering = self.object_list.query.order_by or Job._meta.ordering
        by = "id" if ordering and ordering[0] in ("id", "pk") else "-id"
        if top <= bottom:
            return []
        first, *others = (part.order_by(by)[:top] for part in self.parts())
        return list(first.union(*others, all=True).order_by(by)[bottom:top])

    def page(self, number: Any) -> Page:
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        top = bottom + self.per_page
        if top + self.orphans >= self.count:
            top = self.count
        return self._get_page(self.rows(bottom, top), number, self)
