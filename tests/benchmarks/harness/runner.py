"""Drives the adapters: one subprocess per (workload, figure, repetition, system)."""

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

from . import config, services

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
    db_counter: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

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


def figures(workload: str, sizes: config.Sizes) -> list[str]:
    if workload == "relay":
        return list(config.RELAY_SLOTS)
    if workload == "growth":
        return [str(h) for h in sizes.growth_history]
    if workload == "latency":
        return [f"{sizes.latency_rate:g}/s"]
    if workload == "soak":
        return [str(sizes.soak_jobs)]
    return [str(sizes.drain_jobs)]


def workload_params(
    workload: str, figure: str, system: str, sizes: config.Sizes
) -> tuple[str, dict[str, Any]]:
    """The adapter command and its parameters for one figure of one workload."""
    if workload == "latency":
        p, c = config.LATENCY_LAYOUT[system]
        return "latency", {
            "jobs": sizes.latency_jobs,
            "rate": sizes.latency_rate,
            "processes": p,
            "concurrency": c,
        }
    if workload == "relay":
        p, c = config.RELAY_SLOTS[figure]
        return "relay", {
            "kind": "relay",
            "jobs": sizes.relay_jobs,
            "single_jobs": 0,
            "processes": p,
            "concurrency": c,
        }
    p, c = config.DRAIN_LAYOUT[system]
    if workload == "soak":  # one worker process, so its RSS is the figure
        return "soak", {"jobs": sizes.soak_jobs, "processes": 1, "concurrency": max(c, 1)}
    if workload == "growth":
        return "growth", {
            "kind": "noop",
            "jobs": sizes.growth_jobs,
            "single_jobs": 0,
            "history": int(figure),
            "processes": p,
            "concurrency": c,
        }
    return "drain", {
        "kind": "noop",
        "jobs": sizes.drain_jobs,
        "single_jobs": sizes.drain_single_jobs,
        "processes": p,
        "concurrency": c,
    }


def skip_reason(ctx: Context, st: SystemState, workload: str) -> str | None:
    if st.status != "ok":
        return st.reason or st.status
    if workload == "growth" and st.name not in config.GROWTH_SUPPORTED:
        return config.GROWTH_SKIP_REASON
    if workload == "soak" and st.name not in config.SOAK_SUPPORTED:
        return config.SOAK_SKIP_REASON
    return None


def one_run(ctx: Context, st: SystemState, workload: str, figure: str, rep: int) -> dict[str, Any]:
    command, params = workload_params(workload, figure, st.name, ctx.sizes)
    workdir = ctx.work_root / workload / f"{st.name}-{figure.replace('/', '')}-r{rep}"
    db = None
    try:
        db = fresh_database(ctx, st)
        url = services.with_dbname(ctx.pg.url, db) if db and ctx.pg else None
        if st.name == "celery":  # a clean broker for every run
            run_adapter(ctx, st, "install", base_params(ctx, None), workdir / "install", 120)
        load_before = os.getloadavg()[0]
        t0 = time.monotonic()
        result = run_adapter(ctx, st, command, dict(base_params(ctx, url), **params), workdir)
        result["elapsed_s"] = time.monotonic() - t0
        # the 1-minute load average around the run: other work on the machine shows here
        result["loadavg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    except RuntimeError as exc:
        result = {"ok": False, "error": str(exc)}
    finally:
        drop_database(ctx, st, db)
    result["params"] = params
    return result


def headline(workload: str, result: dict[str, Any]) -> str:
    if not result.get("ok"):
        return "ERROR " + str(result.get("error", ""))[:300]
    if workload == "soak":
        return (
            f"{result['jobs_per_s']:.0f} jobs/s  rss {result['rss_mb_at_10pct']:.1f} MB at 10% "
            f"-> {result['rss_mb_at_end']:.1f} MB at end ({result['handled']} jobs)"
        )
    if workload == "latency":
        return (
            f"p50 {result['p50_ms']:.1f} ms  p95 {result['p95_ms']:.1f} ms  "
            f"p99 {result['p99_ms']:.1f} ms  ({result['samples']} samples)"
        )
    text = f"{result['jobs_per_s']:.0f} jobs/s  rss {result['worker_peak_rss_mb']:.0f} MB"
    if result.get("enqueue_bulk_per_s"):
        text += f"  enqueue bulk {result['enqueue_bulk_per_s']:.0f}/s"
    if result.get("enqueue_one_per_call_per_s"):
        text += f"  one-per-call {result['enqueue_one_per_call_per_s']:.0f}/s"
    if not result.get("completed_in_time", True):
        text += "  (INCOMPLETE)"
    return text


def run_all(
    ctx: Context,
    workloads: list[str],
    repeat: int,
    on_result: Callable[[str, str, str, dict[str, Any]], None],
) -> None:
    for workload in workloads:
        for figure in figures(workload, ctx.sizes):
            for rep in range(repeat):
                for st in ctx.states.values():
                    reason = skip_reason(ctx, st, workload)
                    if reason:
                        if rep == 0:
                            on_result(
                                workload,
                                figure,
                                st.name,
                                {"ok": False, "skipped": True, "reason": reason},
                            )
                        continue
                    ctx.log(f"[{workload} {figure} rep {rep + 1}/{repeat}] {st.name} ...")
                    result = one_run(ctx, st, workload, figure, rep)
                    ctx.log(f"    {headline(workload, result)}")
                    on_result(workload, figure, st.name, result)
                    sys.stderr.flush()
