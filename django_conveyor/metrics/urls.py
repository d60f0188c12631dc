"""``path("conveyor/metrics", include("django_conveyor.metrics.urls"))`` mounts the scrape view."""

from django.urls import path

from .scrape import metrics_view

app_name = "conveyor-metrics"
urlpatterns = [path("", metrics_view, name="metrics")]
