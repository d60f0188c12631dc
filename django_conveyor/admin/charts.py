"""Bar charts as inline SVG, drawn on the server: nothing to fetch, no script."""

from __future__ import annotations

from collections.abc import Sequence

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString


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
