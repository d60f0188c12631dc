"""The shop's own tests, written as a project using django-conveyor writes them.

`django_conveyor.testing` asserts on what `place_order()` enqueued and runs
those jobs in the test, through the same claim, handler and fenced outcome
as a worker, so a test checks the handlers' effects. Run them with
`python example_project/manage.py test shop`.
"""

from __future__ import annotations

from django.core import mail
from django.test import TestCase, override_settings

from django_conveyor import testing
from django_conveyor.models import Job, LedgerEntry

from .models import GatewayCharge, Order, Payment
from .services import place_order, request_inventory_sync
from .tasks import charge_payment, flaky_sync, send_receipt


def an_order() -> Order:
    return place_order(email="ada@example.com", item="mug", quantity=2, unit_price_cents=1250)


class PlaceOrderTests(testing.ConveyorAssertions, TestCase):
    def test_an_order_enqueues_its_workflow(self):
        order = an_order()
        charge = self.assertEnqueued(charge_payment, args=[order.pk], queue="payments")
        self.assertEqual((charge.id, charge.state), (order.charge_job_id, "available"))
        receipt = self.assertEnqueued(send_receipt, args=[order.pk], queue="emails")
        self.assertEqual(receipt.state, "blocked")  # It waits for the charge.

    def test_running_the_jobs_sends_one_receipt_and_records_one_payment(self):
        with testing.run_enqueued() as ran:
            order = an_order()
        # The charge, then the receipt and the stock update, then "fulfilled".
        self.assertEqual(ran.counts, {"completed": 4})
        order.refresh_from_db()
        self.assertIsNotNone(order.receipt_sent_at)
        self.assertIsNotNone(order.fulfilled_at)
        self.assertEqual([m.to for m in mail.outbox], [["ada@example.com"]])
        payment = Payment.objects.get(order=order)
        self.assertEqual(payment.amount_cents, 2500)
        # Recorded inside context.atomic(), under the token that completed the job.
        self.assertEqual(payment.token, Job.objects.get(pk=order.charge_job_id).lease_version)
        self.assertEqual(LedgerEntry.objects.filter(job_id=order.charge_job_id).count(), 1)
        self.assertNotEnqueued()

    @override_settings(SHOP_GATEWAY_DROP_FIRST_REPLY=True)
    def test_a_lost_gateway_reply_is_retried_with_the_same_key_and_charges_once(self):
        order = an_order()
        ran = testing.run_jobs(queues=["payments"], until_empty=True, immediate_retries=True)
        self.assertEqual(ran.counts, {"retried": 1, "completed": 1})
        charge = GatewayCharge.objects.get()  # One charge for two calls with one key.
        self.assertEqual(charge.calls, 2)
        self.assertEqual(Payment.objects.get(order=order).gateway_charge_id, charge.charge_id)
        # Unblocked by the charge, not run: it is on another queue.
        self.assertEqual(self.assertEnqueued(send_receipt, args=[order.pk]).state, "available")


class InventorySyncTests(testing.ConveyorAssertions, TestCase):
    def test_the_sync_is_retried_until_it_is_dead(self):
        job_id = request_inventory_sync("MUG-1")
        self.assertEnqueued(flaky_sync, args=["MUG-1"], queue="default")
        ran = testing.run_jobs(until_empty=True, immediate_retries=True)
        self.assertEqual(ran.counts, {"retried": 2, "dead": 1})
        result = flaky_sync.get_result(job_id)
        self.assertEqual(result.state, "dead")
        self.assertEqual(len(result.errors), 3)
