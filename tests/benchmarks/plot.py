"""Draw a results JSON as one PNG: ``python plot.py bench.json bench.png`` (matplotlib)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

COLORS = {
    "conveyor": "#1b7f5f",
    "procrastinate": "#7a5195",
    "pgqueuer": "#ef5675",
    "chancy": "#ffa600",
    "django-tasks-db": "#488f31",
    "django-ox": "#003f5c",
    "celery": "#8a8a8a",
}


def cell(
    doc: dict[str, Any], workload: str, system: str, figure: str, metric: str
) -> tuple[float, float, float] | None:
    per = doc["results"].get(workload, {}).get(system, {})
    stats = per.get(figure, {}).get("summary", {}).get(metric) if isinstance(per, dict) else None
    if not stats:
        return None
    return stats["median"], stats["min"], stats["max"]


def systems_of(doc: dict[str, Any], workload: str) -> list[str]:
    per = doc["results"].get(workload, {})
    return [
        s
        for s in doc["systems"]
        if isinstance(per.get(s), dict) and any(k != "skipped" for k in per[s])
    ]


def bars(
    ax: Axes,
    doc: dict[str, Any],
    workload: str,
    figures: list[str],
    metric: str,
    title: str,
    ylabel: str,
    log: bool = False,
) -> None:
    names = systems_of(doc, workload)
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        xs, ys, lo, hi = [], [], [], []
        for j, fig in enumerate(figures):
            found = cell(doc, workload, name, fig, metric)
            if found:
                med, mn, mx = found
                xs.append(j + i * width)
                ys.append(med)
                lo.append(med - mn)
                hi.append(mx - med)
        if xs:
            drawn = ax.bar(
                xs, ys, width, yerr=[lo, hi], capsize=2, label=name, color=COLORS.get(name)
            )
            ax.bar_label(drawn, labels=[f"{y:,.0f}" for y in ys], fontsize=6, padding=2)
    ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(figures))], figures)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel)
    if not names:
        ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes)
    if log:
        ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)


def latency(ax: Axes, doc: dict[str, Any]) -> None:
    figs = list(doc["results"].get("latency", {}).get(next(iter(doc["systems"])), {}) or [])
    figure = next((f for f in figs if f != "skipped"), "100/s")
    names = systems_of(doc, "latency")
    for k, (metric, hatch) in enumerate((("p50_ms", ""), ("p95_ms", "//"), ("p99_ms", "xx"))):
        for i, name in enumerate(names):
            found = cell(doc, "latency", name, figure, metric)
            if found:
                med, mn, mx = found
                drawn = ax.bar(
                    i + (k - 1) * 0.27,
                    med,
                    0.27,
                    yerr=[[med - mn], [mx - med]],
                    capsize=2,
                    color=COLORS.get(name),
                    hatch=hatch,
                    edgecolor="white",
                    label=metric.replace("_ms", "") if i == 0 else None,
                )
                ax.bar_label(drawn, labels=[f"{med:.1f}"], fontsize=6, padding=2)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("ms (log)")
    ax.set_title(f"Latency, enqueue commit to handler start at {figure} (p50/p95/p99)", fontsize=10)
    if names:
        ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)


def main(src: Path, dst: Path) -> None:
    doc = json.loads(src.read_text())
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    drain_fig = str(doc["sizes"]["drain_jobs"])
    bars(
        axes[0][0],
        doc,
        "drain",
        [drain_fig],
        "jobs_per_s",
        f"Drain: {drain_fig} no-op jobs, one worker host",
        "jobs/s (log)",
        log=True,
    )
    latency(axes[0][1], doc)
    bars(
        axes[1][0],
        doc,
        "relay",
        ["1", "4", "12"],
        "jobs_per_s",
        "Relay: 10 ms sleep + 1,000 sha256, by slots",
        "jobs/s",
    )
    growth = [str(h) for h in doc["sizes"]["growth_history"]]
    bars(
        axes[1][1],
        doc,
        "growth",
        growth,
        "jobs_per_s",
        "Growth: drain with N finished rows already in the table",
        "jobs/s",
    )
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in (axes[1][0], axes[1][1]):
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=7, fontsize=9)
    soak = doc["results"].get("soak", {}).get("conveyor", {})
    soak_cell = soak.get(str(doc["sizes"].get("soak_jobs")), {}) if isinstance(soak, dict) else {}
    summary = soak_cell.get("summary", {}) if isinstance(soak_cell, dict) else {}
    if summary.get("rss_mb_at_end"):
        fig.text(
            0.5,
            0.935,
            f"django-conveyor worker RSS over a {doc['sizes']['soak_jobs']:,}-job drain: "
            f"{summary['rss_mb_at_10pct']['median']:.1f} MB at 10% -> "
            f"{summary['rss_mb_at_end']['median']:.1f} MB at the end (median)",
            fontsize=8,
            ha="center",
        )
    m = doc["machine"]
    pg = (doc.get("postgres") or {}).get("settings", {}).get("server_version", "?")
    fig.suptitle(
        f"Python job queues on PostgreSQL {pg} - {m['cores']} cores, "
        f"{m['ram_gib']} GiB - {doc['date']} - median of {doc['repeat']}, "
        "bars = min-max",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0.05, 1, 0.93))
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
