"""The console in a real browser: Debian's Chromium, driven by Playwright.

Never downloads a browser: it launches the system's `chromium` by path
(CONVEYOR_CHROMIUM, else `chromium` on PATH, else /usr/bin/chromium). Without
one these tests skip, except in CI (CI=true), where a missing browser fails.
Screenshots go to var/screenshots/.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.urls import reverse

from django_conveyor import protocol
from django_conveyor.admin import dashboard
from django_conveyor.models import Job
from tests.chromium import CHROMIUM_ARGS, chromium_path
from tests.factories import JobFactory
from tests.helpers import REPO, wait_until
from tests.testapp import tasks

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True, databases=["default", "shard"]),
]

SCREENSHOTS = REPO / "var" / "screenshots"
USERNAME, PASSWORD = "ops", "browser-pw"


def missing(reason: str) -> None:
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(f"{reason}; CI must run the browser tests (apt-get install chromium).")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    path = chromium_path()
    if path is None:
        missing("no Chromium found (set CONVEYOR_CHROMIUM or install Debian's chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("playwright is not installed (pip install -e '.[test]')")
    with (
        tempfile.TemporaryDirectory(prefix="conveyor-chromium-") as profile,
        pytest.MonkeyPatch.context() as patch,
        sync_playwright() as playwright,
    ):
        # Playwright's sync API keeps an event loop on this thread; the test's
        # own ORM calls are plain blocking calls between browser steps.
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=path,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
        )
        yield context
        context.close()


@pytest.fixture
def page(chromium, live_server):
    User.objects.create_superuser(USERNAME, "ops@example.com", PASSWORD)
    page = chromium.new_page()
    page.set_default_timeout(15_000)
    page.goto(live_server.url + reverse("admin:login"))
    page.fill("#id_username", USERNAME)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(live_server.url + reverse("admin:index"))
    yield page
    page.close()


def shot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def stat(page, queue: str, name: str) -> int:
    return int(page.inner_text(f"#conveyor-queues tr[data-queue='{queue}'] [data-stat='{name}']"))


def test_the_dashboard_shows_the_databases_numbers_and_refreshes_itself(
    page, live_server, monkeypatch
):
    monkeypatch.setattr(dashboard, "REFRESH_SECONDS", 1)
    JobFactory.create_batch(3, queue="emails")
    JobFactory.create_batch(2, queue="default", dead=True)
    JobFactory(queue="default", running=True)
    JobFactory.create_batch(4, queue="default", completed=True)
    page.goto(live_server.url + reverse("admin:conveyor_dashboard_changelist"))
    for queue, name, state in (("emails", "ready", "available"), ("default", "dead", "dead"),
                               ("default", "running", "running")):  # fmt: skip
        assert stat(page, queue, name) == Job.objects.filter(queue=queue, state=state).count()
    assert int(page.inner_text(".conveyor-cards [data-stat='completed_last_hour']")) == 4
    assert page.locator("svg.conveyor-chart").count() >= 2  # drawn on the server
    shot(page, "dashboard")

    JobFactory.create_batch(5, queue="emails")  # no reload: the page fetches its body
    wait_until(lambda: stat(page, "emails", "ready") == 8, timeout=15)
    assert page.evaluate("Number(document.getElementById('conveyor-overview').dataset.refreshes)")


def test_requeue_a_dead_job_through_the_confirmation_page(page, live_server):
    dead = JobFactory(dead=True)
    JobFactory(dead=True, queue="emails")
    page.goto(live_server.url + reverse("admin:conveyor_deadletter_changelist"))
    page.check(f"input[name='_selected_action'][value='{dead.id}']")
    page.select_option("select[name='action']", "requeue_jobs")
    page.click("button[name='index'], input[name='index']")
    page.wait_for_selector("#conveyor-confirm")
    assert page.inner_text(".conveyor-confirm-count strong") == "1"
    assert Job.objects.get(pk=dead.id).state == "dead"  # nothing changed yet
    shot(page, "requeue-confirmation")
    page.click("#conveyor-confirm-yes")
    page.wait_for_selector("ul.messagelist")
    assert "Requeued 1 job(s)." in page.inner_text("ul.messagelist")
    job = Job.objects.get(pk=dead.id)
    assert job.state == "available"
    assert job.history[-1]["actor"] == f"admin:{USERNAME}"


def test_the_job_page_shows_attempts_history_and_json(page, live_server):
    dead = JobFactory(dead=True, args=[{"order": 42, "sku": "COFFEE-1KG"}])
    url = live_server.url + reverse("admin:conveyor_job_change", args=[dead.id])
    page.goto(url)
    assert page.locator("#conveyor-attempts tbody tr").count() == 3
    assert '"sku": "COFFEE-1KG"' in page.inner_text(".conveyor-json >> nth=0")
    page.click("#conveyor-requeue")
    page.click("#conveyor-confirm-yes")
    page.wait_for_url(url)
    assert "requeue" in page.inner_text("#conveyor-history")
    shot(page, "job-page")


def test_cancel_a_running_job_of_a_real_worker_and_watch_it_end_cancelled(
    page, live_server, tmp_path
):
    from tests.helpers import kill_group, start_worker, stop_process
    from tests.testapp import tasks

    job_id = int(tasks.cancellable.enqueue(120).id)
    proc = start_worker("--queues", "default", log=tmp_path / "worker.log")
    try:
        wait_until(lambda: Job.objects.get(pk=job_id).state == "running")
        page.goto(live_server.url + reverse("admin:conveyor_worker_changelist"))
        assert page.locator(".conveyor-worker-live").count() == 1
        shot(page, "workers")
        url = live_server.url + reverse("admin:conveyor_job_change", args=[job_id])
        page.goto(url)
        assert "held by" in page.inner_text("body")
        page.click("#conveyor-cancel")
        assert "the worker holding it is asked to stop it" in page.inner_text("#conveyor-confirm")
        page.click("#conveyor-confirm-yes")
        page.wait_for_url(url)

        def shows_cancelled():
            page.reload()
            return "cancelled" in page.inner_text(".field-state_label")

        wait_until(shows_cancelled, timeout=30, interval=0.5)
        job = Job.objects.get(pk=job_id)
        assert (job.state, job.return_value) == ("cancelled", None)
        assert "cancelled" in page.inner_text("#conveyor-attempts")
        history = page.inner_text("#conveyor-history")
        assert "request_cancel" in history and "cancel_held" in history
        shot(page, "cancelled-job")
        assert stop_process(proc) == 0
    finally:
        kill_group(proc)


def test_a_workflow_on_the_job_page_and_as_a_graph(page, live_server):
    from django_conveyor import operations
    from django_conveyor.workflows import chain, group
    from tests.testapp import tasks

    result = chain(
        tasks.wf_step.step("charge"),
        group(tasks.wf_step.step("receipt"), tasks.wf_step.step("stock")),
        tasks.wf_step.step("fulfilled"),
    ).enqueue()
    charge, receipt, stock, fulfilled = result
    operations.cancel([int(stock.id)])
    page.goto(live_server.url + reverse("admin:conveyor_job_change", args=[int(receipt.id)]))
    row = page.locator(f"#conveyor-dependencies tr[data-job='{charge.id}']")
    assert "available" in row.inner_text()
    assert page.locator(f"#conveyor-dependents tr[data-job='{fulfilled.id}']").inner_text()
    page.click("#conveyor-workflow-graph")
    page.wait_for_selector("svg.conveyor-workflow")
    nodes = page.locator("svg.conveyor-workflow g.conveyor-node")
    assert nodes.count() == 4
    assert page.locator("svg.conveyor-workflow path.conveyor-edge").count() == 4
    node = page.locator(f"g.conveyor-node[data-job='{fulfilled.id}']")
    assert node.get_attribute("data-state") == "cancelled"  # its dependency was cancelled
    box = page.locator(f"g.conveyor-node[data-job='{stock.id}']").bounding_box()
    first = page.locator(f"g.conveyor-node[data-job='{charge.id}']").bounding_box()
    last = node.bounding_box()
    assert first["x"] < box["x"] < last["x"]  # drawn left to right, in dependency order
    shot(page, "workflow-graph")
    page.click(f"g.conveyor-node[data-job='{charge.id}']")
    page.wait_for_url(live_server.url + reverse("admin:conveyor_job_change", args=[int(charge.id)]))


def test_from_a_unique_jobs_page_to_the_job_holding_its_key(page, live_server):
    """Unique jobs: the key on the job page finds every job that held it, and the holder."""
    first = tasks.unique_add.enqueue(1, 2)
    with connection.cursor() as cur:
        protocol.cancel(cur, ids=[int(first.id)])
    holder = tasks.unique_add.enqueue(1, 2)
    page.goto(live_server.url + reverse("admin:conveyor_job_change", args=[first.id]))
    key = page.inner_text("#conveyor-unique-key")
    assert key == Job.objects.get(pk=first.id).unique_key
    assert f"job {holder.id} (available)" in page.inner_text("#conveyor-key-holder")
    shot(page, "unique-job-page")
    page.click("#conveyor-requeue")
    page.click("#conveyor-confirm-yes")
    page.wait_for_selector("ul.messagelist")
    assert f"held by job {holder.id} (available)" in page.inner_text("ul.messagelist")
    assert Job.objects.get(pk=first.id).state == "cancelled"
    page.click("#conveyor-jobs-with-key")
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == 2
    page.goto(live_server.url + reverse("admin:conveyor_job_change", args=[first.id]))
    page.click("#conveyor-key-holder a")
    page.wait_for_selector("#conveyor-key-holder")
    assert "by this job (available)" in page.inner_text("#conveyor-key-holder")


def test_approve_reject_and_signal_gates_on_the_waiting_page(page, live_server):
    from django.contrib.admin.models import LogEntry

    from django_conveyor import workflows
    from django_conveyor.workflows import chain
    from tests.testapp.tasks import noop

    approve = chain(workflows.signal("approval"), noop.step()).enqueue()
    reject = chain(workflows.signal("approval"), noop.step()).enqueue()
    webhook = chain(workflows.signal("paid"), noop.step()).enqueue()
    chain(noop.step(), workflows.signal("approval")).enqueue()  # Not waiting yet: not listed.
    gate_of = {name: int(result[0].id) for name, result in
               (("approve", approve), ("reject", reject), ("webhook", webhook))}  # fmt: skip
    page.goto(live_server.url + reverse("admin:conveyor_waitinggate_changelist"))
    listed = page.locator("input[name='_selected_action']").evaluate_all(
        "boxes => boxes.map(b => Number(b.value))"
    )
    assert sorted(listed) == sorted(gate_of.values())
    assert "signal “approval”" in page.inner_text("#result_list")
    shot(page, "waiting-gates")
    # Approve one, through the confirmation page.
    page.check(f"input[name='_selected_action'][value='{gate_of['approve']}']")
    page.select_option("select[name='action']", "approve_gates")
    page.click("button[name='index'], input[name='index']")
    page.wait_for_selector("#conveyor-confirm")
    assert Job.objects.get(pk=gate_of["approve"]).state == "blocked"  # nothing changed yet
    page.click("#conveyor-confirm-yes")
    page.wait_for_selector("ul.messagelist")
    assert "Approved 1 gate(s)." in page.inner_text("ul.messagelist")
    gate = Job.objects.get(pk=gate_of["approve"])
    assert (gate.state, gate.return_value) == (
        "completed",
        {"approved": True, "by": f"admin:{USERNAME}"},
    )
    assert Job.objects.get(pk=int(approve[1].id)).state == "available"
    # Reject another.
    page.check(f"input[name='_selected_action'][value='{gate_of['reject']}']")
    page.select_option("select[name='action']", "reject_gates")
    page.click("button[name='index'], input[name='index']")
    page.wait_for_selector("#conveyor-confirm")
    page.click("#conveyor-confirm-yes")
    page.wait_for_selector("ul.messagelist")
    assert Job.objects.get(pk=gate_of["reject"]).state == "failed"
    assert Job.objects.get(pk=int(reject[1].id)).state == "cancelled"
    # Any signal, with a payload: the form, a bad payload refused, then a confirmation.
    page.goto(
        live_server.url + reverse("admin:conveyor_waitinggate_signal", args=[gate_of["webhook"]])
    )
    page.fill("#id_payload", "{not json")
    page.click("#conveyor-signal-preview")
    assert "not valid JSON" in page.inner_text("#conveyor-signal")
    page.fill("#id_payload", '{"charge": "ch_1"}')
    page.click("#conveyor-signal-preview")
    page.wait_for_selector("#conveyor-signal-payload")
    assert Job.objects.get(pk=gate_of["webhook"]).state == "blocked"
    page.click("#conveyor-confirm-yes")
    page.wait_for_selector("ul.messagelist")
    assert Job.objects.get(pk=gate_of["webhook"]).return_value == {"charge": "ch_1"}
    messages = set(LogEntry.objects.values_list("object_id", "change_message"))
    assert (str(gate_of["approve"]), "Approved (signal sent).") in messages
    assert (str(gate_of["reject"]), "Rejected (signal refused).") in messages
    assert (str(gate_of["webhook"]), "Signal 'paid' sent.") in messages
    # The workflow graph draws the gate and what it waited for.
    page.goto(live_server.url + reverse("admin:conveyor_job_workflow", args=[gate_of["webhook"]]))
    node = page.locator(f".conveyor-gate[data-job='{gate_of['webhook']}']")
    assert node.get_attribute("data-waits") == "signal “paid”"
    shot(page, "workflow-with-gate")


def test_the_waiting_page_needs_the_operate_permission(chromium, live_server):
    from django.contrib.auth.models import Permission

    from django_conveyor import workflows
    from django_conveyor.workflows import chain

    [gate] = chain(workflows.signal("approval")).enqueue()
    viewer = User.objects.create_user("viewer", password=PASSWORD, is_staff=True)
    viewer.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_job", "view_waitinggate"])
    )
    page = chromium.new_page()
    page.goto(live_server.url + reverse("admin:login"))
    page.fill("#id_username", "viewer")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.goto(live_server.url + reverse("admin:conveyor_waitinggate_changelist"))
    assert page.locator("select[name='action']").count() == 0  # No approve / reject for it.
    response = page.goto(
        live_server.url + reverse("admin:conveyor_waitinggate_signal", args=[int(gate.id)])
    )
    assert response.status == 403
    assert Job.objects.get(pk=int(gate.id)).state == "blocked"
    page.close()


def test_the_search_box_takes_the_syntax_and_tags_link_to_their_search(page, live_server):
    wanted = JobFactory(tags=["tenant:42", "import"], kwargs={"customer_id": 42})
    JobFactory(tags=["tenant:4"], kwargs={"customer_id": 42})
    JobFactory(kwargs={"customer_id": 7})
    jobs = live_server.url + reverse("admin:conveyor_job_changelist")
    page.goto(jobs)
    assert "tag:tenant:42" in page.inner_text("#searchbar_helptext")
    page.fill("#searchbar", "tag:tenant:42 kwargs.customer_id:42")
    page.press("#searchbar", "Enter")
    page.wait_for_url("**q=tag*")
    assert page.locator("#result_list tbody tr").count() == 1
    assert page.inner_text("#result_list tbody tr .field-id") == str(wanted.id)
    shot(page, "search")

    page.fill("#searchbar", "")
    page.press("#searchbar", "Enter")
    page.wait_for_url(jobs + "?q=")
    page.click("#result_list a.conveyor-tag:text-is('import')")
    page.wait_for_url("**q=tag*import*")
    assert page.locator("#result_list tbody tr").count() == 1

    page.fill("#searchbar", "colour:blue")
    page.press("#searchbar", "Enter")
    page.wait_for_selector("ul.messagelist .error")
    assert "Unknown search field 'colour'" in page.inner_text("ul.messagelist")
    assert page.locator("#result_list tbody tr").count() == 0


def test_progress_of_a_real_workers_job_on_its_page_and_the_dashboard(page, live_server, tmp_path):
    from tests.helpers import kill_group, start_worker, stop_process
    from tests.testapp import observe_tasks

    release = tmp_path / "release"
    job_id = int(observe_tasks.reports_progress.enqueue(4, str(release)).id)
    proc = start_worker("--queues", "default", log=tmp_path / "worker.log")
    try:
        wait_until(lambda: Job.objects.get(pk=job_id).progress is not None, timeout=30)
        page.goto(live_server.url + reverse("admin:conveyor_job_change", args=[job_id]))
        report = page.inner_text(".field-progress_bar .conveyor-progress-report")
        assert "100%" in report and "4 of 4: step 4" in report and "attempt 1" in report
        assert page.get_attribute(".field-progress_bar progress", "value") == "100"
        shot(page, "job-progress")
        page.goto(live_server.url + reverse("admin:conveyor_dashboard_changelist"))
        row = page.locator(f"#conveyor-running tr[data-job='{job_id}']")
        assert "4 of 4: step 4" in row.inner_text()
        assert row.locator("progress").get_attribute("value") == "100"
        shot(page, "dashboard-running")
        release.touch()
        wait_until(lambda: Job.objects.get(pk=job_id).state == "completed", timeout=30)
        assert stop_process(proc) == 0
    finally:
        kill_group(proc)


def test_set_a_queues_limits_on_its_page_and_see_them_in_the_list(page, live_server):
    from django_conveyor import limits
    from django_conveyor.models import Queue

    page.goto(live_server.url + reverse("admin:conveyor_queue_changelist"))  # makes the rows
    page.goto(live_server.url + reverse("admin:conveyor_queue_change", args=["emails"]))
    page.fill("#id_concurrency", "3")
    page.fill("#id_rate", "ten a minute")
    page.click("input[name='_save']")
    page.wait_for_selector(".errorlist")
    assert "rate must be a number of starts" in page.inner_text(".field-rate")
    shot(page, "queue-limits-refused")
    assert limits.of(Queue.objects.get(name="emails")) == limits.Limits()
    page.fill("#id_rate", "10/m")
    page.check("#id_fair")
    page.click("input[name='_save']")
    page.wait_for_selector("ul.messagelist")
    row = page.inner_text("#result_list tr:has(a:text-is('emails')) .field-limits")
    assert row == "concurrency 3, rate 10/m, fair"
    shot(page, "queue-limits")
