"""``sfcdc maintain``: compact, checkpoint, clean the log of and VACUUM every table.

::

    sfcdc maintain [--conf conf/] [--objects Account Contact] [--dry-run]

Every table of the selected objects (default: every enabled one) and sfcdc's bookkeeping
tables, with the retention of ``maintenance`` in ``pipeline.yml`` -- longer on a table whose
consumer (silver of bronze, gold of silver) has not yet read an older version, so nothing it
still needs goes (:mod:`pipelines.maintenance`). One line per table: files compacted, files
vacuumed, log entries removed, the retention used and why. ``--dry-run`` only prints the
retention each table would get.
"""

from __future__ import annotations

import argparse
from typing import Any

from pipelines.commands.conf_options import add_conf_options, conf_from_args
from pipelines.maintenance import describe, maintain_tables
from pipelines.session import engine_for

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    """Add the ``maintain`` subcommand."""
    parser = subparsers.add_parser(
        "maintain",
        help="compact, clean up the Delta logs of and VACUUM every table, safely",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    add_conf_options(parser)
    parser.add_argument(
        "--objects",
        nargs="+",
        metavar="NAME",
        help="API names of the objects (or streaming:<channel> keys) whose tables to maintain "
        "(default: every enabled one); bookkeeping tables are always maintained",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the retention of each table, change nothing"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Maintain the tables the parsed arguments select."""
    conf = conf_from_args(args)
    engine = engine_for(conf.pipeline.lake, write=True)
    done = maintain_tables(engine, conf, objects=args.objects, dry_run=args.dry_run)
    for item in done:
        print(describe(item))
    if not done:
        print("nothing to maintain: no tables yet")
    return 0
