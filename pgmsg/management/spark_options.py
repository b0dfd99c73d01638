"""The Spark options that the commands running a Spark job share (--master, --conf)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator

from django.core.management.base import CommandError

#: The `spark` extra's libraries (setup.cfg): Spark, Arrow, and the report's plots.
SPARK_EXTRA = ("pyspark", "pyarrow", "matplotlib")
#: What to install: pgmsg itself is not on PyPI (README), so not pgmsg with the extra.
INSTALL = (
    "pip install pyspark pyarrow matplotlib (or the checkout with its extra: './pgmsg[spark]')"
)


@contextlib.contextmanager
def spark_extra(command: str) -> Iterator[None]:
    """Around a command's imports of the export modules, made when it runs (its --help needs
    none of them): a library of the `spark` extra missing is one line naming it
    (CommandError), not a traceback."""
    try:
        yield
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in SPARK_EXTRA:
            raise
        raise CommandError(
            f"{command} needs the `spark` extra: {missing} is not installed; {INSTALL}"
        ) from None


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(text)
    return key, value


def add_spark_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--master", help="Spark master URL (default: PGMSG EXPORT_SPARK_MASTER, local[*])"
    )
    parser.add_argument(
        "--conf",
        action="append",
        type=_key_value,
        default=[],
        metavar="KEY=VALUE",
        help="Spark configuration, repeatable",
    )
