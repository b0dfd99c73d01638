"""The tests' flush: empties what Django's flush empties, touching only the tables that hold rows.

Django's TransactionTestCase ends each test with `flush`: one TRUNCATE of every model table,
which on pgmsg's schema is some 500 relations (partitions and their indexes) all given new
files, then post_migrate to make content types and permissions again. That was about a second
per transactional test, half of `make test-fast`. This command (an app's command overrides
Django's own) truncates only the tables that hold rows, and leaves the content types and
permissions that migrate made, so post_migrate has nothing to do. What a test sees at its
start is the same: every model table empty but those two.
"""

from __future__ import annotations

from django.core.management.commands import flush
from django.db import DEFAULT_DB_ALIAS, connections
from psycopg import sql

#: Made by post_migrate at migrate time and the same for every test.
KEPT = {"django_content_type", "auth_permission"}


class Command(flush.Command):
    def handle(self, **options):
        connection = connections[options.get("database") or DEFAULT_DB_ALIAS]
        tables = set(connection.introspection.django_table_names(only_existing=True)) - KEPT
        with connection.cursor() as cursor:
            cursor.execute(
                # Partitions and inheritance children (TRUNCATE empties both), every table
                # among them that can hold rows of its own.
                "WITH RECURSIVE tree(rel) AS (SELECT unnest(%s::regclass[])::oid "
                "UNION SELECT i.inhrelid FROM pg_inherits AS i "
                "JOIN tree ON i.inhparent = tree.rel) "
                "SELECT rel::regclass::text FROM tree JOIN pg_class AS c ON c.oid = rel "
                "WHERE c.relkind = 'r'",
                [sorted(tables)],
            )
            leaves = [name for (name,) in cursor.fetchall()]
            if not leaves:
                return
            holding = sql.SQL(" UNION ALL ").join(
                sql.SQL("SELECT {name} WHERE EXISTS (SELECT FROM ONLY {table})").format(
                    name=sql.Literal(leaf),
                    table=sql.SQL(leaf),  # regclass text: quoted already
                )
                for leaf in leaves
            )
            cursor.execute(holding.as_string(cursor.cursor.connection))
            full = [name for (name,) in cursor.fetchall()]
            if full:
                # CASCADE: a table that references a truncated one is emptied with it, as the
                # whole-schema TRUNCATE would have emptied it.
                cursor.execute(f"TRUNCATE {', '.join('ONLY ' + name for name in full)} CASCADE")
