from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("conveyor/api/", include("django_conveyor.api.urls")),
    path("conveyor/metrics", include("django_conveyor.metrics.urls")),
]
