"""Where a bulk enqueue's time goes: `enqueue_many()` as shipped, and without each of its parts.

    CONVEYOR_DATA_DIR=var/pg-3.12 .venv-3.12/bin/python tests/benchmarks/bulk_parts.py \\
        [--jobs 50000] [--chunk 5000] [--rounds 3] [--out docs/results]

In one process, on Django's connection in autocommit, against a scratch
database `conveyor_bulk_parts` on the suite's PostgreSQL (the embedded one
unless DATABASE_URL is set). Each round enqueues `--jobs` jobs of
`tests.testapp.tasks.add` through `enqueue_many()` in calls of `--chunk`,
once per variant, one variant after another:

- shipped: as released (pieces of `protocol.ENQUEUE_PIECE` in a pipeline,
  the garbage collector paused);
- one statement: the whole call in one ENQUEUE (no pieces);
- collector on: Python's cyclic garbage collector left running;
- pieces of 500 and of 2,500.

Prints, per variant, jobs/s, wall and Python CPU microseconds per job, and
the garbage collector's collections and time per call (`gc.callbacks`);
writes `bulk-parts-<date>.json` to --out when given. The database is
dropped afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO))

import scratch  # noqa: E402  (beside this script)

DATABASE = "conveyor_bulk_parts"
SHARD = "conveyor_bulk_parts_shard"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=50_000)
    ap.add_argument("--chunk", type=int, default=5_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    return ap.parse_args()


class CollectorClock:
    """The garbage collector's collections and seconds, from its callbacks."""

    def __init__(self) -> None:
        self.collections, self.seconds, self._started = 0, 0.0, 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.collections += 1
            self.seconds += time.perf_counter() - self._started


def variants() -> dict[str, Callable[[], contextlib.AbstractContextManager[Any]]]:
    from django_conveyor import backend, protocol

    return {
        "shipped": contextlib.nullcontext,
        "one statement": lambda: mock.patch.object(protocol, "ENQUEUE_PIECE", 10**9),
        "collector on": lambda: mock.patch.object(
            backend, "collector_paused", contextlib.nullcontext
        ),
        "pieces of 500": lambda: mock.patch.object(protocol, "ENQUEUE_PIECE", 500),
        "pieces of 2,500": lambda: mock.patch.object(protocol, "ENQUEUE_PIECE", 2_500),
    }


def measure(jobs: int, chunk: int, rounds: int) -> dict[str, list[dict[str, float]]]:
    from tests.testapp.tasks import add

    clock = CollectorClock()
    results: dict[str, list[dict[str, float]]] = {}
    seq = 0
    for _ in range(rounds):
        for name, variant in variants().items():
            batches = []
            for _ in range(0, jobs, chunk):
                batches.append([((seq + i, i), {}) for i in range(chunk)])
                seq += chunk
            collections, collected = clock.collections, clock.seconds
            with variant():
                wall, cpu = time.perf_counter(), time.process_time()
                for calls in batches:
                    add.enqueue_many(calls)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            results.setdefault(name, []).append(
                {
                    "jobs_per_s": jobs / wall,
                    "wall_us_per_job": wall / jobs * 1e6,
                    "python_cpu_us_per_job": cpu / jobs * 1e6,
                    "collections_per_call": (clock.collections - collections) / len(batches),
                    "collector_ms_per_call": (clock.seconds - collected) / len(batches) * 1e3,
                }
            )
    return results


def main() -> int:
    args = parse_args()
    with scratch.migrated(DATABASE, SHARD):
        logging.getLogger("django.tasks").setLevel(logging.WARNING)  # as the drain benchmark
        results = measure(args.jobs, args.chunk, args.rounds)
    for name, runs in results.items():
        median = statistics.median(r["jobs_per_s"] for r in runs)
        shown = " / ".join(
            f"{r['jobs_per_s']:,.0f} ({r['python_cpu_us_per_job']:.1f} µs CPU, "
            f"{r['collections_per_call']:.0f} gc {r['collector_ms_per_call']:.1f} ms)"
            for r in runs
        )
        print(f"{name:16} median {median:,.0f}/s: {shown}", file=sys.stderr)
    scratch.report(
        {
            "date": dt.date.today().isoformat(),
            "jobs": args.jobs,
            "chunk": args.chunk,
            "rounds": args.rounds,
            "results": results,
        },
        args.out,
        "bulk-parts",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
