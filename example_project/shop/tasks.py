"""The shop's background jobs.

`send_receipt` is at-least-once, like any e-mail: a worker that dies after
sending and before recording it sends the receipt again on the retry.
`build_report` is a long job that stops as soon as an operator cancels it
from the admin. `charge_payment` shows the two halves of exactly-once: the
remote charge is made safe by the idempotency key the gateway honours, and
the local record is made exactly-once by `context.atomic()`. `flaky_sync` always fails, so it
ends `dead` and shows up in the admin's dead-letter view. `nightly_stock_report`
is a periodic job: settings.CONVEYOR["CRON"] runs it every night.

An order is a small workflow (shop/services.py): the charge, then the
receipt and `update_stock` side by side, then `order_fulfilled`, which reads
what its dependencies returned through `context.dependency_results`.
"""

from __future__ import annotations

from datetime import datetime, time, timedelta
from time import monotonic, sleep
from zoneinfo import ZoneInfo

from django.core.mail import send_mail
from django.db.models import Sum
from django.utils import timezone

from django_conveyor import task
from django_conveyor.models import Job

from . import gateway
from .models import Order, Payment, StockReport

REPORT_TIMEZONE = "Europe/Berlin"  # The shop's day; the schedule uses the same zone.

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


@task()
def update_stock(order_id: int) -> dict[str, int | str]:
    """Take the sold units off the shelf (here: stamp the order, once)."""
    order = Order.objects.get(pk=order_id)
    Order.objects.filter(pk=order.pk, stock_updated_at__isnull=True).update(
        stock_updated_at=timezone.now()
    )
    return {"item": order.item, "units": order.quantity}


@task(takes_context=True)
def order_fulfilled(context, order_id: int) -> dict[str, object]:
    """The fan-in: runs once the charge, the receipt and the stock update completed."""
    done = {r.task.name: r.return_value for r in context.dependency_results.values()}
    Order.objects.filter(pk=order_id, fulfilled_at__isnull=True).update(fulfilled_at=timezone.now())
    return {"order": order_id, "after": sorted(done)}


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
    deadline = monotonic() + seconds
    while monotonic() < deadline:
        if not context.lease_held():
            return "stopped early"
        sleep(0.2)
    return "report built"


@task(takes_context=True, max_attempts=3)
def nightly_stock_report(context) -> dict[str, int | str]:
    """Units sold per item on the day before the schedule's tick.

    The day comes from the tick (the job's `run_after`), not from the clock,
    so a retry or a late run reports the same day. Writing the report and
    its ledger entry in `context.atomic()` makes a second run replace
    nothing twice: one report per day.
    """
    tick = Job.objects.get(pk=context.job_id).run_after
    zone = ZoneInfo(REPORT_TIMEZONE)
    day = tick.astimezone(zone).date() - timedelta(days=1)
    start = datetime.combine(day, time.min, tzinfo=zone)
    orders = Order.objects.filter(created_at__gte=start, created_at__lt=start + timedelta(days=1))
    lines = {
        row["item"]: row["units"]
        for row in orders.values("item").annotate(units=Sum("quantity")).order_by("item")
    }
    revenue = sum(order.total_cents for order in orders)
    with context.atomic():
        StockReport.objects.update_or_create(
            day=day,
            defaults={
                "units": sum(lines.values()),
                "revenue_cents": revenue,
                "lines": lines,
                "job_id": context.job_id,
            },
        )
        context.record_effect(f"stock-report-{day}")
    return {"day": day.isoformat(), "units": sum(lines.values())}


def _pack(order_id: int) -> str:
    """The parcel's label (a step whose write commits once, with its record)."""
    Order.objects.filter(pk=order_id, stock_updated_at__isnull=True).update(
        stock_updated_at=timezone.now()
    )
    return f"PARCEL-{order_id:06d}"


@task(takes_context=True, max_attempts=5)
def ship_order(context, order_id: int) -> dict[str, object]:
    """After approval and the cooling-off timer: pack (a checkpointed step), then ship.

    A later attempt gets the recorded label back without packing again.
    """
    label = context.checkpoint("pack", _pack, order_id)
    Order.objects.filter(pk=order_id, fulfilled_at__isnull=True).update(fulfilled_at=timezone.now())
    return {"order": order_id, "label": label}
