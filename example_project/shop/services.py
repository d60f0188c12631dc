"""What the views (and the demo command) call: one code path for both."""

from __future__ import annotations

from django.db import transaction

from .models import Order
from .tasks import charge_payment, flaky_sync, send_receipt


def place_order(*, email: str, item: str, quantity: int, unit_price_cents: int) -> Order:
    """Create an order and enqueue its receipt and charge in the same transaction.

    If anything in the block fails, the order and both jobs roll back
    together; once it commits, all three exist and a worker is woken.
    """
    with transaction.atomic():
        order = Order.objects.create(
            email=email, item=item, quantity=quantity, unit_price_cents=unit_price_cents
        )
        receipt = send_receipt.enqueue(order.pk)
        # One charge job per order, however often this is called for it.
        charge = charge_payment.using(idempotency_key=f"charge-order-{order.pk}").enqueue(order.pk)
        order.receipt_job_id = receipt.id
        order.charge_job_id = charge.id
        order.save(update_fields=["receipt_job_id", "charge_job_id"])
    return order


def request_inventory_sync(sku: str) -> str:
    """Enqueue the always-failing sync job; returns its job id."""
    return flaky_sync.enqueue(sku).id
