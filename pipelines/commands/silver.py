"""``sfcdc silver``: decode the bronze rows not yet processed into the silver tables.

::

    sfcdc silver [--conf conf/] [--objects Account,Contact]

Each object's silver table records, with a Delta app transaction, the last bronze version it
processed, so the command only reads what bronze gained since, and running it again without
new bronze rows changes nothing. Rows that cannot be decoded go to the quarantine table with
the reason.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from pipelines.commands.conf_options import add_conf_options, conf_from_args
from pipelines.ops.recorder import recorder_for
from pipelines.session import engine_for
from pipelines.silver.job import QUARANTINE_TABLE, SilverResult, run_silver

if TYPE_CHECKING:
    pass

__all__ = ["register", "run", "summary"]


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
    engine = engine_for(conf.pipeline.lake)
    ops = recorder_for(engine, conf)
    with ops.watching("silver"):
        result = run_silver(engine, conf, objects=objects, on_commit=ops.record)
    for line in summary(result):
        print(line)
    if not result.topics:
        print("nothing to do: no bronze table of the selected objects exists yet")
    return 0
