"""The Waiting page: gates that wait, with approve / reject and a signal form.

A gate waits while it is blocked with its upstream steps done (gates.py).
The list reads them through the gates' partial index (conveyor_job_gate_waiting_idx),
so it costs what the waiting gates cost, whatever the table's size. Approve
and reject are list actions behind the usual confirmation page; the signal
form sends any signal with a JSON payload. Every change goes through
protocol.SIGNAL, with a LogEntry and an entry in the gate's history.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from ..conf import conveyor_settings
from ..exceptions import ArgumentsNotSerializable, GateError
from ..models import Job, WaitingGate
from ..states import JobState
from .actions import approve_gates, reject_gates
from .base import actor_for, log_job_changes
from .jobs import JobAdmin
from .workflow import waits_for

KINDS = {"signal": "a signal", "sleep": "a timer", "condition": "a row condition"}


class KindFilter(admin.SimpleListFilter):
    title = "waits for"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return list(KINDS.items())

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        return queryset.filter(gate__kind=self.value()) if self.value() else queryset


class SignalForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="The signal the gate waits for.")
    payload = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 6, "cols": 60}),
        help_text="JSON (at most 64 KiB): the gate's result, which the next steps read. "
        "Empty: null.",
    )

    def clean_payload(self) -> Any:
        text = self.cleaned_data["payload"].strip()
        if not text:
            return None
        try:
            return json.loads(text, parse_constant=_no_constant)
        except ValueError as exc:
            raise forms.ValidationError(f"The payload is not valid JSON: {exc}.") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


@admin.register(WaitingGate)
class WaitingGateAdmin(JobAdmin):
    list_display = ("id", "waits", "queue", "deadline", "enqueued_at", "workflow", "signal_link")
    list_filter = (KindFilter, "queue")
    actions = [approve_gates, reject_gates]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        return (
            super()
            .get_queryset(request)
            .filter(state=JobState.BLOCKED, gate__isnull=False, pending_dependencies=0)
        )

    @admin.display(description="waits for")
    def waits(self, obj: Job) -> str:
        return waits_for(obj)

    @admin.display(description="deadline")
    def deadline(self, obj: Job) -> Any:
        return obj.gate_deadline or "—"

    @admin.display(description="workflow")
    def workflow(self, obj: Job) -> str:
        url = reverse("admin:conveyor_job_workflow", args=[obj.pk])
        return format_html("<a href='{}'>graph</a>", url)

    @admin.display(description="")
    def signal_link(self, obj: Job) -> str:
        if (obj.gate or {}).get("kind") != "signal":
            return ""
        url = reverse("admin:conveyor_waitinggate_signal", args=[obj.pk])
        return format_html("<a class='button' href='{}'>send signal…</a>", url)

    def get_urls(self) -> list[Any]:
        own = [
            path(
                "<path:object_id>/signal/",
                self.admin_site.admin_view(self.signal_view),
                name="conveyor_waitinggate_signal",
            )
        ]
        return own + super().get_urls()

    def signal_view(self, request: HttpRequest, object_id: str) -> Any:
        """A signal with a payload, for one gate: the form, a confirmation, then SIGNAL."""
        from ..workflows.gates import send_signal

        if not self.has_operate_permission(request):
            raise PermissionDenied
        gate = self.get_queryset(request).filter(pk=object_id).first()
        if gate is None or (gate.gate or {}).get("kind") != "signal":
            raise Http404(f"No gate with the id {object_id!r} waits for a signal.")
        initial = {"name": gate.gate["signal"]}
        form = SignalForm(request.POST or None, initial=initial)
        confirm = False
        if request.method == "POST" and form.is_valid():
            if request.POST.get("post") != "yes":
                confirm = True
            else:
                name, payload = form.cleaned_data["name"], form.cleaned_data["payload"]
                try:
                    send_signal(
                        f"{conveyor_settings().DATABASE}:{gate.pk}", name, payload,
                        actor=actor_for(request),
                    )  # fmt: skip
                except (GateError, ArgumentsNotSerializable, ValueError) as exc:
                    form.add_error(None, str(exc))
                else:
                    log_job_changes(request, [gate.pk], f"Signal {name!r} sent.")
                    self.message_user(
                        request, f"Signal {name!r} sent to gate {gate.pk}.", messages.SUCCESS
                    )
                    return HttpResponseRedirect(
                        reverse("admin:conveyor_job_change", args=[gate.pk])
                    )
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Send a signal to gate {gate.pk}",
            "gate": gate,
            "waits": waits_for(gate),
            "form": form,
            "confirm": confirm,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/conveyor/waiting/signal.html", context)
