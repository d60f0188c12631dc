"""The operator commands: requeue, cancel, queues."""

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_conveyor.models import Job, Queue
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "shard"])


def test_requeue_dead_jobs_of_a_task(capsys):
    dead = JobFactory(dead=True, task_path="tests.testapp.tasks.always_fails")
    other = JobFactory(dead=True)
    done = JobFactory(completed=True, task_path="tests.testapp.tasks.always_fails")
    call_command("conveyor_jobs", "requeue", "--task", "tests.testapp.tasks.always_fails")
    assert "Requeued 1 job(s)." in capsys.readouterr().out
    assert Job.objects.get(pk=dead.id).state == "available"
    assert Job.objects.get(pk=other.id).state == "dead"
    assert Job.objects.get(pk=done.id).state == "completed"


def test_cancel_by_ids_and_dry_run(capsys):
    a, b = JobFactory(), JobFactory(running=True)
    call_command("conveyor_jobs", "cancel", "--ids", f"{a.id},{b.id}", "--dry-run")
    assert "Would cancel 1 job(s)." in capsys.readouterr().out
    assert Job.objects.get(pk=a.id).state == "available"
    call_command("conveyor_jobs", "cancel", "--ids", f"{a.id},{b.id}")
    assert Job.objects.get(pk=a.id).state == "cancelled"
    assert Job.objects.get(pk=b.id).state == "running"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["requeue"],
            "Select jobs with --ids, --state, --queue, --task, --search or --unique-key.",
        ),
        (["requeue", "--search", "colour:blue"], "--search: Unknown search field 'colour'"),
        (["requeue", "--search", 'meta.a:"open'], "--search: A quoted value is not closed"),
        (["requeue", "--search", "  "], "--search needs at least one term"),
        (
            ["cancel", "--unique-key", "ABC"],
            "--unique-key takes a job's unique key (64 lowercase hex digits), not 'ABC'.",
        ),
        (["requeue", "--state", "running"], "Cannot requeue jobs in state 'running'"),
        (["cancel", "--ids", "1,x"], "--ids takes comma-separated job ids, not '1,x'."),
    ],
)
def test_bad_selections_are_named(args, message):
    JobFactory(dead=True)
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call_command("conveyor_jobs", *args)
    assert Job.objects.get().state == "dead"


def test_requeue_what_a_search_finds_with_the_other_filters(capsys):
    wanted = JobFactory(dead=True, tags=["tenant:42"], kwargs={"customer_id": 42})
    other_tenant = JobFactory(dead=True, tags=["tenant:4"], kwargs={"customer_id": 42})
    other_customer = JobFactory(dead=True, tags=["tenant:42"], kwargs={"customer_id": 7})
    running = JobFactory(running=True, tags=["tenant:42"], kwargs={"customer_id": 42})
    query = "tag:tenant:42 kwargs.customer_id:42"
    call_command("conveyor_jobs", "requeue", "--search", query, "--dry-run")
    assert "Would requeue 1 job(s)." in capsys.readouterr().out
    call_command("conveyor_jobs", "requeue", "--search", query)
    assert "Requeued 1 job(s)." in capsys.readouterr().out
    states = dict(Job.objects.values_list("id", "state"))
    assert states == {wanted.id: "available", other_tenant.id: "dead",
                      other_customer.id: "dead", running.id: "running"}  # fmt: skip


def test_pause_resume_and_list(capsys):
    JobFactory(queue="emails")
    call_command("conveyor_queues", "pause", "emails")
    assert Queue.objects.get(name="emails").paused
    call_command("conveyor_queues", "list")
    out = capsys.readouterr().out
    assert "emails\tpaused\twaiting=1\trunning=0" in out
    call_command("conveyor_queues", "resume", "emails")
    assert not Queue.objects.get(name="emails").paused
    with pytest.raises(CommandError, match="Unknown queue"):
        call_command("conveyor_queues", "pause", "nope")


def test_the_commands_sign_the_jobs_history_as_cli():
    dead = JobFactory(dead=True)
    call_command("conveyor_jobs", "requeue", "--ids", str(dead.id))
    assert Job.objects.get(pk=dead.id).history[-1]["actor"] == "cli"


@pytest.mark.parametrize(("option", "value"), [("--queue", "a\udcffb"), ("--task", "a\x00b")])
def test_a_filter_postgresql_cannot_hold_is_refused_naming_it(option, value):
    """Bytes of argv that are not UTF-8 (a lone surrogate) or a NUL: a clear error, no query."""
    with pytest.raises(CommandError, match=rf"{option}.*(surrogate|NUL)"):
        call_command("conveyor_jobs", "cancel", option, value, "--dry-run")
