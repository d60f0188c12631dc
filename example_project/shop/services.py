"""What the views (and the demo command) call: one code path for both."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction

from django_conveyor import workflows
from django_conveyor.workflows import Workflow, WorkflowResult, chain, group

from .models import Order
from .tasks import (
    charge_payment,
    flaky_sync,
    order_fulfilled,
    send_receipt,
    ship_order,
    update_stock,
)

APPROVAL_TIMEOUT = timedelta(days=2)


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


def place_wholesale_order(
    *,
    email: str,
    item: str,
    quantity: int,
    unit_price_cents: int,
    cooling_off: timedelta | None = None,
) -> tuple[Order, WorkflowResult]:
    """An order that waits: the charge, a manager's approval, a cooling-off timer, then shipping.

    The approval is a gate (`workflows.signal("approval")`): the order waits
    in the database, approved or rejected on the admin's Waiting page (or
    with `send_signal`), for two days at most. The cooling-off period
    (`settings.SHOP_COOLING_OFF_SECONDS`, an hour; the demo sets a few
    seconds) is a durable timer. Nothing runs, and no worker holds anything,
    while they wait.
    """
    if cooling_off is None:
        cooling_off = timedelta(seconds=getattr(settings, "SHOP_COOLING_OFF_SECONDS", 3600))
    with transaction.atomic():
        order = Order.objects.create(
            email=email, item=item, quantity=quantity, unit_price_cents=unit_price_cents
        )
        charge = charge_payment.using(idempotency_key=f"charge-order-{order.pk}")
        flow = Workflow()
        flow.add(charge.step(order.pk), name="charge")
        flow.add(workflows.signal("approval", timeout=APPROVAL_TIMEOUT), name="approval",
                 after=["charge"])  # fmt: skip
        flow.add(workflows.sleep(cooling_off), name="cooling_off", after=["approval"])
        flow.add(ship_order.step(order.pk), name="ship", after=["cooling_off"])
        result = flow.enqueue()
        order.charge_job_id = result["charge"].id
        order.fulfilled_job_id = result["ship"].id
        order.save(update_fields=["charge_job_id", "fulfilled_job_id"])
    return order, result


def request_inventory_sync(sku: str) -> str:
    """Enqueue the always-failing sync job; returns its job id."""
    return flaky_sync.enqueue(sku).id
