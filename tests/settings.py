"""Settings for the test suite: a real PostgreSQL, never a mock.

With DATABASE_URL set the suite uses that server; otherwise it starts the
embedded PostgreSQL in `var/` (DESIGN §7).
"""

import os
from pathlib import Path

import environ

from django_conveyor.embedded import database_url

REPO = Path(__file__).resolve().parent.parent
DATA_DIR = os.environ.get("CONVEYOR_DATA_DIR") or str(REPO / "var" / "pg-tests")

DATABASES = {"default": environ.Env.db_url_config(database_url(DATA_DIR))}
DATABASES["default"]["TEST"] = {"NAME": os.environ.get("CONVEYOR_TEST_DB", "conveyor_test")}
# A second database on the same server: the queue "other" is sharded there.
DATABASES["shard"] = {
    **DATABASES["default"],
    "NAME": "conveyor_shard",
    "TEST": {"NAME": DATABASES["default"]["TEST"]["NAME"] + "_shard"},
}

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "static/"  # The live server needs one.

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",  # The browser tests' live server serves the admin's CSS.
    "django_conveyor",
    "tests.testapp",
]
try:  # Django 5.2: the backport is an app of its own.
    import django.tasks  # noqa: F401
except ImportError:
    INSTALLED_APPS.append("django_tasks")

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

TASKS = {
    "default": {
        "BACKEND": "django_conveyor.backend.ConveyorBackend",
        "QUEUES": ["default", "emails", "slow", "other"],
    }
}
CONVEYOR = {
    "LEASE_SECONDS": 30.0,
    "HEARTBEAT_SECONDS": 2.0,
    "POLL_SECONDS": 0.2,
    "REAP_SECONDS": 0.5,
    "BACKOFF_BASE_SECONDS": 0.05,
    "BACKOFF_CAP_SECONDS": 0.2,
    "QUEUE_DATABASES": {"other": "shard"},
    # The HTTP API may enqueue these; every other task (always_fails, ...) is refused.
    "API_TASKS": [
        "tests.testapp.tasks.add",
        "tests.testapp.tasks.send_email",
        "tests.testapp.tasks.apply_once",
        "tests.testapp.tasks.fails_*",
        "tests.testapp.observe_tasks.tagged",
    ],
}

# A worker process may be given other CONVEYOR values (JSON; NaN allowed), as
# a test of what a process that skips the system checks does with them.
if os.environ.get("CONVEYOR_TEST_CONVEYOR_JSON"):
    import json

    CONVEYOR.update(json.loads(os.environ["CONVEYOR_TEST_CONVEYOR_JSON"]))

# Worker processes started by the tests connect to the test database by name.
if os.environ.get("CONVEYOR_DB_NAME"):
    DATABASES["default"]["NAME"] = os.environ["CONVEYOR_DB_NAME"]
if os.environ.get("CONVEYOR_SHARD_DB_NAME"):
    DATABASES["shard"]["NAME"] = os.environ["CONVEYOR_SHARD_DB_NAME"]

# Behind PgBouncer in transaction mode (tests/pgbouncer/run.py sets these):
# the configuration docs/worker.md documents as tested. DATABASE_URL then
# points at PgBouncer and CONVEYOR_TEST_DIRECT_DSN at the server itself.
POOLER = os.environ.get("CONVEYOR_TEST_POOLER")  # "poll-only" or "listener-dsn"
if POOLER:
    from psycopg.conninfo import make_conninfo

    for alias in DATABASES.values():
        alias["DISABLE_SERVER_SIDE_CURSORS"] = True
    if POOLER == "poll-only":
        CONVEYOR["LISTEN"] = False
    else:
        # NOTIFY reaches listeners of its own database: the test database.
        name = os.environ.get("CONVEYOR_DB_NAME") or DATABASES["default"]["TEST"]["NAME"]
        direct = os.environ["CONVEYOR_TEST_DIRECT_DSN"]
        CONVEYOR["LISTENER_DSN"] = make_conninfo(direct, dbname=name)
