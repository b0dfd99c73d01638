"""Each broker, for real: what the relay publishes is read back from the broker."""

from __future__ import annotations

import pytest
from django.db import transaction

from pgmsg.outbox import destinations, operations
from pgmsg_tests.outbox import brokers
from pgmsg_tests.outbox.helpers import make_due_now, relay, rows
from pgmsg_tests.testapp.outbox_declarations import BY_BROKER

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=sorted(brokers.CLIENTS))
def broker(request):
    client = brokers.connect(request.param)
    yield client
    destinations.close_all()
    client.close()


def test_committed_messages_reach_the_broker_in_key_order_and_rolled_back_ones_never(broker):
    outbox = BY_BROKER[broker.kind]
    topic = broker.topic()
    published = []
    for n in range(40):
        key = f"key-{n % 4}"
        published.append(
            outbox.publish("order.placed", {"n": n}, topic=topic, key=key, headers={"h": "v"})
        )
        if n == 20:
            with pytest.raises(RuntimeError), transaction.atomic():
                outbox.publish("order.placed", {"n": "rolled back"}, topic=topic, key="key-0")
                raise RuntimeError("roll back")
    relay(outbox.name, batch_size=16)
    assert not rows(outbox.name).exists()
    # The last message of each key arrived last, so once all 40 are there, so is anything
    # published before them (the rolled-back one would be among them).
    got = broker.consume(topic, 40)
    assert sorted(m["payload"]["n"] for m in got) == list(range(40))
    for key in {f"key-{i}" for i in range(4)}:
        numbers = [m["payload"]["n"] for m in got if m["key"] == key]
        assert numbers == sorted(numbers)
    first = next(m for m in got if m["payload"]["n"] == 0)
    assert first["message_id"] == published[0].message_id
    assert first["headers"]["h"] == "v"
    assert first["headers"]["pgmsg-type"] == "order.placed"
    assert first["headers"]["pgmsg-redelivery-count"] == "0"


def test_a_refused_message_becomes_a_dead_letter_with_the_brokers_error(broker):
    outbox = BY_BROKER[broker.kind]
    refused_topic = broker.refused_topic()
    good_topic = broker.topic()
    bad = outbox.publish("order.placed", {"n": 1}, topic=refused_topic, key="k")
    outbox.publish("order.placed", {"n": 2}, topic=good_topic, key="other")
    for _ in range(2):  # max_attempts=2
        relay(outbox.name)
        make_due_now(outbox.name)
    dead = operations.dead_letters(outbox.name).get()
    assert dead.message_id == bad.message_id and dead.attempts == 2
    expected = {
        "amqp": "unroutable",
        "nats": "no JetStream stream takes this subject",
        "redis": "WRONGTYPE",
        "mqtt": "wildcards",
    }[broker.kind]
    assert expected in dead.last_error
    assert [m["payload"]["n"] for m in broker.consume(good_topic, 1)] == [2]
    if broker.fix is None:
        return  # no broker setting makes an MQTT wildcard topic publishable
    broker.fix(refused_topic)
    assert operations.replay([dead.id]) == 1
    relay(outbox.name)
    assert not rows(outbox.name).exists()
    (replayed,) = broker.consume(refused_topic, 1)
    assert replayed["message_id"] == bad.message_id
