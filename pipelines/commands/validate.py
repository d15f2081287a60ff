"""``sfcdc validate``: check ``conf/`` and say what would run.

::

    sfcdc validate [--conf conf/] [--online]

Every problem of every file is reported at once, each with its file and key (exit 2);
a valid configuration gets a short summary of the source, the lake and each object's topic
and tables (exit 0). No JVM is started and nothing is connected to: secret references are
only resolved when the pipeline runs. ``--online`` also connects to the source and asks
GetTopic for every enabled object's topic (a topic that does not exist, or whose Change Data
Capture is off, fails there, exit 1); for the emulator it lists the objects it serves. The
in-process emulator is started without its workload or state directory for that.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from ingest.auth import SecretResolver
from ingest.client import SchemaCache
from ingest.errors import ConfigError, PubSubError, SfcdcError
from pipelines.commands.cometd_report import describe_streams
from pipelines.commands.conf_options import add_conf_options, conf_from_args, secrets_from_args
from pipelines.connect import connect
from pipelines.spec.conf import Conf

__all__ = ["check_topics", "describe", "register", "run"]


def register(subparsers: Any) -> None:
    """Add ``validate`` to the ``sfcdc`` command."""
    parser = subparsers.add_parser(
        "validate",
        help="check conf/ and report every problem, or summarise what would run",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    add_conf_options(parser)
    parser.add_argument(
        "--online",
        action="store_true",
        help="also connect to the source and check every enabled topic with GetTopic",
    )
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
    enabled = len(conf.enabled_objects()) + len(conf.enabled_streams())
    total = len(conf.objects) + len(conf.streams)
    kinds = (
        f" ({len(conf.enabled_objects())} Pub/Sub, {len(conf.enabled_streams())} Streaming API)"
        if conf.streams
        else ""
    )
    lines = [
        f"{conf.conf_dir}: valid; {enabled} of {total} objects enabled{kinds}",
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


def check_topics(conf: Conf, *, secrets: SecretResolver) -> tuple[list[str], list[str]]:
    """GetTopic for every enabled topic of ``conf``: (report lines, problems). For the
    emulator the lines also name the objects it serves."""
    connection = conf.pipeline.connection
    if connection.source == "emulator" and connection.emulator.mode == "in_process":
        # The same catalogue, without seeding the configured state directory.
        emulator = dataclasses.replace(
            connection.emulator,
            state_dir=None,
            workload=dataclasses.replace(
                connection.emulator.workload, events=0, platform_events=0, events_per_second=None
            ),
        )
        connection = dataclasses.replace(connection, emulator=emulator)
    lines: list[str] = []
    problems: list[str] = []
    topics = conf.topics()
    with connect(connection, secrets=secrets, topics=topics) as source:
        cache = SchemaCache(source.channel, tokens=source.tokens)
        lines.append(f"online: {source.description}")
        for spec in topics:
            names = ", ".join(o.api_name for o in spec.objects)
            try:
                info = cache.topic_info(spec.topic)
            except PubSubError as exc:
                problems.append(f"{names}: topic {spec.topic}: {exc}")
                continue
            access = "subscribe" if info.can_subscribe else "NO subscribe permission"
            if not info.can_subscribe:
                problems.append(f"{names}: topic {spec.topic}: the user cannot subscribe to it")
            lines.append(f"  {names:<18} {spec.topic}: found ({access})")
        if source.emulator is not None:
            served = sorted(
                f"{t.entity} ({t.name})"
                for t in source.emulator.catalogue
                if t.kind == "change_events"
            )
            events = sorted(t.name for t in source.emulator.catalogue if t.kind == "platform_event")
            lines.append(f"  the emulator serves change events of: {', '.join(served)}")
            if events:
                lines.append(f"  and platform events: {', '.join(events)}")
    return lines, problems


def run(args: argparse.Namespace) -> int:
    """Validate ``args.conf``: 0 when valid, 2 with every problem listed otherwise."""
    try:
        conf = conf_from_args(args)
    except ConfigError as exc:
        print(f"sfcdc validate: {exc}", file=sys.stderr)
        return 2
    for line in describe(conf):
        print(line)
    if not getattr(args, "online", False):
        return 0
    try:
        lines, problems = check_topics(conf, secrets=secrets_from_args(args))
    except SfcdcError as exc:
        print(f"sfcdc validate --online: cannot reach the source: {exc}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    if problems:
        print(
            f"sfcdc validate --online: {len(problems)} topics cannot be subscribed:",
            file=sys.stderr,
        )
        for problem in problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    return 0
