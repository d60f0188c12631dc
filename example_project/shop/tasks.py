"""The shop's background jobs.

`send_receipt` is at-least-once, like any e-mail: a worker that dies after
sending and before recording it sends the receipt again on the retry.
`build_report` is a long job that stops as soon as an operator cancels it
from the admin. `charge_payment` shows the two halves of exactly-once: the remote charge is
made safe by the idempotency key the gateway honours, and the local record
is made exactly-once by `context.atomic()`. `flaky_sync` always fails, so it
ends `dead` and shows up in the admin's dead-letter view.
"""

from __future__ import annotations

import time

from django.core.mail import send_mail
from django.utils import timezone

from django_conveyor import task

from . import gateway
from .models import Order, Payment

PAYMENT_EFFECT = "payment"


@task(queue_name="emails", max_attempts=5)
def send_receipt(order_id: int) -> str:
    order = Order.objects.get(pk=order_id)
    if order.receipt_sent_at:
        return "already sent"
    send_mail(
        subject=f"Your receipt for order {order.pk}",
        message=(
            f"Thank you for your order of {order.quantity} x {order.item}.\n"
            f"Total: {order.total_cents / 100:.2f} EUR.\n"
        ),
        from_email=None,
        recipient_list=[order.email],
    )
    Order.objects.filter(pk=order.pk).update(receipt_sent_at=timezone.now())
    return f"sent to {order.email}"


@task(queue_name="payments", takes_context=True, max_attempts=5, timeout=60)
def charge_payment(context, order_id: int) -> dict[str, str]:
    order = Order.objects.get(pk=order_id)
    # The remote call comes first and outside the transaction, so no row lock
    # is held while a slow gateway answers. If this attempt dies after it, the
    # retry sends the same key and the gateway returns the same charge.
    charge = gateway.charge(
        amount_cents=order.total_cents,
        reference=f"order-{order.pk}",
        idempotency_key=context.idempotency_key,
    )
    # The local record, its ledger entry and the job's completion commit
    # together, and only while this attempt still holds the lease. A zombie
    # attempt gets LeaseLost here and none of it is written.
    with context.atomic():
        Payment.objects.create(
            order=order,
            amount_cents=charge.amount_cents,
            gateway_charge_id=charge.id,
            idempotency_key=context.idempotency_key,
            job_id=context.job_id,
            token=context.token,
        )
        context.record_effect(PAYMENT_EFFECT)
    return {"charge": charge.id, "attempt": str(context.attempt)}


@task(max_attempts=3, backoff_base=0.5, backoff_cap=2.0)
def flaky_sync(sku: str) -> None:
    # Stands in for a call to a partner system that is down. Any exception
    # means "retry later"; after max_attempts the job is dead.
    raise ConnectionError(
        f"Inventory service unreachable while syncing {sku!r} (demo: always fails)."
    )


@task(queue_name="default", takes_context=True, max_attempts=1)
def build_report(context, seconds: float) -> str:
    # Long work in small steps, checking between them whether to go on: an
    # operator's cancel (or a lost lease) makes lease_held() false.
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not context.lease_held():
            return "stopped early"
        time.sleep(0.2)
    return "report built"
