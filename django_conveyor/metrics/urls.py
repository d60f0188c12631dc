"""``path("conveyor/metrics", include("django_conveyor.metrics.urls"))`` mounts the scrape view."""

from django.urls import path

from . import process
from .scrape import metrics_view

process.install()  # the site counts its enqueues once its URLs are loaded

app_name = "conveyor-metrics"
urlpatterns = [path("", metrics_view, name="metrics")]
