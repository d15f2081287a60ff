"""``sfcdc streaming``: the Salesforce Streaming API (CometD) source of ``conf/``, layer by layer.

::

    sfcdc streaming ingest [--conf conf/] [--once | --for 600] [--channels /topic/InvoiceUpdates]
    sfcdc streaming silver [--conf conf/] [--channels ...]
    sfcdc streaming gold   [--conf conf/] [--channels ...]
    sfcdc streaming run    [--conf conf/] [--once | --for 600]   # ingest, then silver and gold

``ingest`` connects as ``conf/pipeline.yml`` says, makes or checks the PushTopics, stores the
describes and lands every enabled object file of ``kind: streaming_api`` (one CometD session
for all channels) until SIGINT / SIGTERM (open batches committed, exit 0), for ``--for``
seconds, or with ``--once`` until a connect comes back empty. A second signal stops it at
once, which is safe: the next run resumes where the Delta checkpoints say. ``silver`` and
``gold`` process what bronze gained since their last run. ``sfcdc run --once`` covers these
channels too, next to the Pub/Sub objects.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from ingest.errors import ConfigError
from pipelines.bronze.cometd import CometdLanding
from pipelines.bronze.landing_state import LandingResult
from pipelines.cometd_pipeline import land_streams, push_topic_provisioner
from pipelines.commands.conf_options import add_conf_options, conf_from_args, secrets_from_args
from pipelines.commands.signals import stop_on_signals
from pipelines.connect import connect
from pipelines.gold.cometd import run_cometd_gold
from pipelines.gold.job import GoldResult
from pipelines.ops.recorder import recorder_for
from pipelines.session import engine_for
from pipelines.silver.cometd_job import CometdSilverResult, run_cometd_silver
from pipelines.spec.conf import Conf

__all__ = ["gold_lines", "ingest_lines", "register", "silver_lines"]


def _channels(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError(
            f"expected channels such as /topic/InvoiceUpdates (got {text!r})"
        )
    return names


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds (got {text!r})") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0 (got {text!r})")
    return value


def register(subparsers: Any) -> None:
    """Add ``streaming`` and its subcommands to the ``sfcdc`` command."""
    parser = subparsers.add_parser(
        "streaming",
        help="the Salesforce Streaming API (CometD) channels: ingest, silver, gold, run",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    sub = parser.add_subparsers(dest="streaming_command", metavar="STEP", required=True)
    for name, text in (
        ("ingest", "land the channels' notifications in bronze, exactly once"),
        ("silver", "decode new bronze messages into the channels' silver tables"),
        ("gold", "merge new silver rows into the PushTopic and change event gold tables"),
        ("run", "ingest, then silver and gold"),
    ):
        step = sub.add_parser(name, help=text, description=text)
        add_conf_options(step)
        step.add_argument(
            "--channels",
            type=_channels,
            metavar="CHANNELS",
            help="comma-separated channels (default: every enabled Streaming API object file)",
        )
        if name in ("ingest", "run"):
            until = step.add_mutually_exclusive_group()
            until.add_argument(
                "--once",
                action="store_true",
                help="stop once a connect comes back empty (nothing pending on any channel)",
            )
            until.add_argument(
                "--for",
                dest="seconds",
                type=_seconds,
                metavar="SECONDS",
                help="land for this long, then stop cleanly",
            )
        step.set_defaults(handler=_HANDLERS[name])


def _conf(args: argparse.Namespace) -> Conf:
    conf = conf_from_args(args)
    if not conf.enabled_streams():
        raise ConfigError(
            f"{conf.conf_dir}: no enabled object file of kind streaming_api; add one to "
            f"{conf.conf_dir / 'objects'} (see conf/README.md)"
        )
    return conf


def ingest_lines(result: LandingResult) -> list[str]:
    """What the landing did, one line per channel."""
    lines = [f"stopped after {result.seconds:.1f} s ({result.stopped})"]
    for t in result.topics:
        gaps = f", {t.replay_gaps} REPLAY GAP" if t.replay_gaps else ""
        lines.append(
            f"  {t.topic} -> {t.table}: {t.events} notifications in {t.commits} commits{gaps}; "
            f"resumes after replay id {t.last_replay_id or 'none'}"
        )
    return lines


def silver_lines(result: CometdSilverResult) -> list[str]:
    """What the silver pass did, one line per channel."""
    lines = []
    for s in result.streams:
        if not s.commits:
            lines.append(f"  {s.stream}: up to date ({s.table} at bronze v{s.bronze_version})")
            continue
        lines.append(
            f"  {s.stream}: {s.bronze_rows} messages -> {s.rows} rows in {s.table}, "
            f"{s.quarantined} quarantined (bronze {s.bronze_table} up to v{s.bronze_version})"
        )
    return lines


def gold_lines(result: GoldResult) -> list[str]:
    """What the gold pass did, one line per channel."""
    lines = []
    for obj in result.objects:
        m = obj.merge
        if m is None:
            lines.append(f"  {obj.object}: up to date ({obj.table})")
            continue
        lines.append(
            f"  {obj.object}: {obj.changes} changes of {obj.records} records -> {obj.table}: "
            f"{m.inserted} inserted, {m.updated} updated, {m.deleted} deleted"
            + (f"; {obj.resync_rows} re-sync rows" if obj.resync_rows else "")
        )
    if result.replay_gaps:
        lines.append(f"  {result.replay_gaps} replay gaps recorded in gold.sfcdc_resync")
    return lines


def _land(args: argparse.Namespace, conf: Conf) -> LandingResult:
    engine = engine_for(conf.pipeline.lake, write=True, environ=os.environ)
    ops = recorder_for(engine, conf)
    provision = push_topic_provisioner(conf)
    running: list[CometdLanding] = []

    def started(landing: CometdLanding) -> None:
        running.append(landing)

    def stop(reason: str) -> None:
        for landing in running:
            landing.stop(reason)

    with (
        connect(
            conf.pipeline.connection, secrets=secrets_from_args(args), on_start=provision
        ) as source,
        stop_on_signals(stop),
        ops.watching("bronze"),
    ):
        return land_streams(
            conf,
            engine=engine,
            tokens=source.tokens,
            ca_file=source.ca_file,
            once=args.once,
            duration=args.seconds,
            streams=args.channels,
            started=started,
            ops=ops,
        )


def _ingest(args: argparse.Namespace) -> int:
    conf = _conf(args)
    result = _land(args, conf)
    print("sfcdc streaming ingest: " + "\n".join(ingest_lines(result)))
    return 0


def _silver(args: argparse.Namespace) -> int:
    conf = _conf(args)
    engine = engine_for(conf.pipeline.lake, write=True)
    ops = recorder_for(engine, conf)
    with ops.watching("silver"):
        result = run_cometd_silver(engine, conf, streams=args.channels, on_commit=ops.record)
    print("\n".join(["sfcdc streaming silver:", *silver_lines(result)]))
    return 0


def _gold(args: argparse.Namespace) -> int:
    conf = _conf(args)
    engine = engine_for(conf.pipeline.lake, write=True)
    ops = recorder_for(engine, conf)
    with ops.watching("gold"):
        result = run_cometd_gold(engine, conf, streams=args.channels, on_commit=ops.record)
    print("\n".join(["sfcdc streaming gold:", *gold_lines(result)]))
    return 0


def _run(args: argparse.Namespace) -> int:
    conf = _conf(args)
    landing = _land(args, conf)
    engine = engine_for(conf.pipeline.lake, write=True)
    ops = recorder_for(engine, conf)
    with ops.watching("silver"):
        silver = run_cometd_silver(engine, conf, streams=args.channels, on_commit=ops.record)
    with ops.watching("gold"):
        gold = run_cometd_gold(engine, conf, streams=args.channels, on_commit=ops.record)
    lines: Sequence[str] = [
        "sfcdc streaming run: " + ingest_lines(landing)[0],
        *ingest_lines(landing)[1:],
        "silver:",
        *silver_lines(silver),
        "gold:",
        *gold_lines(gold),
    ]
    print("\n".join(lines))
    return 0


_HANDLERS = {"ingest": _ingest, "silver": _silver, "gold": _gold, "run": _run}
