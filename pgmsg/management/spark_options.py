"""The Spark options that the commands running a Spark job share (--master, --conf)."""

from __future__ import annotations

import argparse


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
