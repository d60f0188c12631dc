"""The shop's tables: orders, their payments, and the fake gateway's records."""

from django.db import models


class Order(models.Model):
    email = models.EmailField()
    item = models.CharField(max_length=100)
    quantity = models.PositiveIntegerField(default=1)
    unit_price_cents = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    receipt_sent_at = models.DateTimeField(null=True, blank=True)
    stock_updated_at = models.DateTimeField(null=True, blank=True)
    fulfilled_at = models.DateTimeField(null=True, blank=True)  # The workflow's last step.
    # Ids of the jobs enqueued with the order, to show their status.
    receipt_job_id = models.CharField(max_length=32, blank=True)
    charge_job_id = models.CharField(max_length=32, blank=True)
    fulfilled_job_id = models.CharField(max_length=32, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"Order {self.pk}: {self.quantity} x {self.item} for {self.email}"

    @property
    def total_cents(self) -> int:
        return self.quantity * self.unit_price_cents

    @property
    def total_display(self) -> str:
        return f"{self.total_cents / 100:.2f} EUR"


class Payment(models.Model):
    """Written by `charge_payment` inside `context.atomic()`: at most one per order."""

    order = models.OneToOneField(Order, on_delete=models.CASCADE, related_name="payment")
    amount_cents = models.PositiveIntegerField()
    gateway_charge_id = models.CharField(max_length=64)
    idempotency_key = models.CharField(max_length=255)  # What the gateway was given.
    job_id = models.BigIntegerField()  # The conveyor job that recorded it...
    token = models.BigIntegerField()  # ...and the fencing token it held.
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"Payment {self.gateway_charge_id} for order {self.order_id}"


class GatewayCharge(models.Model):
    """The fake payment gateway's own records (see `shop.gateway`).

    A real gateway keeps these on its side; here they live in the same
    database only so the demo can show them. They are written in their own
    transaction, outside the job's, as a remote system's would be.
    """

    idempotency_key = models.CharField(max_length=255, unique=True)
    reference = models.CharField(max_length=100)
    amount_cents = models.PositiveIntegerField()
    calls = models.PositiveIntegerField(default=1)  # Requests that named this key.
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.charge_id} ({self.reference})"

    @property
    def charge_id(self) -> str:
        return f"ch_fake_{self.pk:06d}"


class StockReport(models.Model):
    """Units sold per item on one day: written by the nightly periodic job."""

    day = models.DateField(unique=True)  # One report per day, however often its job runs.
    units = models.PositiveIntegerField()
    revenue_cents = models.PositiveIntegerField()
    lines = models.JSONField(default=dict)  # item -> units sold
    job_id = models.BigIntegerField()  # The conveyor job that wrote it last.
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-day"]

    def __str__(self) -> str:
        return f"Stock report for {self.day}: {self.units} units"
