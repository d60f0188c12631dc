"""The results document: machine facts, raw runs, summaries, best settings, a Markdown table.

Layout of ``results``::

    results[workload][system] = {"skipped": reason}            # or
    results[workload][system][figure] = {
        "settings": {label: {"setting": {...}, "runs": [...], "summary": {...}}},
        "sweep":    {label: {...}},          # drain only: one smaller run per setting
        "best": label,                       # the setting with the best median
    }
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
from pathlib import Path
from typing import Any

SUMMARY_METRICS = {
    "enqueue": (
        "enqueue_one_per_call_per_s",
        "floor_insert_commit_per_s",
        "one_per_call_share_of_floor",
        "enqueue_bulk_per_s",
        "enqueue_one_p50_us",
        "floor_p50_us",
    ),
    "drain": (
        "jobs_per_s",
        "jobs_per_s_by_handler_marks",
        "ack_lag_ms",
        "enqueue_bulk_per_s",
        "worker_peak_rss_mb",
        "wall_s_incl_startup_exit",
    ),
    "relay": ("jobs_per_s", "worker_peak_rss_mb"),
    "growth": ("jobs_per_s", "prefill_s", "worker_peak_rss_mb"),
    "features": (
        "jobs_per_s",
        "single_plain_per_s",
        "single_unique_per_s",
        "single_unique_over_plain",
        "bulk_plain_per_s",
        "bulk_unique_per_s",
        "bulk_unique_over_plain",
    ),
    "sustained": (
        "measured_jobs_per_s",
        "first_10pct_jobs_per_s",
        "last_10pct_jobs_per_s",
        "last_over_first",
        "rss_mb_at_10pct",
        "rss_mb_at_end",
        "rss_growth_mb",
        "max_dead_tuples",
        "worker_peak_rss_mb",
    ),
    "latency": (
        "p50_ms",
        "p95_ms",
        "p99_ms",
        "max_ms",
        "from_return_p50_ms",
        "from_return_p99_ms",
        "achieved_rate",
        "worker_peak_rss_mb",
    ),
    "limit": ("jobs_per_s", "cycles"),
    "profile": ("profiled_jobs_per_s", "jobs_per_s"),
}
# metric that decides the best setting, and whether higher is better
BEST = {
    "drain": ("jobs_per_s", True),
    "latency": ("p50_ms", False),
    "limit": ("jobs_per_s", True),
}


def spread(values: list[float]) -> dict[str, float | int]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def summarize(workload: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in runs if r.get("ok")]
    out: dict[str, Any] = {"runs_ok": len(good), "runs_failed": len(runs) - len(good)}
    for metric in SUMMARY_METRICS[workload]:
        values = [float(r[metric]) for r in good if r.get(metric) is not None]
        if values:
            out[metric] = spread(values)
    loads = [r.get("load", {}) for r in runs]
    others = [x["others_cpu_pct"] for x in loads if x.get("others_cpu_pct") is not None]
    during = [
        x["others_cpu_pct_during"] for x in loads if x.get("others_cpu_pct_during") is not None
    ]
    avg = [x["loadavg_1m"] for x in loads if x.get("loadavg_1m") is not None]
    out["load"] = {
        "loadavg_1m_max": max(avg, default=None),
        "others_cpu_pct_before_max": max(others, default=None),
        "others_cpu_pct_during_max": max(during, default=None),
    }
    if good:
        out["knobs"] = good[-1].get("knobs")
        out["all_completed"] = all(r.get("completed_in_time", True) for r in good)
        dupes = [r.get("duplicates", 0) for r in good]
        out["duplicates_max"] = max(dupes)
    errors = [r.get("error") for r in runs if not r.get("ok") and r.get("error")]
    if errors:
        out["errors"] = errors
    return out


def meminfo_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine_info() -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "cpu_model": cpu_model(),
        "ram_gib": meminfo_gib(),
        "kernel": platform.release(),
        "platform": platform.platform(),
        "harness_python": platform.python_version(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def venv_python_version(py: Path) -> str | None:
    out = subprocess.run(
        [str(py), "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() or None


class Document:
    """Accumulates runs and rewrites the JSON file after each one."""

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path = path
        self.doc: dict[str, Any] = dict(header, results={})

    def skip(self, workload: str, system: str, reason: str) -> None:
        self.doc["results"].setdefault(workload, {})[system] = {"skipped": reason}
        self.save()

    def add(
        self,
        workload: str,
        figure: str,
        system: str,
        label: str,
        setting: dict[str, Any],
        result: dict[str, Any],
        phase: str = "final",
    ) -> None:
        per_system = self.doc["results"].setdefault(workload, {}).setdefault(system, {})
        cell = per_system.setdefault(figure, {"settings": {}})
        group = cell.setdefault("sweep" if phase == "sweep" else "settings", {})
        entry = group.setdefault(label, {"setting": setting, "runs": []})
        entry["runs"].append(result)
        entry["summary"] = summarize(workload, entry["runs"])
        if cell["settings"]:
            cell["best"] = self.best_label(workload, cell["settings"])
        self.save()

    @staticmethod
    def best_label(workload: str, settings: dict[str, Any]) -> str | None:
        metric, higher = BEST.get(workload, ("jobs_per_s", True))
        scored = [
            (entry["summary"][metric]["median"], label)
            for label, entry in settings.items()
            if metric in entry["summary"]
        ]
        if not scored:  # no ranking metric (one setting): the first that ran
            return next(iter(settings), None)
        return (max(scored) if higher else min(scored))[1]

    def best_setting(self, workload: str, system: str, figure: str) -> dict[str, Any] | None:
        """The best setting so far; for the drain, the best of its sweep."""
        cell = self.doc["results"].get(workload, {}).get(system, {}).get(figure)
        if not isinstance(cell, dict):
            return None
        group = (
            cell.get("sweep") if workload == "drain" and cell.get("sweep") else cell.get("settings")
        )
        label = self.best_label(workload, group or {})
        return group[label]["setting"] if label else None

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.doc, indent=1, sort_keys=False) + "\n")
        tmp.replace(self.path)
