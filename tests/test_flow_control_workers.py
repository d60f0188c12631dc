"""Flow control with real worker processes: several processes, several keys, one sampler.

A sampler thread reads the running rows every few milliseconds (one
statement, one snapshot); each test fails if one sample is over a limit.
"""

import json
import threading
from collections import Counter

import pytest
from django.db.models import Count

from django_conveyor import limits
from django_conveyor.limits import Limits
from django_conveyor.models import Job, Queue
from django_conveyor.worker.connections import connect
from tests.helpers import start_worker, stop_process, wait_until
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


class Sampler(threading.Thread):
    """Running rows per (queue, key), sampled until stopped."""

    def __init__(self, queues: list[str]) -> None:
        super().__init__(daemon=True)
        self.queues = queues
        self.stopped = threading.Event()
        self.samples = 0
        self.max_queue: Counter[str] = Counter()
        self.max_key: Counter[tuple[str, str]] = Counter()
        self.max_keys_at_once = 0

    def run(self) -> None:
        with connect("default") as conn, conn.cursor() as cur:
            while not self.stopped.wait(0.003):
                cur.execute(
                    "SELECT queue, concurrency_key, count(*) FROM conveyor_job "
                    "WHERE state = 'running' AND queue = ANY(%s) GROUP BY 1, 2",
                    [self.queues],
                )
                per_queue: Counter[str] = Counter()
                keys = 0
                for queue, key, n in cur.fetchall():
                    per_queue[queue] += n
                    if key is not None:
                        keys += 1
                        self.max_key[queue, key] = max(self.max_key[queue, key], n)
                for queue, n in per_queue.items():
                    self.max_queue[queue] = max(self.max_queue[queue], n)
                self.max_keys_at_once = max(self.max_keys_at_once, keys)
                self.samples += 1

    def stop(self) -> None:
        self.stopped.set()
        self.join(10)


def workers(
    procs, tmp_path, count: int, queues: str, conveyor: dict | None = None, slots: int = 4
) -> list:
    env = {"CONVEYOR_TEST_CONVEYOR_JSON": json.dumps(conveyor)} if conveyor else None
    for i in range(count):
        proc = start_worker(
            "--queues", queues, "--concurrency", str(slots), log=tmp_path / f"w{i}.log", env=env
        )
        procs.append(proc)
    return procs


def final(queue: str) -> dict[str, int]:
    return dict(Job.objects.filter(queue=queue).values_list("state").annotate(n=Count("id")))


def test_a_declared_concurrency_holds_across_three_processes(procs, tmp_path):
    """CONVEYOR["QUEUES"] synced at start: 3 processes of 2 slots, at most 3 running.

    No process can run 3 alone, so a sample at 3 counts jobs of two processes.
    """
    slow = tasks.sleeper.using(queue_name="slow")
    slow.enqueue_many([((0.25,), {}) for _ in range(36)])
    sampler = Sampler(["slow"])
    sampler.start()
    workers(procs, tmp_path, 3, "slow", {"QUEUES": {"slow": {"concurrency": 3}}}, slots=2)
    try:
        wait_until(lambda: final("slow") == {"completed": 36}, timeout=90)
    finally:
        sampler.stop()
    assert sampler.max_queue["slow"] == 3  # Held, and reached: the limit bound the drain.
    assert sampler.samples > 100
    assert Queue.objects.get(name="slow").concurrency == 3
    owners = set(Job.objects.filter(queue="slow").values_list("lease_owner", flat=True))
    assert len({owner.split(":")[1] for owner in owners}) > 1  # More than one process ran jobs.
    for proc in procs:
        assert stop_process(proc) == 0


def test_key_concurrency_one_is_serial_per_key_and_parallel_across_keys(procs, tmp_path):
    """Four keys at most one running each, set at run time, while three processes drain."""
    limits.set_limits("emails", Limits(key_concurrency=1, fair=True), actor="test")
    for key in ("a", "b", "c", "d"):
        keyed = tasks.sleeper.using(queue_name="emails", concurrency_key=f"account:{key}")
        keyed.enqueue_many([((0.1,), {}) for _ in range(10)])
    sampler = Sampler(["emails"])
    sampler.start()
    workers(procs, tmp_path, 3, "emails")
    try:
        wait_until(lambda: final("emails") == {"completed": 40}, timeout=90)
    finally:
        sampler.stop()
    assert max(sampler.max_key.values()) == 1, sampler.max_key
    assert len(sampler.max_key) == 4
    assert sampler.max_keys_at_once > 1  # Keys ran side by side.
    assert sampler.samples > 100
    for proc in procs:
        assert stop_process(proc) == 0


def test_limits_set_while_workers_run_take_hold(procs, tmp_path):
    """A queue without limits, then a concurrency of 2 set from outside: the workers obey."""
    slow = tasks.sleeper.using(queue_name="slow")
    workers(procs, tmp_path, 2, "slow")
    slow.enqueue_many([((0.05,), {}) for _ in range(8)])
    wait_until(lambda: final("slow") == {"completed": 8}, timeout=60)
    limits.set_limits("slow", Limits(concurrency=2), actor="test")
    sampler = Sampler(["slow"])
    sampler.start()
    slow.enqueue_many([((0.2,), {}) for _ in range(20)])
    try:
        wait_until(lambda: final("slow") == {"completed": 28}, timeout=90)
    finally:
        sampler.stop()
    assert sampler.max_queue["slow"] == 2
    for proc in procs:
        assert stop_process(proc) == 0


def test_a_burst_worker_drains_a_rate_limited_queue_at_its_rate(procs, tmp_path):
    """12 jobs at 5/s: a burst worker waits for the window instead of exiting early."""
    tasks.add.using(queue_name="slow").enqueue_many([((i, i), {}) for i in range(12)])
    proc = start_worker(
        "--queues", "slow", "--burst", log=tmp_path / "burst.log",
        env={"CONVEYOR_TEST_CONVEYOR_JSON": json.dumps({"QUEUES": {"slow": {"rate": "5/s"}}})},
    )  # fmt: skip
    procs.append(proc)
    assert proc.wait(60) == 0, (tmp_path / "burst.log").read_text()[-2000:]
    assert final("slow") == {"completed": 12}
    starts = sorted(Job.objects.filter(queue="slow").values_list("started_at", flat=True))
    assert (starts[-1] - starts[0]).total_seconds() >= 2.0  # 12 starts at 5/s: three windows.
    for i in range(len(starts) - 5):
        assert (starts[i + 5] - starts[i]).total_seconds() >= 1.0  # No 6 in one second.
