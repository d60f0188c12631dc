"""Gates in workflows, end to end: the builders, send_signal and its refusals,
wait_until conditions, and checkpointed steps, with real workers in burst mode."""

from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.db import DatabaseError, transaction
from django.db.models import F, Q

from django_conveyor import reject_signal, send_signal, workflows
from django_conveyor.exceptions import (
    ArgumentsNotSerializable,
    GateAlreadyPassed,
    GateClosed,
    GateNotFound,
    GateNotReady,
    InvalidCondition,
    NotAGate,
    WrongSignal,
)
from django_conveyor.models import Job, LedgerEntry
from django_conveyor.worker.services.base import Now
from django_conveyor.worker.services.gates import GatesService
from django_conveyor.workflows import Workflow, chain
from tests.helpers import run_burst, wait_until
from tests.testapp.models import Effect
from tests.testapp.tasks import add, noop, reads_dependencies, three_steps

pytestmark = pytest.mark.django_db(transaction=True)


def job(result):
    return Job.objects.get(pk=int(result.id))


def fire_gates():
    from django.db import connection

    with connection.cursor() as cursor:
        return GatesService(database="default").run_once(cursor, Now.read())


class TestBuilders:
    def test_a_signal_gate_is_a_blocked_job_that_waits(self):
        result = chain(workflows.signal("approval"), noop.step()).enqueue()
        gate = job(result[0])
        assert gate.state == "blocked" and gate.pending_dependencies == 0
        assert gate.task_path == "django_conveyor.workflows.gates.signal"
        assert gate.gate["signal"] == "approval"
        assert job(result[1]).state == "blocked"

    @pytest.mark.parametrize(
        ("build", "message"),
        [
            (lambda: workflows.signal(""), "non-empty string"),
            (lambda: workflows.signal("a\x00b"), "NUL"),
            (lambda: workflows.signal("x", on_timeout="later"), "on_timeout must be one of"),
            (lambda: workflows.signal("x", timeout=5), "must be a timedelta"),
            (lambda: workflows.signal("x", timeout=timedelta(seconds=-1)), "from 0 to ten years"),
            (lambda: workflows.sleep(), "exactly one of them"),
            (lambda: workflows.sleep(timedelta(1), until=datetime.now(UTC)), "exactly one"),
            (lambda: workflows.sleep(until=datetime(2030, 1, 1)), "aware datetime"),
            (lambda: workflows.signal("x", dependency_policy="maybe"), "dependency_policy"),
        ],
    )
    def test_bad_definitions_are_refused_with_a_clear_error(self, build, message):
        with pytest.raises((ValueError, TypeError), match=message):
            build()
        assert Job.objects.count() == 0

    def test_conditions_that_cannot_be_stored_are_refused_at_definition(self):
        with pytest.raises(InvalidCondition, match="cannot be stored"):
            workflows.wait_until(Effect, Q(job_id=F("token")))
        with pytest.raises(InvalidCondition, match="not valid"):
            workflows.wait_until(Effect, Q(no_such_field=1))
        with pytest.raises(InvalidCondition, match="model class"):
            workflows.wait_until("testapp.Effect", Q(label="x"))
        with pytest.raises(InvalidCondition, match="Q"):
            workflows.wait_until(Effect, {"label": "x"})
        with pytest.raises(InvalidCondition, match="at most 16384 can be stored"):
            workflows.wait_until(Effect, Q(label__in=[f"label-{i}" for i in range(2000)]))


class TestSignals:
    def test_the_payload_reaches_dependents_as_a_return_value(self):
        result = chain(workflows.signal("approval"), reads_dependencies.step()).enqueue()
        gate = send_signal(result[0], "approval", payload={"by": "maria"})
        assert gate.status.name == "SUCCESSFUL"
        run_burst()
        assert job(result[1]).return_value == [{"by": "maria"}]

    def test_dependents_never_start_before_their_gate(self):
        result = chain(workflows.signal("go"), noop.step()).enqueue()
        run_burst()
        assert job(result[1]).state == "blocked"  # The worker found nothing to run.
        send_signal(result[0].id, "go")
        run_burst()
        assert job(result[1]).state == "completed"
        assert job(result[1]).started_at >= job(result[0]).finished_at

    def test_refusals_name_the_reason_and_write_nothing(self):
        plain = noop.enqueue()
        result = chain(noop.step(), workflows.signal("go"), noop.step()).enqueue()
        timer = Workflow()
        timer.add(workflows.sleep(timedelta(hours=1)))
        [sleeping] = timer.enqueue()
        with pytest.raises(GateNotFound):
            send_signal("999999999", "go")
        with pytest.raises(GateNotFound):
            send_signal("nothing", "go")
        with pytest.raises(NotAGate):
            send_signal(plain, "go")
        with pytest.raises(WrongSignal, match="timer"):
            send_signal(sleeping, "go")
        with pytest.raises(WrongSignal, match="waits for the signal 'go', not 'stop'"):
            send_signal(result[1], "stop")
        with pytest.raises(GateNotReady, match="1 of its upstream steps"):
            send_signal(result[1], "go")
        run_burst()
        send_signal(result[1], "go", payload=1)
        with pytest.raises(GateAlreadyPassed):
            send_signal(result[1], "go", payload=2)
        assert job(result[1]).return_value == 1

    @pytest.mark.parametrize(
        ("payload", "error", "message"),
        [
            ({"a": "\x00"}, ArgumentsNotSerializable, "NUL"),
            ({"a": "\ud800"}, ArgumentsNotSerializable, "surrogate"),
            (float("nan"), ArgumentsNotSerializable, "finite"),
            ("x" * 70_000, ValueError, "at most 65536"),
            ({"timed_out": True}, ValueError, "reserved|may not have"),
            (object(), ArgumentsNotSerializable, "not JSON-serializable"),
        ],
    )
    def test_bad_payloads_are_refused(self, payload, error, message):
        [gate] = chain(workflows.signal("go")).enqueue()
        with pytest.raises(error, match=message):
            send_signal(gate, "go", payload=payload)
        assert job(gate).state == "blocked"

    def test_a_signal_commits_with_the_callers_transaction(self):
        [gate] = chain(workflows.signal("go")).enqueue()
        with pytest.raises(RuntimeError), transaction.atomic():
            send_signal(gate, "go")
            raise RuntimeError("roll back")
        assert job(gate).state == "blocked"

    def test_a_rejection_fails_the_gate_and_cancels_what_follows(self):
        result = chain(workflows.signal("approval"), noop.step()).enqueue()
        reject_signal(result[0], "approval", reason="too expensive", actor="admin:maria")
        gate = job(result[0])
        assert gate.state == "failed"
        assert "too expensive" in gate.errors[-1]["traceback"]
        assert job(result[1]).state == "cancelled"
        with pytest.raises(GateClosed):
            send_signal(result[0], "approval")

    def test_upstream_failure_cancels_the_gate_and_a_late_signal_is_refused(self):
        from tests.testapp.tasks import discard_me

        result = chain(discard_me.step("no"), workflows.signal("go"), noop.step()).enqueue()
        run_burst()
        assert [job(r).state for r in result] == ["failed", "cancelled", "cancelled"]
        with pytest.raises(GateClosed, match="cancelled"):
            send_signal(result[1], "go")


class TestTimers:
    def test_sleep_then_run(self):
        result = chain(workflows.sleep(timedelta(0)), add.step(1, 2)).enqueue()
        assert fire_gates().gates_timed_out == 1
        run_burst()
        assert job(result[1]).return_value == 3
        assert "slept_until" in job(result[0]).return_value

    def test_until_in_the_future_waits(self):
        later = datetime.now(UTC) + timedelta(hours=1)
        result = chain(workflows.sleep(until=later), noop.step()).enqueue()
        assert fire_gates().gates_timed_out == 0
        assert job(result[0]).gate_deadline == later.replace(microsecond=later.microsecond)

    def test_a_timed_out_signal_refuses_late_signals_and_requeue_makes_it_wait_again(self):
        from django_conveyor import operations

        result = chain(workflows.signal("go", timeout=timedelta(0)), noop.step()).enqueue()
        fire_gates()
        assert job(result[0]).state == "failed"
        with pytest.raises(GateClosed, match="timed out"):
            send_signal(result[0], "go")
        operations.requeue([int(result[0].id)])
        assert job(result[0]).state == "blocked"
        assert job(result[1]).state == "blocked"


class TestConditions:
    def test_checked_at_creation_when_already_true(self):
        Effect.objects.create(job_id=1, token=0, worker="", label="ready")
        result = chain(workflows.wait_until(Effect, Q(label="ready")), noop.step()).enqueue()
        gate = job(result[0])
        assert gate.state == "completed"
        assert gate.return_value["matched"] == Effect.objects.get().pk

    def test_met_later_by_the_gates_service(self):
        result = chain(workflows.wait_until(Effect, Q(label="later")), noop.step()).enqueue()
        assert fire_gates().conditions_met == 0
        Effect.objects.create(job_id=1, token=0, worker="", label="later")
        counts = fire_gates()
        assert (counts.conditions_checked, counts.conditions_met) == (1, 1)
        assert job(result[0]).state == "completed"
        run_burst()
        assert job(result[1]).state == "completed"

    def test_a_broken_stored_condition_fails_its_own_gate_only(self):
        good = chain(workflows.wait_until(Effect, Q(label="x"))).enqueue()[0]
        bad = chain(workflows.wait_until(Effect, Q(label="y"))).enqueue()[0]
        Job.objects.filter(pk=int(bad.id)).update(
            gate={
                **job(bad).gate,
                "condition": {"model": "testapp.Gone", "q": job(bad).gate["condition"]["q"]},
            }
        )
        Effect.objects.create(job_id=1, token=0, worker="", label="x")
        fire_gates()
        assert job(good).state == "completed"
        assert job(bad).state == "failed"
        assert job(bad).errors[-1]["exception_class_path"].endswith("ConditionInvalid")

    def test_a_read_only_session_is_dropped_so_the_next_pass_checks_again(self):
        """After a failover Django's session may be on the fenced primary: not for ever."""
        from django.db import connection

        from django_conveyor.worker.connections import connection_params, is_read_only

        result = chain(workflows.wait_until(Effect, Q(label="later"))).enqueue()
        Effect.objects.create(job_id=1, token=0, worker="", label="later")
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION default_transaction_read_only = on")
        service = GatesService(database="default")
        with psycopg.connect(**connection_params("default"), autocommit=True) as loop:
            with pytest.raises(DatabaseError) as refused:
                service.run_once(loop.cursor(), Now.read())
            assert is_read_only(refused.value)  # The loop reconnects on it, and says so.
            assert connection.connection is None  # Dropped: the next session may write.
            assert job(result[0]).state == "blocked"
            counts = service.run_once(loop.cursor(), Now.read())
        assert (counts.conditions_checked, counts.conditions_met) == (1, 1)
        assert job(result[0]).state == "completed"


class TestCheckpoints:
    def test_a_recorded_step_is_not_run_again_by_a_later_attempt(self):
        result = three_steps.enqueue(2)
        wait_until(lambda: run_burst() and job(result).state == "completed")
        row = job(result)
        assert row.state == "completed"
        assert row.return_value == ["one", "two", "three"]
        assert sorted(Effect.objects.values_list("label", flat=True)) == ["one", "three", "two"]
        keys = sorted(
            LedgerEntry.objects.filter(job_id=row.pk).values_list("effect_key", flat=True)
        )
        assert keys == ["checkpoint:one", "checkpoint:three", "checkpoint:two"]
        assert row.attempt == 3

    def test_a_checkpoint_refuses_to_run_inside_atomic_and_bad_names(self):
        from tests.testapp.tasks import checkpoint_misuse

        result = checkpoint_misuse.enqueue()
        run_burst()
        assert job(result).return_value == [
            "context.checkpoint() cannot run inside or after context.atomic()",
            "A checkpoint's name must be a non-empty string",
            "is not JSON-serializable",
        ]
        assert Effect.objects.count() == 0  # The refused step's write rolled back.
