"""The shop's listeners, discovered by pgmsg at start-up."""

import logging
import os

import pgmsg
from example_project.shop.channels import (
    FraudCheck,
    OrderPaid,
    PointsEarned,
    PointsSpent,
    PriceChanged,
)
from example_project.shop.models import Invoice, LoyaltyBalance, Order, Payment, Shipment

logger = logging.getLogger(__name__)


@pgmsg.listener("shop.order_changed")
def ship_new_orders(change: pgmsg.RowChange) -> None:
    if change.operation == "INSERT":
        Shipment.objects.create(order_id=change.new.pk, worker_pid=os.getpid())


@pgmsg.listener(OrderPaid)
def write_invoice(message: OrderPaid) -> None:
    Invoice.objects.create(
        order_id=message.order_id,
        amount=message.amount,
        paid_at=message.paid_at,
        worker_pid=os.getpid(),
    )


@pgmsg.listener(FraudCheck)
def call_fraud_service(message: FraudCheck) -> None:
    raise ConnectionError(f"fraud service unreachable for order {message.order_id}")


@pgmsg.listener(PriceChanged)
def refresh_price_cache(message: PriceChanged) -> None:
    logger.warning("worker %s: price of %s is now %s", os.getpid(), message.sku, message.price)


# -- the transactional inbox: webhooks from a payment provider -------------------------------

webhooks = pgmsg.Inbox("shop.webhooks", ordered=True)


@webhooks.handler("payment.captured")
def record_payment(message: pgmsg.InboxMessage) -> None:
    Payment.objects.create(order_id=int(message.aggregate_id), provider_ref=message.payload["ref"])
    Order.objects.filter(pk=int(message.aggregate_id)).update(status="paid")


# -- the event store: a loyalty balance projected from loyalty-<customer> streams ------------

loyalty = pgmsg.Subscription("shop.loyalty", category="loyalty", partitions=2)


@loyalty.handler(PointsEarned, PointsSpent)
def project_balance(recorded: pgmsg.RecordedEvent) -> None:
    customer = recorded.stream_name.split("-", 1)[1]
    delta = (
        recorded.event.points
        if recorded.type == "loyalty.points_earned"
        else -recorded.event.points
    )
    balance, _ = LoyaltyBalance.objects.get_or_create(customer=customer)
    balance.points += delta
    balance.events_seen += 1
    balance.save()
