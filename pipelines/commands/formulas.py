"""``sfcdc formulas [--objects ...] [--all]``: refresh formula fields in gold.

::

    sfcdc formulas [--objects Account,Opportunity] [--all] [--conf conf/]

Each object with ``formulas.refresh_every`` whose refresh is due (every one with ``--all``):
its describe's formula fields are read with one query of ``Id`` and those fields (a Bulk API
2.0 job by default) and only those gold columns, with ``_cdc_formulas_refreshed_at``, are set
(:mod:`pipelines.formulas`). ``sfcdc run`` refreshes what is due after each gold pass; the
bundle's ``sfcdc_poll`` job runs this after its polls.
"""

from __future__ import annotations

import argparse
from typing import Any

from ingest.bulk import BulkQueryClient
from pipelines.commands.bootstrap import open_rest
from pipelines.commands.conf_options import add_conf_options, conf_from_args, secrets_from_args
from pipelines.commands.ingest import _names
from pipelines.formulas import FormulaResult, ensure_formula_table, formulas_due, refresh_formulas
from pipelines.ops.recorder import recorder_for
from pipelines.session import engine_for
from pipelines.snapshot_read import BulkRecords

__all__ = ["describe", "register", "run"]


def register(subparsers: Any) -> None:
    """Add the ``formulas`` subcommand."""
    parser = subparsers.add_parser(
        "formulas",
        help="refresh formula fields in gold (formulas.refresh_every)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument(
        "--objects",
        type=_names,
        default=None,
        metavar="NAMES",
        help="comma-separated object API names (default: every object with refresh on)",
    )
    parser.add_argument(
        "--all",
        dest="force",
        action="store_true",
        help="refresh every selected object now, whether its refresh is due or not",
    )
    add_conf_options(parser)
    parser.set_defaults(handler=run)


def describe(result: FormulaResult) -> str:
    """The line the command prints for one object."""
    fields = ", ".join(result.fields) or "no formula field"
    api = "the Bulk API" if result.api == "bulk" else "REST"
    return (
        f"{result.object}: {fields}: {result.records} records read over {api}, "
        f"{result.updated} gold rows updated ({result.duration_s:.1f} s)"
    )


def run(args: argparse.Namespace) -> int:
    """Refresh the formula fields of the objects the parsed arguments select."""
    from datetime import datetime, timezone

    conf = conf_from_args(args)
    engine = engine_for(conf.pipeline.lake)
    ensure_formula_table(engine)
    names = list(args.objects) if args.objects else None
    if not args.force and not formulas_due(engine, conf, names, now=datetime.now(timezone.utc)):
        print("nothing to refresh: no object's formula refresh is due")
        return 0
    ops = recorder_for(engine, conf)
    try:
        with open_rest(conf, secrets=secrets_from_args(args)) as (_source, rest):
            results = refresh_formulas(
                engine,
                conf,
                names,
                rest=rest,
                bulk=BulkRecords(BulkQueryClient(rest), describe=rest.describe),
                force=args.force,
                on_record=ops.record,
            )
    finally:
        ops.flush()
    for result in results:
        print(describe(result))
    if not results:
        print("nothing to refresh: no object with formulas.refresh_every has a gold table yet")
    return 0
