"""What the views (and the demo command) call: one code path for both."""

from __future__ import annotations

from django.db import transaction

from django_conveyor.workflows import chain, group

from .models import Order
from .tasks import charge_payment, flaky_sync, order_fulfilled, send_receipt, update_stock


def place_order(*, email: str, item: str, quantity: int, unit_price_cents: int) -> Order:
    """Create an order and enqueue its workflow in the same transaction.

    The charge first; once it completed, the receipt and the stock update;
    once both completed, "order fulfilled". If anything in the block fails,
    the order and every job roll back together; once it commits, all exist
    and a worker is woken. A charge that ends dead cancels the rest, and
    requeueing it from the admin brings them back.
    """
    with transaction.atomic():
        order = Order.objects.create(
            email=email, item=item, quantity=quantity, unit_price_cents=unit_price_cents
        )
        # One charge job per order, however often this is called for it.
        charge = charge_payment.using(idempotency_key=f"charge-order-{order.pk}")
        workflow = chain(
            charge.step(order.pk),
            group(send_receipt.step(order.pk), update_stock.step(order.pk)),
            order_fulfilled.step(order.pk),
        ).enqueue()
        charged, receipt, _, fulfilled = workflow
        order.receipt_job_id = receipt.id
        order.charge_job_id = charged.id
        order.fulfilled_job_id = fulfilled.id
        order.save(update_fields=["receipt_job_id", "charge_job_id", "fulfilled_job_id"])
    return order


def request_inventory_sync(sku: str) -> str:
    """Enqueue the always-failing sync job; returns its job id."""
    return flaky_sync.enqueue(sku).id
