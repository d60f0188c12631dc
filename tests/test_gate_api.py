"""`POST /jobs/{id}/signal` over a real socket: bodies, errors and scopes."""

import json
import urllib.error
import urllib.request

import pytest

from django_conveyor import workflows
from django_conveyor.api import keys
from django_conveyor.models import Job
from django_conveyor.workflows import chain
from tests.testapp.tasks import noop

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = "/conveyor/api/jobs"


@pytest.fixture
def call(live_server):
    secrets = {scope: keys.create(f"svc-{scope}", [scope])[1] for scope in ("operate", "read")}

    def call(path, body, *, scope="operate", raw=None):
        request = urllib.request.Request(
            live_server.url + path,
            data=raw if raw is not None else json.dumps(body).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {secrets[scope]}",
                     "Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    return call


def gate_and_next(name="approval"):
    result = chain(workflows.signal(name), noop.step()).enqueue()
    return result[0].id, result[1].id


def test_a_signal_completes_the_gate_with_its_payload(call):
    gate, after = gate_and_next()
    status, body = call(f"{JOBS}/{gate}/signal", {"name": "approval", "payload": {"ok": 1}})
    assert status == 200
    assert (body["state"], body["return_value"]) == ("completed", {"ok": 1})
    assert body["gate"]["signal"] == "approval"
    assert Job.objects.get(pk=after).state == "available"
    assert Job.objects.get(pk=gate).history[-1]["actor"] == "api:svc-operate"


def test_a_second_signal_is_409_and_changes_nothing(call):
    gate, _ = gate_and_next()
    assert call(f"{JOBS}/{gate}/signal", {"name": "approval", "payload": 1})[0] == 200
    status, body = call(f"{JOBS}/{gate}/signal", {"name": "approval", "payload": 2})
    assert status == 409
    assert body["detail"] == f"Gate {gate} already passed: it takes one signal."
    assert body["job_id"] == gate
    assert Job.objects.get(pk=gate).return_value == 1


def test_a_rejection_fails_the_gate(call):
    gate, after = gate_and_next()
    status, body = call(f"{JOBS}/{gate}/signal",
                        {"name": "approval", "reject": True, "reason": "no budget"})  # fmt: skip
    assert (status, body["state"]) == (200, "failed")
    assert "no budget" in body["errors"][-1]["traceback"]
    assert Job.objects.get(pk=after).state == "cancelled"


@pytest.mark.parametrize(
    ("body", "status", "detail"),
    [
        ({"name": "other"}, 409, "waits for the signal 'approval', not 'other'"),
        ({"name": "approval", "payload": {"timed_out": True}}, 400, "timed_out"),
        ({"name": "approval", "payload": "x" * 70_000}, 400, "larger than"),
        ({"name": "approval", "payload": "\u0000"}, 400, "NUL"),
        ({"name": ""}, 400, ""),
        ({"name": "approval", "extra": 1}, 400, ""),
        ({"name": "approval", "reject": "yes"}, 400, ""),
    ],
)
def test_bad_requests_are_refused_and_write_nothing(call, body, status, detail):
    gate, _ = gate_and_next()
    got, answer = call(f"{JOBS}/{gate}/signal", body)
    assert got == status, answer
    assert detail in answer["detail"]
    assert Job.objects.get(pk=gate).state == "blocked"


def test_not_found_not_a_gate_and_scope(call):
    plain = noop.enqueue().id
    assert call(f"{JOBS}/999999/signal", {"name": "x"})[0] == 404
    status, body = call(f"{JOBS}/{plain}/signal", {"name": "x"})
    assert (status, body["detail"]) == (409, f"Job {plain} is not a gate; only gates take signals.")
    gate, _ = gate_and_next()
    assert call(f"{JOBS}/{gate}/signal", {"name": "approval"}, scope="read")[0] == 403
    assert call(f"{JOBS}/{gate}/signal", None, raw=b"{not json")[0] == 400
    assert Job.objects.get(pk=gate).state == "blocked"


@pytest.mark.django_db(transaction=True, databases=["default", "shard"])
def test_metrics_count_waiting_gates_per_kind(client):
    from datetime import timedelta

    from django.db.models import Q
    from prometheus_client.parser import text_string_to_metric_families

    from tests.testapp.models import Effect

    chain(workflows.signal("approval"), noop.step()).enqueue()
    chain(workflows.signal("approval")).enqueue()
    chain(workflows.sleep(timedelta(hours=1))).enqueue()
    chain(workflows.wait_until(Effect, Q(label="never"))).enqueue()
    chain(noop.step(), workflows.signal("later")).enqueue()  # Not waiting yet: upstream pending.
    raw = keys.create("prometheus", ["metrics"])[1]
    response = client.get("/conveyor/metrics", HTTP_AUTHORIZATION=f"Bearer {raw}")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
        if s.name == "conveyor_gates_waiting"
    }
    assert samples == {
        ("conveyor_gates_waiting", (("kind", "condition"), ("queue", "default"))): 1,
        ("conveyor_gates_waiting", (("kind", "signal"), ("queue", "default"))): 2,
        ("conveyor_gates_waiting", (("kind", "sleep"), ("queue", "default"))): 1,
    }
