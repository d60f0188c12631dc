"""Settings for the admin scale benchmark: the test settings on a database of its own."""

import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES

DATABASES = {"default": {**DATABASES["default"]}}
DATABASES["default"]["NAME"] = os.environ.get("CONVEYOR_BENCH_DB", "conveyor_admin_bench")
QUEUES = ["default", "emails", "payments", "reports", "webhooks", "imports", "exports", "search"]
TASKS = {"default": {"BACKEND": "django_conveyor.backend.ConveyorBackend", "QUEUES": QUEUES}}
CONVEYOR = {"LEASE_SECONDS": 30.0}
STATIC_URL = "static/"
