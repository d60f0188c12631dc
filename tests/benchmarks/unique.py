"""What unique jobs cost, and what they cost the jobs that do not use them.

    CONVEYOR_DATA_DIR=var/pg-3.12 .venv-3.12/bin/python tests/benchmarks/unique.py \
        [--base REF] [--rounds 3] [--calls 2000] [--drain 5000] [--bulk 50000] [--out DIR]

Runs on the suite's PostgreSQL (the embedded one unless DATABASE_URL is
set), each measurement in a scratch database of its own, one after another
within each round, so that a loaded machine slows every side alike:

- **Free when unused**: plain `task.enqueue()` calls (one per transaction,
  autocommit) and the drain of plain jobs by an in-process burst worker
  (concurrency 4), by the code of `--base` (default: the commit where this
  branch left main, taken with `git archive` into a temporary directory)
  and by this working tree, each in a process of its own importing its own
  tree, each with its own migrations.
- **Unique enqueue**: `add.using(unique=Unique())` calls, each with a new
  key, against plain `add` calls, in alternating blocks of `--block` calls
  (`--calls` of each in all), so both meet the same load (target: within
  15%).
- **Bulk**: `enqueue_many()` of `--bulk` unique calls with 10% duplicates
  (half of them of jobs already in the table, enqueued untimed first, half
  of earlier calls of the same batch), against `enqueue_many()` of
  `--bulk` plain calls, one after the other (target: within 1.5x).

Prints the per-round figures, the medians and the ratios, and writes
`unique-<date>.json` to --out when given. Figures depend on the machine and
its load: compare sides of one run, not runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DATABASE = "conveyor_unique_bench"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--base", default=None, help="git ref of the code before (default: merge base)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--block", type=int, default=100)
    ap.add_argument("--drain", type=int, default=5000)
    ap.add_argument("--bulk", type=int, default=50000)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--measure", choices=["plain", "unique"], help=argparse.SUPPRESS)
    return ap.parse_args()


# -- inside one measuring process ---------------------------------------------------------------


def setup(database: str) -> None:
    sys.path.insert(0, str(HERE))
    import scratch

    scratch.setup_django(database)
    scratch.recreate(database)
    import logging

    from django.core.management import call_command

    logging.getLogger("django.tasks").setLevel(logging.WARNING)  # As the drain benchmark does.
    call_command("migrate", verbosity=0)


def truncate() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE conveyor_job CASCADE")
        cursor.execute("VACUUM ANALYZE conveyor_job")


def timed_calls(call: Any, calls: int, first: int = 0, cpu: list[float] | None = None) -> float:
    """Microseconds per call, each call its own transaction (autocommit); the
    process's CPU microseconds per call (Python, not the server) go to `cpu`."""
    started, used = time.perf_counter(), time.process_time()
    for i in range(first, first + calls):
        call(i)
    if cpu is not None:
        cpu.append((time.process_time() - used) / calls * 1e6)
    return (time.perf_counter() - started) / calls * 1e6


def measure_plain(args: argparse.Namespace) -> dict[str, float]:
    """Enqueue and drain of jobs without `unique`, by whichever tree this process imports."""
    from django_conveyor.worker.config import WorkerOptions
    from django_conveyor.worker.loop import Worker
    from tests.testapp.tasks import add, noop

    truncate()
    cpu: list[float] = []
    enqueue_us = timed_calls(lambda i: add.enqueue(i, i), args.calls, cpu=cpu)
    truncate()
    for start in range(0, args.drain, 10_000):
        noop.enqueue_many([((), {}) for _ in range(min(10_000, args.drain - start))])
    started = time.perf_counter()
    worker = Worker(WorkerOptions(queues=("default",), concurrency=4, burst=True, listen=False,
                                  stop_signals=()))  # fmt: skip
    assert worker.run() == 0
    seconds = time.perf_counter() - started
    from django_conveyor.models import Job

    assert Job.objects.filter(state="completed").count() == args.drain
    return {
        "enqueue_us": enqueue_us,
        "enqueue_cpu_us": cpu[0],
        "drain_jobs_per_s": args.drain / seconds,
    }


def measure_unique(args: argparse.Namespace) -> dict[str, float]:
    """This tree only: unique against plain, one call at a time and in bulk."""
    from django_conveyor import Unique
    from tests.testapp.tasks import add

    unique = add.using(unique=Unique())
    figures: dict[str, float] = {}
    truncate()
    plain_us, unique_us, plain_cpu, unique_cpu = [], [], [], []
    for block in range(0, args.calls, args.block):
        plain_us.append(timed_calls(lambda i: add.enqueue(i, 0), args.block, block, plain_cpu))
        unique_us.append(timed_calls(lambda i: unique.enqueue(i, 0), args.block, block, unique_cpu))
    figures["single_plain_us"] = statistics.mean(plain_us)
    figures["single_unique_us"] = statistics.mean(unique_us)
    figures["single_plain_cpu_us"] = statistics.mean(plain_cpu)
    figures["single_unique_cpu_us"] = statistics.mean(unique_cpu)
    figures["single_block_ratio"] = statistics.median(
        u / p for u, p in zip(unique_us, plain_us, strict=True)
    )
    truncate()
    plain_calls = [((i, 0), {}) for i in range(args.bulk)]
    started = time.perf_counter()
    add.enqueue_many(plain_calls)
    figures["bulk_plain_s"] = time.perf_counter() - started
    truncate()
    held, again = args.bulk // 20, args.bulk // 20  # 5% of existing jobs, 5% within the batch.
    unique.enqueue_many([((i, 1), {}) for i in range(held)])  # Untimed: the existing jobs.
    fresh = args.bulk - held - again
    calls = [((i, 1), {}) for i in range(held)]  # Duplicates of jobs in the table.
    calls += [((i, 2), {}) for i in range(fresh)]
    calls += [((i, 2), {}) for i in range(again)]  # Duplicates of earlier calls of the batch.
    started = time.perf_counter()
    results = unique.enqueue_many(calls)
    figures["bulk_unique_s"] = time.perf_counter() - started
    assert sum(r.created for r in results) == fresh
    return figures


def measuring_process(args: argparse.Namespace) -> None:
    setup(os.environ["CONVEYOR_BENCH_DATABASE"])
    figures: dict[str, Any] = (
        measure_plain(args) if args.measure == "plain" else measure_unique(args)
    )
    import django_conveyor

    figures["package"] = str(Path(django_conveyor.__file__).parent)  # Which tree ran.
    print(json.dumps(figures))
    sys.path.insert(0, str(HERE))
    import scratch

    scratch.drop(os.environ["CONVEYOR_BENCH_DATABASE"])


# -- the parent ---------------------------------------------------------------------------------


def base_tree(ref: str | None, into: Path) -> tuple[str, Path]:
    """The code of `ref` (default: where this branch left main), as files in `into`."""
    if ref is None:
        ref = subprocess.run(["git", "merge-base", "HEAD", "main"], cwd=REPO, check=True,
                             capture_output=True, text=True).stdout.strip()  # fmt: skip
    archive = subprocess.run(["git", "archive", ref], cwd=REPO, check=True, capture_output=True)
    path = into / "tree.tar"
    path.write_bytes(archive.stdout)
    with tarfile.open(path) as tar:
        tar.extractall(into / "base", filter="data")
    return ref, into / "base"


def run(tree: Path, measure: str, args: argparse.Namespace, label: str) -> dict[str, float]:
    """One measuring process importing `tree` (its package, its tests, its migrations)."""
    command = [sys.executable, str(HERE / "unique.py"), "--measure", measure]
    command += ["--calls", str(args.calls), "--block", str(args.block)]
    command += ["--drain", str(args.drain), "--bulk", str(args.bulk)]
    # Every process uses this tree's PostgreSQL server, wherever it runs from.
    data_dir = Path(os.environ.get("CONVEYOR_DATA_DIR") or REPO / "var" / "pg-tests").resolve()
    env = {**os.environ, "PYTHONPATH": str(tree), "CONVEYOR_DATA_DIR": str(data_dir),
           "CONVEYOR_BENCH_DATABASE": f"{DATABASE}_{label}"}  # fmt: skip
    done = subprocess.run(command, cwd=tree, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> int:
    args = parse_args()
    if args.measure:
        measuring_process(args)
        return 0
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="conveyor-unique-bench-") as tmp:
        ref, before = base_tree(args.base, Path(tmp))
        for number in range(args.rounds):
            figures = {"load_before": load()}
            figures["before"] = run(before, "plain", args, "before")
            figures["after"] = run(REPO, "plain", args, "after")
            figures["unique"] = run(REPO, "unique", args, "unique")
            figures["load_after"] = load()
            rounds.append(figures)
            print(f"round {number + 1}: {json.dumps(figures)}", file=sys.stderr)

    def median(side: str, name: str) -> float:
        return statistics.median(r[side][name] for r in rounds)

    summary = {
        "plain_enqueue_us": {"before": median("before", "enqueue_us"),
                             "after": median("after", "enqueue_us")},
        "plain_enqueue_cpu_us": {"before": median("before", "enqueue_cpu_us"),
                                 "after": median("after", "enqueue_cpu_us")},
        "plain_drain_jobs_per_s": {"before": median("before", "drain_jobs_per_s"),
                                   "after": median("after", "drain_jobs_per_s")},
        "single_us": {"plain": median("unique", "single_plain_us"),
                      "unique": median("unique", "single_unique_us"),
                      "median_block_ratio": median("unique", "single_block_ratio"),
                      "plain_cpu": median("unique", "single_plain_cpu_us"),
                      "unique_cpu": median("unique", "single_unique_cpu_us")},
        "bulk_s": {"plain": median("unique", "bulk_plain_s"),
                   "unique": median("unique", "bulk_unique_s")},
    }  # fmt: skip
    summary["ratios"] = {
        "plain_enqueue_after_over_before": summary["plain_enqueue_us"]["after"]
        / summary["plain_enqueue_us"]["before"],
        "plain_drain_after_over_before": summary["plain_drain_jobs_per_s"]["after"]
        / summary["plain_drain_jobs_per_s"]["before"],
        "single_unique_over_plain": summary["single_us"]["unique"] / summary["single_us"]["plain"],
        "bulk_unique_over_plain": summary["bulk_s"]["unique"] / summary["bulk_s"]["plain"],
    }
    result = {
        "date": dt.date.today().isoformat(),
        "base": ref,
        "cpus": os.cpu_count(),
        "options": {k: getattr(args, k) for k in ("rounds", "calls", "block", "drain", "bulk")},
        "rounds": rounds,
        "summary": summary,
    }
    sys.path.insert(0, str(HERE))
    import scratch

    scratch.report(result, args.out, "unique")
    return 0


if __name__ == "__main__":
    sys.exit(main())
