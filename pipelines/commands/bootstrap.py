"""``sfcdc bootstrap <object>``: load every record of an object into gold (REST or Bulk API).

::

    sfcdc bootstrap Account [--conf conf/] [--api rest|bulk|auto] [--bulk-threshold N]

The stream position is recorded first (the topic's bronze checkpoint; without one the topic is
landed until drained to write it), silver and gold catch up with bronze, then every record is
read with SOQL (``queryAll``: over REST, or with a Bulk API 2.0 query job; ``auto`` counts the
records first and uses Bulk from ``--bulk-threshold`` records on) and MERGEd into gold as a
snapshot row, and the object's open re-sync rows are resolved. The landing continues from the
recorded position, so changes made while the snapshot was read still reach gold;
docs/bootstrap.md explains why they apply on top of the snapshot and older events do not
overwrite it.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ingest.auth import SecretResolver
from ingest.bulk import BulkQueryClient
from ingest.client import SchemaCache, TlsSettings
from ingest.rest import RestClient
from pipelines.bootstrap import SnapshotResult, bootstrap_object
from pipelines.bronze.landing import BronzeLanding
from pipelines.commands.conf_options import add_conf_options, conf_from_args, secrets_from_args
from pipelines.commands.ingest import select_topics
from pipelines.connect import Source, connect, secret_resolver
from pipelines.engines.base import LakeEngine
from pipelines.session import engine_for
from pipelines.snapshot_read import BULK_THRESHOLD, BulkRecords, SnapshotSource
from pipelines.spec.conf import Conf

__all__ = ["add_api_options", "describe", "open_rest", "register", "run", "snapshot_source"]


def register(subparsers: Any) -> None:
    """Add the ``bootstrap`` subcommand."""
    parser = subparsers.add_parser(
        "bootstrap",
        help="load every record of an object into gold (REST or Bulk API 2.0)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("object", help="API name of a change event object (Account)")
    add_api_options(parser)
    add_conf_options(parser)
    parser.set_defaults(handler=run)


def add_api_options(parser: argparse.ArgumentParser) -> None:
    """``--api`` and ``--bulk-threshold``: how a whole object is read."""
    parser.add_argument(
        "--api",
        choices=("rest", "bulk", "auto"),
        default="auto",
        help="how a whole object is read: REST queryAll, a Bulk API 2.0 query job, or auto "
        "(count first; Bulk from --bulk-threshold records on; default)",
    )
    parser.add_argument(
        "--bulk-threshold",
        type=_records,
        default=BULK_THRESHOLD,
        metavar="N",
        help=f"records from which --api auto uses the Bulk API ({BULK_THRESHOLD:,})",
    )


def _records(text: str) -> int:
    try:
        value = int(text.replace(",", "").replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number (got {text!r})") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0 (got {text!r})")
    return value


def snapshot_source(rest: RestClient, args: argparse.Namespace) -> SnapshotSource:
    """Where the command reads records: REST, and Bulk API jobs through the same client."""
    bulk = BulkRecords(BulkQueryClient(rest), describe=rest.describe)
    return SnapshotSource(rest, bulk=bulk, api=args.api, bulk_threshold=args.bulk_threshold)


def _ca_file(conf: Conf, source: Source) -> Path | None:
    connection = conf.pipeline.connection
    if connection.source == "salesforce" and connection.salesforce is not None:
        ca = connection.salesforce.tls.ca_file
        return Path(ca) if ca else None
    if source.emulator is not None:
        return source.emulator.ca_cert_path
    tls = connection.emulator.tls
    return Path(tls.ca_file) if tls.enabled and tls.ca_file else None


@contextmanager
def open_rest(
    conf: Conf, *, secrets: SecretResolver | None = None
) -> Iterator[tuple[Source, RestClient]]:
    """The event source ``conf`` describes and a REST client logged in with its tokens;
    ``secrets`` resolves the connection's secret references (default: the environment). The
    objects a command reads are checked by that command (an in-process emulator serves the
    topics of every enabled object)."""
    topics = conf.topics()
    resolver = secrets if secrets is not None else secret_resolver()
    with connect(conf.pipeline.connection, secrets=resolver, topics=topics) as source:
        tls = TlsSettings(ca_file=_ca_file(conf, source))
        with RestClient(source.tokens, tls=tls) as rest:
            yield source, rest


def describe(result: SnapshotResult) -> list[str]:
    """The lines the bootstrap and resync commands print for one object."""
    merge = result.merge
    counts = (
        f"{merge.inserted} inserted, {merge.updated} updated, {merge.deleted} deleted"
        if merge is not None
        else "nothing written"
    )
    what = "whole object" if result.full else f"{result.requested} records"
    api = "the Bulk API" if result.api == "bulk" else "REST"
    lines = [
        f"{result.object}: {result.mode} read {result.read} records over {api} ({what}; "
        f"{result.deleted_read} in the recycle bin) -> {result.table} ({counts}); "
        f"{result.marked_deleted} gone from Salesforce marked deleted; {result.resolved} "
        "re-sync rows resolved"
    ]
    if result.position is not None:
        lines.append(f"  the stream continues from {result.position}")
    return lines


def _land(engine: LakeEngine, conf: Conf, source: Source, name: str) -> None:
    landing = BronzeLanding(
        engine,
        select_topics(conf, [name]),
        channel=source.channel,
        tokens=source.tokens,
        ingest=conf.pipeline.ingest,
    )
    landing.run(once=True)


def run(args: argparse.Namespace) -> int:
    """Bootstrap the object the parsed arguments name."""
    conf = conf_from_args(args)
    engine = engine_for(conf.pipeline.lake, write=True)
    with open_rest(conf, secrets=secrets_from_args(args)) as (source, rest):
        schemas = SchemaCache(source.channel, tokens=source.tokens)
        result = bootstrap_object(
            engine,
            conf,
            args.object,
            rest=snapshot_source(rest, args),
            land=lambda: _land(engine, conf, source, args.object),
            fetch_schema=schemas.current_schema,
        )
    for line in describe(result):
        print(line)
    return 0
