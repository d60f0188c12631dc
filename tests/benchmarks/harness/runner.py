"""Drives the adapters: one subprocess per (workload, figure, setting, repetition, system).

Order matters on a shared machine: repetitions are interleaved (every system
runs its figure once before any runs it again, and the order of the systems
rotates from one repetition to the next), and every run records the
machine's load before and during it.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import config, load, services

RESULT_PREFIX = "BENCH-RESULT "
RUN_TIMEOUT_S = 1800.0


@dataclass
class SystemState:
    name: str
    python: Path | None = None
    status: str = "pending"  # ok | error | skipped
    reason: str = ""
    version: str | None = None
    template_db: str | None = None


@dataclass
class Context:
    systems_dir: Path
    work_root: Path
    sizes: config.Sizes
    procs: services.Processes
    pg: services.Postgres | None
    redis_url: str | None
    states: dict[str, SystemState]
    log: Callable[[str], None]
    monitor: load.Monitor
    explicit_systems: bool = False  # --systems named them: run every workload for them
    pinned: dict[str, Any] | None = None  # --setting: no sweep, this setting only
    processes: tuple[int, ...] | None = None  # --processes: drain/limit layouts
    figures: tuple[str, ...] | None = None  # --figures: only these figures of each workload
    quiet_pct: float = 0.0  # wait before a run until others use less CPU than this
    quiet_max_wait_s: float = 0.0
    pyspy: Path | None = None
    profile_dir: Path | None = None
    db_counter: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    best: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)

    def pg_python(self) -> Path | None:
        for st in self.states.values():
            if st.python and config.USES_POSTGRES[st.name] and st.status != "skipped":
                return st.python
        return None


def parse_result(log: Path) -> dict[str, Any] | None:
    found = None
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith(RESULT_PREFIX):
            found = json.loads(line[len(RESULT_PREFIX) :])
    return found


def run_adapter(
    ctx: Context,
    st: SystemState,
    command: str,
    params: dict[str, Any],
    workdir: Path,
    timeout: float = RUN_TIMEOUT_S,
) -> dict[str, Any]:
    assert st.python is not None
    workdir.mkdir(parents=True, exist_ok=True)
    pgid_file = workdir / "pgids.txt"
    ctx.procs.pgid_files.append(pgid_file)
    env = dict(
        os.environ,
        PYTHONPATH=str(ctx.systems_dir),
        BENCH_PGID_FILE=str(pgid_file),
        PYTHONUNBUFFERED="1",
    )
    argv = [
        str(st.python),
        str(ctx.systems_dir / config.ADAPTERS[st.name]),
        command,
        json.dumps(dict(params, workdir=str(workdir))),
    ]
    log = workdir / "adapter.log"
    proc = ctx.procs.spawn(argv, log, env)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        ctx.procs.cleanup()
        proc.wait()
        return {"ok": False, "error": f"timed out after {timeout:.0f}s (log: {log})"}
    finally:
        if proc.pid in ctx.procs.groups:
            ctx.procs.groups.remove(proc.pid)
    result = parse_result(log)
    if result is None:
        tail = log.read_text(errors="replace")[-800:]
        return {"ok": False, "error": f"adapter exited {proc.returncode} without a result: {tail}"}
    return result


def base_params(ctx: Context, db_url: str | None) -> dict[str, Any]:
    return {"database_url": db_url, "redis_url": ctx.redis_url}


def prepare_system(ctx: Context, st: SystemState) -> None:
    """Create the system's template database (schema installed once, then cloned)."""
    if st.status in ("skipped", "error"):
        return
    if not config.USES_POSTGRES[st.name]:
        st.status = "ok"
        return
    if ctx.pg is None or st.python is None:
        st.status, st.reason = "error", "no PostgreSQL"
        return
    tpl = f"bench_{st.name.replace('-', '_')}_tpl"
    try:
        services.run_sql(
            st.python,
            ctx.pg.url,
            f"DROP DATABASE IF EXISTS {tpl} WITH (FORCE)",
            f"CREATE DATABASE {tpl}",
        )
    except RuntimeError as exc:
        st.status, st.reason = "error", f"cannot create database: {exc}"
        return
    res = run_adapter(
        ctx,
        st,
        "install",
        base_params(ctx, services.with_dbname(ctx.pg.url, tpl)),
        ctx.work_root / "install" / st.name,
        timeout=600,
    )
    if not res.get("ok"):
        st.status, st.reason = "error", f"install failed: {res.get('error')}"
        return
    st.template_db, st.status = tpl, "ok"


def fresh_database(ctx: Context, st: SystemState) -> str | None:
    if not config.USES_POSTGRES[st.name]:
        return None
    assert ctx.pg is not None and st.python is not None
    name = f"bench_{st.name.replace('-', '_')}_{next(ctx.db_counter)}"
    services.run_sql(
        st.python,
        ctx.pg.url,
        f"DROP DATABASE IF EXISTS {name} WITH (FORCE)",
        f"CREATE DATABASE {name} TEMPLATE {st.template_db}",
    )
    return name


def drop_database(ctx: Context, st: SystemState, name: str | None) -> None:
    if name and ctx.pg is not None and st.python is not None:
        try:
            services.run_sql(st.python, ctx.pg.url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        except RuntimeError as exc:
            ctx.log(f"  warning: could not drop {name}: {exc}")


# ---------------------------------------------------------------- what runs


@dataclass(frozen=True)
class Cell:
    """One figure of one system: the adapter command and its parameters."""

    workload: str
    figure: str
    system: str
    setting: dict[str, Any]
    command: str
    params: dict[str, Any]
    phase: str = "final"  # "sweep" runs pick the setting of the "final" runs

    @property
    def label(self) -> str:
        return config.label(self.setting)


DEFAULT_SETTING: dict[str, dict[str, Any]] = {
    "conveyor": {"concurrency": 10, "prefetch": None},
    "pgqueuer": {"batch_size": 50, "concurrency_limit": 0},
    "procrastinate": {"concurrency": 10},
    "chancy": {"concurrency": 10},
    "django-tasks-db": {"interval": 0.1},
    "django-ox": {"concurrency": 4, "interval": 0.1},
    "celery": {"pool": "solo", "concurrency": 1, "prefetch": 64},
}


def process_label(n: int) -> str:
    return f"{n} process" + ("" if n == 1 else "es")


def drain_processes(ctx: Context) -> tuple[int, ...]:
    return ctx.processes or config.DRAIN_PROCESSES


def sweep_of(ctx: Context, table: dict[str, list[dict[str, Any]]], system: str) -> list[dict]:
    if ctx.pinned is not None:
        return [dict(DEFAULT_SETTING.get(system, {}), **ctx.pinned)]
    settings = table.get(system) or [DEFAULT_SETTING.get(system, {})]
    if ctx.sizes.sweep_settings:
        settings = settings[: ctx.sizes.sweep_settings]
    return settings


def best_setting(ctx: Context, system: str, processes: int) -> dict[str, Any]:
    """The drain's best setting at this many processes, else the nearest, else a default."""
    if ctx.pinned is not None:
        return dict(DEFAULT_SETTING.get(system, {}), **ctx.pinned)
    for n in (processes, *drain_processes(ctx)):
        found = ctx.best.get(("drain", process_label(n), system))
        if found is not None:
            return dict(found)
    return dict(DEFAULT_SETTING.get(system, {}))


def final_drain_settings(ctx: Context, system: str, processes: int) -> list[dict[str, Any]]:
    """The final drains' settings: the best swept one, and beside it the system's
    no-flags setting (config.NO_FLAGS) when a sweep ran and chose another."""
    best = best_setting(ctx, system, processes)
    no_flags = config.NO_FLAGS.get(system)
    if ctx.pinned is not None or no_flags is None or dict(no_flags) == best:
        return [best]
    return [best, dict(no_flags)]


def skip_reason(ctx: Context, st: SystemState, workload: str) -> str | None:
    if st.status != "ok":
        return st.reason or st.status
    if workload in config.CONVEYOR_ONLY and st.name != "conveyor":
        return config.CONVEYOR_ONLY[workload]
    sustained = workload == "sustained" and not ctx.explicit_systems
    if sustained and st.name not in config.SUSTAINED_SYSTEMS:
        return config.SUSTAINED_SKIP
    if workload == "profile" and ctx.pyspy is None:
        return "py-spy is not available (see the run's venvs.log)"
    return None


def cells(ctx: Context, workload: str, systems: list[str], phase: str = "final") -> list[Cell]:
    """Every cell of a workload for these systems, figure by figure."""
    z = ctx.sizes
    chunk = {"bulk_chunk": z.bulk_chunk}
    out: list[Cell] = []
    for system in systems:
        if workload == "enqueue":
            params = {"single": z.enqueue_single, "bulk": z.enqueue_bulk, **chunk}
            out.append(Cell(workload, "enqueue", system, {}, "enqueue", params))
        elif workload == "drain":
            for n in drain_processes(ctx):
                fig = process_label(n)
                jobs = z.sweep_jobs if phase == "sweep" else z.drain_jobs
                settings = (
                    sweep_of(ctx, config.DRAIN_SWEEP, system)
                    if phase == "sweep"
                    else final_drain_settings(ctx, system, n)
                )
                for setting in settings:
                    params = {"jobs": jobs, "processes": n, "setting": setting, **chunk}
                    out.append(Cell(workload, fig, system, setting, "drain", params, phase))
        elif workload == "latency":
            for setting in sweep_of(ctx, config.LATENCY_SWEEP, system):
                params = {
                    "jobs": z.latency_jobs,
                    "rate": z.latency_rate,
                    "processes": 1,
                    "setting": setting,
                }
                out.append(
                    Cell(workload, f"{z.latency_rate:g}/s", system, setting, "latency", params)
                )
        elif workload == "sustained":
            n = (ctx.processes or (2,))[-1]
            setting = best_setting(ctx, system, n)
            params = {
                "jobs": z.sustained_jobs,
                "backlog": z.sustained_backlog,
                "processes": n,
                "setting": setting,
                **chunk,
            }
            fig = f"{z.sustained_jobs:,} jobs, {process_label(n)}"
            out.append(Cell(workload, fig, system, setting, "sustained", params))
        elif workload in ("growth", "features"):
            # One drain (or enqueue) per figure, at 2 processes' best setting.
            setting = best_setting(ctx, system, 2)
            if workload == "growth":
                figures = config.GROWTH_FIGURES
                sized = {
                    "rows": z.growth_rows,
                    "growth_processes": z.growth_processes,
                    "growth_queues": z.growth_queues,
                }
            else:
                figures = config.FEATURE_FIGURES
                sized = {"single": z.enqueue_single, "bulk": z.enqueue_bulk}
            for fig in figures:
                params = {
                    "figure": fig,
                    "jobs": z.growth_jobs,
                    "processes": 2,
                    **sized,
                    "setting": setting,
                    **chunk,
                }
                out.append(Cell(workload, fig, system, setting, workload, params))
        elif workload == "limit":
            settings = [{"batch": b, "pipeline": True} for b in config.LIMIT_BATCHES]
            settings += [{"batch": b, "pipeline": False} for b in (50, 200)]
            # diagnostic, not the shipped SQL: the claim's per-row paused filter of before
            variant = {"pipeline": True, "claim": "per-row-filter"}
            settings += [{"batch": b, **variant} for b in (50, 200)]
            if ctx.sizes.sweep_settings:
                settings = settings[: ctx.sizes.sweep_settings]
            if ctx.pinned is not None:
                settings = [ctx.pinned]
            for n in drain_processes(ctx):
                for setting in settings:
                    params = {"jobs": z.limit_jobs, "processes": n, "setting": setting, **chunk}
                    out.append(Cell(workload, process_label(n), system, setting, "limit", params))
        elif workload == "relay":
            for fig, (p, c) in config.RELAY_SLOTS.items():
                setting = config.relay_setting(system, p, c)
                params = {"kind": "relay", "jobs": z.relay_jobs, "processes": p, "setting": setting}
                out.append(Cell(workload, f"{fig} slots", system, setting, "drain", params))
        elif workload == "profile":
            setting = best_setting(ctx, system, 1)
            params = {
                "jobs": z.profile_jobs,
                "processes": 1,
                "setting": setting,
                "pyspy": str(ctx.pyspy),
                "profile_dir": str(ctx.profile_dir),
                "rate": 200,
                **chunk,
            }
            out.append(Cell(workload, "1 process", system, setting, "profile", params))
    if ctx.figures:
        out = [c for c in out if c.figure in ctx.figures]
    return out


# ---------------------------------------------------------------- running


def wait_for_quiet(ctx: Context) -> tuple[dict[str, Any], float]:
    """The load before a run; with --quiet, wait (bounded) until others are quiet."""
    t0 = time.monotonic()
    while True:
        before = ctx.monitor.before()
        others = before.get("others_cpu_pct") or 0.0
        waited = time.monotonic() - t0
        if ctx.quiet_pct <= 0 or others < ctx.quiet_pct or waited >= ctx.quiet_max_wait_s:
            return before, waited
        time.sleep(2.0)


def one_run(ctx: Context, st: SystemState, cell: Cell, rep: int) -> dict[str, Any]:
    slug = cell.figure.replace("/", "").replace(" ", "").replace(",", "")
    tag = f"{cell.phase}-" if cell.phase != "final" else ""
    setting_slug = "".join(ch if ch.isalnum() else "_" for ch in cell.label)[:60]
    workdir = ctx.work_root / cell.workload / f"{st.name}-{slug}-{tag}{setting_slug}-r{rep}"
    db = None
    try:
        db = fresh_database(ctx, st)
        url = services.with_dbname(ctx.pg.url, db) if db and ctx.pg else None
        if st.name == "celery":  # a clean broker for every run
            run_adapter(ctx, st, "install", base_params(ctx, None), workdir / "install", 120)
        before, waited = wait_for_quiet(ctx)
        ctx.monitor.start()
        t0 = time.monotonic()
        try:
            result = run_adapter(
                ctx, st, cell.command, dict(base_params(ctx, url), **cell.params), workdir
            )
        finally:
            during = ctx.monitor.finish()
        result["elapsed_s"] = round(time.monotonic() - t0, 2)
        result["load"] = dict(before, **during, waited_s=round(waited, 1))
    except RuntimeError as exc:
        result = {"ok": False, "error": str(exc)}
    finally:
        drop_database(ctx, st, db)
    result["params"] = {k: v for k, v in cell.params.items() if k not in ("pyspy",)}
    result["setting"] = cell.setting
    result["phase"] = cell.phase
    return result


def headline(workload: str, result: dict[str, Any]) -> str:
    if not result.get("ok"):
        return "ERROR " + str(result.get("error", ""))[:300]
    if workload == "enqueue":
        return (
            f"one-per-call {result['enqueue_one_per_call_per_s']:.0f}/s, floor "
            f"{result['floor_insert_commit_per_s']:.0f}/s "
            f"({100 * result['one_per_call_share_of_floor']:.0f}%), "
            f"bulk {result['enqueue_bulk_per_s']:.0f}/s"
        )
    if workload == "latency":
        return (
            f"p50 {result['p50_ms']:.2f} ms  p95 {result['p95_ms']:.2f} ms  "
            f"p99 {result['p99_ms']:.2f} ms from the call's start ({result['samples']} samples)"
        )
    if workload == "sustained":
        return (
            f"{result['measured_jobs_per_s']:.0f} jobs/s, last/first 10% "
            f"{result['last_over_first']:.2f}, rss {result['rss_mb_at_10pct']:.1f} -> "
            f"{result['rss_mb_at_end']:.1f} MB, dead tuples <= {result['max_dead_tuples']}"
        )
    if workload == "profile":
        rate, jobs = result["profiled_jobs_per_s"], result["profiled_jobs"]
        return f"{rate:.0f} jobs/s under py-spy ({jobs} jobs)"
    if "single_unique_per_s" in result:  # features: unique enqueue
        return (
            f"one call: plain {result['single_plain_per_s']:.0f}/s, unique "
            f"{result['single_unique_per_s']:.0f}/s; enqueue_many: plain "
            f"{result['bulk_plain_per_s']:.0f}/s, unique {result['bulk_unique_per_s']:.0f}/s"
        )
    text = f"{result['jobs_per_s']:.0f} jobs/s"
    if result.get("worker_peak_rss_mb"):
        text += f"  rss {result['worker_peak_rss_mb']:.0f} MB"
    if result.get("ack_lag_ms") is not None:
        text += f"  ack lag {result['ack_lag_ms']:.0f} ms"
    if not result.get("completed_in_time", True):
        text += "  (INCOMPLETE)"
    return text


def execute(
    ctx: Context,
    todo: list[Cell],
    rep: int,
    repeat: int,
    on_result: Callable[[Cell, dict[str, Any]], None],
) -> None:
    for cell in todo:
        st = ctx.states[cell.system]
        phase = f"sweep, {cell.label}" if cell.phase == "sweep" else cell.label
        ctx.log(f"[{cell.workload} {cell.figure} rep {rep + 1}/{repeat}] {st.name} ({phase}) ...")
        result = one_run(ctx, st, cell, rep)
        ctx.log(
            f"    {headline(cell.workload, result)}   [{load.describe(result.get('load', {}))}]"
        )
        on_result(cell, result)
        sys.stderr.flush()


def rotated(names: list[str], rep: int) -> list[str]:
    k = rep % max(len(names), 1)
    return names[k:] + names[:k]


def interleave(groups: list[list[Cell]]) -> list[Cell]:
    """One cell of each system in turn: a, b, c, a, b, c, ..."""
    out: list[Cell] = []
    for i in range(max((len(g) for g in groups), default=0)):
        out += [g[i] for g in groups if i < len(g)]
    return out


def run_all(
    ctx: Context,
    workloads: list[str],
    repeat: int,
    on_result: Callable[[Cell, dict[str, Any]], None],
    on_skip: Callable[[str, str, str], None],
    choose_best: Callable[[str, str, str], dict[str, Any] | None],
) -> None:
    for workload in workloads:
        runnable = []
        for st in ctx.states.values():
            reason = skip_reason(ctx, st, workload)
            if reason:
                on_skip(workload, st.name, reason)
            else:
                runnable.append(st.name)
        if not runnable:
            continue
        if workload == "drain" and ctx.pinned is None:
            # sweep: every setting once (smaller drains), settings of all systems interleaved
            sweep = cells(ctx, "drain", runnable, phase="sweep")
            for n in drain_processes(ctx):
                fig = process_label(n)
                groups = [[c for c in sweep if c.system == s and c.figure == fig] for s in runnable]
                execute(ctx, interleave(groups), 0, 1, on_result)
            for system in runnable:
                for n in drain_processes(ctx):
                    found = choose_best("drain", system, process_label(n))
                    if found is not None:
                        ctx.best[("drain", process_label(n), system)] = found
        for rep in range(repeat):
            todo: list[Cell] = []
            for system in rotated(runnable, rep):
                todo += cells(ctx, workload, [system])
            # figure by figure, systems in turn, so a change in load hits all of them
            by_figure: dict[str, list[Cell]] = {}
            for cell in todo:
                by_figure.setdefault(cell.figure, []).append(cell)
            ordered = [c for fig_cells in by_figure.values() for c in fig_cells]
            execute(ctx, ordered, rep, repeat, on_result)
        if workload in ("latency", "limit"):
            for system in runnable:
                for fig in {c.figure for c in cells(ctx, workload, [system])}:
                    found = choose_best(workload, system, fig)
                    if found is not None:
                        ctx.best[(workload, fig, system)] = found
