"""What a job that uses no observability feature costs: enqueue and drain, two trees interleaved.

    CONVEYOR_DATA_DIR=var/pg-3.12 .venv-3.12/bin/python tests/benchmarks/observe_cost.py \
        BASE_TREE [--jobs 5000] [--rounds 3] [--out docs/results]

BASE_TREE is a checkout of the code to compare with (say `git archive main`
unpacked); this checkout is the other. Each round runs, for each tree in
turn (ABAB...), a child process importing that tree's django_conveyor on a
fresh scratch database: `--jobs` single `task.enqueue()` calls in autocommit
(plain jobs: no tags, meta, progress or logs), then an in-process burst
worker (concurrency 8) draining them. This checkout runs twice: with
`TRACING` off (as a site without the `[otel]` extra) and with it on while
opentelemetry-api is importable but no SDK is set up. Prints jobs/s per
run and the medians.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent.parent
DATABASE = "conveyor_observe_cost"
SHARD = "conveyor_observe_cost_shard"


def child(tree: Path, jobs: int) -> None:
    sys.path[:0] = [str(tree), str(tree / "tests" / "benchmarks")]
    import scratch

    scratch.setup_django(DATABASE, SHARD)
    from django.core.management import call_command

    scratch.recreate(DATABASE, SHARD)
    try:
        call_command("migrate", verbosity=0)
        call_command("migrate", database="shard", verbosity=0)
        import django_conveyor
        from django_conveyor.worker.config import WorkerOptions
        from django_conveyor.worker.loop import Worker
        from tests.testapp import tasks

        assert Path(django_conveyor.__file__).is_relative_to(tree), django_conveyor.__file__
        started = time.perf_counter()
        for i in range(jobs):
            tasks.add.enqueue(i, 1)
        enqueue = time.perf_counter() - started
        started = time.perf_counter()
        worker = Worker(WorkerOptions(queues=("default",), burst=True, listen=False,
                                      stop_signals=(), concurrency=8))  # fmt: skip
        assert worker.run() == 0
        drain = time.perf_counter() - started
        from django_conveyor.models import Job

        assert Job.objects.filter(state="completed").count() == jobs
    finally:
        scratch.drop(DATABASE, SHARD)
    print(json.dumps({"enqueue_per_s": jobs / enqueue, "drain_per_s": jobs / drain}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("base", type=Path)
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.jobs)
        return 0
    import os

    # "this" without tracing is what a site without the [otel] extra runs;
    # "this, otel api" has opentelemetry-api importable (no SDK: no-op spans).
    off = {"CONVEYOR_TEST_CONVEYOR_JSON": json.dumps({"TRACING": False})}
    trees = {
        "base": (args.base.resolve(), {}),
        "this": (REPO, off),
        "this, otel api": (REPO, {}),
    }
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for round_ in range(args.rounds):
        for name, (tree, env) in trees.items():
            out = subprocess.run(
                [sys.executable, str(HERE), str(tree), "--child", str(tree),
                 "--jobs", str(args.jobs)],
                cwd=tree, check=True, capture_output=True, text=True,
                env={**os.environ, **env},
            )  # fmt: skip
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(round_, name, runs[name][-1], flush=True)

    result = {
        "date": dt.date.today().isoformat(),
        "jobs": args.jobs,
        "runs": runs,
        "median": {
            name: {k: round(statistics.median(r[k] for r in rs), 1) for k in rs[0]}
            for name, rs in runs.items()
        },
        "machine": f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at end",
    }
    print(json.dumps(result["median"], indent=2))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"observe-cost-{result['date']}.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
