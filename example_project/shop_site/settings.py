"""Settings for the example shop.

Configured from the environment with django-environ. With `DATABASE_URL`
set, that PostgreSQL is used; without it, django-conveyor starts (or reuses)
an embedded PostgreSQL in `$CONVEYOR_DATA_DIR` (the scripts set it), else in
`var/pg-example` at the repository root, so a fresh machine needs only Python.
"""

import os
from pathlib import Path

import environ

from django_conveyor.embedded import database_url

BASE_DIR = Path(__file__).resolve().parent.parent  # example_project/
VAR_DIR = BASE_DIR.parent / "var"

env = environ.Env()

# A fixed key is fine for a local demo; set SECRET_KEY anywhere else.
SECRET_KEY = env.str("SECRET_KEY", default="example-shop-demo-key-not-for-production")
DEBUG = env.bool("DEBUG", default=True)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])

DATA_DIR = os.environ.get("CONVEYOR_DATA_DIR") or VAR_DIR / "pg-example"
DATABASES = {"default": env.db_url_config(database_url(DATA_DIR))}
# Keep connections between requests, as a deployed site would (the API pays
# for a new PostgreSQL connection on every request otherwise).
DATABASES["default"]["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_conveyor",
    "shop",
]
try:  # Django 6.x ships django.tasks; on 5.2 the backport is an app of its own.
    import django.tasks  # noqa: F401
except ImportError:
    INSTALLED_APPS.append("django_tasks")

TASKS = {
    "default": {
        "BACKEND": "django_conveyor.backend.ConveyorBackend",
        "QUEUES": ["default", "emails", "payments"],
    }
}
# Every key has a default; these are spelled out to show where they go.
CONVEYOR = {
    "LEASE_SECONDS": 30.0,
    "SHUTDOWN_TIMEOUT_SECONDS": 10.0,
    # Periodic jobs (docs/cron.md): every worker schedules them, one job per tick.
    "CRON": {
        "nightly-stock-report": {
            "schedule": "0 3 * * *",
            "task": "shop.tasks.nightly_stock_report",
            "timezone": "Europe/Berlin",
            "missed": "latest",  # after downtime: one catch-up run, not one per night
        },
    },
    # The HTTP API (conveyor/api/) may enqueue these two tasks, and no other.
    "API_TASKS": ["shop.tasks.send_receipt", "shop.tasks.flaky_sync"],
    # Prometheus on this machine may scrape conveyor/metrics without a key.
    "METRICS_ALLOWED_ADDRESSES": env.list("METRICS_ALLOWED_ADDRESSES", default=["127.0.0.1"]),
}
# The demo's API key (manage.py demo creates it). A fixed key is fine for a
# local demo only; anywhere else, create keys with manage.py conveyor_api_key.
SHOP_DEMO_API_KEY = env.str(
    "SHOP_DEMO_API_KEY", default="cvk_demo0000_conveyor-demo-key-not-for-production"
)

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "shop_site.urls"
WSGI_APPLICATION = "shop_site.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Receipts are written as files instead of being sent, so the demo needs no
# mail server. Set EMAIL_BACKEND (and the usual EMAIL_* settings) to send them.
EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="django.core.mail.backends.filebased.EmailBackend")
EMAIL_FILE_PATH = env.str("EMAIL_FILE_PATH", default=str(VAR_DIR / "example-mail"))
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="shop@example.com")

# The fake payment gateway (shop/gateway.py) can drop the reply to each new
# charge, as a network can, to show a retry reusing the idempotency key.
SHOP_GATEWAY_DROP_FIRST_REPLY = env.bool("SHOP_GATEWAY_DROP_FIRST_REPLY", default=False)

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
