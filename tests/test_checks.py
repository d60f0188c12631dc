"""System checks: bad configuration fails at start-up with a message naming it."""

import pytest
from django.core import checks
from django.test import override_settings

from django_conveyor.checks import check_database, check_settings

pytestmark = pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")


def errors(check) -> list[str]:
    return [m.msg for m in check() if m.level >= checks.ERROR]


def test_defaults_pass():
    assert errors(check_settings) == []
    assert errors(check_database) == []


@override_settings(
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
)
def test_non_postgresql_database_is_refused():
    assert errors(check_database) == [
        "django-conveyor needs PostgreSQL, but DATABASES['default'] uses "
        "'django.db.backends.sqlite3'."
    ]


@pytest.mark.parametrize(
    ("conveyor", "message"),
    [
        ({"LEASE_SECONDS": "30"}, "CONVEYOR['LEASE_SECONDS'] must be int or float, not str '30'."),
        ({"LEASE_SECONDS": 0}, "CONVEYOR['LEASE_SECONDS'] must be more than 0, not 0."),
        ({"MAX_ATTEMPTS": 0}, "CONVEYOR['MAX_ATTEMPTS'] must be 1 or more, not 0."),
        ({"MAX_ATTEMPTS": True}, "CONVEYOR['MAX_ATTEMPTS'] must be int, not bool True."),
        ({"LEASE": 3}, "CONVEYOR['LEASE'] is not a setting of django-conveyor."),
        ({"DATABASE": "other"}, "CONVEYOR['DATABASE'] names 'other', which is not in DATABASES."),
        ({"LISTEN": "no"}, "CONVEYOR['LISTEN'] must be bool, not str 'no'."),
        (
            {"LEASE_SECONDS": 10, "HEARTBEAT_SECONDS": 6},
            "CONVEYOR['HEARTBEAT_SECONDS'] (6) must be at most half of CONVEYOR['LEASE_SECONDS'] "
            "(10), or one late heartbeat loses the lease.",
        ),
    ],
)
def test_bad_settings_name_the_key(conveyor, message):
    with override_settings(CONVEYOR=conveyor):
        assert message in errors(check_settings)


def test_conveyor_must_be_a_dict():
    with override_settings(CONVEYOR=["LEASE_SECONDS"]):
        assert errors(check_settings) == ["CONVEYOR must be a dict, not list."]


def test_checks_run_through_the_framework():
    with override_settings(
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
    ):
        ids = {m.id for m in checks.run_checks()}
    assert "conveyor.E020" in ids
