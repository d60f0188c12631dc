"""CONVEYOR["CRON"]: every bad input is a system check error; settings sync across starts."""

from datetime import timedelta

import pytest
from django.core import checks
from django.test import override_settings

from django_conveyor.checks import check_cron
from django_conveyor.models import Cron
from django_conveyor.periodic import expressions, schedules
from tests.helpers import run_burst

TASK = "tests.testapp.tasks.nightly_report"
GOOD = {"schedule": "0 3 * * *", "task": TASK, "timezone": "Europe/Berlin"}
KEY = "CONVEYOR['CRON']['nightly']"


def cron_errors(cron) -> list[tuple[str, str]]:
    with override_settings(CONVEYOR={"CRON": cron}):
        return [(m.id, m.msg) for m in check_cron() if m.level >= checks.ERROR]


def test_a_good_schedule_passes():
    assert cron_errors({"nightly": GOOD}) == []
    assert cron_errors({}) == []


@pytest.mark.parametrize(
    ("change", "check_id", "message"),
    [
        (
            {"schedule": "61 3 * * *"},
            "conveyor.E104",
            f"{KEY}['schedule']: '61 3 * * *' is not a cron expression: Bad minute.",
        ),
        (
            {"schedule": "0 0 31 2 *"},
            "conveyor.E104",
            f"{KEY}['schedule']: '0 0 31 2 *' is not a cron expression: Bad day-of-month.",
        ),
        (
            {"timezone": "Mars/Olympus"},
            "conveyor.E105",
            f"{KEY}['timezone']: 'Mars/Olympus' is not a known IANA time zone.",
        ),
        (
            {"task": "nowhere.tasks.nightly"},
            "conveyor.E106",
            f"{KEY}['task']: 'nowhere.tasks.nightly' does not import: "
            "ModuleNotFoundError: No module named 'nowhere'.",
        ),
        (
            {"task": "tests.testapp.tasks.not_a_task"},
            "conveyor.E106",
            f"{KEY}['task']: 'tests.testapp.tasks.not_a_task' is not a task "
            "(decorate it with @task).",
        ),
        (
            {"queue": "reports"},
            "conveyor.E107",
            f"{KEY}['queue']: 'reports' is not a queue of task backend 'default' "
            "(its QUEUES: default, emails, other, slow).",
        ),
        (
            {"priority": 101},
            "conveyor.E108",
            f"{KEY}['priority']: Must be a whole number from -100 to 100, not 101.",
        ),
        (
            {"missed": "sometimes"},
            "conveyor.E109",
            f"{KEY}['missed']: Must be one of latest, all, skip, not 'sometimes'.",
        ),
        (
            {"args": [{1, 2}]},
            "conveyor.E110",
            f"{KEY}['args']: args[0] is not JSON-serializable: set value {{1, 2}}. Task "
            "arguments and return values must survive a JSON round trip; pass ids or plain "
            "data instead.",
        ),
        (
            {"kwargs": {"ratio": float("nan")}},
            "conveyor.E110",
            f"{KEY}['kwargs']: kwargs['ratio'] is nan, which JSON cannot represent "
            "(only finite numbers)",
        ),
        ({"kwargs": [1]}, "conveyor.E110", f"{KEY}['kwargs']: Must be a dict, not [1]."),
        (
            {"every": "day"},
            "conveyor.E103",
            f"{KEY}['every']: Not a field of a schedule (fields: schedule, task, timezone, "
            "args, kwargs, queue, priority, missed).",
        ),
    ],
)
def test_each_bad_input_has_its_check_id_and_names_schedule_and_field(change, check_id, message):
    [(found_id, found)] = cron_errors({"nightly": {**GOOD, **change}})
    assert found_id == check_id
    assert found.removesuffix(": nan.").removesuffix(".") == message.removesuffix(".")


def test_missing_fields_bad_names_and_bad_entries():
    assert cron_errors({"nightly": {"task": TASK}}) == [
        ("conveyor.E103", f"{KEY}['schedule']: Is required.")
    ]
    assert cron_errors({"bad name!": GOOD}) == [
        (
            "conveyor.E101",
            "CONVEYOR['CRON']['bad name!']: A schedule name is 1 to 100 letters, digits, '.', "
            "'_' or '-', starting with a letter or digit, not 'bad name!'.",
        )
    ]
    assert cron_errors({"nightly": "0 3 * * *"}) == [
        ("conveyor.E102", f"{KEY}: Must be a dict, not '0 3 * * *'.")
    ]


def test_cron_that_is_not_a_dict_is_a_settings_error():
    from django_conveyor.checks import check_settings

    with override_settings(CONVEYOR={"CRON": ["nightly"]}):
        assert "CONVEYOR['CRON'] must be dict, not list ['nightly']." in [
            m.msg for m in check_settings()
        ]


def test_schedules_without_cronsim_are_one_clear_error(monkeypatch):
    def missing():
        raise expressions.CronNotInstalled("no cronsim")

    monkeypatch.setattr(expressions, "_cronsim", missing)
    assert cron_errors({"nightly": GOOD}) == [
        (
            "conveyor.E100",
            "CONVEYOR['CRON'] declares 1 schedule(s), but the cronsim package is not installed.",
        )
    ]


def test_checks_run_through_the_framework():
    with override_settings(CONVEYOR={"CRON": {"nightly": {**GOOD, "timezone": "Nowhere"}}}):
        assert "conveyor.E105" in {m.id for m in checks.run_checks()}


@pytest.mark.django_db(transaction=True, databases=["default", "shard"])
class TestSettingsSync:
    """Each run_burst() is a worker start: it syncs CONVEYOR["CRON"] before its first pass."""

    def start(self, cron):
        with override_settings(CONVEYOR={"CRON": cron, "POLL_SECONDS": 0.05}):
            run_burst()

    def test_add_change_and_remove_across_worker_starts(self):
        self.start({"nightly": GOOD})
        row = Cron.objects.get(name="nightly")
        assert (row.declared, row.enabled, row.schedule, row.queue, row.priority) == (
            True, True, "0 3 * * *", "emails", 5
        )  # fmt: skip
        first_next = row.next_tick_at
        assert first_next.astimezone(expressions.zone("Europe/Berlin")).hour == 3

        self.start({"nightly": {**GOOD, "kwargs": {"full": True}}})
        row.refresh_from_db()
        assert (row.kwargs, row.next_tick_at) == ({"full": True}, first_next)

        self.start({"nightly": {**GOOD, "schedule": "30 4 * * *"}})
        row.refresh_from_db()
        assert row.schedule == "30 4 * * *"
        assert row.next_tick_at.astimezone(expressions.zone("Europe/Berlin")).minute == 30

        Cron.objects.filter(pk=row.pk).update(last_tick_at=first_next, last_job_id=42)
        self.start({})
        row.refresh_from_db()  # kept with its history, disabled, no longer owned by settings
        assert (row.declared, row.enabled, row.last_job_id) == (False, False, 42)

        self.start({"nightly": GOOD})
        row.refresh_from_db()
        assert (row.declared, row.enabled, row.schedule) == (True, True, "0 3 * * *")
        assert Cron.objects.count() == 1

    def test_an_operators_disable_survives_a_restart(self):
        self.start({"nightly": GOOD})
        assert schedules.set_enabled("nightly", False)
        self.start({"nightly": GOOD})
        assert not Cron.objects.get(name="nightly").enabled

    def test_admin_rows_are_left_alone_and_adopted_by_name(self):
        Cron.objects.create(name="adhoc", schedule="* * * * *", task_path=TASK, queue="emails")
        self.start({})
        assert Cron.objects.get(name="adhoc").enabled
        self.start({"adhoc": GOOD})
        row = Cron.objects.get(name="adhoc")
        assert (row.declared, row.schedule) == (True, "0 3 * * *")

    def test_a_schedule_lives_in_the_database_of_its_queue(self):
        cron = {"sharded": {**GOOD, "queue": "other"}, "nightly": GOOD}
        with override_settings(CONVEYOR={"CRON": cron, "QUEUE_DATABASES": {"other": "shard"}}):
            assert schedules.sync("default") == schedules.SyncCounts(added=1)
            assert schedules.sync("shard") == schedules.SyncCounts(added=1)
        assert list(Cron.objects.values_list("name", flat=True)) == ["nightly"]
        assert list(Cron.objects.using("shard").values_list("name", flat=True)) == ["sharded"]

    def test_a_changed_zone_restarts_from_now(self):
        self.start({"nightly": GOOD})
        before = Cron.objects.get(name="nightly").next_tick_at
        self.start({"nightly": {**GOOD, "timezone": "America/New_York"}})
        after = Cron.objects.get(name="nightly").next_tick_at
        assert after - before in {timedelta(hours=h) for h in (5, 6, -18, -19)}
