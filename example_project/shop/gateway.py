"""A fake payment gateway, honest about being fake.

It stands in for a payment provider's "create charge" API so the demo needs
no account anywhere. Like a real provider that supports idempotency keys
(Stripe's `Idempotency-Key` header, for instance), it answers a repeated key
with the charge it already made instead of charging again. That behaviour is
what makes a retried `charge_payment` safe: django-conveyor can run a handler
more than once, and only the remote side can refuse a second charge.

Nothing leaves the machine: the "charge" is a row in `GatewayCharge`,
committed at once in its own transaction, as a remote call would be.

With the setting `SHOP_GATEWAY_DROP_FIRST_REPLY` on (the demo command turns
it on for its worker) the gateway makes the charge for a new key and then
"loses" the reply, raising `GatewayTimeout`, the way a network can. The job
retries, sends the same key, and gets the same charge back: one charge, two
calls.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F

from .models import GatewayCharge


@dataclass(frozen=True)
class Charge:
    id: str
    amount_cents: int
    replayed: bool  # True when the key had been seen before: no new charge was made.


class GatewayError(Exception):
    """The gateway refused the request."""


class GatewayTimeout(GatewayError):
    """No reply came back: the charge may or may not have been made."""


def charge(*, amount_cents: int, reference: str, idempotency_key: str) -> Charge:
    """Charge once per idempotency key; a repeated key returns the first charge."""
    if not idempotency_key:
        raise GatewayError("An idempotency key is required.")
    result = _charge_once(amount_cents, reference, idempotency_key)
    if not result.replayed and settings.SHOP_GATEWAY_DROP_FIRST_REPLY:
        raise GatewayTimeout(f"No reply from the gateway for {reference} (the demo drops it).")
    return result


def _charge_once(amount_cents: int, reference: str, idempotency_key: str) -> Charge:
    # Committed before the reply, as a remote system's write would be. Call it
    # outside any transaction (charge_payment calls it before context.atomic()),
    # or an enclosing rollback would undo what a real gateway could not.
    with transaction.atomic():
        try:
            with transaction.atomic():
                record = GatewayCharge.objects.create(
                    idempotency_key=idempotency_key, reference=reference, amount_cents=amount_cents
                )
            return Charge(record.charge_id, record.amount_cents, replayed=False)
        except IntegrityError:
            pass  # The key is known: answer with the charge already made.
        record = GatewayCharge.objects.select_for_update().get(idempotency_key=idempotency_key)
        if record.amount_cents != amount_cents:
            raise GatewayError(
                f"Idempotency key {idempotency_key!r} was used for {record.amount_cents} cents, "
                f"not {amount_cents}."
            )
        GatewayCharge.objects.filter(pk=record.pk).update(calls=F("calls") + 1)
        return Charge(record.charge_id, record.amount_cents, replayed=True)
