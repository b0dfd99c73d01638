"""manage.py demo: pgmsg end to end, visibly, on the embedded (or DATABASE_URL) PostgreSQL."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

import pgmsg
from example_project.shop.channels import (
    FraudCheck,
    OrderPaid,
    OrderPlaced,
    PointsEarned,
    PointsSpent,
    PriceChanged,
)
from example_project.shop.live import start_live_page
from example_project.shop.models import Invoice, LoyaltyBalance, Order, Payment, Shipment
from pgmsg.models import Notification, NotificationDeadLetter

ROOT = Path(__file__).resolve().parents[4]
ORDERS = 200
WEBHOOKS = 20


class Command(BaseCommand):
    help = "Run the pgmsg demo: channels, trigger channels, 2 workers, exactly-once, dead letters."
    # Checked after its own migrate: on a fresh database pgmsg.E010 (migrations not applied)
    # would refuse the run that applies them.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        parser.add_argument(
            "--live",
            action="store_true",
            help="also serve the live order feed (uvicorn) and print its URL; after the demo, "
            "place an order a second until Ctrl+C (or --live-for)",
        )
        parser.add_argument("--live-port", type=int, default=8765, help="its port (8765)")
        parser.add_argument(
            "--live-for",
            type=float,
            default=0.0,
            help="seconds to keep placing orders after the demo (0: until Ctrl+C)",
        )

    def handle(self, *args, **options):
        say = self.stdout.write
        self.live = options["live"]
        say(self.style.MIGRATE_HEADING("1. Database and migrations"))
        call_command("migrate", verbosity=0)
        self.check()
        Order.objects.all().delete()  # cascades to shipments
        Invoice.objects.all().delete()
        LoyaltyBalance.objects.all().delete()
        Notification.objects.filter(channel__startswith="shop.").delete()
        NotificationDeadLetter.objects.filter(channel__startswith="shop.").delete()
        say("   migrated; shop tables emptied for a fresh run")

        say(
            self.style.MIGRATE_HEADING(
                "2. Start `manage.py listen --processes 2` in the background"
            )
        )
        supervisor = subprocess.Popen(
            [sys.executable, "manage.py", "listen", "--processes", "2"],
            cwd=ROOT,
            env=dict(os.environ),
            start_new_session=True,
        )
        server = None
        try:
            if self.live:
                server, self.live_url = start_live_page(say, port=options["live_port"])
            self.wait_until_listening(say, processes=2)
            self.produce(say)
            self.wait_and_report(say)
            if self.live:
                self.keep_placing_orders(say, seconds=options["live_for"])
        finally:
            say(self.style.MIGRATE_HEADING("6. Stop the workers (SIGTERM: finish, commit, exit)"))
            supervisor.send_signal(signal.SIGTERM)
            code = supervisor.wait(timeout=60)
            say(f"   supervisor exited with code {code}")
            if server is not None:
                server.send_signal(signal.SIGTERM)  # the streams end with a retry hint
                server.wait(timeout=60)
                say("   the live page's server stopped")

    def keep_placing_orders(self, say, *, seconds: float) -> None:
        say(self.style.MIGRATE_HEADING("5b. The live page: an order a second"))
        say(
            f"   watch them arrive at {self.live_url}; "
            + ("Ctrl+C to stop" if not seconds else f"for {seconds:g} s")
        )
        deadline = time.monotonic() + seconds if seconds else None
        n = 0
        try:
            while deadline is None or time.monotonic() < deadline:
                n += 1
                with transaction.atomic():
                    place(Order.objects.create(customer=f"walk-in-{n}", total=Decimal("5.00") + n))
                time.sleep(1.0)
        except KeyboardInterrupt:
            pass
        say(f"   {n} more orders placed")

    def wait_until_listening(self, say, processes: int) -> None:
        from django.db import connection

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND query LIKE 'LISTEN \"pgmsg:shop.price_changed\"'"
                )
                if cursor.fetchone()[0] >= processes:
                    say(f"   {processes} worker processes are listening")
                    return
            time.sleep(0.1)
        raise CommandError("the workers did not start listening within 60 s")

    def produce(self, say):
        say(self.style.MIGRATE_HEADING("3. Produce messages inside transactions"))
        now = dt.datetime.now(dt.UTC)
        for batch in range(ORDERS // 50):
            with transaction.atomic():
                for i in range(50):
                    order = Order.objects.create(
                        customer=f"customer-{batch}-{i}", total=Decimal("19.90") + i
                    )
                    pgmsg.notify(OrderPaid(order_id=order.pk, amount=order.total, paid_at=now))
                    if self.live:
                        place(order)
        say(
            f"   {ORDERS} orders created in 4 transactions; the Order trigger channel stored one "
            f"message per insert, and each order also sent OrderPaid"
        )
        try:
            with transaction.atomic():
                ghost = Order.objects.create(customer="rolled-back", total=Decimal("1.00"))
                pgmsg.notify(OrderPaid(order_id=ghost.pk, amount=ghost.total, paid_at=now))
                raise RuntimeError("the customer cancelled")
        except RuntimeError:
            pass
        say("   1 more order + OrderPaid in a transaction that rolled back")
        pgmsg.notify(FraudCheck(order_id=Order.objects.first().pk))
        say("   1 FraudCheck whose listener always fails (PGMSG MAX_ATTEMPTS=3)")
        pgmsg.notify(PriceChanged(sku="SKU-1", price=Decimal("9.99")))
        say("   1 PriceChanged broadcast: every worker process logs it")

        paid = list(Order.objects.order_by("pk")[:WEBHOOKS])
        stored = duplicates = 0
        for _ in range(2):  # the provider delivers every webhook twice
            for order in paid:
                result = pgmsg.receive(
                    "shop.webhooks",
                    f"evt-{order.pk}",
                    type="payment.captured",
                    payload={"ref": f"pay_{order.pk}"},
                    source="payment-provider",
                    aggregate_id=str(order.pk),
                )
                stored += result.stored
                duplicates += result.duplicate
        say(
            f"   inbox shop.webhooks: {WEBHOOKS} webhooks delivered twice each: {stored} stored, "
            f"{duplicates} recognised as duplicates"
        )

        self.run_tag = f"{int(time.time())}"
        alice, bob = f"loyalty-alice.{self.run_tag}", f"loyalty-bob.{self.run_tag}"
        with transaction.atomic():  # two streams, one transaction
            pgmsg.append(
                alice,
                [PointsEarned(points=100), PointsSpent(points=30)],
                expected_version=pgmsg.NO_STREAM,
            )
            pgmsg.append(bob, PointsEarned(points=50), expected_version=pgmsg.NO_STREAM)
        try:
            pgmsg.append(alice, PointsEarned(points=999), expected_version=1)
        except pgmsg.errors.ConcurrencyError as exc:
            say(f"   event store: 3 events on 2 streams; a stale append was refused: {exc}")

    def wait_and_report(self, say):
        say(self.style.MIGRATE_HEADING("4. Wait for the workers"))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done = (
                Shipment.objects.count() >= ORDERS
                and Invoice.objects.count() >= ORDERS
                and Payment.objects.filter(order__in=Order.objects.all()).count() >= WEBHOOKS
                and sum(LoyaltyBalance.objects.values_list("events_seen", flat=True)) >= 3
            )
            dead = NotificationDeadLetter.objects.filter(channel="shop.fraud_check")
            if done and dead.exists():
                break
            time.sleep(0.2)
        else:
            raise CommandError("the workers did not finish within 120 s; see their log above")
        time.sleep(1.0)  # let any (wrongly) duplicated delivery show up before counting

        say(self.style.MIGRATE_HEADING("5. What was handled"))
        shipments = Counter(Shipment.objects.values_list("order_id", flat=True))
        invoices = Counter(Invoice.objects.values_list("order_id", flat=True))
        by_worker = Counter(Shipment.objects.values_list("worker_pid", flat=True))
        once = (
            len(shipments) == ORDERS
            and set(shipments.values()) == {1}
            and len(invoices) == ORDERS
            and set(invoices.values()) == {1}
        )
        say(
            f"   shipments: {sum(shipments.values())} for {len(shipments)} orders; "
            f"invoices: {sum(invoices.values())} for {len(invoices)} orders"
        )
        say(f"   work shared by worker processes: {dict(by_worker)}")
        rolled_back = Invoice.objects.filter(order_id__gt=Order.objects.order_by("-pk").first().pk)
        say(f"   messages of the rolled-back transaction delivered: {rolled_back.count()}")
        dead = NotificationDeadLetter.objects.get(channel="shop.fraud_check")
        say(
            f"   dead letter #{dead.pk} on {dead.channel}: {dead.attempts} attempts, last error: "
            f"{dead.last_error.strip().splitlines()[-1]}"
        )
        say(f"   (replay it with: python manage.py pgmsg_deadletters replay {dead.pk})")
        payments = Counter(Payment.objects.values_list("order_id", flat=True))
        say(
            f"   inbox: {sum(payments.values())} payments for {len(payments)} orders "
            f"(each webhook handled once, duplicates never)"
        )
        balances = {b.customer.split(".")[0]: b.points for b in LoyaltyBalance.objects.all()}
        say(f"   subscription shop.loyalty projected the balances: {balances}")
        once = once and set(payments.values()) == {1} and len(payments) == WEBHOOKS
        once = once and balances == {"alice": 70, "bob": 50}
        if once:
            say(self.style.SUCCESS("   every order shipped and invoiced exactly once"))
        else:
            raise CommandError("a message was handled more than once or not at all")


def place(order: Order) -> None:
    """The order's event, in the order's transaction: the live page's feed."""
    pgmsg.append(f"order-{order.pk}", OrderPlaced(customer=order.customer, total=order.total))
