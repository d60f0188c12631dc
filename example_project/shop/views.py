from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from django_conveyor.models import Job

from .models import Order
from .services import place_order, request_inventory_sync

ORDERS_SHOWN = 50


class OrderForm(forms.Form):
    email = forms.EmailField(initial="customer@example.com")
    item = forms.CharField(max_length=100, initial="Coffee beans, 1 kg")
    quantity = forms.IntegerField(min_value=1, max_value=100, initial=1)
    unit_price = forms.DecimalField(
        min_value=0, max_digits=8, decimal_places=2, initial="18.50", label="Unit price (EUR)"
    )


def order_rows() -> list[dict[str, Any]]:
    orders = list(Order.objects.select_related("payment")[:ORDERS_SHOWN])
    job_ids = {
        int(i) for o in orders for i in (o.receipt_job_id, o.charge_job_id, o.fulfilled_job_id) if i
    }
    # conveyor_job is readable like any table (writes go through the worker).
    states = dict(Job.objects.filter(id__in=job_ids).values_list("id", "state"))

    def state(job_id: str) -> str:
        return states.get(int(job_id), "pruned") if job_id else "-"

    return [
        {
            "order": order,
            "payment": getattr(order, "payment", None),
            "receipt_state": state(order.receipt_job_id),
            "charge_state": state(order.charge_job_id),
            "fulfilled_state": state(order.fulfilled_job_id),
        }
        for order in orders
    ]


def render_orders(request: HttpRequest, form: OrderForm, status: int = 200) -> HttpResponse:
    context = {"rows": order_rows(), "form": form}
    return render(request, "shop/orders.html", context, status=status)


@require_GET
def order_list(request: HttpRequest) -> HttpResponse:
    return render_orders(request, OrderForm())


@require_POST
def place_order_view(request: HttpRequest) -> HttpResponse:
    form = OrderForm(request.POST)
    if not form.is_valid():
        return render_orders(request, form, status=400)
    data = form.cleaned_data
    order = place_order(
        email=data["email"],
        item=data["item"],
        quantity=data["quantity"],
        unit_price_cents=int(data["unit_price"] * 100),
    )
    messages.success(request, f"Order {order.pk} placed: its receipt and charge are enqueued.")
    return redirect("order-list")


@require_POST
def sync_inventory_view(request: HttpRequest) -> HttpResponse:
    job_id = request_inventory_sync("COFFEE-1KG")
    messages.warning(
        request, f"Inventory sync enqueued as job {job_id}; it always fails and will end dead."
    )
    return redirect("order-list")
