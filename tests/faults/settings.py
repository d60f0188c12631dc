"""Django settings for the fault harness's worker processes and its own checks.

The harness starts its own PostgreSQL and passes its address in the
environment: `CONVEYOR_FAULTS_PG_PORT` is where workers connect (the fault
proxy's port in the `network` scenario, the server's port otherwise).
Leases are short so that every injected fault resolves within seconds.

The failover experiment (tests/ha/) points them at every node of a cluster
instead: `CONVEYOR_FAULTS_PG_HOST` and `_PORT` list the nodes (libpq's
multi-host form), `CONVEYOR_FAULTS_PG_NAME` names the database, and
`CONVEYOR_FAULTS_FOLLOW_PRIMARY` adds the settings docs/worker.md gives for
following a primary (read-write sessions only, keepalives, a TCP timeout).
"""

import os

SECRET_KEY = "fault-harness-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("CONVEYOR_FAULTS_PG_NAME", "postgres"),
        "USER": "postgres",
        "HOST": os.environ.get("CONVEYOR_FAULTS_PG_HOST", "127.0.0.1"),
        "PORT": os.environ.get("CONVEYOR_FAULTS_PG_PORT", "5432"),
        "CONN_MAX_AGE": 0,
        # A dead server or a dropped proxy connection must fail fast, not hang.
        "OPTIONS": {"connect_timeout": 3, "application_name": "conveyor-faults"},
    }
}
if os.environ.get("CONVEYOR_FAULTS_FOLLOW_PRIMARY"):
    DATABASES["default"]["OPTIONS"].update(
        {
            "target_session_attrs": "read-write",  # Skip standbys and demoted primaries.
            # A cut-off server answers nothing: notice within seconds, not minutes.
            "keepalives_idle": 2,
            "keepalives_interval": 1,
            "keepalives_count": 3,
            "tcp_user_timeout": 5000,  # Milliseconds.
        }
    )
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# Behind PgBouncer in transaction mode (run.py --pgbouncer): the tested
# configuration of docs/worker.md; the listener's direct DSN, if any, below.
if os.environ.get("CONVEYOR_FAULTS_POOLER"):
    DATABASES["default"]["PASSWORD"] = os.environ.get("CONVEYOR_FAULTS_PG_PASSWORD", "")
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True

INSTALLED_APPS = ["django_conveyor", "tests.testapp"]
try:  # Django 5.2: the backport is an app of its own.
    import django.tasks  # noqa: F401
except ImportError:
    INSTALLED_APPS.append("django_tasks")

QUEUE = "faults"
TASKS = {
    "default": {
        "BACKEND": "django_conveyor.backend.ConveyorBackend",
        # Any queue name: the `poison` scenario's handlers live in tests.testapp
        # (queue "default"); the workers serve QUEUE alone (--queues, workers.py).
        "QUEUES": [],
    }
}

LEASE_SECONDS = 2.0
CONVEYOR = {
    "LEASE_SECONDS": LEASE_SECONDS,
    "HEARTBEAT_SECONDS": 0.5,
    "REAP_SECONDS": 0.5,
    "POLL_SECONDS": 0.2,
    "SHUTDOWN_TIMEOUT_SECONDS": 5.0,
    "BACKOFF_BASE_SECONDS": 0.05,
    "BACKOFF_CAP_SECONDS": 0.5,
    # Infrastructure faults cost attempts (each restart or drop fails the
    # attempts in flight); the pass criterion is that every job completes.
    "MAX_ATTEMPTS": 100,
    # The `limits` scenario's queues (tests/faults/limits.py); workers of the
    # other scenarios serve QUEUE alone, so these rows only sit in conveyor_queue.
    "QUEUES": {
        "faults-concurrency": {"concurrency": 5},  # Below the runs' slots: the limit binds.
        "faults-keyed": {"key_concurrency": 1, "fair": True},
        "faults-rate": {"rate": "8/s"},
    },
}
# The failover run: a tick every second, each an ordinary job of the fault
# handler (an effect, a ledger entry), so the scheduler is checked too.
if os.environ.get("CONVEYOR_FAULTS_CRON"):
    CONVEYOR["CRON"] = {
        "ha-tick": {
            "schedule": "* * * * * *",
            "task": "tests.faults.tasks.apply_effect",
            "args": [0, 0],
            "queue": QUEUE,
        }
    }
if os.environ.get("CONVEYOR_FAULTS_LISTENER_DSN"):
    CONVEYOR["LISTENER_DSN"] = os.environ["CONVEYOR_FAULTS_LISTENER_DSN"]
