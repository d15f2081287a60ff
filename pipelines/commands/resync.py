"""``sfcdc resync [<object>]``: re-read from Salesforce what events could not reproduce.

::

    sfcdc resync [Account | streaming:/topic/InvoiceUpdates] [--conf conf/] [--api rest|bulk|auto]

For each object (default: every enabled change event object, and every PushTopic and change
event channel of the Streaming API, named ``streaming:<channel>``), silver and gold catch up
with bronze, then the open rows of ``gold.sfcdc_resync`` decide what to read: the whole object after
a GAP_OVERFLOW or a replay gap, otherwise the records gap events (and diffs that could not be
rebuilt, changes of records gold never saw) named. A whole object is read as ``--api`` says
(as ``sfcdc bootstrap`` does); named records over REST. The records are MERGEd into gold as
snapshot rows with ``_cdc_needs_resync`` cleared, and the re-sync rows are marked resolved.
"""

from __future__ import annotations

import argparse
from typing import Any

from pipelines.bootstrap import resync_objects
from pipelines.commands.bootstrap import add_api_options, describe, open_rest, snapshot_source
from pipelines.commands.conf_options import add_conf_options, conf_from_args, secrets_from_args
from pipelines.session import engine_for

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    """Add the ``resync`` subcommand."""
    parser = subparsers.add_parser(
        "resync",
        help="re-read from Salesforce the records gold flags for re-sync",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument(
        "object",
        nargs="?",
        default=None,
        help="API name of one object, or a Streaming API channel (streaming:/topic/Name) "
        "(default: every object and channel with open re-sync rows)",
    )
    add_api_options(parser)
    add_conf_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Re-sync the objects the parsed arguments select."""
    conf = conf_from_args(args)
    engine = engine_for(conf.pipeline.lake, write=True)
    names = [args.object] if args.object else None
    with open_rest(conf, secrets=secrets_from_args(args)) as (_source, rest):
        results = resync_objects(engine, conf, names, rest=snapshot_source(rest, args))
    for result in results:
        for line in describe(result):
            print(line)
    if not results:
        print("nothing to re-sync: no open rows in the re-sync table")
    return 0
