"""The dashboard: per queue what is ready, scheduled, running, failed and dead,
throughput over the last hour, pickup lag, pauses and workers.

It is the changelist of a proxy model, so it sits first in the app's list.
The page refreshes its body every few seconds from `?fragment=1`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from .. import operations
from ..models import Dashboard
from ..queue_counts import EXACT_BELOW
from . import overview

REFRESH_SECONDS = 5


@admin.register(Dashboard)
class DashboardAdmin(admin.ModelAdmin):
    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        user = request.user
        return any(
            user.has_perm(f"conveyor.{p}")
            for p in ("view_dashboard", "view_job", "change_job", "view_queue", "change_queue")
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[Any]:
        from django.urls import path

        name = f"{self.opts.app_label}_{self.opts.model_name}_changelist"
        return [path("", self.admin_site.admin_view(self.changelist_view), name=name)]

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        from django.core.exceptions import PermissionDenied

        if not self.has_view_permission(request):
            raise PermissionDenied
        figures = overview.overview(operations.known_queues())
        total = figures.total
        rows = [(q, bar_chart(q.per_minute, label=f"{q.name}: completed per minute"))
                for q in figures.queues]  # fmt: skip
        context = {
            **self.admin_site.each_context(request),
            "title": "Dashboard",
            "opts": self.opts,
            "overview": figures,
            "rows": rows,
            "total": total,
            "total_chart": bar_chart(
                total.per_minute, width=720, height=120, label="all queues: completed per minute"
            ),
            "refresh_seconds": REFRESH_SECONDS,
            "lost_after_seconds": overview.lost_after_seconds(),
            "exact_below": f"{EXACT_BELOW:,}",
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        template = (
            "admin/conveyor/dashboard_body.html"
            if request.GET.get("fragment")
            else "admin/conveyor/dashboard.html"
        )
        return TemplateResponse(request, template, context)


# Bar charts as inline SVG, drawn on the server: nothing to fetch, no script.
def bar_chart(
    values: Sequence[int], *, width: int = 120, height: int = 28, label: str = ""
) -> SafeString:
    """One bar per value, oldest left; each bar's tooltip says its minute and count."""
    count = len(values) or 1
    peak = max(values, default=0) or 1
    step = width / count

    def bar(i: int, value: int) -> tuple[str, ...]:
        tall = max(value / peak * height, 1.0) if value else 0.0
        x, y, wide = i * step, height - tall, max(step - 1, 1)
        return f"{x:.1f}", f"{y:.1f}", f"{wide:.1f}", f"{tall:.1f}", str(count - 1 - i), str(value)

    bars = format_html_join(
        "",
        "<rect x='{}' y='{}' width='{}' height='{}'><title>{} min ago: {}</title></rect>",
        (bar(i, v) for i, v in enumerate(values)),
    )
    return format_html(
        "<svg class='conveyor-chart' role='img' aria-label='{}' viewBox='0 0 {} {}' "
        "width='{}' height='{}' preserveAspectRatio='none' data-peak='{}'>"
        "<line class='conveyor-axis' x1='0' y1='{}' x2='{}' y2='{}'/>{}</svg>",
        label or f"per minute, peak {max(values, default=0)}",
        width,
        height,
        width,
        height,
        max(values, default=0),
        height,
        width,
        height,
        bars,
    )
