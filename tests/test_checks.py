"""System checks: bad configuration fails at start-up with a message naming it."""

import re

import pytest
from django.core import checks
from django.test import override_settings

from django_conveyor import bounds, conf
from django_conveyor.checks import check_database, check_settings
from django_conveyor.exceptions import ConveyorConfigurationError
from tests.helpers import REPO

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


# -- the declaration: every key, from conf.SETTINGS --------------------------------

DECLARED = sorted(conf.SETTINGS.values(), key=lambda s: s.name)
NUMBERS = [s for s in DECLARED if float in s.types or int in s.types]
BOUNDED = [s for s in DECLARED if s.minimum is not None]


def messages_by_id(conveyor) -> list[tuple[str, str]]:
    with override_settings(CONVEYOR=conveyor):
        return [(m.id, m.msg) for m in check_settings() if m.level >= checks.ERROR]


@pytest.mark.parametrize("setting", DECLARED, ids=lambda s: s.name)
def test_every_key_refuses_a_bad_type_with_e003(setting):
    assert messages_by_id({setting.name: {"x"}}) == [  # No key takes a set.
        (
            "conveyor.E003",
            f"CONVEYOR[{setting.name!r}] must be "
            f"{' or '.join('None' if t is type(None) else t.__name__ for t in setting.types)}, "
            "not set {'x'}.",
        )
    ]


@pytest.mark.parametrize("setting", NUMBERS, ids=lambda s: s.name)
def test_every_number_refuses_a_bool_with_e003(setting):
    [(check_id, msg)] = messages_by_id({setting.name: True})
    assert check_id == "conveyor.E003"
    assert msg.startswith(f"CONVEYOR[{setting.name!r}] must be ")
    assert msg.endswith("not bool True.")


@pytest.mark.parametrize("setting", [s for s in NUMBERS if float in s.types], ids=lambda s: s.name)
def test_every_duration_refuses_nan_with_e004(setting):
    [(check_id, msg)] = messages_by_id({setting.name: float("nan")})
    assert check_id == "conveyor.E004"
    assert msg.startswith(f"CONVEYOR[{setting.name!r}] must be ")
    assert msg.endswith("not nan.")


@pytest.mark.parametrize("value", [float("inf"), 1e300, bounds.MAX_SECONDS + 1])
@pytest.mark.parametrize("setting", [s for s in NUMBERS if float in s.types], ids=lambda s: s.name)
def test_every_duration_refuses_what_postgresql_cannot_add_to_now(setting, value):
    assert messages_by_id({setting.name: value}) == [
        (
            "conveyor.E004",
            f"CONVEYOR[{setting.name!r}] must be at most 315360000 seconds (ten years), "
            f"not {value!r}.",
        )
    ]
    with (
        override_settings(CONVEYOR={setting.name: value}),
        pytest.raises(ConveyorConfigurationError),
    ):
        conf.conveyor_settings()  # refused without the checks too


def test_maximums_are_declared():
    maximums = {s.name: s.maximum for s in DECLARED if s.maximum is not None}
    seconds = {s.name for s in NUMBERS if float in s.types}
    assert maximums == dict.fromkeys(seconds, bounds.MAX_SECONDS) | {
        "MAX_ATTEMPTS": 2**31 - 1,
        "PREFETCH": 2**31 - 1,
        "SEARCH_SCAN_ROWS": 2**31 - 1,
        "VACUUM_DEAD_ROWS": 2**31 - 1,
    }
    with override_settings(CONVEYOR={"MAX_ATTEMPTS": 2**31}):
        assert errors(check_settings) == [
            "CONVEYOR['MAX_ATTEMPTS'] must be at most 2147483647, not 2147483648."
        ]


@pytest.mark.parametrize("setting", BOUNDED, ids=lambda s: s.name)
def test_every_bound_refuses_the_value_past_it_with_e004(setting):
    value = int(setting.minimum) if setting.exclusive else int(setting.minimum) - 1
    bound = (
        f"more than {setting.minimum:g}" if setting.exclusive else f"{setting.minimum:g} or more"
    )
    assert messages_by_id({setting.name: value}) == [
        (setting.bound_id, f"CONVEYOR[{setting.name!r}] must be {bound}, not {value}.")
    ]
    refused = pytest.raises(ConveyorConfigurationError, match=re.escape(f"[{setting.name!r}]"))
    with override_settings(CONVEYOR={setting.name: value}), refused:
        conf.conveyor_settings()  # refused without the checks too


def test_bounds_are_declared_not_read_from_key_names():
    bounds = {s.name: (s.minimum, s.exclusive) for s in BOUNDED}
    assert bounds == {
        "LEASE_SECONDS": (0, True),
        "HEARTBEAT_SECONDS": (0, True),
        "POLL_SECONDS": (0, True),
        "REAP_SECONDS": (0, True),
        "GATES_SECONDS": (0, True),
        "SHUTDOWN_TIMEOUT_SECONDS": (0, False),
        "MAX_ATTEMPTS": (1, False),
        "BACKOFF_BASE_SECONDS": (0, True),
        "BACKOFF_CAP_SECONDS": (0, True),
        "PREFETCH": (0, False),
        "RETENTION_SECONDS": (0, True),
        "API_MAX_BODY_BYTES": (1, False),
        "SEARCH_SCAN_ROWS": (1000, False),
        "VACUUM_DEAD_ROWS": (1000, False),
    }
    ids = {s.name: s.bound_id for s in BOUNDED}
    assert ids == dict.fromkeys(bounds, "conveyor.E004") | {"API_MAX_BODY_BYTES": "conveyor.E032"}


@override_settings(CONVEYOR={s.name: 3 for s in DECLARED if s.name.endswith("_SECONDS")})
def test_every_duration_is_converted_to_float():
    values = conf.conveyor_settings()
    for setting in DECLARED:
        if setting.name.endswith("_SECONDS"):
            value = getattr(values, setting.name)
            assert (type(value), value) == (float, 3.0), setting.name


def test_defaults_are_the_documented_ones():
    with override_settings(CONVEYOR={}):
        values = conf.conveyor_settings()
        assert {s.name: getattr(values, s.name) for s in DECLARED} == {
            "API_MAX_BODY_BYTES": 65536,
            "API_TASKS": (),
            "BACKOFF_BASE_SECONDS": 1.0,
            "BACKOFF_CAP_SECONDS": 600.0,
            "CRON": {},
            "DATABASE": "default",
            "GATES_SECONDS": 1.0,
            "HEARTBEAT_SECONDS": 10.0,
            "JOB_LOG_LEVEL": 30,  # "WARNING", as logging's number
            "LEASE_SECONDS": 30.0,
            "LISTEN": True,
            "LISTENER_DSN": None,
            "MAX_ATTEMPTS": 5,
            "METRICS_ALLOWED_ADDRESSES": (),
            "NOTIFY": True,
            "POLL_SECONDS": 1.0,
            "PREFETCH": None,
            "QUEUE_DATABASES": {},
            "QUEUES": {},
            "REAP_SECONDS": 5.0,
            "RETENTION_SECONDS": 604800.0,
            "SEARCH_SCAN_ROWS": 25000,
            "SHUTDOWN_TIMEOUT_SECONDS": 30.0,
            "TRACING": True,
            "VACUUM_DEAD_ROWS": 50000,
        }


def test_every_key_is_in_the_configuration_page():
    page = (REPO / "docs" / "configuration.md").read_text()
    for setting in DECLARED:
        assert f"| `{setting.name}` |" in page, setting.name


BAD_ONE_EACH = {
    "conveyor.E001": ["LEASE_SECONDS"],
    "conveyor.E002": {"LEASE": 3},
    "conveyor.E003": {"LISTEN": "no"},
    "conveyor.E004": {"LEASE_SECONDS": 0},
    "conveyor.E005": {"DATABASE": "other"},
    "conveyor.E006": {"LEASE_SECONDS": 10, "HEARTBEAT_SECONDS": 6},
    "conveyor.E007": {"QUEUE_DATABASES": {"emails": 1}},
    "conveyor.E008": {"QUEUE_DATABASES": {"emails": "nowhere"}},
    "conveyor.E009": {"JOB_LOG_LEVEL": "LOUD"},
}


@pytest.mark.parametrize(("check_id", "conveyor"), BAD_ONE_EACH.items())
def test_each_check_id_has_one_message_and_a_hint(check_id, conveyor):
    with override_settings(CONVEYOR=conveyor):
        [message] = [m for m in check_settings() if m.level >= checks.ERROR]
    assert message.id == check_id
    assert message.hint


def test_queue_database_entries_and_aliases_have_their_own_ids():
    assert messages_by_id({"QUEUE_DATABASES": {"emails": 1}}) == [
        (
            "conveyor.E007",
            "CONVEYOR['QUEUE_DATABASES'] must map queue names to database aliases (strings), "
            "not 'emails': 1.",
        )
    ]
    assert messages_by_id({"QUEUE_DATABASES": {"emails": "nowhere"}}) == [
        (
            "conveyor.E008",
            "CONVEYOR['QUEUE_DATABASES']['emails'] names 'nowhere', which is not in DATABASES.",
        )
    ]


@pytest.mark.parametrize(
    "addresses",
    [["0.0.0.0/0"], ["::/0"], ["10.0.0.5", "0.0.0.0/1", "128.0.0.0/1"], ["0.0.0.0/0", "::/0"]],
)
def test_metrics_open_to_every_address_is_a_warning(addresses):
    from django_conveyor.api.checks import check_api_settings

    with override_settings(CONVEYOR={"METRICS_ALLOWED_ADDRESSES": addresses}):
        found = [m for m in check_api_settings() if m.id == "conveyor.W034"]
    assert len(found) == 1, found
    assert isinstance(found[0], checks.Warning)
    assert "every" in found[0].msg and "METRICS_ALLOWED_ADDRESSES" in found[0].msg


def test_metrics_open_to_a_network_is_no_warning():
    from django_conveyor.api.checks import check_api_settings

    with override_settings(CONVEYOR={"METRICS_ALLOWED_ADDRESSES": ["10.0.0.0/8", "::1"]}):
        assert [m for m in check_api_settings() if m.id == "conveyor.W034"] == []
