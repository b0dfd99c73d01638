"""An inbox over the project's own model (pgmsg.ModelInbox): its rows are the messages."""

import pytest
from django.db import connection, models
from django.db.models.functions import Now

import pgmsg
from pgmsg.core import errors
from pgmsg.core.worker import Worker
from pgmsg.inbox import operations as inbox_ops
from pgmsg.models import InboxMessage
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.testapp.every_field import EveryField
from pgmsg_tests.testapp.inbox_models import WebhookEvent
from pgmsg_tests.testapp.models import Effect, Order

pytestmark = pytest.mark.django_db(transaction=True)


def drain(partition=None) -> Worker:
    worker = Worker(
        inboxes=["test.webhooks"],
        until_idle=True,
        install_signal_handlers=False,
        partition=partition,
    )
    worker.run()
    return worker


def effects() -> dict:
    found = {}
    for key in Effect.objects.filter(channel="inbox:test.webhooks").values_list("key", flat=True):
        found[key] = found.get(key, 0) + 1
    return found


def make_due_now() -> None:
    InboxMessage.objects.filter(status="pending").update(available_at=Now())


@pytest.mark.parametrize(
    "options, complaint",
    [
        ({"model": object}, "must be a Django model"),
        ({"id_field": "kind"}, "must be unique"),
        ({"id_field": "nope"}, "'nope' is not a field"),
        ({"processed_field": "kind"}, "nullable DateTimeField or a BooleanField"),
        ({"ordered": True}, "not supported"),
    ],
)
def test_bad_model_inbox_declarations_are_refused(options, complaint):
    args = {
        "model": WebhookEvent,
        "id_field": "event_id",
        "type_field": "kind",
        "processed_field": "processed_at",
        **options,
    }
    with pytest.raises(errors.ConfigurationError, match=complaint):
        pgmsg.ModelInbox("test.bad-model", **args)


def test_rows_are_processed_once_and_marked_in_the_handlers_transaction():
    for i in range(5):
        WebhookEvent.objects.create(event_id=f"evt-{i}", kind="charge", account=f"acc-{i % 2}")
    drain()
    assert effects() == {f"evt-{i}": 1 for i in range(5)}
    assert not WebhookEvent.objects.filter(processed_at__isnull=True).exists()
    assert Effect.objects.get(key="evt-3").data == {
        "pk": WebhookEvent.objects.get(event_id="evt-3").pk,
        "account": "acc-1",
    }
    drain()
    assert sum(effects().values()) == 5
    assert not InboxMessage.objects.exists()  # no failures, so no records


def test_failures_are_recorded_retried_dead_lettered_and_replayed(settings):
    settings.PGMSG = {**settings.PGMSG, "RETRY_BACKOFF": 30.0, "RETRY_BACKOFF_MAX": 60.0}
    WebhookEvent.objects.create(event_id="bad", kind="charge", body={"fail_unless_fixed": True})
    WebhookEvent.objects.create(event_id="odd", kind="unknown.kind")
    WebhookEvent.objects.create(event_id="ok", kind="refund")
    drain()
    record = InboxMessage.objects.get(inbox="test.webhooks", message_id="bad")
    assert (record.status, record.attempts) == ("pending", 1)
    assert "not fixed yet" in record.last_error
    assert InboxMessage.objects.get(message_id="odd").status == "dead"
    drain()  # backing off: not claimed again yet
    assert InboxMessage.objects.get(message_id="bad").attempts == 1
    make_due_now()
    drain()
    record = InboxMessage.objects.get(message_id="bad")
    assert (record.status, record.attempts) == ("dead", 2)  # max_attempts=2
    [health] = pgmsg.inbox_health(["test.webhooks"])
    assert (health.pending, health.dead, health.processed_last_minute) == (0, 2, 1)
    assert WebhookEvent.objects.filter(processed_at__isnull=True).count() == 2
    Effect.objects.create(key="fixed:bad")
    assert inbox_ops.replay("test.webhooks", [record.id]) == 1
    assert pgmsg.inbox_health(["test.webhooks"])[0].pending == 1
    drain()
    assert effects() == {"ok": 1, "bad": 1}
    assert InboxMessage.objects.get(message_id="bad").status == "processed"
    inbox_ops.discard("test.webhooks", type="unknown.kind", reason="no such webhook")
    drain()
    assert WebhookEvent.objects.get(event_id="odd").processed_at is None
    assert pgmsg.inbox_health(["test.webhooks"])[0].status == "healthy"


def test_partitions_share_model_rows_by_aggregate_field():
    for i in range(20):
        WebhookEvent.objects.create(event_id=f"p-{i}", kind="charge", account=f"acc-{i % 6}")
    drain(partition=(0, 2))
    first = set(effects())
    drain(partition=(1, 2))
    assert 0 < len(first) < 20 and sum(effects().values()) == 20
    accounts = dict(WebhookEvent.objects.values_list("event_id", "account"))
    assert not {accounts[k] for k in first} & {accounts[k] for k in set(effects()) - first}


@pytest.mark.processes
def test_the_wake_trigger_wakes_a_running_worker(workers):
    WebhookEvent.objects.create(event_id="before-start", kind="charge")
    workers.start("--inbox", "test.webhooks", "--settings", "pgmsg_tests.testapp.inbox_settings")
    # Handled by the start-up sweep; the next sweep is 10 minutes away.
    wait_for(lambda: effects() == {"before-start": 1}, timeout=30, message="start-up sweep")
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO testapp_webhookevent (event_id, kind, account, body) "
            "VALUES ('raw', 'charge', '', '{}')"
        )
    wait_for(
        lambda: effects() == {"before-start": 1, "raw": 1},
        timeout=20,
        message="worker woke by NOTIFY",
    )


def test_order_model_without_a_unique_key_is_refused():
    with pytest.raises(errors.ConfigurationError, match="must be unique"):
        pgmsg.ModelInbox(
            "test.orders",
            model=Order,
            id_field="reference",
            type_field="reference",
            processed_field="placed_at",
        )
    assert isinstance(Order._meta.get_field("placed_at"), models.DateTimeField)


# -- the claim's index ---------------------------------------------------------------------


def test_a_model_without_an_index_over_its_unprocessed_rows_is_warned_with_the_index_to_add():
    from pgmsg import checks
    from pgmsg.inbox import declarations

    pgmsg.ModelInbox(
        "test.orders-unindexed",
        model=Order,
        id_field="id",
        type_field="reference",
        processed_field="placed_at",
    )
    try:
        warned = [p for p in checks.check_model_inboxes() if p.id == "pgmsg.W001"]
    finally:
        declarations.registry.inboxes.pop("test.orders-unindexed")
    assert [p.obj for p in warned] == [Order]  # WebhookEvent declares the index
    assert "'test.orders-unindexed'" in warned[0].msg
    assert (
        'models.Index(fields=["id"], condition=models.Q(placed_at__isnull=True), '
        'name="testapp_order_unprocessed")' in warned[0].hint
    )


def test_the_claim_reads_the_index_the_check_asks_for():
    """With the index (pgmsg_tests' WebhookEvent declares it, as pgmsg.W001 asks), the claim
    reads only the unprocessed rows' entries, not the primary key's over processed rows."""
    from pgmsg.inbox import model_inbox
    from pgmsg.inbox.declarations import registry

    WebhookEvent.objects.bulk_create(
        WebhookEvent(event_id=f"ix-{i}", kind="charge", processed_at=None if i < 5 else Now())
        for i in range(2000)
    )
    claim = model_inbox.queries(registry.get("test.webhooks"))["claim"]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE testapp_webhookevent")
        params = {"inbox": "test.webhooks", "parts": 1, "part": 0, "limit": 100}
        cursor.execute(f"EXPLAIN {cursor.mogrify(claim, params)}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "webhook_unprocessed" in plan, plan


@pytest.fixture
def boolean_marked():
    """A model inbox over EveryField, processed_field its nullable BooleanField (NULL and
    false are unprocessed), recording each handled row's pk; undeclared afterwards."""
    from pgmsg.inbox import declarations

    spec = pgmsg.ModelInbox(
        "test.every", model=EveryField, id_field="id", type_field="char", processed_field="boolean"
    )
    handled = []
    spec.handler("row")(lambda message: handled.append(message.payload.pk))
    yield spec, handled
    declarations.registry.inboxes.pop(spec.name)
    declarations.registry.handlers.pop((spec.name, "row"))


def test_a_boolean_mark_takes_null_and_false_as_unprocessed_and_its_index_is_read(
    boolean_marked,
):
    from pgmsg import checks
    from pgmsg.inbox import model_inbox

    spec, handled = boolean_marked
    rows = {mark: EveryField.objects.create(char="row", boolean=mark) for mark in (None, False)}
    EveryField.objects.create(char="row", boolean=True)
    [warned] = [p for p in checks.check_model_inboxes() if p.obj is EveryField]
    condition = "models.Q(boolean__isnull=True) | models.Q(boolean=False)"
    assert f"condition={condition}" in warned.hint
    Worker(inboxes=["test.every"], until_idle=True, install_signal_handlers=False).run()
    assert sorted(handled) == sorted(row.pk for row in rows.values())
    assert EveryField.objects.filter(boolean=True).count() == 3

    # The index the hint names is what the claim reads.
    index = models.Index(
        fields=["id"],
        condition=models.Q(boolean__isnull=True) | models.Q(boolean=False),
        name="every_unprocessed",
    )
    EveryField.objects.bulk_create(EveryField(char="row", boolean=True) for _ in range(2000))
    with connection.schema_editor() as editor:
        editor.add_index(EveryField, index)
    try:
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE testapp_everyfield")
            params = {"inbox": "test.every", "parts": 1, "part": 0, "limit": 100}
            claim = cursor.mogrify(model_inbox.queries(spec)["claim"], params)
            cursor.execute(f"EXPLAIN {claim}")
            plan = "\n".join(row[0] for row in cursor.fetchall())
    finally:
        with connection.schema_editor() as editor:
            editor.remove_index(EveryField, index)
    assert "every_unprocessed" in plan, plan
