"""`conveyor_worker --metrics-port`: scraped with prometheus_client's parser after known work."""

from __future__ import annotations

import json
import re
import socket
import sys
import urllib.request
from collections import Counter
from collections.abc import Iterator

import pytest
from django.core.management import CommandError, call_command

from django_conveyor import metrics
from django_conveyor.metrics.worker import STALE_REFUSED, WorkerMetrics
from django_conveyor.models import Job
from tests.helpers import REPO, run_burst, stop_process, wait_until
from tests.helpers import start_logged_worker as worker
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

Samples = Counter[tuple[str, tuple[tuple[str, str], ...]]]


def free_ports(n: int) -> int:
    """The first of `n` consecutive ports that are free on 127.0.0.1 now."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + n > 65535:
            continue
        try:
            for port in range(first, first + n):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first
    raise AssertionError("no free ports")


def scrape(port: int) -> Iterator[tuple[str, dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            yield sample.name, sample.labels, sample.value


def scrape_all(ports: range) -> Samples:
    """Every port's samples, added up per name and labels (as Prometheus's sum() would)."""
    total: Samples = Counter()
    for port in ports:
        for name, labels, value in scrape(port):
            total[(name, tuple(sorted(labels.items())))] += value
    return total


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum over every series of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= set(ls))


ADD = "tests.testapp.tasks.add"
FAILS = "tests.testapp.tasks.always_fails"
FLAKY = "tests.testapp.tasks.fails_then_succeeds"


@pytest.mark.slow
def test_two_processes_serve_their_metrics_after_known_work(procs, tmp_path):
    completed, dead = 4, 2
    for i in range(completed):
        tasks.add.enqueue(i, 1)
    for i in range(dead):
        tasks.always_fails.enqueue(f"boom {i}")  # 3 attempts: retried twice, then dead
    tasks.fails_then_succeeds.enqueue(1)  # retried once, then completed
    tasks.snooze_once.enqueue(0.05)  # snoozed once, then completed
    for _ in range(2):  # the second enqueue of the same key is a replay
        tasks.enqueues_child.enqueue("child-1")

    port = free_ports(2)
    ports = range(port, port + 2)
    proc = worker(
        procs, tmp_path, "metrics", "--processes", "2", "--concurrency", "2",
        "--metrics-port", str(port), "--metrics-address", "127.0.0.1",
    )  # fmt: skip
    wait_until(lambda: not Job.objects.exclude(state__in=["completed", "dead"]).exists(), 60)
    assert Job.objects.count() == completed + dead + 2 + 2 + 1  # + the child job

    expected_completed = completed + 1 + 1 + 2 + 1  # add, flaky, snooze, parents, child
    # The outcome is counted once its cycle commits, just after the row changed.
    samples = wait_until(
        lambda: (
            (s := scrape_all(ports))
            and total(s, "conveyor_jobs_processed_total", outcome="completed") == expected_completed
            and total(s, "conveyor_jobs_processed_total", outcome="dead") == dead
            and s
        )
    )
    processed = "conveyor_jobs_processed_total"
    added = total(samples, processed, queue="default", task=ADD, outcome="completed")
    assert added == completed + 1  # and the child
    assert total(samples, processed, task=FAILS, outcome="dead") == dead
    assert total(samples, processed, task=FAILS, outcome="retried") == 2 * dead
    assert total(samples, processed, task=FLAKY, outcome="retried") == 1
    assert total(samples, processed, task=FLAKY, outcome="completed") == 1
    assert total(samples, processed, outcome="snoozed") == 1
    assert total(samples, processed, outcome="failed") == 0
    assert total(samples, processed, outcome=STALE_REFUSED) == 0
    attempts = expected_completed + 3 * dead + 1 + 1
    assert total(samples, processed) == attempts
    # Every attempt ran its handler and was claimed once.
    assert total(samples, "conveyor_job_duration_seconds_count") == attempts
    assert total(samples, "conveyor_job_duration_seconds_sum") > 0
    assert total(samples, "conveyor_job_pickup_seconds_count") == attempts
    assert total(samples, "conveyor_job_duration_seconds_bucket", le="+Inf") == attempts
    # Handlers enqueue too: the parents' key made one job and one replay.
    assert total(samples, "conveyor_jobs_enqueued_total", task=ADD) == 1
    assert total(samples, "conveyor_jobs_enqueue_replays_total", task=ADD) == 1
    assert total(samples, "conveyor_leases_lost_total") == 0
    # Both processes serve, and with nothing left they hold nothing.
    for each in ports:
        names = {name for name, _, _ in scrape(each)}
        assert {"conveyor_worker_leases_held", "conveyor_worker_jobs_in_flight"} <= names
    # Set once per pass of the loop: an idle worker's next pass comes within its poll.
    wait_until(
        lambda: (
            (s := scrape_all(ports))
            and total(s, "conveyor_worker_leases_held") == 0
            and total(s, "conveyor_worker_jobs_in_flight") == 0
        )
    )
    assert stop_process(proc) == 0


def test_a_taken_port_is_refused_before_any_worker_starts():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=rf"127.0.0.1:{port}: .*Choose another"):
            call_command(
                "conveyor_worker", "--queues", "default", "--burst", "--metrics-port", str(port),
                "--metrics-address", "127.0.0.1",
            )  # fmt: skip
        # With --processes, every port of the range is checked.
        with pytest.raises(CommandError, match=rf"127.0.0.1:{port}: "):
            call_command(
                "conveyor_worker", "--queues", "default", "--burst", "--processes", "2",
                "--metrics-port", str(port - 1), "--metrics-address", "127.0.0.1",
            )  # fmt: skip


def test_ports_beyond_the_last_are_refused():
    with pytest.raises(CommandError, match="needs ports up to 65536"):
        call_command(
            "conveyor_worker", "--queues", "default", "--processes", "2", "--metrics-port", "65535"
        )


def test_a_missing_extra_is_named(monkeypatch):
    monkeypatch.delattr(metrics, "worker", raising=False)
    monkeypatch.setitem(sys.modules, "django_conveyor.metrics.worker", None)
    with pytest.raises(CommandError, match=r'pip install "django-conveyor\[metrics\]"'):
        call_command("conveyor_worker", "--queues", "default", "--burst", "--metrics-port", "9100")


def test_the_instrument_counts_an_in_process_worker():
    for i in range(3):
        tasks.add.enqueue(i, 1)
    tasks.discard_me.enqueue("no")
    instrument = WorkerMetrics()
    run_burst(queues=("default",), instrument=instrument)
    value = instrument.registry.get_sample_value
    labels = {"queue": "default", "task": ADD}
    assert value("conveyor_jobs_processed_total", {**labels, "outcome": "completed"}) == 3
    discard = {"queue": "default", "task": "tests.testapp.tasks.discard_me"}
    assert value("conveyor_jobs_processed_total", {**discard, "outcome": "failed"}) == 1
    assert value("conveyor_job_duration_seconds_count", labels) == 3
    assert value("conveyor_job_pickup_seconds_count", {"queue": "default"}) == 4
    assert value("conveyor_worker_leases_held") is not None  # set once per pass


def test_refused_outcomes_and_lost_leases_are_counted():
    instrument = WorkerMetrics()
    lease = type("L", (), {"queue": "default", "task_path": ADD})()
    instrument.outcome_refused("complete", lease)
    instrument.lease_lost(lease, "reaped")
    value = instrument.registry.get_sample_value
    labels = {"queue": "default", "task": ADD}
    assert value("conveyor_jobs_processed_total", {**labels, "outcome": STALE_REFUSED}) == 1
    assert value("conveyor_leases_lost_total", labels) == 1


def served_names() -> set[str]:
    """Every sample name the scrape view and a worker's port can serve."""
    from django_conveyor.metrics import process, scrape

    process.counters()  # made on first use
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    families = [
        *scrape.DatabaseCollector().collect(),
        *WorkerMetrics().registry.collect(),
        *process.REGISTRY.collect(),
    ]
    return {f.name + suffix for f in families for suffix in suffixes[f.type]}


@pytest.mark.django_db(transaction=True, databases=["default", "shard"])
def test_the_dashboard_uses_exactly_the_served_names():
    dashboard = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        for name in re.findall(r"conveyor_[a-z_]+", target["expr"])
    }
    served = served_names()
    assert used - served == set()
    worker = {f.name for f in WorkerMetrics().registry.collect()}
    # Every worker metric has a panel.
    assert {n for n in worker if not any(u.startswith(n) for u in used)} == set()


@pytest.mark.parametrize(
    ("value", "message"),
    [("0", "must be a TCP port, 1 to 65535, got 0"), ("http", "expected a port number")],
)
def test_a_bad_port_is_named(value, message):
    with pytest.raises(CommandError, match=f"argument --metrics-port: {message}"):
        call_command("conveyor_worker", "--metrics-port", value)
