"""py-spy for the profile workload, and the breakdown of its samples.

The profile run attaches two py-spy recorders to one conveyor worker process
while it drains (see systems/conveyor_adapter.py): one samples only the
thread holding the GIL (`--gil`: where the process's Python time goes), one
samples every thread including waits (`--idle`: where each thread's wall time
goes). Both write py-spy's raw format: one collapsed stack per line, frames
separated by `;`, then the sample count. The breakdown sorts every stack into
one category by the first rule that matches, and turns samples into
microseconds per job: samples / rate / jobs handled while profiling.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

from . import envs

# (category, pattern on the collapsed stack): the first match wins, so the
# most specific rules come first. Frames look like `func (path/file.py:line)`.
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("handler body (the no-op's mark write)", r"bench_common\.py"),
    ("logging", r"\(logging/|log_job \("),
    (
        "a threading.Event per claimed job (LeaseState)",
        r"Worker\.cycle [^;]*;(?:[^;]*;)?[^;]*(?:Event|Condition)\.__init__",
    ),
    ("TaskResult built per job", r"build_result \(|results\.py|TaskResult"),
    ("task_started/task_finished signals", r"dispatch/dispatcher\.py|\bsend \(|report \("),
    ("JSON encode/decode", r"json_round_trip|json/|_json \(|jsonb|dumps \(|loads \("),
    ("per-job connection hygiene (Django)", r"connection_hygiene|close_if_unusable"),
    (
        "thread hand-offs (queues, events, locks)",
        r"queue\.py|threading\.py|SimpleQueue|\bput \(|\bget \(|wait \(|\bset \(",
    ),
    ("claim: SQL round trip and rows to Lease", r"\bclaim \("),
    ("outcomes: COMPLETE statement", r"write_batch|\bcomplete \(|_guarded"),
    ("heartbeat / reap", r"heartbeat \(|reap \("),
    ("psycopg other", r"psycopg"),
    ("task call and import", r"\bcall \(|import_task|resolve \("),
    ("slot bookkeeping", r"run_slot|observe \("),
    (
        "control loop bookkeeping",
        r"cycle \(|collect_outcomes|settle \(|control_loop|free_slots|prefetch \(",
    ),
)


def ensure_pyspy(repo: Path, venvs_root: Path, log: Path) -> Path | None:
    try:
        py = envs.ensure_venv(envs.specs(repo)["_tools"], venvs_root, repo, log)
    except (subprocess.CalledProcessError, RuntimeError, OSError):
        return None
    binary = py.parent / "py-spy"
    return binary if binary.exists() else None


def read_raw(path: Path) -> list[tuple[str, int]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            out.append((stack, int(count)))
    return out


def categorize(stacks: list[tuple[str, int]]) -> dict[str, int]:
    rules = [(name, re.compile(rx)) for name, rx in CATEGORIES]
    totals: dict[str, int] = {}
    for stack, count in stacks:
        name = next((n for n, rx in rules if rx.search(stack)), "other")
        totals[name] = totals.get(name, 0) + count
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


# What the control loop (the main thread) is doing, from the wall-clock profile:
# waiting on PostgreSQL for one statement, or running Python, or idle.
LOOP_WAITS: tuple[tuple[str, str], ...] = (
    ("waiting on PostgreSQL: CLAIM", r"\bclaim \(django_conveyor.*(wait|_exec|execute|fetch)"),
    (
        "waiting on PostgreSQL: COMPLETE",
        r"(_guarded|write_batch|complete \().*(wait|_exec|execute)",
    ),
    ("waiting on PostgreSQL: heartbeat / reap", r"(heartbeat|reap) \(.*(wait|execute)"),
    (
        # The common cycle: BEGIN, COMPLETE and CLAIM in one round trip, then COMMIT.
        "waiting on PostgreSQL: a pipelined cycle (COMPLETE and CLAIM, then COMMIT)",
        r"execute_pipelined \(django_conveyor.*(Connection\.wait|_exec_command|Transaction|sync)",
    ),
    (
        "waiting on PostgreSQL: BEGIN / COMMIT",
        r"cycle \(django_conveyor.*(Connection\.wait|_exec_command|Transaction)",
    ),
    ("idle: waiting for outcomes or a wake-up", r"control_loop \([^;]*\);(Event|Condition)\.wait"),
    (
        "Python: building leases and per-job state",
        r"claim \(|LeaseState|__create_fn__|Condition\.__init__|Event\.__init__",
    ),
    ("Python: other control-loop work", r"."),
)


def thread_kind(stack: str) -> str:
    head = stack.split(";", 1)[0]
    if "conveyor-slot" in head:
        return "slot threads"
    if "MainThread" in head:
        return "control loop (main thread)"
    if "listen" in stack.lower():
        return "listener"
    return "other threads"


def by_thread(stacks: list[tuple[str, int]]) -> dict[str, int]:
    """Samples per thread kind (slot threads folded together)."""
    out: dict[str, int] = {}
    for stack, count in stacks:
        kind = thread_kind(stack)
        out[kind] = out.get(kind, 0) + count
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def loop_waits(stacks: list[tuple[str, int]]) -> dict[str, int]:
    rules = [(name, re.compile(rx)) for name, rx in LOOP_WAITS]
    out: dict[str, int] = {}
    for stack, count in stacks:
        if thread_kind(stack) != "control loop (main thread)":
            continue
        name = next(n for n, rx in rules if rx.search(stack))
        out[name] = out.get(name, 0) + count
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def summarize_run(result: dict[str, Any]) -> dict[str, Any]:
    """µs per job per category, from the GIL profile (and threads from the wall one)."""
    jobs = max(int(result.get("profiled_jobs", 0)), 1)
    out: dict[str, Any] = {"jobs": jobs, "wall_us_per_job": 1e6 * result["profiled_s"] / jobs}
    for key in ("gil", "wall"):
        path = Path(result["files"][key])
        if not path.exists():
            continue
        rate = float(result["rate_hz"][key])
        stacks = read_raw(path)
        total = sum(c for _, c in stacks)
        out[key] = {
            "samples": total,
            "us_per_job_total": 1e6 * total / rate / jobs,
            "us_per_job": {
                k: round(1e6 * v / rate / jobs, 1) for k, v in categorize(stacks).items()
            },
            "us_per_job_by_thread": {
                k: round(1e6 * v / rate / jobs, 1) for k, v in by_thread(stacks).items()
            },
        }
        if key == "wall":  # the control loop's wall time, by what it waits on
            out[key]["control_loop_us_per_job"] = {
                k: round(1e6 * v / rate / jobs, 1) for k, v in loop_waits(stacks).items()
            }
    return out
