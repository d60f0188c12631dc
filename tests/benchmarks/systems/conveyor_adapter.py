"""django-conveyor's adapter, plus the workloads that exist for it alone.

- growth: the drain with 10^6 finished or ready rows in the table, with 8
  worker processes, and over 100 queues;
- limit: what PostgreSQL alone needs for the CLAIM and COMPLETE statements of
  `django_conveyor/protocol.py`, driven by a tight psycopg loop (pipeline
  mode, no worker Python), one connection per "process";
- profile: a long drain by one worker process with py-spy attached.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bench_common
import cpu_window
import limit_cycle
from bench_common import Run, stop, tail, timed
from djsystems import DjangoAdapter

TABLE = "conveyor_job"
BACKLOG_QUEUE = "backlog"  # rows of the growth workload that no worker serves
READY_SEQ_FROM = 0


def worker_queues(setting: dict[str, Any]) -> list[str]:
    """The queues a worker serves: a list, or `a+b` from `--setting queues=default+emails`."""
    queues = setting.get("queues") or ["default"]
    return queues.split("+") if isinstance(queues, str) else list(queues)


class ConveyorAdapter(DjangoAdapter):
    name = "conveyor"
    main_table = TABLE
    finished_sql = f"SELECT count(*) FROM {TABLE} WHERE state = 'completed'"
    pending_sql = f"SELECT count(*) FROM {TABLE} WHERE state IN ('available', 'running')"
    bulk_description = "task.enqueue_many(calls)"

    def __init__(self, params: dict[str, Any]) -> None:
        super().__init__(params)
        self.workloads = {
            "growth": workload_growth,
            "features": workload_features,
            "limit": workload_limit,
            "profile": workload_profile,
        }

    def enqueue_bulk(self, kind: str, seqs: Sequence[int], queue: str | None = None) -> None:
        task = self.task(kind)
        if queue:
            task = task.using(queue_name=queue)
        task.enqueue_many([((seq,), {}) for seq in seqs])

    def limits(self, queue: str) -> dict[str, Any]:
        """The limits the workers synced for `queue` (conveyor_queue), as stored."""
        rows = self.sql(
            "SELECT concurrency, rate_count, rate_seconds, key_concurrency, fair"
            " FROM conveyor_queue WHERE name = %s",
            [queue],
        )
        if not rows:
            return {}
        names = ("concurrency", "rate_count", "rate_seconds", "key_concurrency", "fair")
        return {k: v for k, v in zip(names, rows[0], strict=True) if v not in (None, False)}

    def pending_in(self, queues: Sequence[str]) -> int:
        rows = self.sql(self.pending_sql + " AND queue = ANY(%s)", [list(queues)])
        return int(rows[0][0])

    def worker_argvs(
        self, kind: str, processes: int, setting: dict[str, Any], burst: bool
    ) -> list[list[str]]:
        queues = worker_queues(setting)
        argv = self.manage(
            "conveyor_worker",
            "--queues",
            ",".join(queues),
            "--concurrency",
            str(setting.get("concurrency", 10)),
            "--processes",
            str(processes),
        )
        if setting.get("prefetch") is not None:
            argv += ["--prefetch", str(setting["prefetch"])]
        return [argv + (["--burst"] if burst else [])]

    def knobs(self, kind: str, processes: int, setting: dict[str, Any]) -> dict[str, Any]:
        prefetch = setting.get("prefetch")
        return {
            "command": "conveyor_worker",
            "processes": processes,
            "concurrency": setting.get("concurrency", 10),
            "prefetch": "adaptive (default)" if prefetch is None else prefetch,
            "queues": len(worker_queues(setting)),
            "wakeup": "LISTEN/NOTIFY + polling (package defaults)",
            "django.tasks logger": "WARNING",
        }

    def insert_rows(self, n: int, state: str, queue: str, seq_from: int = 0) -> None:
        """Clone one enqueued job n times as `state` rows on `queue`, older than now.

        Every column is copied from a real enqueued row (so columns added by
        later migrations get their defaults), with the state and its
        timestamps overridden. Ready rows get run_after an hour back, so they
        come first in claim order.
        """
        self.task("noop").enqueue(-1)
        template_id = _max_id(self)
        finished = state == "completed"
        overrides = {
            "state": "%(state)s",
            "queue": "%(queue)s",
            "args": "jsonb_build_array(g)",
            "attempt": "1" if finished else "0",
            "idempotency_key": "NULL",
            "lease_owner": "NULL",
            "lease_expires_at": "NULL",
            "run_after": "now() - interval '1 hour'",
            "enqueued_at": "now() - interval '1 hour'",
            "started_at": "now()" if finished else "NULL",
            "finished_at": "now()" if finished else "NULL",
        }
        names = [
            r[0]
            for r in self.sql(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_name = %s AND column_name <> 'id' ORDER BY ordinal_position",
                [TABLE],
            )
        ]
        values = [overrides.get(name, f"t.{name}") for name in names]
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute(
                f"INSERT INTO {TABLE} ({', '.join(names)})"
                f" SELECT {', '.join(values)} FROM {TABLE} t,"
                " generate_series(%(lo)s, %(hi)s) AS g WHERE t.id = %(id)s",
                {
                    "state": state,
                    "queue": queue,
                    "lo": seq_from,
                    "hi": seq_from + n - 1,
                    "id": template_id,
                },
            )
            cur.execute(f"DELETE FROM {TABLE} WHERE id = %s", [template_id])


def _max_id(a: ConveyorAdapter) -> int:
    return int(a.sql(f"SELECT coalesce(max(id), 0) FROM {TABLE}")[0][0])


def workload_growth(run: Run) -> dict[str, Any]:
    """The drain under one growth condition; the figure is jobs/s as for the drain."""
    p = run.params
    a: ConveyorAdapter = run.adapter  # type: ignore[assignment]
    figure, n, rows = p["figure"], int(p["jobs"]), int(p["rows"])
    processes = run.processes
    setting = dict(run.setting)
    prefill_s = 0.0
    burst = True
    acknowledged = None
    if figure == "finished-1e6":
        prefill_s = timed(lambda: a.insert_rows(rows, "completed", "default", seq_from=-rows - 10))
        a.sql(f"VACUUM ANALYZE {TABLE}")  # what autovacuum would have done by now
        run.load(n)
    elif figure == "ready-1e6":
        # n of the 10^6 ready rows are drained; the rest stay ready throughout
        prefill_s = timed(lambda: a.insert_rows(rows, "available", "default", READY_SEQ_FROM))
        burst = False
        since = _max_id(a) - rows

        def acknowledged() -> bool:
            done = a.sql(
                f"SELECT count(*) FROM {TABLE} WHERE state = 'completed' AND id > %s", [since]
            )
            return int(done[0][0]) >= n

    elif figure == "ready-other-queue-1e6":
        # ready rows of a queue this worker does not serve, ahead in claim order
        prefill_s = timed(
            lambda: a.insert_rows(rows, "available", BACKLOG_QUEUE, seq_from=-rows - 10)
        )
        run.load(n)

        def acknowledged() -> bool:
            return a.pending_in(["default"]) <= 0

    elif figure == "processes-8":
        processes = int(p["growth_processes"])
        run.load(n)
    elif figure == "queues-100":
        queues = [f"q{i}" for i in range(int(p["growth_queues"]))]
        setting["queues"] = queues
        per = n // len(queues)
        for i, queue in enumerate(queues):
            a.enqueue_bulk("noop", list(range(i * per, (i + 1) * per)), queue=queue)
        n = per * len(queues)
    else:  # base
        run.load(n)
    a.analyze()
    started = time.time()
    procs = run.start_workers(burst=burst, processes=processes, setting=setting)
    out = run.drain(
        n,
        procs,
        float(p.get("timeout", 1800)),
        acknowledged,
        started=started,
        first_n=figure == "ready-1e6",  # the first n of the 10^6 ready rows
        burst=burst,
    )
    out.update(
        {
            "figure": figure,
            "rows_in_table_first": rows if figure.endswith("1e6") else 0,
            "prefill_s": prefill_s,
            "knobs": a.knobs("noop", processes, setting),
        }
    )
    return out


# ---------------------------------------------------------------- features

# Features figure -> the queue drained (djproject/settings.py declares its
# limit) and how many concurrency keys its jobs spread over.
FEATURE_QUEUES = {
    "no limit": ("default", 0),
    "concurrency": ("limit-concurrency", 0),
    "rate": ("limit-rate", 0),
    "key_concurrency": ("limit-keys", 1000),
    "fair": ("limit-fair", 1000),
}


def workload_features(run: Run) -> dict[str, Any]:
    """What flow control and unique jobs cost: a drain, or unique enqueue beside plain."""
    p = run.params
    if p["figure"] == "unique enqueue":
        return _unique_enqueue(run)
    a: ConveyorAdapter = run.adapter  # type: ignore[assignment]
    queue, keys = FEATURE_QUEUES[p["figure"]]
    n, chunk = int(p["jobs"]), int(p.get("bulk_chunk", 5000))
    task = a.task("noop").using(queue_name=queue)
    calls = [
        ((seq,), {}, {"concurrency_key": f"k{seq % keys}"} if keys else None) for seq in range(n)
    ]
    for i in range(0, n, chunk):
        task.enqueue_many(calls[i : i + chunk])
    a.analyze()
    setting = {**run.setting, "queues": [queue]}
    started = time.time()
    # Not --burst: a worker that finds no room under a limit and holds nothing exits.
    procs = run.start_workers(burst=False, setting=setting)
    out = run.drain(n, procs, float(p.get("timeout", 1800)), started=started, burst=False)
    out.update(
        {
            "figure": p["figure"],
            "queue": queue,
            "concurrency_keys": keys,
            "knobs": {**a.knobs("noop", run.processes, setting), "limits": a.limits(queue)},
        }
    )
    return out


def _unique_enqueue(run: Run) -> dict[str, Any]:
    """Calls with unique=Unique() (a new key each) against plain calls, in alternating
    blocks; then enqueue_many() of unique calls, 10% of them repeating the call
    before (folded into its job), against enqueue_many() of plain calls."""
    from django_conveyor import Unique

    p = run.params
    a: ConveyorAdapter = run.adapter  # type: ignore[assignment]
    n, bulk_n, chunk = int(p["single"]), int(p["bulk"]), int(p.get("bulk_chunk", 5000))
    plain = a.task("noop")
    unique = plain.using(unique=Unique())
    for warm in range(-20, 0):
        plain.enqueue(warm)
        unique.enqueue(warm - 100)
    took = {"plain": 0.0, "unique": 0.0}
    blocks, seq = 4, 0
    for _ in range(blocks):
        for name, task in (("plain", plain), ("unique", unique)):
            for _ in range(max(1, n // blocks)):
                t0 = time.perf_counter()
                task.enqueue(seq)
                took[name] += time.perf_counter() - t0
                seq += 1
    single = max(1, n // blocks) * blocks
    seq += 1_000_000
    bulk_seqs = [seq + i - (i % 10 == 9) for i in range(bulk_n)]  # every tenth repeats
    bulk = {}
    for name, task in (("plain", plain), ("unique", unique)):
        t0 = time.perf_counter()
        for i in range(0, bulk_n, chunk):
            task.enqueue_many([((s,), {}) for s in bulk_seqs[i : i + chunk]])
        bulk[name] = bulk_n / (time.perf_counter() - t0)
        bulk_seqs = [s + 10 * bulk_n for s in bulk_seqs]
    single_plain, single_unique = single / took["plain"], single / took["unique"]
    return {
        "figure": "unique enqueue",
        "single_plain_per_s": single_plain,
        "single_unique_per_s": single_unique,
        "single_unique_over_plain": single_unique / single_plain,
        "bulk_plain_per_s": bulk["plain"],
        "bulk_unique_per_s": bulk["unique"],
        "bulk_unique_over_plain": bulk["unique"] / bulk["plain"],
        "single_calls": single,
        "bulk_calls": bulk_n,
        "bulk_duplicates": sum(1 for i in range(bulk_n) if i % 10 == 9),
        "knobs": {
            "single": "task.enqueue() per call, autocommit, blocks of plain and unique calls",
            "unique": "task.using(unique=Unique()): key from task, arguments and queue",
            "bulk": f"enqueue_many() in calls of {chunk}; unique: every tenth call repeats "
            "the one before",
        },
    }


# ---------------------------------------------------------------- physical limit


# A diagnostic variant, not the shipped SQL: CLAIM's queue filter as it was
# before issue 15, per row (`queue <> ALL(ARRAY(...))`, and no lone-queue
# constant for the queue-led index), which makes the planner estimate one
# matching row and sort every ready row per claim. The limit workload
# measures both, so the table shows what the shipped filter buys. The
# shipped filter (paused and limited queues taken out of the worker's list
# once, before the scan) is found by its two ends, as its middle changes.
SHIPPED_FILTER = re.compile(
    r"AND queue = ANY\(ARRAY\(.*?OR queue = \(%\(queues\)s::text\[\]\)\[1\]\)", re.DOTALL
)
PER_ROW_FILTER = (
    "AND queue = ANY(%(queues)s)"
    " AND queue <> ALL(ARRAY(SELECT name FROM conveyor_queue WHERE paused))"
)


def claim_sql(protocol: Any, variant: str) -> str:
    if variant == "protocol":
        return protocol.CLAIM
    edited, found = SHIPPED_FILTER.subn(lambda _: PER_ROW_FILTER, protocol.CLAIM, count=1)
    if not found:
        raise RuntimeError(
            "protocol.CLAIM no longer has the paused-queue filter this variant edits"
        )
    return edited


def _limit_process(
    url: str, batch: int, pipeline: bool, barrier: Any, results: Any, claim: str, protocol: Any
) -> None:
    conn = limit_cycle.connect(url)
    barrier.wait()
    cycles = limit_cycle.run_cycles(
        conn,
        limit_cycle.shipped(protocol, claim),
        owner=f"limit:{os.getpid()}",
        batch=batch,
        pipeline=pipeline,
    )
    results.put(cycles)
    conn.close()


def workload_limit(run: Run) -> dict[str, Any]:
    """CLAIM + COMPLETE of n jobs, batch by batch, in one transaction per cycle."""
    from django.db import connections

    from django_conveyor import protocol

    p = run.params
    a: ConveyorAdapter = run.adapter  # type: ignore[assignment]
    n = int(p["jobs"])
    batch = int(run.setting.get("batch", 50))
    pipeline = bool(run.setting.get("pipeline", True))
    variant = str(run.setting.get("claim", "protocol"))
    claim = claim_sql(protocol, variant)
    run.load(n)
    a.analyze()
    connections.close_all()  # never share a connection across fork
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(run.processes + 1)
    results = ctx.SimpleQueue()
    procs = [
        ctx.Process(
            target=_limit_process,
            args=(a.database_url, batch, pipeline, barrier, results, claim, protocol),
        )
        for _ in range(run.processes)
    ]
    for proc in procs:
        proc.start()
    barrier.wait(timeout=120)
    t0 = time.time()
    for proc in procs:
        proc.join(timeout=float(p.get("timeout", 900)))
    t1 = time.time()
    cycles = sum(results.get() for proc in procs if proc.exitcode == 0)
    finished = a.count_finished()
    if finished != n:
        raise RuntimeError(f"physical limit: {finished} of {n} jobs completed")
    return {
        "jobs_per_s": n / (t1 - t0),
        "window_s": t1 - t0,
        "handled": finished,
        "cycles": cycles,
        "knobs": {
            "statements": "protocol.CLAIM then protocol.COMPLETE of the previous batch, "
            "one transaction per cycle",
            "processes": run.processes,
            "batch": batch,
            "pipeline": pipeline,
            "claim_sql": "protocol.CLAIM as shipped"
            if variant == "protocol"
            else "diagnostic: the per-row paused filter of before issue 15 (not the shipped SQL)",
            "round_trips_per_cycle": 1 if pipeline else 4,
            "driver": "psycopg, jsonb/timestamptz left as text",
        },
    }


# ---------------------------------------------------------------- profile


def workload_profile(run: Run) -> dict[str, Any]:
    """One worker process drains n jobs: CPU per job from 5% to 35%, py-spy from 40% to 95%."""
    p = run.params
    a: ConveyorAdapter = run.adapter  # type: ignore[assignment]
    n = int(p["jobs"])
    pyspy, rate = p["pyspy"], int(p.get("rate", 200))
    out_dir = p["profile_dir"]
    os.makedirs(out_dir, exist_ok=True)
    run.load(n)
    a.analyze()
    procs = run.start_workers(burst=True, processes=1)
    pid = procs[0].pid  # --processes 1 runs the worker in the command's process
    files = {
        "gil": os.path.join(out_dir, "conveyor-worker-gil.txt"),
        "wall": os.path.join(out_dir, "conveyor-worker-wall.txt"),
    }
    commands = {
        # only the thread holding the GIL: where the process's Python time goes
        "gil": [pyspy, "record", "--pid", str(pid), "--rate", str(rate), "--gil",
                "--nonblocking", "--threads", "--format", "raw", "--output", files["gil"]],
        # every thread, waiting included: where each thread's wall time goes
        "wall": [pyspy, "record", "--pid", str(pid), "--rate", str(max(rate // 2, 50)),
                 "--idle", "--nonblocking", "--threads", "--format", "raw",
                 "--output", files["wall"]],
    }  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while run.reader.count() < n * 0.05:
            if time.monotonic() > deadline or procs[0].poll() is not None:
                raise RuntimeError(f"worker did not start draining: {tail(run.log)}")
            time.sleep(0.02)
        # Unprofiled first (5% to 35%): CPU time of the worker and the server per job.
        cpu0, k0, s0 = cpu_window.snapshot(a.sql, pid), run.reader.count(), time.time()
        while run.reader.count() < n * 0.35 and procs[0].poll() is None:
            time.sleep(0.02)
        cpu1, k1, s1 = cpu_window.snapshot(a.sql, pid), run.reader.count(), time.time()
        cpu = cpu_window.per_job(cpu0, cpu1, k1 - k0, s1 - s0)
        while run.reader.count() < n * 0.4 and procs[0].poll() is None:
            time.sleep(0.02)
        spies = {}
        for key, cmd in commands.items():
            with open(files[key] + ".log", "w") as err:
                spies[key] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        time.sleep(0.5)  # py-spy attaches
        c0, t0 = run.reader.count(), time.time()
        while run.reader.count() < n * 0.95 and procs[0].poll() is None:
            time.sleep(0.02)
        c1, t1 = run.reader.count(), time.time()
        for spy in spies.values():
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
        for spy in spies.values():
            spy.wait(timeout=60)
        out = run.drain(n, procs, 600)
    finally:
        stop(procs)
    missing = [f for f in files.values() if not os.path.exists(f)]
    if missing:
        raise RuntimeError(f"py-spy wrote no profile: {tail(Path(missing[0] + '.log'))}")
    out.update(
        {
            "profiled_jobs": c1 - c0,
            "profiled_s": t1 - t0,
            "profiled_jobs_per_s": (c1 - c0) / (t1 - t0),
            "unprofiled": {**cpu, "jobs_per_s": (k1 - k0) / (s1 - s0)},
            "rate_hz": {"gil": rate, "wall": max(rate // 2, 50)},
            "files": files,
            "commands": {k: " ".join(v) for k, v in commands.items()},
            "knobs": run.knobs(),
        }
    )
    return out


if __name__ == "__main__":
    bench_common.main(ConveyorAdapter)
