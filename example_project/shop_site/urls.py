from django.contrib import admin
from django.urls import include, path
from shop import views

urlpatterns = [
    path("", views.order_list, name="order-list"),
    path("orders/new/", views.place_order_view, name="order-create"),
    path("inventory/sync/", views.sync_inventory_view, name="inventory-sync"),
    path("admin/", admin.site.urls),
    path("conveyor/api/", include("django_conveyor.api.urls")),
    path("conveyor/metrics", include("django_conveyor.metrics.urls")),
]
