"""``sfcdc run``: ingest -> silver -> gold for every enabled object, in one command.

::

    sfcdc run [--conf conf/] --once                  # drain what is available, then stop
    sfcdc run [--conf conf/] [--continuous] [--interval 1] [--objects Account,Contact]

``--once`` lands what was published before it started (every topic caught up: see
docs/operations.md),
then runs silver and gold once. Continuous mode (the default) lands in a child process
(``sfcdc ingest``, so silver and gold never hold up the landing) and runs silver and gold
every ``--interval`` seconds in this one, printing per-topic progress; SIGINT or SIGTERM stops
it cleanly (the child commits its open bronze batches, then a last silver and gold pass); a
second signal stops it at once, which the Delta checkpoints make safe too. If the landing
process dies, the run stops with an error naming its exit code. ``--landing thread`` lands in
a thread of this process instead.

With ``connection.source: emulator`` in ``mode: in_process`` (the shipped ``conf/``) the
emulator is started inside this process and seeded with the configured workload.
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

from pipelines.commands.cometd import gold_lines, silver_lines
from pipelines.commands.conf_options import (
    add_conf_options,
    add_metrics_option,
    conf_from_args,
    secrets_from_args,
)
from pipelines.commands.gold import summary as gold_summary
from pipelines.commands.ingest import _names, _positive_seconds, report_failures
from pipelines.commands.signals import stop_on_signals
from pipelines.commands.silver import summary as silver_summary
from pipelines.ops.metrics import PipelineMetrics, serve_metrics
from pipelines.run import LandingProcess, Pipeline, RunResult

__all__ = ["DEFAULT_INTERVAL", "register", "run", "summary"]

# A pass over steps of a second or so costs well under a second (small steps skip Spark), so
# passes this often keep gold within seconds of bronze without taking the landing's CPU.
DEFAULT_INTERVAL = 1.0


def register(subparsers: Any) -> None:
    """Add ``run`` to the ``sfcdc`` command."""
    parser = subparsers.add_parser(
        "run",
        help="ingest -> silver -> gold for every enabled object (once or continuously)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    add_conf_options(parser)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--once",
        action="store_true",
        help="drain what is available, run silver and gold once, and stop",
    )
    mode.add_argument(
        "--continuous",
        action="store_true",
        help="land continuously, silver and gold every --interval seconds (the default)",
    )
    parser.add_argument(
        "--interval",
        type=_positive_seconds,
        default=DEFAULT_INTERVAL,
        metavar="SECONDS",
        help="seconds between the starts of silver/gold passes in continuous mode (default: "
        f"{DEFAULT_INTERVAL:g}; a longer pass is followed by the next at once)",
    )
    parser.add_argument(
        "--landing",
        choices=("process", "thread"),
        default="process",
        help="continuous mode: land in a child process (the default) or in a thread of this one",
    )
    parser.add_argument(
        "--for",
        dest="seconds",
        type=_positive_seconds,
        metavar="SECONDS",
        help="continuous mode: land for this long (counted once the tables are ready), "
        "then stop cleanly",
    )
    parser.add_argument(
        "--objects",
        type=_names,
        metavar="NAMES",
        help="comma-separated object API names (default: every enabled object); a topic "
        "shared by several objects is landed whole",
    )
    add_metrics_option(parser)
    parser.set_defaults(handler=run)


def summary(result: RunResult) -> list[str]:
    """What ``sfcdc run`` prints when it stops."""
    lines = [f"sfcdc run: stopped after {result.seconds:.1f} s ({result.stopped})"]
    landed = result.landing.topics + (result.streaming.topics if result.streaming else ())
    for t in landed:
        extra = f", {t.replay_gaps} REPLAY GAP" if t.replay_gaps else ""
        lines.append(
            f"  bronze {t.table}: {t.events} events in {t.commits} commits{extra}; last "
            f"replay id {t.last_replay_id or 'none'}"
        )
    passes = [p for p in result.passes if p.silver.topics or p.gold.objects]
    if result.pass_count == 1:
        for line in silver_summary(result.passes[0].silver):
            lines.append(f"  silver {line}")
        for line in gold_summary(result.passes[0].gold):
            lines.append(f"  gold {line}")
        channels = result.passes[0].streaming
        if channels is not None:
            lines += [f"  silver {line.strip()}" for line in silver_lines(channels.silver)]
            lines += [f"  gold {line.strip()}" for line in gold_lines(channels.gold)]
    elif passes:
        lines.append(
            f"  {result.pass_count} silver/gold passes: {result.silver_rows} silver rows, "
            f"{result.quarantined} quarantined"
        )
        for name, n in sorted(result.merged().items()):
            lines.append(f"  gold {name}: {n} rows inserted, updated or deleted")
    return lines


def run(args: argparse.Namespace) -> int:
    """Run the pipeline as ``args`` say."""
    conf = conf_from_args(args)
    child = None
    if not args.once and args.landing == "process":
        verbosity = getattr(args, "verbose", 0)
        options = ("-q",) if getattr(args, "quiet", False) else ("-v",) * verbosity
        child = LandingProcess(
            args.conf,
            tuple(args.overrides),
            cli_options=options,
            streams=bool(conf.enabled_streams()) and not args.objects,
        )
    prometheus = conf.pipeline.ops.prometheus
    metrics = PipelineMetrics() if prometheus.port is not None and not args.once else None
    pipeline = Pipeline(
        conf,
        objects=args.objects,
        report=lambda line: print(line, flush=True),
        secrets=secrets_from_args(args),
        landing_process=child,
        metrics=metrics,
    )
    with contextlib.ExitStack() as stack:
        if metrics is not None and prometheus.port is not None:
            server = stack.enter_context(
                serve_metrics(metrics, port=prometheus.port, host=prometheus.host)
            )
            print(f"serving Prometheus metrics at {server.url}", flush=True)
        stack.enter_context(stop_on_signals(pipeline.stop))
        if args.once:
            result = pipeline.run_once()
        else:
            result = pipeline.run_continuous(interval=args.interval, duration=args.seconds)
    for line in summary(result):
        print(line)
    return report_failures("sfcdc run", conf, result.landing)
