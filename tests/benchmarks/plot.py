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


def best(doc: dict[str, Any], workload: str, system: str, figure: str) -> dict[str, Any] | None:
    """The summary of the best setting of one figure, or None."""
    per = doc["results"].get(workload, {}).get(system, {})
    cell = per.get(figure) if isinstance(per, dict) else None
    if not isinstance(cell, dict) or not cell.get("best"):
        return None
    return cell["settings"][cell["best"]]["summary"]


def stat(summary: dict[str, Any] | None, metric: str) -> tuple[float, float, float] | None:
    s = (summary or {}).get(metric)
    return (s["median"], s["min"], s["max"]) if s else None


def systems_of(doc: dict[str, Any], workload: str) -> list[str]:
    per = doc["results"].get(workload, {})
    return [s for s in doc["systems"] if isinstance(per.get(s), dict) and "skipped" not in per[s]]


def figures_of(doc: dict[str, Any], workload: str) -> list[str]:
    seen: list[str] = []
    for per in doc["results"].get(workload, {}).values():
        seen += [f for f in per if f != "skipped" and f not in seen]
    return seen


def grouped(
    ax: Axes,
    doc: dict[str, Any],
    workload: str,
    metric: str,
    title: str,
    ylabel: str,
    log: bool = False,
    names: list[str] | None = None,
) -> None:
    """One group of bars per figure, one bar per system (median, whiskers min-max)."""
    figures = figures_of(doc, workload)
    names = names or systems_of(doc, workload)
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        xs, ys, lo, hi = [], [], [], []
        for j, fig in enumerate(figures):
            found = stat(best(doc, workload, name, fig), metric)
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
    ax.set_xticks(
        [j + width * (len(names) - 1) / 2 for j in range(len(figures))], figures, fontsize=8
    )
    finish(ax, title, ylabel, log, bool(names))


def finish(ax: Axes, title: str, ylabel: str, log: bool, drawn: bool) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel)
    if not drawn:
        ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes)
    if log:
        ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)


def enqueue(ax: Axes, doc: dict[str, Any]) -> None:
    names = systems_of(doc, "enqueue")
    metrics = (
        ("enqueue_one_per_call_per_s", "one call per transaction", ""),
        ("floor_insert_commit_per_s", "bare INSERT + COMMIT (floor)", "//"),
        ("enqueue_bulk_per_s", "bulk", "xx"),
    )
    for k, (metric, label, hatch) in enumerate(metrics):
        for i, name in enumerate(names):
            found = stat(best(doc, "enqueue", name, "enqueue"), metric)
            if found:
                drawn = ax.bar(
                    i + (k - 1) * 0.27,
                    found[0],
                    0.27,
                    color=COLORS.get(name),
                    hatch=hatch,
                    edgecolor="white",
                    label=label if i == 0 else None,
                )
                ax.bar_label(drawn, labels=[f"{found[0]:,.0f}"], fontsize=5, padding=2)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    if names:
        ax.legend(fontsize=7)
    finish(ax, "Enqueue /s: one per call, its floor, bulk", "jobs/s (log)", True, bool(names))


def latency(ax: Axes, doc: dict[str, Any]) -> None:
    figure = next(iter(figures_of(doc, "latency")), "100/s")
    names = systems_of(doc, "latency")
    for k, (metric, hatch) in enumerate((("p50_ms", ""), ("p95_ms", "//"), ("p99_ms", "xx"))):
        for i, name in enumerate(names):
            found = stat(best(doc, "latency", name, figure), metric)
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
    if names:
        ax.legend(fontsize=7)
    finish(
        ax,
        f"Pickup latency at {figure} from the enqueue call's start",
        "ms (log)",
        True,
        bool(names),
    )


def sustained(ax: Axes, doc: dict[str, Any]) -> None:
    drawn = False
    twin = ax.twinx()
    for name in systems_of(doc, "sustained"):
        for fig in figures_of(doc, "sustained"):
            cell = doc["results"]["sustained"][name].get(fig, {})
            for entry in cell.get("settings", {}).values():
                run = next((r for r in entry["runs"] if r.get("ok")), None)
                if not run:
                    continue
                xs = [t for t, _ in run["throughput_series"]]
                ys = [v for _, v in run["throughput_series"]]
                ax.plot(xs, ys, color=COLORS.get(name), label=f"{name} jobs/s", lw=1)
                samples = run.get("table_samples", [])
                dead = [(t["t"], t["n_dead_tup"]) for t in samples if "n_dead_tup" in t]
                if dead:
                    twin.plot(
                        [d[0] for d in dead],
                        [d[1] for d in dead],
                        color=COLORS.get(name),
                        ls=":",
                        lw=1,
                        label=f"{name} dead tuples",
                    )
                drawn = True
                break
    ax.set_xlabel("seconds")
    twin.set_ylabel("dead tuples (dotted)", fontsize=8)
    if drawn:
        lines = ax.get_legend_handles_labels()
        more = twin.get_legend_handles_labels()
        ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=6, loc="lower left")
    finish(ax, "Sustained: producer + workers, throughput over time", "jobs/s", False, drawn)


def limit(ax: Axes, doc: dict[str, Any]) -> None:
    figures = figures_of(doc, "limit")
    ys_limit = [stat(best(doc, "limit", "conveyor", f), "jobs_per_s") for f in figures]
    ys_drain = [stat(best(doc, "drain", "conveyor", f), "jobs_per_s") for f in figures]
    for k, (ys, label, color) in enumerate(
        (
            (ys_limit, "PostgreSQL alone (protocol SQL)", "#bbbbbb"),
            (ys_drain, "conveyor drain", COLORS["conveyor"]),
        )
    ):
        xs = [j + (k - 0.5) * 0.4 for j, y in enumerate(ys) if y]
        vals = [y[0] for y in ys if y]
        if vals:
            drawn = ax.bar(xs, vals, 0.4, color=color, label=label)
            ax.bar_label(drawn, labels=[f"{v:,.0f}" for v in vals], fontsize=6, padding=2)
    ax.set_xticks(range(len(figures)), figures, fontsize=8)
    if figures:
        ax.legend(fontsize=7)
    finish(ax, "Physical limit: claim + complete SQL vs our drain", "jobs/s", False, bool(figures))


def main(src: Path, dst: Path) -> None:
    doc = json.loads(src.read_text())
    fig, axes = plt.subplots(3, 2, figsize=(13, 13))
    grouped(
        axes[0][0],
        doc,
        "drain",
        "jobs_per_s",
        f"Drain: {doc['sizes']['drain_jobs']:,} no-op jobs, best setting per system",
        "jobs/s",
    )
    enqueue(axes[0][1], doc)
    latency(axes[1][0], doc)
    sustained(axes[1][1], doc)
    grouped(
        axes[2][0],
        doc,
        "growth",
        "jobs_per_s",
        "Growth (conveyor): drain under each condition",
        "jobs/s",
        names=["conveyor"],
    )
    axes[2][0].tick_params(axis="x", labelrotation=20)
    limit(axes[2][1], doc)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=7, fontsize=9)
    m = doc["machine"]
    pg = (doc.get("postgres") or {}).get("settings", {}).get("server_version", "?")
    fig.suptitle(
        f"Python job queues on PostgreSQL {pg} - {m['cores']} cores - {doc['date']} - "
        f"median of {doc['repeat']}, whiskers min-max; load beside each figure in the JSON",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.03, 1, 0.97))
    fig.savefig(dst, dpi=100)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
