"""``sfcdc silver``: decode the bronze rows not yet processed into the silver tables.

::

    sfcdc silver [--conf conf/] [--objects Account,Contact]
    sfcdc silver [--conf conf/] --retry-quarantine

Each object's silver table records, with a Delta app transaction, the last bronze version it
processed, so the command only reads what bronze gained since, and running it again without
new bronze rows changes nothing. Rows that cannot be decoded go to the quarantine table with
the reason. ``--retry-quarantine`` then fetches, through the configured source, the schemas
that quarantined rows lacked (GetSchema had refused them when they were landed), and decodes
those rows into silver once (see :mod:`pipelines.silver.retry`).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ingest.client import SchemaCache
from pipelines.commands.conf_options import add_conf_options, conf_from_args, secrets_from_args
from pipelines.connect import connect
from pipelines.ops.recorder import recorder_for
from pipelines.session import engine_for
from pipelines.silver.job import SilverResult, run_silver
from pipelines.silver.retry import RetryResult, retry_quarantine
from pipelines.silver.tables import QUARANTINE_TABLE

if TYPE_CHECKING:
    pass

__all__ = ["register", "retry_summary", "run", "summary"]


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def register(subparsers: Any) -> None:
    """Add the ``silver`` subcommand."""
    parser = subparsers.add_parser(
        "silver",
        help="decode new bronze rows into the silver tables",
        description=(
            "Decode the bronze rows not yet processed into one typed silver table per object; "
            "rows that cannot be decoded go to the quarantine table with the reason. Running "
            "it again without new bronze rows changes nothing."
        ),
    )
    add_conf_options(parser)
    parser.add_argument(
        "--objects",
        nargs="+",
        type=_names,
        default=None,
        metavar="OBJECT",
        help="only these objects (API names, comma- or space-separated); default: all enabled",
    )
    parser.add_argument(
        "--retry-quarantine",
        action="store_true",
        help="then fetch the schemas quarantined rows lacked through the configured source "
        "and decode those rows into silver (once; they are marked resolved)",
    )
    parser.set_defaults(handler=run)


def summary(result: SilverResult) -> list[str]:
    """One line per object and one for the quarantine, as the command prints them."""
    lines = []
    for topic in result.topics:
        for obj in topic.objects:
            if obj.commits == 0:
                lines.append(
                    f"{obj.object}: up to date ({obj.table} has bronze "
                    f"{topic.bronze_table} up to version {obj.bronze_version})"
                )
                continue
            lines.append(
                f"{obj.object}: {obj.events} events -> {obj.rows} rows in {obj.table} "
                f"(version {obj.silver_version}, {obj.commits} commit"
                f"{'s' if obj.commits != 1 else ''}), bronze {topic.bronze_table} up to version "
                f"{obj.bronze_version}"
            )
    if result.quarantined:
        lines.append(f"quarantined: {result.quarantined} rows in {QUARANTINE_TABLE}")
    return lines


def run(args: argparse.Namespace) -> int:
    """Run the silver job for the parsed arguments."""
    conf = conf_from_args(args)
    objects = [name for group in args.objects for name in group] if args.objects else None
    engine = engine_for(conf.pipeline.lake, write=True)
    ops = recorder_for(engine, conf)
    with ops.watching("silver"):
        result = run_silver(engine, conf, objects=objects, on_commit=ops.record)
    for line in summary(result):
        print(line)
    if not result.topics:
        print("nothing to do: no bronze table of the selected objects exists yet")
    if not getattr(args, "retry_quarantine", False):
        return 0
    with connect(conf.pipeline.connection, secrets=secrets_from_args(args)) as source:
        schemas = SchemaCache(source.channel, tokens=source.tokens)
        retried = retry_quarantine(engine, conf, fetch=schemas.schema_json)
    for line in retry_summary(retried):
        print(line)
    return 1 if retried.refused else 0


def retry_summary(result: RetryResult) -> list[str]:
    """What ``--retry-quarantine`` prints."""
    lines = [
        f"retry-quarantine: {len(result.fetched)} schemas fetched, {result.resolved} quarantined "
        f"rows decoded into silver ({result.still_open} still open)"
    ]
    for name, rows in sorted(result.appended.items()):
        lines.append(f"  {name}: {rows} rows appended")
    for sid, error in sorted(result.refused.items()):
        lines.append(f"  schema {sid} is still refused: {error}")
    return lines
