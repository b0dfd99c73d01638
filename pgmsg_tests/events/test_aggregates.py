"""Event-sourced aggregates: load by replay, save with the loaded version as expected version."""

from decimal import Decimal

import pytest

import pgmsg
from pgmsg.core import errors
from pgmsg.models import Snapshot
from pgmsg_tests.testapp.events_handlers import Account, Step

pytestmark = pytest.mark.django_db(transaction=True)


def test_repository_loads_and_saves_aggregates_with_optimistic_concurrency():
    accounts = pgmsg.Repository(Account)
    account = accounts.load("a1")
    assert account.version == 0
    account.open("ann")
    account.deposit(Decimal(10))
    assert accounts.save(account) == 2 and account.pending == []
    first, second = accounts.load("a1"), accounts.load("a1")
    assert (first.owner, first.balance, first.version) == ("ann", Decimal(10), 2)
    first.withdraw(Decimal(4))
    accounts.save(first)
    second.withdraw(Decimal(8))  # decided on a stale balance
    with pytest.raises(errors.ConcurrencyError, match="at version 3, but the append expected 2"):
        accounts.save(second)
    assert accounts.load("a1").balance == Decimal(6)
    with pytest.raises(ValueError, match="balance 6 < 8"):
        accounts.load("a1").withdraw(Decimal(8))


def test_a_new_aggregate_saved_twice_concurrently_is_created_once():
    accounts = pgmsg.Repository(Account)
    one, two = accounts.load("a2"), accounts.load("a2")
    one.open("x")
    two.open("y")
    accounts.save(one)
    with pytest.raises(errors.ConcurrencyError, match="expected pgmsg.NO_STREAM"):
        accounts.save(two)


def test_aggregate_declarations_are_checked():
    with pytest.raises(errors.ConfigurationError, match="give the stream category"):

        class NoCategory(pgmsg.Aggregate):
            pass

    with pytest.raises(errors.ConfigurationError, match="no method apply_step"):
        Account("a3").record(Step(n=1))


def test_snapshots_are_taken_every_n_versions_and_loading_starts_from_them():
    accounts = pgmsg.Repository(Account, snapshot_every=3)
    account = accounts.load("s1")
    account.open("sue")
    accounts.save(account)
    for _ in range(4):
        account.deposit(Decimal(1))
        accounts.save(account)  # versions 2..5; crossing 3 takes a snapshot
    snapshot = Snapshot.objects.get(stream_name="account-s1")
    assert (snapshot.version, snapshot.state) == (3, {"owner": "sue", "balance": "2"})
    # Loading replays only what follows the snapshot: a marked snapshot shows it.
    Snapshot.objects.filter(pk="account-s1").update(state={"owner": "sue", "balance": "100"})
    loaded = accounts.load("s1")
    assert (loaded.version, loaded.balance) == (5, Decimal(102))
    # A snapshot of another snapshot_version is ignored: the full stream is replayed.

    class AccountV2(Account, category="account"):
        snapshot_version = 2

    fresh = pgmsg.Repository(AccountV2, snapshot_every=3).load("s1")
    assert (fresh.version, fresh.balance) == (5, Decimal(4))
    with pytest.raises(errors.ConfigurationError, match="snapshot_every must be"):
        pgmsg.Repository(Account, snapshot_every=0)
