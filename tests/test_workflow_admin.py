"""A workflow in the admin: the job page's neighbours and the server-drawn graph."""

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from django_conveyor import operations
from django_conveyor.admin import workflow
from django_conveyor.models import Job
from django_conveyor.workflows import chain, fan_in, group
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "shard"])


@pytest.fixture
def staff(client):
    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "pw"))
    return client


def page(job_id):
    return reverse("admin:conveyor_job_change", args=[int(job_id)])


def graph_page(job_id):
    return reverse("admin:conveyor_job_workflow", args=[int(job_id)])


def test_the_job_page_lists_dependencies_and_dependents_with_states_and_links(staff):
    result = chain(
        tasks.wf_step.step("a"), group(tasks.wf_step.step("b"), tasks.wf_step.step("c"))
    ).enqueue()
    a, b, c = result
    body = staff.get(page(a.id)).content.decode()
    assert "Runs before (dependents)" in body
    for dependent in (b, c):
        assert f'<a href="{page(dependent.id)}">{dependent.id}</a>' in body
    assert "conveyor-state-blocked" in body
    body = staff.get(page(b.id)).content.decode()
    assert f'<a href="{page(a.id)}">{a.id}</a>' in body
    assert "waiting for 1 dependency" in body
    assert graph_page(b.id) in body


def test_a_job_without_dependencies_shows_no_workflow(staff):
    job = tasks.add.enqueue(1, 2)
    assert "conveyor-workflow" not in staff.get(page(job.id)).content.decode()


def test_the_graph_draws_every_job_with_its_state_and_every_edge(staff):
    result = fan_in([tasks.wf_step.step(str(i)) for i in range(3)], tasks.wf_step.step("f"))
    result = result.enqueue()
    operations.cancel([int(result[0].id)])
    body = staff.get(graph_page(result.last.id)).content.decode()
    assert body.count("class='conveyor-node'") == 4
    assert body.count("class='conveyor-edge'") == 3
    assert f"data-job='{result[0].id}' data-state='cancelled'" in body
    assert f"data-job='{result.last.id}' data-state='cancelled'" in body  # its dependency failed
    assert f"data-job='{result[1].id}' data-state='available'" in body
    assert "<svg class='conveyor-workflow'" in body and "http://" not in body.split("<svg")[1][:60]


def test_a_huge_workflow_is_drawn_up_to_the_limit(staff, monkeypatch):
    monkeypatch.setattr(workflow, "NODE_LIMIT", 5)
    result = fan_in([tasks.wf_step.step(str(i)) for i in range(10)], tasks.wf_step.step("f"))
    result = result.enqueue()
    body = staff.get(graph_page(result.last.id)).content.decode()
    assert body.count("class='conveyor-node'") == 5
    assert "Only the first 5 jobs are drawn." in body


def test_depths_put_each_job_right_of_what_it_waits_for():
    result = chain(
        tasks.wf_step.step("a"),
        group(tasks.wf_step.step("b"), chain(tasks.wf_step.step("c"), tasks.wf_step.step("d"))),
        tasks.wf_step.step("e"),
    ).enqueue()
    graph = workflow.workflow_graph(int(result[0].id), "default")
    depth = graph.depths()
    a, b, c, d, e = (int(r.id) for r in result)
    assert (depth[a], depth[b], depth[c], depth[d], depth[e]) == (0, 1, 1, 2, 3)
    assert Job.objects.filter(state="blocked").count() == 4
