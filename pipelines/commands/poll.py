"""``sfcdc poll [--objects ...] [--all]``: land the objects without change events.

::

    sfcdc poll [--objects Lead,Case] [--all] [--conf conf/]

Each polled object (``kind: polled``) whose ``poll.every`` has passed since its last poll (every
one with ``--all``) is read by an incremental query on ``SystemModstamp`` (REST or a Bulk API
2.0 job, as ``poll.api`` says) and landed in its bronze table with its watermark, in one commit
(:mod:`pipelines.polled.poll`). ``sfcdc silver`` and ``sfcdc gold`` (or ``sfcdc run``, which
polls too) carry the records on to gold. The bundle's ``sfcdc_poll`` job runs this every few
minutes; the YAML schedule decides which objects a run reads.
"""

from __future__ import annotations

import argparse
from typing import Any

from ingest.bulk import BulkQueryClient
from ingest.errors import ConfigError
from pipelines.commands.bootstrap import open_rest
from pipelines.commands.conf_options import add_conf_options, conf_from_args, secrets_from_args
from pipelines.commands.ingest import _names
from pipelines.ops.recorder import recorder_for
from pipelines.polled.poll import PollResult, poll_objects, select_polled
from pipelines.session import engine_for
from pipelines.snapshot_read import BulkRecords

__all__ = ["describe", "register", "run"]


def register(subparsers: Any) -> None:
    """Add the ``poll`` subcommand."""
    parser = subparsers.add_parser(
        "poll",
        help="land the objects without change events (incremental SystemModstamp queries)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument(
        "--objects",
        type=_names,
        default=None,
        metavar="NAMES",
        help="comma-separated object API names (default: every enabled polled object)",
    )
    parser.add_argument(
        "--all",
        dest="force",
        action="store_true",
        help="poll every selected object now, whether its poll.every has passed or not",
    )
    add_conf_options(parser)
    parser.set_defaults(handler=run)


def describe(result: PollResult) -> str:
    """The line the command prints for one object."""
    if not result.due:
        return f"{result.object}: not due (poll.every has not passed since its last poll)"
    since = (
        "the whole object"
        if result.since is None
        else f"saved since {result.since:%Y-%m-%dT%H:%M:%SZ}"
    )
    mark = "none" if result.watermark is None else f"{result.watermark:%Y-%m-%dT%H:%M:%S.%fZ}"
    return (
        f"{result.object}: poll {result.batch_id} read {result.records} records "
        f"({result.deleted} in the Recycle Bin; {since}) over "
        f"{'the Bulk API' if result.api == 'bulk' else 'REST'} -> {result.table}; "
        f"watermark {mark} ({result.duration_s:.1f} s)"
    )


def run(args: argparse.Namespace) -> int:
    """Poll the objects the parsed arguments select."""
    conf = conf_from_args(args)
    chosen = select_polled(conf, args.objects)
    if args.objects:
        unknown = sorted(set(args.objects) - {o.api_name for o in chosen})
        if unknown:
            raise ConfigError(
                f"poll: no enabled polled object {', '.join(map(repr, unknown))} in "
                f"{conf.conf_dir} (polled: "
                f"{', '.join(o.api_name for o in conf.polled_objects()) or 'none'})"
            )
    if not chosen:
        print("nothing to poll: no enabled object has kind polled")
        return 0
    engine = engine_for(conf.pipeline.lake)
    ops = recorder_for(engine, conf)
    names = [o.api_name for o in chosen]
    try:
        with open_rest(conf, secrets=secrets_from_args(args)) as (_source, rest):
            results = poll_objects(
                engine,
                conf,
                names,
                rest=rest,
                bulk=BulkRecords(BulkQueryClient(rest), describe=rest.describe),
                force=args.force,
                on_commit=ops.record,
            )
    finally:
        ops.flush()
    for result in results:
        print(describe(result))
    return 0
