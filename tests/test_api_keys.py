"""`conveyor_api_key create|list|revoke`, the key format and the settings checks."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_conveyor.api import keys
from django_conveyor.api.checks import check_api_settings
from django_conveyor.checks import check_settings
from django_conveyor.models import ApiKey, Job
from tests.factories import JobFactory
from tests.helpers import REPO, worker_env

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "shard"])


def test_create_prints_the_key_once_and_stores_its_hash(capsys):
    call_command("conveyor_api_key", "create", "billing", "--scopes", "read,enqueue")
    out, err = capsys.readouterr()
    raw = out.strip()
    key = ApiKey.objects.get()
    assert raw.startswith(f"cvk_{key.prefix}_") and len(raw) > 50
    assert "shown once" in err and raw not in err
    assert (key.name, key.scopes, key.secret_hash) == (
        "billing", ["enqueue", "read"], keys.hash_key(raw)
    )  # fmt: skip
    assert keys.authenticate(raw) == key

    call_command("conveyor_api_key", "list")
    listed = capsys.readouterr().out
    assert "billing" in listed and key.prefix in listed and raw not in listed

    call_command("conveyor_api_key", "revoke", "billing")
    assert "Revoked API key 'billing'" in capsys.readouterr().out
    assert keys.authenticate(raw) is None
    with pytest.raises(CommandError, match="No live API key"):
        call_command("conveyor_api_key", "revoke", "billing")


def test_revoke_by_prefix_and_reuse_a_name_after_revoking(capsys):
    key, _ = keys.create("svc", ["read"])
    call_command("conveyor_api_key", "revoke", key.prefix)
    keys.create("svc", ["read"])  # a revoked key frees its name
    with pytest.raises(ValueError, match="A live key named 'svc' exists"):
        keys.create("svc", ["read"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["create", "x", "--scopes", "read,admin"], "Unknown scope(s) admin"),
        (["create", "x", "--scopes", ","], "Give at least one scope"),
        (["create", "bad name", "--scopes", "read"], "A key name is 1 to 100"),
    ],
)
def test_create_refuses_bad_input(args, message):
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call_command("conveyor_api_key", *args)
    assert ApiKey.objects.count() == 0


def errors() -> list[str]:
    found = [*check_settings(), *check_api_settings()]  # A bound is declared with its key.
    return [m.msg for m in found if m.level >= checks.ERROR]


def test_the_test_settings_pass():
    assert errors() == []


@pytest.mark.parametrize(
    ("conveyor", "message"),
    [
        ({"API_TASKS": ["shop.*.send"]}, "CONVEYOR['API_TASKS']: 'shop.*.send' has a wildcard "
         "before its last part; name the module (wildcards match task names within it, as in "
         "'shop.tasks.*')."),
        ({"API_TASKS": ["send"]}, "CONVEYOR['API_TASKS']: 'send' is not a dotted task path "
         "such as 'shop.tasks.send_receipt'."),
        ({"API_TASKS": ["tests.testapp.tasks.nope"]}, "CONVEYOR['API_TASKS']: "
         "'tests.testapp.tasks.nope' cannot be imported: Module \"tests.testapp.tasks\" does "
         "not define a \"nope\" attribute/class."),
        ({"API_TASKS": ["tests.testapp.models.Effect"]}, "CONVEYOR['API_TASKS']: "
         "'tests.testapp.models.Effect' is not a task (decorate it with @task)."),
        ({"API_TASKS": ["tests.testapp.tasks.zz*"]}, "CONVEYOR['API_TASKS']: "
         "'tests.testapp.tasks.zz*' matches no task in tests.testapp.tasks."),
        ({"API_MAX_BODY_BYTES": 0}, "CONVEYOR['API_MAX_BODY_BYTES'] must be 1 or more, not 0."),
        ({"METRICS_ALLOWED_ADDRESSES": ["10.0.0.0/33"]}, "CONVEYOR['METRICS_ALLOWED_ADDRESSES'] "
         "holds '10.0.0.0/33', which is not an IP address or network."),
    ],
)  # fmt: skip
def test_bad_api_settings_are_refused(conveyor, message):
    with override_settings(CONVEYOR=conveyor):
        assert errors() == [message]


WITHOUT_EXTRAS = textwrap.dedent(
    """
    import atexit, sys
    from importlib.abc import MetaPathFinder

    OPTIONAL = ("ninja", "pydantic", "prometheus_client")

    class Missing(MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in OPTIONAL:
                raise ImportError(f"{name} is not installed (blocked by the test)")

    sys.meta_path.insert(0, Missing())
    import django
    django.setup()
    import django_conveyor.admin, django_conveyor.backend, django_conveyor.api.keys
    from django.core.management import call_command
    # The worker ends with sys.exit(0): report what was imported on the way out.
    loaded = lambda: [m for m in sys.modules if m.split(".")[0] in OPTIONAL]
    atexit.register(lambda: print("LOADED", loaded()))
    call_command("conveyor_worker", "--burst", "--queues", "default", "--poll-only")
    """
)


def test_the_core_and_the_worker_run_without_the_optional_extras():
    job = JobFactory()
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS],
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "LOADED []" in done.stdout
    assert Job.objects.get(pk=job.id).state == "completed"
