"""`manage.py demo`: the example shop end to end, in one command.

Migrates, makes sure a demo admin login exists, starts a worker process,
places a few orders through the same code as the order form (each enqueues a
receipt and a charge) plus one job that always fails, waits until every job
has settled and prints what happened, then serves the site and its admin.
With --no-serve it exits after the summary: 0 when every job ended as
expected, 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connections
from django.utils import timezone

from django_conveyor import send_signal
from django_conveyor.api import keys
from django_conveyor.conf import conveyor_settings
from django_conveyor.management.arguments import port_number, positive_seconds
from django_conveyor.models import ApiKey, Job, LedgerEntry
from django_conveyor.periodic import schedules
from django_conveyor.states import FINAL_STATES, JobState
from shop.models import GatewayCharge, Order, Payment, StockReport
from shop.services import place_order, place_wholesale_order, request_inventory_sync
from shop.tasks import (
    build_report,
    charge_payment,
    flaky_sync,
    nightly_stock_report,
    order_fulfilled,
    send_receipt,
    ship_order,
)

REPORT_SCHEDULE = "nightly-stock-report"  # settings.CONVEYOR["CRON"]
DEMO_USER = "demo"
DEMO_PASSWORD = "conveyor-demo"  # A local demo login, printed on purpose.
DEMO_API_KEY_NAME = "demo"
DEMO_API_KEY_SCOPES = ("enqueue", "read", "operate", "metrics")
WORKER_CONCURRENCY = 4
WORKER_STOP_TIMEOUT_SECONDS = 30.0  # Past the worker's own shutdown timeout.
POLL_INTERVAL_SECONDS = 0.25
REPORT_SECONDS = 3600.0  # The long job left running for the console's cancel button.
SCHEDULED_IN = timedelta(hours=1)
COOLING_OFF_SECONDS = 3.0  # The wholesale order's timer: an hour in the shop, short here.
TRAFFIC_SECONDS = 15.0  # While serving, a customer orders this often (the dashboard's chart).
METRICS_PORTS = range(9100, 9200)  # The worker's --metrics-port: the first free one.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

DEMO_ORDERS = [
    ("ada@example.com", "Coffee beans, 1 kg", 2, 1850),
    ("grace@example.com", "Pour-over kettle", 1, 4900),
    ("linus@example.com", "Paper filters, 100", 3, 450),
    ("barbara@example.com", "Burr grinder", 1, 12900),
    ("edsger@example.com", "Espresso cups, set of 4", 1, 2400),
]


def curl_enqueue(base: str, api_key: str) -> str:
    """A curl line that enqueues a receipt for order 1 through the HTTP API."""
    body = json.dumps({"task": "shop.tasks.send_receipt", "args": [1]})
    return (
        f"curl -sS -X POST {base}/conveyor/api/jobs -H 'Authorization: Bearer {api_key}' "
        f"-H 'Content-Type: application/json' -H 'Idempotency-Key: demo-receipt-1' -d '{body}'"
    )


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as runserver does
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def raise_keyboard_interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM takes the same way out as Ctrl-C, so the worker is always stopped.
    # SIGINT is set too: a shell that starts us in the background ignores it.
    raise KeyboardInterrupt


class Command(BaseCommand):
    help = (
        "Run the example shop end to end: migrate, create a demo admin login, start a "
        "worker, place demo orders, wait for their jobs, then serve the site."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--port", type=port_number, default=8000, help="Port for the site (default 8000)."
        )
        parser.add_argument(
            "--no-serve",
            action="store_true",
            help="Exit after the summary: 0 if every job ended as expected, 1 if not.",
        )
        parser.add_argument(
            "--orders",
            type=int,
            choices=range(1, len(DEMO_ORDERS) + 1),
            default=3,
            metavar=f"1..{len(DEMO_ORDERS)}",
            help="Demo orders to place (default 3).",
        )
        parser.add_argument(
            "--no-traffic",
            action="store_true",
            help=f"While serving, place no order every {TRAFFIC_SECONDS:g}s (the dashboard's "
            "chart then shows the demo orders alone).",
        )
        parser.add_argument(
            "--timeout",
            type=positive_seconds,
            default=60.0,
            help="Seconds to wait for the demo jobs to settle (default 60).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["no_serve"] and not port_is_free(options["port"]):
            # Checked first: runserver ends the process with os._exit() on a
            # busy port, which would leave the worker running.
            raise CommandError(
                f"Port {options['port']} on 127.0.0.1 is in use; pass --port with a free one."
            )
        self.step("Migrating the database")
        call_command("migrate", interactive=False, verbosity=0)
        login = self.ensure_demo_user()
        api_key = self.ensure_demo_api_key()

        self.stop_traffic: Callable[[], None] = lambda: None
        previous = {sig: signal.signal(sig, raise_keyboard_interrupt) for sig in STOP_SIGNALS}
        worker = self.start_worker()
        settled = interrupted = False
        try:
            jobs = self.enqueue_demo_jobs(options["orders"])
            settled = self.wait_for(jobs, worker, options["timeout"])
            settled = self.summarise(jobs) and settled
            if options["no_serve"]:
                self.show_api(f"http://127.0.0.1:{options['port']}", api_key)
                self.stdout.write("    (run without --no-serve to serve the site and its API)")
            else:
                self.serve(
                    options["port"],
                    login,
                    api_key,
                    settled,
                    not options["no_traffic"],
                    jobs["fulfilled"][-1:],
                )
        except KeyboardInterrupt:
            interrupted = True
        finally:
            self.stop_traffic()
            self.stop_worker(worker)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if interrupted:
            raise CommandError("Interrupted before the demo finished.", returncode=130)
        if not settled:
            raise CommandError("The demo jobs did not all end in their expected states.")

    # -- steps ---------------------------------------------------------------

    def step(self, text: str) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING(f"==> {text}"))

    def ensure_demo_user(self) -> str:
        user_model = get_user_model()
        user, created = user_model.objects.get_or_create(
            username=DEMO_USER,
            defaults={"is_staff": True, "is_superuser": True, "email": "demo@example.com"},
        )
        if created:
            user.set_password(DEMO_PASSWORD)
            user.save(update_fields=["password"])
            self.step(f"Created the admin user {DEMO_USER!r}")
        if user.check_password(DEMO_PASSWORD):
            return f"user {DEMO_USER}, password {DEMO_PASSWORD}"
        return f"user {DEMO_USER} (its password was changed after the demo created it)"

    def ensure_demo_api_key(self) -> str:
        """The demo key (settings.SHOP_DEMO_API_KEY), made once: re-runs reuse it."""
        raw = settings.SHOP_DEMO_API_KEY
        live = ApiKey.objects.filter(name=DEMO_API_KEY_NAME, revoked_at__isnull=True).first()
        if live is not None and live.secret_hash == keys.hash_key(raw):
            return raw
        if live is not None:
            keys.revoke(DEMO_API_KEY_NAME)  # SHOP_DEMO_API_KEY changed since
        keys.create(DEMO_API_KEY_NAME, DEMO_API_KEY_SCOPES, raw_key=raw)
        self.step(f"Created the API key {DEMO_API_KEY_NAME!r} ({', '.join(DEMO_API_KEY_SCOPES)})")
        return raw

    def start_worker(self) -> subprocess.Popen[bytes]:
        queues = ",".join(settings.TASKS["default"]["QUEUES"])
        manage_py = Path(settings.BASE_DIR) / "manage.py"
        flags = ["--queues", queues, "--concurrency", str(WORKER_CONCURRENCY)]
        self.metrics_port = (
            next((p for p in METRICS_PORTS if port_is_free(p)), None)
            if importlib.util.find_spec("prometheus_client")  # django-conveyor[metrics]
            else None
        )
        if self.metrics_port is not None:
            flags += ["--metrics-port", str(self.metrics_port), "--metrics-address", "127.0.0.1"]
        command = [sys.executable, str(manage_py), "conveyor_worker", *flags]
        self.step(f"Starting a worker: manage.py conveyor_worker {' '.join(flags)}")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # Show a retry that reuses the idempotency key: see shop/gateway.py.
        env.setdefault("SHOP_GATEWAY_DROP_FIRST_REPLY", "1")
        # A session of its own keeps the terminal's Ctrl-C away from the worker:
        # this command sends it exactly one SIGTERM, which means "finish and exit".
        return subprocess.Popen(command, env=env, start_new_session=True)

    def enqueue_demo_jobs(self, count: int) -> dict[str, list[int]]:
        self.step(
            f"Placing {plural(count, 'order')} (each a workflow: charge, then receipt and "
            "stock update, then order fulfilled) and one flaky job"
        )
        jobs: dict[str, list[int]] = {
            "orders": [], "receipts": [], "charges": [], "fulfilled": [], "flaky": [], "report": []
        }  # fmt: skip
        for email, item, quantity, price in DEMO_ORDERS[:count]:
            order = place_order(email=email, item=item, quantity=quantity, unit_price_cents=price)
            jobs["orders"].append(order.pk)
            jobs["receipts"].append(int(order.receipt_job_id))
            jobs["charges"].append(int(order.charge_job_id))
            jobs["fulfilled"].append(int(order.fulfilled_job_id))
            self.stdout.write(
                f"    order {order.pk}: {quantity} x {item} ({order.total_display}), "
                f"charge job {order.charge_job_id} -> receipt job {order.receipt_job_id} and "
                f"a stock update -> fulfilled job {order.fulfilled_job_id}"
            )
        order, flow = place_wholesale_order(
            email="cafe@example.com", item="Coffee beans, 1 kg", quantity=40,
            unit_price_cents=1500, cooling_off=timedelta(seconds=COOLING_OFF_SECONDS),
        )  # fmt: skip
        jobs["wholesale"] = [order.pk]
        jobs["approval"] = [int(flow["approval"].id)]
        jobs["cooling_off"] = [int(flow["cooling_off"].id)]
        jobs["shipped"] = [int(flow["ship"].id)]
        self.stdout.write(
            f"    wholesale order {order.pk}: charge job {flow['charge'].id} -> approval gate "
            f"{flow['approval'].id} (a manager's signal) -> cooling-off timer "
            f"{flow['cooling_off'].id} ({COOLING_OFF_SECONDS:g}s here, an hour in the shop) -> "
            f"ship job {flow['ship'].id}"
        )
        jobs["flaky"].append(int(request_inventory_sync("COFFEE-1KG")))
        self.stdout.write(f"    inventory sync: job {jobs['flaky'][0]} (fails on every attempt)")
        # The periodic job runs at 03:00 Berlin time; "run now" shows it at once.
        # The worker syncs the schedule too; syncing here first avoids the race.
        schedules.sync(conveyor_settings().DATABASE)
        jobs["report"].append(schedules.run_now(REPORT_SCHEDULE).id)
        self.stdout.write(
            f"    {REPORT_SCHEDULE} (periodic, 0 3 * * * Europe/Berlin): run now as job "
            f"{jobs['report'][0]}"
        )
        return jobs

    def wait_for(
        self, jobs: dict[str, list[int]], worker: subprocess.Popen[bytes], timeout: float
    ) -> bool:
        keys = ("receipts", "charges", "fulfilled", "flaky", "report", "shipped")
        ids = [i for key in keys for i in jobs[key]]
        approved = False
        self.step(f"Waiting for {len(ids)} jobs to settle (up to {timeout:g}s)")
        started = time.monotonic()
        while True:
            unsettled = Job.objects.filter(id__in=ids).exclude(state__in=FINAL_STATES).count()
            if (
                not approved
                and Job.objects.filter(
                    id__in=jobs["approval"], state=JobState.BLOCKED, pending_dependencies=0
                ).exists()
            ):
                # What a manager does on the admin's Waiting page (or a view, with send_signal).
                send_signal(jobs["approval"][0], "approval", payload={"approved_by": "demo"})
                approved = True
                self.stdout.write(
                    f"    approved gate {jobs['approval'][0]} (the charge completed): the "
                    f"cooling-off timer runs"
                )
            if not unsettled:
                self.stdout.write(f"    settled in {time.monotonic() - started:.1f}s")
                return True
            if worker.poll() is not None:
                self.stderr.write(
                    f"    the worker exited with {worker.returncode}; {unsettled} jobs unsettled"
                )
                return False
            if time.monotonic() - started > timeout:
                self.stderr.write(f"    {unsettled} jobs still unsettled after {timeout:g}s")
                return False
            time.sleep(POLL_INTERVAL_SECONDS)

    def summarise(self, jobs: dict[str, list[int]]) -> bool:
        """Print what each job ended as; True when that is what the demo expects."""
        self.step("Summary")
        expected = [
            (send_receipt, jobs["receipts"], JobState.COMPLETED),
            (charge_payment, jobs["charges"], JobState.COMPLETED),
            (order_fulfilled, jobs["fulfilled"], JobState.COMPLETED),
            (flaky_sync, jobs["flaky"], JobState.DEAD),
            (nightly_stock_report, jobs["report"], JobState.COMPLETED),
            (ship_order, jobs["shipped"], JobState.COMPLETED),
        ]
        ok = True
        for task, ids, wanted in expected:
            rows = list(Job.objects.filter(id__in=ids))
            states = Counter(job.state for job in rows)
            attempts = Counter(job.attempt for job in rows)
            good = states == Counter({wanted.value: len(ids)})
            ok &= good
            described = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
            tries = ", ".join(f"{n} x {a}" for a, n in sorted(attempts.items()))
            line = f"    {task.name:<20} queue {task.queue_name:<9} {described} (attempts: {tries})"
            self.stdout.write(self.style.SUCCESS(line) if good else self.style.ERROR(line))
        for job in Job.objects.filter(id__in=jobs["flaky"], state=JobState.DEAD):
            last = job.errors[-1] if job.errors else {}
            self.stdout.write(
                f"    dead job {job.id}: {len(job.errors)} errors recorded, the last "
                f"{last.get('exception_class_path', 'none')}; see the dead letters in the admin"
            )

        for report in StockReport.objects.filter(job_id__in=jobs["report"]):
            self.stdout.write(
                f"    stock report for {report.day}: {report.units} units sold "
                f"(the day before the run; see the periodic schedules in the admin)"
            )
        payments = Payment.objects.filter(order_id__in=jobs["orders"])
        ledger = LedgerEntry.objects.filter(job_id__in=jobs["charges"])
        keys = payments.values_list("idempotency_key", flat=True)
        charges = GatewayCharge.objects.filter(idempotency_key__in=list(keys))
        calls = sum(charges.values_list("calls", flat=True))
        receipts = Order.objects.filter(pk__in=jobs["orders"], receipt_sent_at__isnull=False)
        fulfilled = Order.objects.filter(
            pk__in=jobs["orders"], stock_updated_at__isnull=False, fulfilled_at__isnull=False
        )
        in_order = all(
            o.payment.created_at <= o.receipt_sent_at <= o.fulfilled_at
            and o.stock_updated_at <= o.fulfilled_at
            for o in fulfilled.select_related("payment")
        )
        effects_ok = payments.count() == ledger.count() == charges.count() == len(
            jobs["orders"]
        ) and receipts.count() == len(jobs["orders"])
        ok &= effects_ok
        flows_ok = fulfilled.count() == len(jobs["orders"]) and in_order
        ok &= flows_ok
        line = (
            f"    {plural(len(jobs['orders']), 'order')}: {receipts.count()} receipts sent, "
            f"{payments.count()} payments, {ledger.count()} ledger entries, "
            f"{charges.count()} gateway charges from {calls} gateway calls"
        )
        self.stdout.write(self.style.SUCCESS(line) if effects_ok else self.style.ERROR(line))
        line = (
            f"    {plural(fulfilled.count(), 'order')} fulfilled, each after its charge, receipt "
            f"and stock update{'' if in_order else ' (OUT OF ORDER)'}"
        )
        self.stdout.write(self.style.SUCCESS(line) if flows_ok else self.style.ERROR(line))
        if calls > charges.count():
            self.stdout.write(
                "    (the fake gateway dropped replies; each retry sent the job's idempotency "
                "key again and got the same charge back)"
            )
        approval = Job.objects.get(pk=jobs["approval"][0])
        timer = Job.objects.get(pk=jobs["cooling_off"][0])
        shipped = Order.objects.get(pk=jobs["wholesale"][0])
        waited = (
            approval.state == timer.state == JobState.COMPLETED
            and shipped.fulfilled_at is not None
            and shipped.fulfilled_at >= timer.finished_at >= approval.finished_at
            and (timer.finished_at - approval.finished_at).total_seconds() >= COOLING_OFF_SECONDS
        )
        ok &= waited
        line = (
            f"    wholesale order {shipped.pk}: approved ({approval.return_value}), shipped after "
            f"a {COOLING_OFF_SECONDS:g}s cooling-off timer"
            + ("" if waited else " (NOT AS EXPECTED)")
        )
        self.stdout.write(self.style.SUCCESS(line) if waited else self.style.ERROR(line))
        verdict = "every job ended as expected" if ok else "some jobs did not end as expected"
        self.stdout.write((self.style.SUCCESS if ok else self.style.ERROR)(f"    {verdict}"))
        return ok

    def enqueue_console_jobs(self) -> int:
        """Something for the console to show besides finished jobs: one running, one later."""
        report = build_report.enqueue(REPORT_SECONDS)
        later = timezone.now() + SCHEDULED_IN
        flaky_sync.using(run_after=later).enqueue("TEA-500G")
        self.stdout.write(
            f"    a long report (job {report.id}: running, cancel it from its page) and an "
            f"inventory sync scheduled for {later:%H:%M} UTC"
        )
        return int(report.id)

    def place_orders_now_and_then(self) -> None:
        """A customer every TRAFFIC_SECONDS, so the dashboard has throughput to chart."""
        stop = threading.Event()
        self.stop_traffic = stop.set

        def shop() -> None:
            n = 0
            while not stop.wait(TRAFFIC_SECONDS):
                email, item, quantity, price = DEMO_ORDERS[n % len(DEMO_ORDERS)]
                try:
                    place_order(email=email, item=item, quantity=quantity, unit_price_cents=price)
                except Exception as exc:  # The demo's site keeps serving.
                    self.stderr.write(f"    demo traffic stopped: {exc}")
                    return
                finally:
                    connections.close_all()
                n += 1

        threading.Thread(target=shop, name="demo-traffic", daemon=True).start()
        self.stdout.write(f"    a demo customer places an order every {TRAFFIC_SECONDS:g}s")

    def serve(
        self,
        port: int,
        login: str,
        api_key: str,
        settled: bool,
        traffic: bool,
        workflow: list[int],
    ) -> None:
        base = f"http://127.0.0.1:{port}"
        report = self.enqueue_console_jobs()
        if traffic:
            self.place_orders_now_and_then()
        self.step("Serving the shop (Ctrl-C stops the site and the worker)")
        self.stdout.write(f"    shop:         {base}/")
        self.stdout.write(f"    admin:        {base}/admin/  ({login})")
        self.stdout.write(f"    dashboard:    {base}/admin/conveyor/dashboard/")
        self.stdout.write(f"    dead letters: {base}/admin/conveyor/deadletter/")
        self.stdout.write(f"    running job:  {base}/admin/conveyor/job/{report}/change/")
        for job_id in workflow:
            self.stdout.write(f"    a workflow:   {base}/admin/conveyor/job/{job_id}/workflow/")
        self.show_api(base, api_key)
        if not settled:
            self.stderr.write("    (the demo jobs did not settle as expected; see above)")
        call_command("runserver", f"127.0.0.1:{port}", use_reloader=False)

    def show_api(self, base: str, api_key: str) -> None:
        self.stdout.write(f"    API docs:     {base}/conveyor/api/docs")
        self.stdout.write(f"    metrics:      {base}/conveyor/metrics")
        if self.metrics_port is not None:
            self.stdout.write(f"    worker:       http://127.0.0.1:{self.metrics_port}/metrics")
        self.stdout.write(f"    API key:      {api_key}")
        self.stdout.write("    enqueue a receipt over HTTP:")
        self.stdout.write(f"      {curl_enqueue(base, api_key)}")

    def stop_worker(self, worker: subprocess.Popen[bytes]) -> None:
        if worker.poll() is not None:
            return
        self.step(f"Stopping the worker (pid {worker.pid})")
        worker.send_signal(signal.SIGTERM)
        try:
            code = worker.wait(WORKER_STOP_TIMEOUT_SECONDS)
        except KeyboardInterrupt:
            # A second Ctrl-C: pass it on; the worker exits at once and the
            # leases it still holds expire and are reaped by the next worker.
            self.stderr.write("    stopping the worker at once")
            worker.send_signal(signal.SIGTERM)
            code = worker.wait(WORKER_STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self.stderr.write("    the worker did not stop in time; killing it")
            worker.kill()
            code = worker.wait()
        self.stdout.write(f"    worker exited with {code}")
