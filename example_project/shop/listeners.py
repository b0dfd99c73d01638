"""The shop's listeners, discovered by pgmsg at start-up."""

import logging
import os

import pgmsg
from example_project.shop.channels import FraudCheck, OrderPaid, PriceChanged
from example_project.shop.models import Invoice, Shipment

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
