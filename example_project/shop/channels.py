"""The shop's declared channels."""

import datetime as dt
from decimal import Decimal

import pgmsg


class OrderPaid(pgmsg.Channel, name="shop.order_paid"):
    order_id: int
    amount: Decimal
    paid_at: dt.datetime


class FraudCheck(pgmsg.Channel, name="shop.fraud_check"):
    """Its listener always fails, to show retries and the dead-letter queue."""

    order_id: int


class PriceChanged(pgmsg.Channel, name="shop.price_changed", delivery=pgmsg.BROADCAST):
    sku: str
    price: Decimal


class PointsEarned(pgmsg.Event, type="loyalty.points_earned"):
    points: int


class PointsSpent(pgmsg.Event, type="loyalty.points_spent"):
    points: int


class OrderPlaced(pgmsg.Event, type="shop.order_placed"):
    """Appended to ``order-<id>`` with each order by ``manage.py demo --live``: the live page's
    feed (example_project/shop/live.py)."""

    customer: str
    total: Decimal
