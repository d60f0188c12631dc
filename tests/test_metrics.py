"""The scrape view, parsed with prometheus_client's own parser after known work."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from django_conveyor import queue_counts
from django_conveyor.api import keys
from django_conveyor.models import Job
from tests.factories import JobFactory
from tests.helpers import run_burst, wait_until
from tests.testapp.tasks import add, always_fails, send_email

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "shard"])

METRICS = "/conveyor/metrics"


def scrape(client, **extra) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get(METRICS, **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def metrics_key() -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {keys.create('prometheus', ['metrics'])[1]}"}


def value(samples, name, **labels) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_gauges_after_known_work(client):
    completed, dead = 4, 2
    for i in range(completed):
        add.enqueue(i, 1)
    for i in range(dead):
        always_fails.enqueue(f"boom {i}")
    # Retries wait out their backoff, so burst again until every job is final.
    wait_until(
        lambda: (
            run_burst(queues=("default",))
            and not Job.objects.exclude(state__in=["completed", "dead"]).exists()
        )
    )
    # Deferred to a minute ago and not yet claimed: the queue lags by a minute.
    JobFactory(queue="slow", run_after=timezone.now() - timedelta(seconds=60))
    JobFactory(queue="emails", run_after=timezone.now() + timedelta(hours=1))  # not ready
    JobFactory(queue="emails", running=True)
    JobFactory(queue="emails", expired=True)

    samples = scrape(client, **metrics_key())
    assert value(samples, "conveyor_jobs", queue="default", state="completed") == completed
    assert value(samples, "conveyor_jobs", queue="default", state="dead") == dead
    assert value(samples, "conveyor_dead_letter_jobs", queue="default") == dead
    assert value(samples, "conveyor_jobs", queue="default", state="available") == 0
    assert 60 <= value(samples, "conveyor_queue_lag_seconds", queue="slow") < 90
    assert value(samples, "conveyor_queue_lag_seconds", queue="emails") == 0
    assert value(samples, "conveyor_jobs", queue="emails", state="available") == 1
    assert value(samples, "conveyor_leases_active", queue="emails") == 1
    assert value(samples, "conveyor_leases_expired", queue="emails") == 1
    assert value(samples, "conveyor_queue_paused", queue="emails") == 0
    assert value(samples, "conveyor_scrape_duration_seconds") > 0
    # Every known queue is there, even with no job at all.
    assert value(samples, "conveyor_jobs", queue="other", state="available") == 0


def test_sharded_queues_are_counted_in_their_database(client):
    JobFactory._meta.database = "shard"
    try:
        JobFactory.create_batch(3, queue="other")
    finally:
        JobFactory._meta.database = "default"
    samples = scrape(client, **metrics_key())
    assert value(samples, "conveyor_jobs", queue="other", state="available") == 3


def test_finished_counts_turn_into_estimates_above_the_bound(client, monkeypatch):
    JobFactory.create_batch(30, completed=True)
    JobFactory.create_batch(3, dead=True)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE conveyor_job")
    monkeypatch.setattr(queue_counts, "EXACT_BELOW", 10)
    default = queue_counts.snapshot()["default"]
    assert default.estimated == {"completed"}
    assert 20 <= default.jobs["completed"] <= 40  # the planner's figure, close to 30
    assert default.jobs["dead"] == 3  # under the bound: exact


def test_401_403_and_the_address_allow_list(client):
    assert client.get(METRICS).status_code == 401
    assert client.get(METRICS, HTTP_AUTHORIZATION="Bearer nope").status_code == 401
    reader = keys.create("reader", ["read"])[1]
    assert client.get(METRICS, HTTP_AUTHORIZATION=f"Bearer {reader}").status_code == 403
    with override_settings(CONVEYOR={"METRICS_ALLOWED_ADDRESSES": ["127.0.0.0/8"]}):
        assert client.get(METRICS).status_code == 200  # the test client is 127.0.0.1
        assert client.get(METRICS, REMOTE_ADDR="10.1.2.3").status_code == 401
    assert client.post(METRICS, **metrics_key()).status_code == 405


def test_openmetrics_when_asked(client):
    response = client.get(
        METRICS, HTTP_ACCEPT="application/openmetrics-text; version=1.0.0", **metrics_key()
    )
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.decode().rstrip().endswith("# EOF")


def test_the_site_counts_new_jobs_and_replays_apart(client):
    client.get("/conveyor/api/openapi.json")  # loads the URLs, which install the counters
    key = metrics_key()
    before = scrape(client, **key)

    def count(samples, name):
        return samples.get(
            (name, (("queue", "emails"), ("task", "tests.testapp.tasks.send_email"))), 0
        )

    for n in range(3):
        send_email.enqueue(f"user{n}@example.com")
    keyed = send_email.using(idempotency_key="welcome-1")
    keyed.enqueue("a@example.com")
    keyed.enqueue("a@example.com")  # a replay: no new job
    with transaction.atomic():
        send_email.enqueue("never@example.com")
        transaction.set_rollback(True)  # rolled back: not a job, not counted
    after = scrape(client, **key)
    new = "conveyor_jobs_enqueued_total"
    replays = "conveyor_jobs_enqueue_replays_total"
    assert count(after, new) - count(before, new) == 4
    assert count(after, replays) - count(before, replays) == 1
