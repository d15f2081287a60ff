"""``sfcdc reconcile [--objects ...]``: measure how far gold is from the org, and repair it.

::

    sfcdc reconcile [--objects Account,Contact] [--no-repair] [--lookback-seconds S]
                    [--api rest|bulk|auto] [--bulk-threshold N] [--conf conf/]

For each object (default: every enabled change event and polled object), silver and gold
catch up, then one query (``SELECT Id, SystemModstamp, IsDeleted`` as ``queryAll``; a Bulk API
2.0 job for large objects) is compared with gold: records missing from gold, live in gold but
deleted or hard-deleted in Salesforce, or older in gold than their ``SystemModstamp`` go to
``gold.sfcdc_resync`` with reason ``drift`` and are re-read through the re-sync path. The
counts per object are printed and recorded in ``gold.sfcdc_reconcile``. Exit status 0 even when
drift was found (it was repaired); ``--no-repair`` only measures.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

from ingest.errors import ConfigError
from pipelines.commands.bootstrap import add_api_options, open_rest, snapshot_source
from pipelines.commands.conf_options import add_conf_options, conf_from_args, secrets_from_args
from pipelines.commands.ingest import _names
from pipelines.ops.recorder import recorder_for
from pipelines.reconcile import ReconcileResult, reconcile_objects
from pipelines.session import engine_for

__all__ = ["describe", "register", "run"]


def register(subparsers: Any) -> None:
    """Add the ``reconcile`` subcommand."""
    parser = subparsers.add_parser(
        "reconcile",
        help="compare gold with Salesforce (Id, SystemModstamp) and repair the drift",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument(
        "--objects",
        type=_names,
        default=None,
        metavar="NAMES",
        help="comma-separated object API names (default: every enabled change event and polled "
        "object)",
    )
    parser.add_argument(
        "--no-repair",
        dest="repair",
        action="store_false",
        help="measure and record the drift, re-read nothing (default: reconcile.repair)",
    )
    parser.add_argument(
        "--lookback-seconds",
        type=float,
        default=None,
        metavar="S",
        help="records saved this recently are in flight, not judged "
        "(default: reconcile.lookback_seconds in pipeline.yml)",
    )
    add_api_options(parser)
    add_conf_options(parser)
    # Unset options take pipeline.yml's reconcile section.
    parser.set_defaults(handler=run, api=None, repair=None)


def describe(result: ReconcileResult) -> str:
    """The line the command prints for one object."""
    api = "Bulk API" if result.api == "bulk" else "REST"
    return (
        f"{result.object}: {result.salesforce_records} records in Salesforce "
        f"({result.salesforce_deleted} deleted, read over {api}), {result.gold_records} in gold: "
        f"drift_missing {result.drift_missing}, drift_extra {result.drift_extra}, "
        f"drift_stale {result.drift_stale}, in flight {result.in_flight}; "
        f"repaired {result.repaired} ({result.duration_s:.1f} s)"
    )


def run(args: argparse.Namespace) -> int:
    """Reconcile the objects the parsed arguments select."""
    conf = conf_from_args(args)
    spec = conf.pipeline.reconcile
    lookback = spec.lookback_seconds if args.lookback_seconds is None else args.lookback_seconds
    if lookback < 0:
        raise ConfigError(f"--lookback-seconds must be >= 0 (got {lookback})")
    args.api = args.api or spec.api
    engine = engine_for(conf.pipeline.lake)
    ops = recorder_for(engine, conf)
    try:
        with open_rest(conf, secrets=secrets_from_args(args)) as (_source, rest):
            results = reconcile_objects(
                engine,
                conf,
                args.objects,
                source=snapshot_source(rest, args),
                repair=spec.repair if args.repair is None else args.repair,
                lookback=timedelta(seconds=lookback),
                on_record=ops.record,
            )
    finally:
        ops.flush()
    for result in results:
        print(describe(result))
    if not results:
        print("nothing to reconcile: no object has a gold table yet")
    total = sum(r.drift for r in results)
    print(f"drift: {total} records in {len(results)} objects")
    return 0
