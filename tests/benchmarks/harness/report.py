"""The results document: machine facts, raw runs and median/min-max summaries."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
from pathlib import Path
from typing import Any

SUMMARY_METRICS = {
    "drain": (
        "jobs_per_s",
        "enqueue_bulk_per_s",
        "enqueue_one_per_call_per_s",
        "worker_peak_rss_mb",
        "wall_s_incl_startup_exit",
    ),
    "relay": ("jobs_per_s", "worker_peak_rss_mb"),
    "growth": ("jobs_per_s", "worker_peak_rss_mb", "history_insert_s"),
    "soak": (
        "rss_growth_mb",
        "rss_mb_at_10pct",
        "rss_mb_at_end",
        "jobs_per_s",
        "worker_peak_rss_mb",
    ),
    "latency": ("p50_ms", "p95_ms", "p99_ms", "max_ms", "achieved_rate", "worker_peak_rss_mb"),
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
    if good:
        out["knobs"] = good[-1].get("knobs")
        out["all_completed"] = all(r.get("completed_in_time", True) for r in good)
        lost = [r["handled"] - r["params"]["jobs"] for r in good if "handled" in r]
        if lost:
            out["min_handled_minus_jobs"] = min(lost)
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

    def add(self, workload: str, figure: str, system: str, result: dict[str, Any]) -> None:
        per_system = self.doc["results"].setdefault(workload, {}).setdefault(system, {})
        if result.get("skipped"):
            per_system["skipped"] = result["reason"]
        else:
            cell = per_system.setdefault(figure, {"runs": []})
            cell["runs"].append(result)
            cell["summary"] = summarize(workload, cell["runs"])
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.doc, indent=1, sort_keys=False) + "\n")
        tmp.replace(self.path)
