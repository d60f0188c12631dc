"""Benchmark django-conveyor against its peers on one machine and one PostgreSQL.

    python tests/benchmarks/run.py                        # full: every system and workload
    python tests/benchmarks/run.py --quick                # CI size, conveyor only
    python tests/benchmarks/run.py --systems conveyor --workloads drain \
        --processes 1 --setting concurrency=10 --jobs 50000 --repeat 3   # one figure, fast
    python tests/benchmarks/run.py --plot-only docs/results/bench-YYYY-MM-DD.json

Needs only the standard library: every system runs in its own virtualenv under
var/bench/venvs/<system> (created on first use, reused after), driven through
a small argv/stdout JSON protocol (see systems/bench_common.py).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import datetime as dt
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

from harness import config, envs, load, markdown, profile, report, runner, services  # noqa: E402

VAR = REPO / "var" / "bench"


def log(msg: str) -> None:
    stamp = dt.datetime.now().strftime("%H:%M:%S")
    print(f"{stamp} {msg}", file=sys.stderr, flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--systems",
        help="comma list (default: all; with --quick: conveyor). "
        f"Known: {', '.join(config.ALL_SYSTEMS)}",
    )
    ap.add_argument(
        "--workloads",
        default=",".join(config.DEFAULT_WORKLOADS),
        help=f"comma list of {','.join(config.ALL_WORKLOADS)} (profile only when named)",
    )
    ap.add_argument("--repeat", type=int, help="repetitions per figure (default 3; quick 1)")
    ap.add_argument("--quick", action="store_true", help="small counts for CI (about a minute)")
    ap.add_argument(
        "--setting",
        metavar="K=V,...",
        help="pin one setting instead of sweeping, e.g. concurrency=10,prefetch=auto "
        "(merged into each named system's default setting)",
    )
    ap.add_argument(
        "--processes",
        metavar="N,...",
        help="worker processes for the drain and the limit (default 1,2); the sustained "
        "run uses the last (default 2)",
    )
    ap.add_argument(
        "--figures",
        metavar="F,...",
        help="only these figures of each workload, e.g. ready-1e6,queues-100 (growth) "
        "or '1 process' (drain)",
    )
    ap.add_argument(
        "--jobs",
        type=int,
        help="jobs per drain, sweep, growth, limit, sustained and profile run (overrides the size)",
    )
    ap.add_argument(
        "--quiet",
        type=float,
        metavar="PCT",
        help="before each run, wait until other processes use less than PCT%% of the "
        "machine's CPU (default 10 in the full run, off with --quick)",
    )
    ap.add_argument(
        "--quiet-max-wait",
        type=float,
        default=120.0,
        metavar="S",
        help="give up waiting for quiet after S seconds and run (the load is recorded)",
    )
    ap.add_argument("--out", default=str(REPO / "docs" / "results"), help="results folder")
    ap.add_argument("--plot-only", metavar="FILE", help="redraw the PNG from a results JSON")
    ap.add_argument(
        "--tables-only",
        metavar="FILE",
        help="print (and write next to it) the Markdown tables of a results JSON",
    )
    ap.add_argument("--no-plot", action="store_true", help="skip the matplotlib plot")
    ap.add_argument(
        "--pg-port",
        type=int,
        default=55433,
        help="TCP port for the embedded PostgreSQL (ignored with DATABASE_URL)",
    )
    ap.add_argument("--redis-port", type=int, default=56380)
    ap.add_argument(
        "--no-install-redis",
        action="store_true",
        help="do not apt-get install redis-server when it is missing",
    )
    return ap.parse_args(argv)


def plot(results: Path, log_file: Path) -> Path | None:
    try:
        py = envs.ensure_venv(envs.specs(REPO)["_plot"], VAR / "venvs", REPO, log_file)
    except (subprocess.CalledProcessError, RuntimeError) as exc:
        log(f"plot skipped: cannot build the plotting venv ({exc}); see {log_file}")
        return None
    png = results.with_suffix(".png")
    out = subprocess.run(
        [str(py), str(HERE / "plot.py"), str(results), str(png)], capture_output=True, text=True
    )
    if out.returncode != 0:
        log(f"plot failed: {out.stderr.strip()[-500:]}")
        return None
    return png


def build_envs(names: list[str], log_file: Path) -> dict[str, runner.SystemState]:
    states: dict[str, runner.SystemState] = {}
    all_specs = envs.specs(REPO)
    for name in names:
        st = runner.SystemState(name)
        spec = all_specs[name]
        log(f"venv {name}: preparing (log: {log_file})")
        try:
            st.python = envs.ensure_venv(spec, VAR / "venvs", REPO, log_file)
            st.version = envs.dist_version(st.python, spec.dist)
        except (subprocess.CalledProcessError, RuntimeError, OSError) as exc:
            st.status, st.reason = "error", f"virtualenv/pip install failed: {exc}"
        states[name] = st
    return states


METHOD = (
    "Each handler appends (job seq, start, end) wall-clock marks to a per-process file. "
    "A drain's window runs from the first handler start to the start of the first poll "
    "of the system's own store (a separate connection, every 5 ms once 99% of the jobs "
    "ran) that shows every job acknowledged (Celery: its Redis queue and unacked hash "
    "empty and every handler run); throughput = jobs / window. Bulk loads are followed "
    "by ANALYZE. The drain sweeps each system's main knob once on smaller drains, then "
    "runs the best setting of each system and process count `repeat` times "
    "(django-conveyor's no-flags setting beside it, when another was best); "
    "repetitions interleave the systems and rotate their order. Latency = handler "
    "start - start of the producer's enqueue call. Each run uses a fresh database "
    "cloned from a template holding the system's schema. Before each run the 1-minute "
    "load average and the CPU share of processes not started by the benchmark (over "
    "1 s) are recorded, and that share again during the run."
)


def header(
    args: argparse.Namespace,
    sizes: config.Sizes,
    repeat: int,
    states: dict[str, runner.SystemState],
    pg: services.Postgres | None,
    redis_info: dict[str, Any],
) -> dict[str, Any]:
    pg_info: dict[str, Any] = {}
    py = next(
        (s.python for s in states.values() if s.python and config.USES_POSTGRES[s.name]), None
    )
    if pg is not None and py is not None:
        try:
            rows = services.run_sql(
                py,
                pg.url,
                "SELECT version()",
                "SELECT name, setting FROM pg_settings WHERE name IN ('shared_buffers',"
                " 'synchronous_commit', 'fsync', 'max_connections', 'work_mem',"
                " 'wal_level', 'checkpoint_timeout', 'max_wal_size', 'server_version')",
            )
            pg_info = {
                "version": rows[0][0][0] if rows[0] else None,
                "settings": dict(rows[1] or []),
            }
        except RuntimeError as exc:
            pg_info = {"error": str(exc)}
        pg_info["source"] = "DATABASE_URL" if pg.stopper is None else "django_conveyor.embedded"
    return {
        "schema": 2,
        "date": dt.date.today().isoformat(),
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": "python tests/benchmarks/run.py " + " ".join(sys.argv[1:]),
        "quick": args.quick,
        "repeat": repeat,
        "machine": report.machine_info(),
        "postgres": pg_info,
        "redis": redis_info,
        "sizes": sizes.as_json(),
        "settings_swept": {
            "drain": config.DRAIN_SWEEP,
            "latency": config.LATENCY_SWEEP,
            "limit_batches": config.LIMIT_BATCHES,
            "pinned": config.parse_setting(args.setting) if args.setting else None,
        },
        "relay_slots": config.RELAY_SLOTS,
        "method": METHOD,
        "systems": {
            n: {
                "status": s.status,
                "reason": s.reason or None,
                "version": s.version,
                "python": report.venv_python_version(s.python) if s.python else None,
                "adapter": f"tests/benchmarks/systems/{config.ADAPTERS[n]}",
            }
            for n, s in states.items()
        },
    }


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.tables_only:
        import json

        path = Path(args.tables_only)
        text = markdown.render(json.loads(path.read_text()))
        path.with_suffix(".md").write_text(text)
        sys.stdout.write(text)
        return 0
    if args.plot_only:
        png = plot(Path(args.plot_only), VAR / "plot-venv.log")
        if png:
            log(f"plot: {png}")
        return 0 if png else 1
    sizes = config.QUICK if args.quick else config.FULL
    if args.jobs:
        sizes = dataclasses.replace(
            sizes,
            drain_jobs=args.jobs,
            sweep_jobs=args.jobs,
            growth_jobs=args.jobs,
            limit_jobs=args.jobs,
            sustained_jobs=args.jobs,
            profile_jobs=args.jobs,
        )
    repeat = args.repeat or sizes.repeat
    processes = tuple(int(x) for x in args.processes.split(",")) if args.processes else None
    pinned = config.parse_setting(args.setting) if args.setting else None
    quiet = args.quiet if args.quiet is not None else (0.0 if args.quick else 10.0)
    default_systems = ["conveyor"] if args.quick else list(config.ALL_SYSTEMS)
    names = args.systems.split(",") if args.systems else default_systems
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = [n for n in names if n not in config.ALL_SYSTEMS] + [
        w for w in workloads if w not in config.ALL_WORKLOADS
    ]
    if unknown:
        log(f"unknown system/workload: {', '.join(unknown)}")
        return 2

    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    work_root = VAR / "runs" / stamp
    work_root.mkdir(parents=True, exist_ok=True)
    venv_log = work_root / "venvs.log"
    procs = services.Processes()
    pg: services.Postgres | None = None

    def shutdown() -> None:
        procs.cleanup()
        if pg is not None:
            pg.stop()

    def on_signal(signum: int, _frame: object) -> None:
        with contextlib.suppress(OSError):  # stderr may be a closed pipe by now
            log(f"signal {signum}: stopping every process this run started")
        raise SystemExit(128 + signum)

    atexit.register(shutdown)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    states = build_envs(names, venv_log)
    conveyor_py = states["conveyor"].python if "conveyor" in states else None
    if conveyor_py is None and any(config.USES_POSTGRES[n] for n in names):
        try:  # the embedded server comes from the package even when not benchmarked
            conveyor_py = envs.ensure_venv(
                envs.specs(REPO)["conveyor"], VAR / "venvs", REPO, venv_log
            )
        except (subprocess.CalledProcessError, RuntimeError, OSError):
            conveyor_py = None
    if any(config.USES_POSTGRES[n] for n in names):
        try:
            pg = services.Postgres.start(conveyor_py, VAR / "pgdata", args.pg_port)
            log(f"postgres: {pg.url}")
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            log(f"postgres unavailable: {exc}")
            for st in states.values():
                if config.USES_POSTGRES[st.name] and st.status == "pending":
                    st.status, st.reason = "error", f"PostgreSQL unavailable: {exc}"

    redis_url, redis_info = None, {}
    if "celery" in states and states["celery"].status == "pending":
        binary, why = services.find_redis(not args.no_install_redis, venv_log)
        if binary is None:
            states["celery"].status, states["celery"].reason = "skipped", why
            redis_info = {"skipped": why}
        else:
            try:
                services.start_redis(binary, args.redis_port, procs, work_root / "redis.log")
                redis_url = f"redis://127.0.0.1:{args.redis_port}/0"
                redis_info = {
                    "version": services.redis_version(binary),
                    "url": redis_url,
                    "persistence": "off",
                }
            except RuntimeError as exc:
                states["celery"].status, states["celery"].reason = "skipped", str(exc)
                redis_info = {"skipped": str(exc)}

    postmaster = load.postmaster_pid(pg.data_dir_any if pg else None)
    roots = {os.getpid()} | ({postmaster} if postmaster else set())
    ctx = runner.Context(
        HERE / "systems",
        work_root,
        sizes,
        procs,
        pg,
        redis_url,
        states,
        log,
        monitor=load.Monitor(roots, before_s=0.25 if args.quick else 1.0),
        explicit_systems=bool(args.systems),
        pinned=pinned,
        processes=processes,
        figures=tuple(args.figures.split(",")) if args.figures else None,
        quiet_pct=quiet,
        quiet_max_wait_s=args.quiet_max_wait,
    )
    if "profile" in workloads and "conveyor" in states:
        ctx.pyspy = profile.ensure_pyspy(REPO, VAR / "venvs", venv_log)
        ctx.profile_dir = REPO / "var" / "profile" / stamp
    for st in states.values():
        runner.prepare_system(ctx, st)
        if st.status != "ok":
            log(f"{st.name}: {st.status}: {st.reason}")

    out_dir = Path(args.out)
    name = f"bench-{'quick-' if args.quick else ''}{dt.date.today().isoformat()}.json"
    doc = report.Document(out_dir / name, header(args, sizes, repeat, states, pg, redis_info))
    doc.save()
    t0 = time.monotonic()

    def on_result(cell: runner.Cell, result: dict[str, Any]) -> None:
        if cell.workload == "profile" and result.get("ok"):
            result["breakdown"] = profile.summarize_run(result)
        doc.add(
            cell.workload, cell.figure, cell.system, cell.label, cell.setting, result, cell.phase
        )

    runner.run_all(ctx, workloads, repeat, on_result, doc.skip, doc.best_setting)
    doc.doc["finished_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    doc.doc["duration_s"] = round(time.monotonic() - t0, 1)
    doc.doc["best_settings"] = {f"{w}/{f}/{s}": v for (w, f, s), v in sorted(ctx.best.items())}
    doc.save()
    md = doc.path.with_suffix(".md")
    md.write_text(markdown.render(doc.doc))
    log(f"results: {doc.path} (tables: {md})")
    sys.stderr.write(md.read_text())
    if not args.no_plot:
        png = plot(doc.path, venv_log)
        if png:
            log(f"plot: {png}")
    failed = [
        f"{w}/{s}/{f}/{label}"
        for w, per in doc.doc["results"].items()
        for s, figures in per.items()
        for f, cell in figures.items()
        if isinstance(cell, dict)
        for group in ("sweep", "settings")
        for label, entry in cell.get(group, {}).items()
        if entry["summary"]["runs_failed"]
    ]
    broken = [n for n, s in states.items() if s.status == "error"]
    if failed or broken:
        log(f"failed: {', '.join(broken + failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
