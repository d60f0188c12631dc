"""Workflows end to end: builders, refusals, and real worker processes running graphs."""

import os
import signal

import pytest
from django.db import transaction

from django_conveyor import operations, protocol
from django_conveyor.context import dependency_results
from django_conveyor.exceptions import (
    DependencyAlreadyFailed,
    DependencyCycle,
    DependencyInOtherDatabase,
    DependencyNotFound,
    TooManyDependencies,
)
from django_conveyor.models import Dependency, Job
from django_conveyor.workflows import Workflow, chain, fan_in, group
from tests.helpers import run_burst, stop_process, wait_until
from tests.helpers import start_logged_worker as worker
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def states(results):
    rows = dict(Job.objects.filter(pk__in=[int(r.id) for r in results]).values_list("id", "state"))
    return [rows[int(r.id)] for r in results]


def edges():
    return set(Dependency.objects.values_list("job_id", "depends_on_id"))


def ran_before(first, then):
    """The handler of `first` wrote its effect before the handler of `then` wrote its own."""
    one = Effect.objects.get(job_id=int(first.id))
    two = Effect.objects.get(job_id=int(then.id))
    return one.id < two.id


class TestEnqueue:
    def test_using_depends_on_takes_results_and_ids(self):
        a = tasks.add.enqueue(1, 2)
        b = tasks.add.enqueue(3, 4)
        c = tasks.add.using(depends_on=[a, b.id]).enqueue(5, 6)
        assert (c.state, c.status) == ("blocked", "READY")
        assert edges() == {(int(c.id), int(a.id)), (int(c.id), int(b.id))}
        assert Job.objects.get(pk=int(c.id)).pending_dependencies == 2

    def test_refusals_name_the_problem_and_write_nothing(self):
        a = tasks.add.enqueue(1, 2)
        operations.cancel([int(a.id)])
        before = Job.objects.count()
        with pytest.raises(DependencyNotFound, match="Dependency 999999 of a"):
            tasks.add.using(depends_on=[999999]).enqueue(1, 1)
        with pytest.raises(DependencyAlreadyFailed, match=f"Dependency {a.id} .* is already"):
            tasks.add.using(depends_on=[a]).enqueue(1, 1)
        with pytest.raises(DependencyInOtherDatabase, match="lives in database 'shard'"):
            tasks.add.using(depends_on=["shard:1"]).enqueue(1, 1)
        with pytest.raises(TypeError, match="a list of results"):
            tasks.add.using(depends_on=a)
        assert Job.objects.count() == before
        assert tasks.add.using(depends_on=[a], dependency_policy="run").enqueue(1, 1).state == (
            "available"
        )

    def test_a_cycle_is_refused_before_anything_is_written(self):
        workflow = Workflow()
        workflow.add(tasks.wf_step.step("a"), name="a", after=["c"])
        workflow.add(tasks.wf_step.step("b"), name="b", after=["a"])
        workflow.add(tasks.wf_step.step("c"), name="c", after=["b"])
        workflow.add(tasks.wf_step.step("d"), name="d")
        with pytest.raises(DependencyCycle, match="in a cycle: a, b, c; nothing was enqueued"):
            workflow.enqueue()
        assert not Job.objects.exists()

    def test_more_dependencies_than_the_limit_are_refused(self, monkeypatch):
        monkeypatch.setattr(protocol, "MAX_DEPENDENCIES", 3)
        workflow = fan_in([tasks.wf_step.step(str(i)) for i in range(4)], tasks.wf_step.step("f"))
        with pytest.raises(TooManyDependencies, match="waits for 4 jobs; the limit is 3"):
            workflow.enqueue()
        assert not Job.objects.exists()

    def test_the_shapes_wire_their_edges(self):
        result = chain(
            tasks.wf_step.step("a"),
            group(tasks.wf_step.step("b"), tasks.wf_step.step("c")),
            tasks.wf_step.step("d"),
        ).enqueue()
        a, b, c, d = (int(r.id) for r in result)
        assert edges() == {(b, a), (c, a), (d, b), (d, c)}
        assert states(result) == ["available", "blocked", "blocked", "blocked"]
        assert result.last.id == str(d)

    def test_a_workflow_commits_with_the_callers_transaction(self):
        with pytest.raises(RuntimeError), transaction.atomic():
            chain(tasks.wf_step.step("a"), tasks.wf_step.step("b")).enqueue()
            raise RuntimeError("the caller rolls back")
        assert not Job.objects.exists() and not Dependency.objects.exists()

    def test_dependency_results_is_one_query(self, django_assert_num_queries):
        result = fan_in([tasks.wf_step.step(str(i)) for i in range(5)], tasks.wf_step.step("f"))
        result = result.enqueue()
        run_burst()
        with django_assert_num_queries(1):
            seen = dependency_results("default", int(result.last.id))
        assert list(seen) == [r.id for r in result.results[:5]]
        assert [r.return_value["label"] for r in seen.values()] == ["0", "1", "2", "3", "4"]
        assert Job.objects.get(pk=int(result.last.id)).return_value["saw"] == list("01234")


@pytest.mark.slow
def test_chain_group_fan_in_and_diamond_run_in_dependency_order(procs, tmp_path):
    steps = [tasks.wf_step.step(f"chain-{i}") for i in range(5)]
    the_chain = chain(*steps).enqueue()
    members = [tasks.wf_step.step(f"member-{i:02}") for i in range(20)]
    the_fan_in = fan_in(members, tasks.wf_step.step("fan-in")).enqueue()
    diamond = Workflow()
    diamond.add(tasks.wf_step.step("top"), name="top")
    diamond.add(tasks.wf_step.step("left"), name="left", after=["top"])
    diamond.add(tasks.wf_step.step("right"), name="right", after=["top"])
    diamond.add(tasks.wf_step.step("bottom"), name="bottom", after=["left", "right"])
    the_diamond = diamond.enqueue()
    everything = [*the_chain, *the_fan_in, *the_diamond]
    for name in ("one", "two"):
        worker(procs, tmp_path, name, "--concurrency", "4")
    wait_until(lambda: set(states(everything)) == {"completed"}, timeout=90)
    for earlier, later in zip(the_chain.results, the_chain.results[1:], strict=False):
        assert ran_before(earlier, later)
    for member in the_fan_in.results[:-1]:
        assert ran_before(member, the_fan_in.last)
    assert the_fan_in.last.task.get_result(the_fan_in.last.id).return_value["saw"] == [
        f"member-{i:02}" for i in range(20)
    ]
    for first, then in [("top", "left"), ("top", "right"), ("left", "bottom"), ("right", "bottom")]:
        assert ran_before(the_diamond[first], the_diamond[then])
    assert Effect.objects.count() == len(everything)  # each step ran once


@pytest.mark.slow
def test_a_dead_dependency_cancels_runs_the_cleanup_and_a_requeue_completes(procs, tmp_path):
    workflow = Workflow()
    workflow.add(tasks.wf_breaks.step("fragile"), name="fragile")
    workflow.add(tasks.wf_step.step("next"), name="next", after=["fragile"])
    workflow.add(tasks.wf_step.step("last"), name="last", after=["next"])
    workflow.add(tasks.wf_cleanup.step("cleanup"), name="cleanup", after=["fragile"])
    result = workflow.enqueue()
    worker(procs, tmp_path, "w", "--concurrency", "2")
    wait_until(lambda: states(result) == ["dead", "cancelled", "cancelled", "completed"])
    cancelled = Job.objects.get(pk=int(result["next"].id))
    assert cancelled.errors[-1]["dependency"] == int(result["fragile"].id)
    assert "ended dead" in cancelled.errors[-1]["traceback"]
    assert Job.objects.get(pk=int(result["cleanup"].id)).return_value["states"] == ["dead"]
    Effect.objects.create(job_id=0, token=0, worker="", label="fix:fragile")
    assert operations.requeue([int(result["fragile"].id)], actor="cli") == [
        int(result["fragile"].id)
    ]
    wait_until(lambda: states(result)[:3] == ["completed"] * 3)
    assert ran_before(result["next"], result["last"])


@pytest.mark.slow
def test_a_zombies_completion_of_a_dependency_unblocks_nothing(procs, tmp_path):
    dependency = tasks.wf_held.enqueue("held")
    dependent = tasks.add.using(depends_on=[dependency]).enqueue(1, 2)
    zombie = worker(procs, tmp_path, "zombie", "--lease", "1")
    wait_until(lambda: Job.objects.get(pk=int(dependency.id)).state == "running")
    os.kill(zombie.pid, signal.SIGSTOP)
    rescuer = worker(procs, tmp_path, "rescuer", "--lease", "30")
    wait_until(lambda: Job.objects.get(pk=int(dependency.id)).attempt == 2, timeout=30)
    os.kill(zombie.pid, signal.SIGCONT)
    assert stop_process(zombie) == 0  # its handler finished; its COMPLETE was refused
    log = (tmp_path / "zombie.log").read_text()
    assert "'stale_outcomes': 1" in log or "'leases_lost': 1" in log, log[-2000:]
    row = Job.objects.get(pk=int(dependent.id))
    assert (row.state, row.pending_dependencies) == ("blocked", 1)
    Effect.objects.create(job_id=0, token=0, worker="", label="go:held")
    wait_until(lambda: Job.objects.get(pk=int(dependent.id)).state == "completed", timeout=30)
    assert Job.objects.get(pk=int(dependency.id)).return_value == {"label": "held", "attempt": 2}
    assert stop_process(rescuer) == 0


def test_enqueue_share_locks_the_dependencies_until_commit():
    import psycopg

    from django_conveyor.worker.connections import connect

    dependency = tasks.add.enqueue(1, 2)
    with transaction.atomic():
        tasks.add.using(depends_on=[dependency]).enqueue(3, 4)
        # A completion (an UPDATE of the dependency) would wait for this commit.
        with connect("default") as other, pytest.raises(psycopg.errors.LockNotAvailable):
            other.execute(
                "SELECT 1 FROM conveyor_job WHERE id = %s FOR NO KEY UPDATE NOWAIT",
                [int(dependency.id)],
            )


def test_the_api_and_the_cli_requeue_through_the_same_reblock(client):
    from django.core.management import call_command

    from django_conveyor.api import keys

    headers = {"HTTP_AUTHORIZATION": f"Bearer {keys.create('ops', ['operate'])[1]}"}
    result = chain(tasks.wf_step.step("a"), tasks.wf_step.step("b")).enqueue()
    a, b = (int(r.id) for r in result)
    operations.cancel([a])
    assert states(result) == ["cancelled", "cancelled"]
    refused = client.post(f"/conveyor/api/jobs/{b}/requeue", **headers)
    assert refused.status_code == 409
    assert refused.json()["detail"] == (
        f"Job {b} depends on a job that is failed, dead or cancelled; requeue that "
        "dependency, and this job follows."
    )
    response = client.post(f"/conveyor/api/jobs/{a}/requeue", **headers)
    assert response.status_code == 200, response.content
    assert states(result) == ["available", "blocked"]
    assert Job.objects.get(pk=b).history[-1]["actor"] == "api:ops"
    operations.cancel([a])
    call_command("conveyor_jobs", "requeue", "--ids", str(a))
    assert states(result) == ["available", "blocked"]
    assert Job.objects.get(pk=b).history[-1]["actor"] == "cli"
