"""``sfcdc gold``: fold the silver rows not yet applied into the current-state gold tables.

::

    sfcdc gold [--conf conf/] [--objects Account,Contact]

Each object's gold table records, with a Delta app transaction, the last silver version it
applied, so the command only reads what silver gained since, and running it again without
new silver rows changes nothing. Records gold cannot reproduce from events (gap events,
diffs that cannot be rebuilt, overflows, replay gaps) are listed in ``gold.sfcdc_resync``.
"""

from __future__ import annotations

import argparse
from typing import Any

from pipelines.commands.conf_options import add_conf_options, conf_from_args
from pipelines.commands.silver import _names
from pipelines.gold.job import GoldResult, run_gold
from pipelines.gold.resync import RESYNC_TABLE
from pipelines.ops.recorder import recorder_for
from pipelines.session import engine_for

__all__ = ["register", "run", "summary"]


def register(subparsers: Any) -> None:
    """Add the ``gold`` subcommand."""
    parser = subparsers.add_parser(
        "gold",
        help="fold new silver rows into the gold tables (MERGE)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
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


def summary(result: GoldResult) -> list[str]:
    """One line per object, and one for the re-sync work list, as the command prints them."""
    lines = []
    for obj in result.objects:
        if obj.skipped:
            lines.append(
                f"{obj.object}: up to date ({obj.table} has {obj.silver_table} up to version "
                f"{obj.after_version})"
            )
            continue
        merge = obj.merge
        counts = (
            f"{merge.inserted} inserted, {merge.updated} updated, {merge.deleted} deleted"
            if merge is not None
            else "nothing merged"
        )
        lines.append(
            f"{obj.object}: {obj.changes} changes of {obj.records} records -> {obj.table} "
            f"({counts}; version {merge.version if merge else '-'}), {obj.silver_table} up to "
            f"version {obj.silver_version}"
        )
    flagged = sum(o.resync_rows for o in result.objects)
    if flagged:
        lines.append(f"re-sync: {flagged} rows added or resolved in {RESYNC_TABLE}")
    if result.not_applicable:
        lines.append("platform events have no gold table: " + ", ".join(result.not_applicable))
    return lines


def run(args: argparse.Namespace) -> int:
    """Run the gold job for the parsed arguments."""
    conf = conf_from_args(args)
    objects = [name for group in args.objects for name in group] if args.objects else None
    engine = engine_for(conf.pipeline.lake, write=True)
    ops = recorder_for(engine, conf)
    with ops.watching("gold"):
        result = run_gold(engine, conf, objects=objects, on_commit=ops.record)
    for line in summary(result):
        print(line)
    if not result.objects:
        print("nothing to do: no silver table of the selected objects exists yet")
    return 0
