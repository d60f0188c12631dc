"""Operator actions on jobs: requeue and cancel, behind a confirmation page.

As Django's delete does, an action first shows what it would change (the
count and a sample) and acts only on a second POST. "Select all" acts on
every job matching the list's filters, in batches of one transaction each.
Every changed job gets a LogEntry and an entry in its own history.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from .. import operations
from ..conf import conveyor_settings
from ..models import Job
from ..states import CANCELLABLE_STATES, REQUEUEABLE_STATES, JobState
from .base import actor_for, log_job_changes

SAMPLE_SIZE = 20
SAMPLE_COLUMNS = ("id", "task_path", "queue", "state", "attempt", "enqueued_at", "finished_at")


@dataclass(frozen=True, slots=True)
class Step:
    """One protocol operation of an action, for the jobs in the states it allows."""

    states: frozenset[str]
    operation: str  # The function of `operations` that does it.
    done: str  # "Requeued {n} job(s)."
    log: str  # The LogEntry message.


@dataclass(frozen=True, slots=True)
class JobAction:
    name: str
    verb: str  # "requeue"
    past: str  # "requeued"
    explain: str  # What happens to the jobs, on the confirmation page.
    steps: tuple[Step, ...]
    skipped: str  # "Skipped {n} job(s) that ..."

    @property
    def states(self) -> frozenset[str]:
        return frozenset().union(*(s.states for s in self.steps))


REQUEUE = JobAction(
    name="requeue_jobs",
    verb="requeue",
    past="requeued",
    explain=(
        "Each job goes back to available to run now, with a fresh set of attempts. "
        "Its error history is kept."
    ),
    steps=(Step(REQUEUEABLE_STATES, "requeue", "Requeued {n} job(s).", "Requeued."),),
    skipped="Skipped {n} job(s) that were not failed, dead or cancelled.",
)
CANCEL = JobAction(
    name="cancel_jobs",
    verb="cancel",
    past="cancelled",
    explain=(
        "Jobs that have not started are cancelled now. For a running job the worker "
        "holding it is asked to stop it: it learns so with its next heartbeat, its "
        "handler's outcome is refused, and the job ends cancelled."
    ),
    steps=(
        Step(CANCELLABLE_STATES, "cancel", "Cancelled {n} job(s).", "Cancelled."),
        Step(
            frozenset({JobState.RUNNING}),
            "request_cancel",
            "Asked the workers holding {n} running job(s) to cancel them.",
            "Cancel requested (running).",
        ),
    ),
    skipped="Skipped {n} job(s) that had already finished or were already asked to stop.",
)


WAITING = frozenset({JobState.BLOCKED})
APPROVE = JobAction(
    name="approve_gates",
    verb="approve",
    past="approved",
    explain=(
        "Each gate receives the signal it waits for, with the payload "
        '{"approved": true, "by": "admin:<you>"}: it completes, and the workflow goes on. '
        "Gates that no longer wait, or wait for a timer or a condition, are left alone."
    ),
    steps=(Step(WAITING, "approve", "Approved {n} gate(s).", "Approved (signal sent)."),),
    skipped="Skipped {n} gate(s) that no longer waited for a signal.",
)
REJECT = JobAction(
    name="reject_gates",
    verb="reject",
    past="rejected",
    explain=(
        "Each gate ends failed (SignalRejected): the steps after it follow their "
        "dependency policy (by default they are cancelled). Requeueing a gate makes it wait again."
    ),
    steps=(Step(WAITING, "reject", "Rejected {n} gate(s).", "Rejected (signal refused)."),),
    skipped="Skipped {n} gate(s) that no longer waited for a signal.",
)


def ids_in_batches(queryset: QuerySet[Job], batch_size: int) -> Iterator[int]:
    """Every id of the queryset, by keyset pages: no OFFSET, no long-held cursor."""
    last = 0
    while True:
        batch = list(
            queryset.filter(id__gt=last).order_by("id").values_list("id", flat=True)[:batch_size]
        )
        yield from batch
        if len(batch) < batch_size:
            return
        last = batch[-1]


def confirm_or_perform(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet[Job],
    action: JobAction,
    *,
    selected: int | None,
    form_url: str = "",
) -> TemplateResponse | None:
    """The confirmation page on the first POST; the change on the second."""
    targets = queryset.filter(state__in=action.states)
    if request.POST.get("post") != "yes":
        count = targets.count()
        sample = list(targets.only(*SAMPLE_COLUMNS).order_by("-id")[:SAMPLE_SIZE])
        context = {
            **modeladmin.admin_site.each_context(request),
            "title": f"Are you sure you want to {action.verb} {count} job(s)?",
            "action": action,
            "count": count,
            "sample": sample,
            "more": max(count - len(sample), 0),
            "skipped": None if selected is None else max(selected - count, 0),
            "selected_ids": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across") == "1",
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "opts": modeladmin.opts,
            "form_url": form_url,
            "changelist_url": reverse(
                f"admin:{modeladmin.opts.app_label}_{modeladmin.opts.model_name}_changelist"
            ),
        }
        request.current_app = modeladmin.admin_site.name
        return TemplateResponse(request, "admin/conveyor/confirm_action.html", context)
    changed = 0
    for step in action.steps:
        ids = ids_in_batches(targets.filter(state__in=step.states), operations.BATCH_SIZE)
        done = operations.in_batches(
            getattr(operations, step.operation),
            ids,
            batch_size=operations.BATCH_SIZE,
            actor=actor_for(request),
            database=conveyor_settings().DATABASE,
        )
        log_job_changes(request, done, step.log)
        changed += len(done)
        if done:
            modeladmin.message_user(request, step.done.format(n=len(done)), messages.SUCCESS)
        if step.operation == "requeue":
            report_held_keys(modeladmin, request, targets.filter(state__in=step.states))
    if not changed:
        modeladmin.message_user(request, f"No job was {action.past}.", messages.WARNING)
    if selected is not None and selected > changed:
        modeladmin.message_user(
            request, action.skipped.format(n=selected - changed), messages.WARNING
        )
    return None


HELD_KEYS_SHOWN = 10  # Refused jobs named in the message; the rest are counted.


def report_held_keys(
    modeladmin: admin.ModelAdmin, request: HttpRequest, left: QuerySet[Job]
) -> None:
    """Name the jobs REQUEUE refused because a newer job holds their unique key."""
    keyed = list(
        left.filter(unique_key__isnull=False).order_by("id").values_list("id", flat=True)[:1000]
    )
    database = conveyor_settings().DATABASE
    holders = operations.key_holders(keyed, database=database) if keyed else {}
    if not holders:
        return
    named = "; ".join(
        f"job {job_id}: held by job {holder} ({state})"
        for job_id, (holder, state) in sorted(holders.items())[:HELD_KEYS_SHOWN]
    )
    more = len(holders) - HELD_KEYS_SHOWN
    modeladmin.message_user(
        request,
        f"Not requeued: {len(holders)} job(s) whose unique key another job holds ({named}"
        f"{f'; and {more} more' if more > 0 else ''}). Two jobs cannot hold one key: cancel "
        "the job that holds it, or wait for it to finish, then requeue.",
        messages.WARNING,
    )


def selection_size(request: HttpRequest) -> int | None:
    """How many jobs were ticked; None for "select all" (the whole filtered list)."""
    if request.POST.get("select_across") == "1":
        return None
    return len(request.POST.getlist(helpers.ACTION_CHECKBOX_NAME))


def list_action(action: JobAction, description: str) -> Any:
    """The admin list's action for `action`: confirmation first, then the change."""

    @admin.action(permissions=["operate"], description=description)
    def run(
        modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Job]
    ) -> TemplateResponse | None:
        return confirm_or_perform(
            modeladmin, request, queryset, action, selected=selection_size(request)
        )

    run.__name__ = action.name  # The admin names an action after its function.
    return run


requeue_jobs = list_action(REQUEUE, "Requeue selected jobs (failed, dead or cancelled)")
approve_gates = list_action(APPROVE, "Approve selected gates (send the signal each waits for)")
reject_gates = list_action(REJECT, "Reject selected gates (they fail)")
cancel_jobs = list_action(CANCEL, "Cancel selected jobs (running ones cooperatively)")


JOB_PAGE_ACTIONS = {"requeue": REQUEUE, "cancel": CANCEL, "approve": APPROVE, "reject": REJECT}


def job_page_action(
    modeladmin: admin.ModelAdmin, request: HttpRequest, object_id: str, verb: str
) -> Any:
    """The job page's buttons: the same confirmation, for one job."""
    if not modeladmin.has_operate_permission(request):
        raise PermissionDenied
    action = JOB_PAGE_ACTIONS[verb]
    queryset = modeladmin.get_queryset(request).filter(pk=object_id)
    if not queryset.exists():
        raise Http404(f"No job has the id {object_id!r}.")
    if request.method != "POST":
        request.POST = request.POST.copy()  # A GET shows the confirmation page.
    response = confirm_or_perform(
        modeladmin,
        request,
        queryset,
        action,
        selected=1,
        form_url=request.path,
    )
    if response is not None:
        return response
    return HttpResponseRedirect(
        reverse(f"admin:{modeladmin.opts.app_label}_job_change", args=[object_id])
    )
