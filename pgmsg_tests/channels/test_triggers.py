"""Trigger channels fire for every kind of write, with old and new rows as model instances."""

import datetime as dt
from decimal import Decimal

import pytest
from django.db import connection

from pgmsg_tests.helpers import drain
from pgmsg_tests.testapp.models import Effect, Order

pytestmark = pytest.mark.django_db(transaction=True)


def changes():
    drain()
    return [e.data for e in Effect.objects.filter(channel="order_changed").order_by("id")]


def test_orm_save_insert_carries_the_new_row_with_exact_types():
    placed = dt.datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=dt.UTC)
    order = Order.objects.create(
        reference="A-1",
        total=Decimal("19.99"),
        weight=1.5,
        placed_at=placed,
        details={"ratio": 0.25, "n": [1, 2.5]},
    )
    (change,) = changes()
    assert change["op"] == "INSERT" and change["old"] is None
    assert change["new"]["id"] == order.pk
    assert change["new"]["total"] == "19.99"
    assert change["new"]["types"] == ["Decimal", "float"]
    assert change["new"]["weight"] == 1.5
    assert change["new"]["details"] == {"ratio": 0.25, "n": [1, 2.5]}
    assert change["new"]["placed_at"] == placed.isoformat()


def test_orm_save_update_carries_old_and_new():
    order = Order.objects.create(reference="B-1", total=Decimal("1.00"))
    order.total = Decimal("2.00")
    order.save()
    _, change = changes()
    assert change["op"] == "UPDATE"
    assert change["old"]["total"] == "1.00" and change["new"]["total"] == "2.00"


def test_bulk_create_fires_once_per_row():
    Order.objects.bulk_create([Order(reference=f"C-{i}") for i in range(20)])
    assert sorted(c["new"]["reference"] for c in changes()) == sorted(f"C-{i}" for i in range(20))


def test_queryset_update_fires_for_each_row():
    Order.objects.bulk_create([Order(reference=f"D-{i}", total=1) for i in range(3)])
    drain()
    Effect.objects.all().delete()
    Order.objects.filter(reference__startswith="D-").update(total=Decimal("5.50"))
    updates = changes()
    assert [c["op"] for c in updates] == ["UPDATE"] * 3
    assert {c["new"]["total"] for c in updates} == {"5.50"}
    assert {c["old"]["total"] for c in updates} == {"1.00"}


def test_raw_sql_writes_fire_too():
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO testapp_order (reference, total, weight, details) "
            "VALUES ('E-1', 3.25, 0, '{}')"
        )
    (change,) = changes()
    assert change["op"] == "INSERT" and change["new"]["reference"] == "E-1"
    assert change["new"]["total"] == "3.25"


def test_deletes_carry_the_old_row():
    order = Order.objects.create(reference="F-1", total=Decimal("7.00"))
    pk = order.pk
    order.delete()
    _, change = changes()
    assert change["op"] == "DELETE" and change["new"] is None
    assert change["old"] == {"reference": "F-1", "total": "7.00", "id": pk}
