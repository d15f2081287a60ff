"""``sfcdc validate``: check ``conf/`` and say what would run.

::

    sfcdc validate [--conf conf/]

Every problem of every file is reported at once, each with its file and key (exit 2);
a valid configuration gets a short summary of the source, the lake and each object's topic
and tables (exit 0). No JVM is started and nothing is connected to: secret references are
only resolved when the pipeline runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ingest.errors import ConfigError
from pipelines.commands.conf_options import add_conf_options, conf_from_args
from pipelines.commands.streaming_report import describe_streams
from pipelines.spec import Conf

__all__ = ["describe", "register", "run"]


def register(subparsers: Any) -> None:
    """Add ``validate`` to the ``sfcdc`` command."""
    parser = subparsers.add_parser(
        "validate",
        help="check conf/ and report every problem, or summarise what would run",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    add_conf_options(parser)
    parser.set_defaults(handler=run)


def _source(conf: Conf) -> str:
    connection = conf.pipeline.connection
    if connection.source == "salesforce" and connection.salesforce is not None:
        sf = connection.salesforce
        return f"Salesforce at {sf.pubsub_endpoint} ({sf.auth.type} login)"
    emu = connection.emulator
    tls = "TLS" if emu.tls.enabled else "plaintext"
    if emu.mode == "external":
        return f"external emulator at {emu.host}:{emu.grpc_port} ({tls})"
    work = emu.workload
    rate = f" at {work.events_per_second:g} events/s" if work.events_per_second is not None else ""
    return (
        f"in-process emulator ({tls}, seed {emu.seed}; a fresh org gets {work.events} workload "
        f"events and {work.platform_events} more platform events{rate})"
    )


def describe(conf: Conf) -> list[str]:
    """What a run of ``conf`` would do, as ``validate`` prints it."""
    lake = conf.pipeline.lake
    enabled = conf.enabled_objects()
    lines = [
        f"{conf.conf_dir}: valid; {len(enabled)} of {len(conf.objects)} objects enabled",
        f"  source  {_source(conf)}",
        f"  lake    {lake.engine} engine at {lake.location}",
    ]
    for topic in conf.topics(include_disabled=True):
        for obj in topic.objects:
            state = "" if obj.enabled else "  (disabled)"
            gold = (
                f", gold.{obj.tables.gold}"
                if obj.kind == "change_events"
                else " (platform event: no gold)"
            )
            lines.append(
                f"  {obj.api_name:<18} {topic.topic} -> bronze.{topic.bronze_table}, "
                f"silver.{obj.tables.silver}{gold}{state}"
            )
    lines.extend(describe_streams(conf))
    return lines


def run(args: argparse.Namespace) -> int:
    """Validate ``args.conf``: 0 when valid, 2 with every problem listed otherwise."""
    try:
        conf = conf_from_args(args)
    except ConfigError as exc:
        print(f"sfcdc validate: {exc}", file=sys.stderr)
        return 2
    for line in describe(conf):
        print(line)
    return 0
