"""The `limits` scenario: limited queues under kill -9, SIGSTOP and PostgreSQL restarts.

The jobs go round-robin to the three queues CONVEYOR["QUEUES"] declares in
tests/faults/settings.py: one with `concurrency`, one with `key_concurrency`
1 and `fair` (its jobs spread over KEYS keys, every UNKEYED_EVERY-th without
a key), one with a `rate`. While the injectors strike, a sampler thread of
its own reads the running rows of those queues every SAMPLE_SECONDS, one
statement per sample (one snapshot), and counts every sample in which a
queue or a key holds more running rows than its limit. A row counts while
it is `running`, also after its lease expired until REAP takes it back: the
limit is on rows, not on processes. The rate is checked at the end, from
the jobs' `started_at` (the claim's clock under the queue row's lock): no
window of the rate's period may hold more starts than the rate allows.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import psycopg

from . import pg

KEYS = 6  # Concurrency keys of the keyed queue ("account:0" ... "account:5").
UNKEYED_EVERY = 8  # Every 8th job of the keyed queue has no key (the claim's unkeyed group).
SAMPLE_SECONDS = 0.005  # Pause between samples.
RECONNECT_SECONDS = 0.02  # Pause between connection attempts while the server is away.
MIN_SAMPLES_PER_SECOND = 10  # Fewer over the run and the run fails: the limit went unwatched.
MIN_SAMPLES = 100
EXAMPLES = 20  # Over-limit samples kept in the report (all are counted).

SAMPLE = """
SELECT queue, concurrency_key, count(*), array_agg(id ORDER BY id),
       array_agg(lease_owner ORDER BY id)
FROM conveyor_job
WHERE state = 'running' AND queue = ANY(%(queues)s::text[])
GROUP BY 1, 2
"""

QUEUE_ROWS = """
SELECT name, concurrency, key_concurrency, rate_count, rate_seconds, fair
FROM conveyor_queue WHERE name = ANY(%(queues)s::text[])
"""

STARTS = """
SELECT started_at FROM conveyor_job
WHERE queue = %(queue)s AND started_at IS NOT NULL ORDER BY started_at
"""

HEADLINE = ("limit_violations", "key_limit_violations", "rate_violations", "samples")


def declared() -> dict[str, Any]:
    """The scenario's queues and their limits, as the workers sync them (limits.Limits)."""
    from django_conveyor import limits

    from .settings import CONVEYOR

    return {
        name: limits.from_mapping(spec, where=name) for name, spec in CONVEYOR["QUEUES"].items()
    }


def enqueue(cur: Any, *, rng: Any, jobs: int, work: tuple[float, float],
            inside: tuple[float, float], attempts: int) -> None:  # fmt: skip
    """`jobs` fault effects, round-robin over the limited queues; keyed ones get keys."""
    from django_conveyor import protocol

    from .tasks import TASK_PATH

    queues = sorted(declared())
    keyed = keyed_queue()
    rows = []
    for n in range(jobs):
        queue, turn = queues[n % len(queues)], n // len(queues)
        key = f"account:{turn % KEYS}" if queue == keyed and turn % UNKEYED_EVERY else None
        rows.append(
            protocol.NewJob(
                task_path=TASK_PATH,
                args=[round(rng.uniform(*work), 3), round(rng.uniform(*inside), 3)],
                kwargs={},
                queue=queue,
                backend="default",
                priority=0,
                max_attempts=attempts,
                concurrency_key=key,
            )
        )
    protocol.enqueue(cur, rows, notify=True)


def keyed_queue() -> str:
    return next(name for name, spec in declared().items() if spec.key_concurrency is not None)


class Sampler(threading.Thread):
    """Reads the limited queues' running rows every few ms; rides out server restarts."""

    def __init__(self, port: int, stop: threading.Event) -> None:
        super().__init__(name="limits-sampler", daemon=True)
        self.port = port
        self.stop = stop
        self.limits = declared()
        self.samples = 0
        self.busy_samples = 0  # Samples in which some job of these queues was running.
        self.max_running: Counter[str] = Counter()
        self.max_running_per_key: dict[str, Counter[str]] = {q: Counter() for q in self.limits}
        self.at_limit: Counter[str] = Counter()  # Samples in which a queue was at its limit.
        self.limit_violations = 0  # Samples with a queue over its `concurrency`.
        self.key_limit_violations = 0  # (sample, key) pairs over `key_concurrency`.
        self.examples: list[dict[str, Any]] = []
        self.connections = 0  # Sessions opened: one, and one more after each restart.
        self.failed_connects = 0  # Connects refused and sessions cut: the server restarting.
        self.longest_gap_s = 0.0  # Between two samples, server restarts included.
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.sample_until_stopped()
        except BaseException as exc:  # Reported: a sampler that died proves nothing.
            self.error = exc

    def sample_until_stopped(self) -> None:
        queues = sorted(self.limits)
        last = time.monotonic()
        started = last
        while not self.stop.is_set():
            try:
                with pg.connect(self.port) as conn:
                    self.connections += 1
                    while not self.stop.is_set():
                        rows = conn.execute(SAMPLE, {"queues": queues}).fetchall()
                        now = time.monotonic()
                        self.longest_gap_s = max(self.longest_gap_s, now - last)
                        last = now
                        self.record(round(now - started, 3), rows)
                        time.sleep(SAMPLE_SECONDS)
            except psycopg.OperationalError:
                self.failed_connects += 1  # The server restarted: connect again.
                time.sleep(RECONNECT_SECONDS)

    def record(self, at: float, rows: list[tuple[Any, ...]]) -> None:
        self.samples += 1
        self.busy_samples += bool(rows)
        per_queue: Counter[str] = Counter()
        over: list[dict[str, Any]] = []
        for queue, key, count, ids, owners in rows:
            per_queue[queue] += count
            limit = self.limits[queue].key_concurrency
            if key is None:
                continue
            keys = self.max_running_per_key[queue]
            keys[key] = max(keys[key], count)
            if limit is not None and count > limit:
                self.key_limit_violations += 1
                over.append({"queue": queue, "key": key, "running": count, "limit": limit,
                             "jobs": ids, "owners": owners})  # fmt: skip
        for queue, count in per_queue.items():
            self.max_running[queue] = max(self.max_running[queue], count)
            limit = self.limits[queue].concurrency
            if limit is not None and count >= limit:
                self.at_limit[queue] += 1
            if limit is not None and count > limit:
                self.limit_violations += 1
                jobs = [i for q, _, _, ids, _ in rows if q == queue for i in ids]
                over.append({"queue": queue, "running": count, "limit": limit, "jobs": jobs})
        if over and len(self.examples) < EXAMPLES:
            self.examples.append({"at_s": at, "over": over})


def max_in_window(starts: list[Any], seconds: float) -> int:
    """The most of the sorted `starts` in any window of `seconds`.

    Half-open, [t, t + seconds), as the claim counts: a start logged at t is
    in the window of a claim stamped s when t > s - seconds.
    """
    period = timedelta(seconds=seconds)
    return max(
        (bisect.bisect_left(starts, t + period, lo=i) - i for i, t in enumerate(starts)),
        default=0,
    )


def check(conn: psycopg.Connection, sampler: Sampler, duration: float) -> dict[str, Any]:
    """The limits' figures: what the sampler saw, the queue rows, and the rate's windows."""
    limits = sampler.limits
    queues = sorted(limits)
    rows = {r[0]: r[1:] for r in conn.execute(QUEUE_ROWS, {"queues": queues}).fetchall()}
    as_declared = {}
    for name, spec in limits.items():
        cols = spec.columns()
        want = (cols["concurrency"], cols["key_concurrency"], cols["rate_count"],
                cols["rate_seconds"], cols["fair"])  # fmt: skip
        as_declared[name] = rows.get(name) == want
    rate: dict[str, Any] = {}
    rate_violations = 0
    for name, spec in limits.items():
        if spec.rate is None:
            continue
        starts = [r[0] for r in conn.execute(STARTS, {"queue": name}).fetchall()]
        most = max_in_window(starts, spec.rate.seconds)
        period = timedelta(seconds=spec.rate.seconds)
        over = sum(
            1
            for i in range(len(starts) - spec.rate.count)
            if starts[i + spec.rate.count] - starts[i] < period
        )
        rate_violations += over
        rate[name] = {
            "rate": str(spec.rate),
            "starts_counted": len(starts),
            "max_starts_in_a_period": most,
            "windows_over_the_rate": over,
            "first_to_last_start_s": round((starts[-1] - starts[0]).total_seconds(), 1)
            if starts
            else None,
        }
    needed = max(MIN_SAMPLES, int(MIN_SAMPLES_PER_SECOND * duration))
    return {
        "limit_violations": sampler.limit_violations,
        "key_limit_violations": sampler.key_limit_violations,
        "rate_violations": rate_violations,
        "samples": sampler.samples,
        "limits": {
            "queues": {name: spec.describe() for name, spec in sorted(limits.items())},
            "queue_rows_as_declared": as_declared,
            "samples_needed": needed,
            "samples_with_running_jobs": sampler.busy_samples,
            "samples_per_second": round(sampler.samples / duration, 1) if duration else None,
            "longest_gap_between_samples_s": round(sampler.longest_gap_s, 3),
            "sampler_reconnects": max(0, sampler.connections - 1),
            "sampler_failed_connects": sampler.failed_connects,
            "sampler_error": None if sampler.error is None else repr(sampler.error),
            "max_running": {q: sampler.max_running[q] for q in queues},
            "samples_at_the_limit": {
                q: sampler.at_limit[q] for q in queues if limits[q].concurrency is not None
            },
            "max_running_per_key": {
                q: dict(sorted(sampler.max_running_per_key[q].items()))
                for q in queues
                if limits[q].key_concurrency is not None
            },
            "rate": rate,
            "over_limit_samples": sampler.examples,
        },
    }


def failures(figures: dict[str, Any]) -> list[str]:
    failed = []
    details = figures["limits"]
    if details["sampler_error"] is not None:
        failed.append(f"The running-rows sampler failed: {details['sampler_error']}.")
    if figures["samples"] < details["samples_needed"]:
        failed.append(f"Only {figures['samples']} samples of the running rows were taken "
                      f"({details['samples_needed']} needed).")  # fmt: skip
    if figures["limit_violations"]:
        failed.append(f"{figures['limit_violations']} sample(s) saw a queue over its concurrency.")
    if figures["key_limit_violations"]:
        failed.append(f"{figures['key_limit_violations']} sample(s) saw a key over its "
                      "key_concurrency.")  # fmt: skip
    if figures["rate_violations"]:
        failed.append(f"{figures['rate_violations']} window(s) held more starts than the rate.")
    wrong = [name for name, ok in details["queue_rows_as_declared"].items() if not ok]
    if wrong:
        failed.append(f"conveyor_queue does not hold the declared limits of {', '.join(wrong)}.")
    return failed
