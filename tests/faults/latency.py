"""The `latency` scenario: throughput and pickup latency of workers on other hosts.

Workers run on `--hosts` hosts (tests/faults/hosts.py) and reach the
database host through one relay each (tests/faults/proxy.py, on the
database's side of the link), which holds every chunk back by half the
added round trip in each direction. For each `--host-latency-ms` value, in
turn, on the same workers:

1. throughput: `--jobs` jobs are enqueued at once and drained; jobs per
   second from the first claim to the last completion (database clock);
2. pickup: `PICKUP_JOBS` jobs are enqueued one at a time, `PICKUP_GAP_SECONDS`
   apart, from the database host itself (so enqueue costs no added
   latency), on idle workers; pickup is `started_at - enqueued_at`, both
   the database's `now()`: the NOTIFY's way out, the claim's round trip.

`tc netem` would add the delay in the kernel; where it is unavailable (the
run probes it and records why) the relay is what adds it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from . import pg, verify

PICKUP_JOBS = 100
PICKUP_GAP_SECONDS = 0.1
PHASE_TIMEOUT_SECONDS = 600.0

THROUGHPUT = """
SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at))::float8
FROM conveyor_job WHERE id = ANY(%(ids)s) AND state = 'completed'
"""
PICKUP = """
SELECT extract(epoch FROM started_at - enqueued_at)::float8 * 1000
FROM conveyor_job WHERE id = ANY(%(ids)s) AND state = 'completed' AND attempt = 1
"""
LEFT = "SELECT count(*) FROM conveyor_job WHERE id = ANY(%(ids)s) AND state <> ALL(%(final)s)"


def measure(
    *,
    port: int,
    latencies_ms: Sequence[float],
    set_latency: Callable[[float], None],
    enqueue: Callable[[int], list[int]],
) -> tuple[list[dict[str, Any]], int]:
    """One entry per added round trip; also the number of jobs enqueued in all."""
    results, total = [], 0
    for rtt in latencies_ms:
        set_latency(rtt)
        batch = enqueue(0)  # Size 0: the run's --jobs.
        _wait_final(port, batch)
        with pg.connect(port) as conn:
            done, seconds = conn.execute(THROUGHPUT, {"ids": batch}).fetchone()  # type: ignore[misc]
        pickup_ids: list[int] = []
        for _ in range(PICKUP_JOBS):
            pickup_ids += enqueue(1)
            time.sleep(PICKUP_GAP_SECONDS)
        _wait_final(port, pickup_ids)
        with pg.connect(port) as conn:
            ms = sorted(r[0] for r in conn.execute(PICKUP, {"ids": pickup_ids}).fetchall())
        total += len(batch) + len(pickup_ids)
        results.append(
            {
                "added_round_trip_ms": rtt,
                "throughput_jobs": len(batch),
                "throughput_completed": done,
                "throughput_jobs_per_s": round(done / seconds, 1) if seconds else None,
                "pickup_jobs": len(ms),
                "pickup_ms": _percentiles(ms),
            }
        )
    return results, total


def _wait_final(port: int, ids: list[int]) -> None:
    deadline = time.monotonic() + PHASE_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        rows = pg.query(port, LEFT, {"ids": ids, "final": list(verify.FINAL_STATES)})
        if rows is not None and rows[0][0] == 0:
            return
        time.sleep(0.2)


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    cuts = (
        statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else values * 99
    )
    return {
        "p50": round(statistics.median(values), 1),
        "p95": round(cuts[94], 1),
        "p99": round(cuts[98], 1),
        "max": round(values[-1], 1),
    }


def relay_latency(rtt_ms: float) -> float:
    """The relay's hold per direction, in seconds, for an added round trip of rtt_ms."""
    return rtt_ms / 2000.0
