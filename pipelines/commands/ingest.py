"""``sfcdc ingest``: land the events of the configured objects in bronze, exactly once.

::

    sfcdc ingest --conf conf/                  # run until SIGINT / SIGTERM
    sfcdc ingest --conf conf/ --once           # land what was published before it started
    sfcdc ingest --conf conf/ --for 600        # run for ten minutes
    sfcdc ingest --conf conf/ --objects Account,Contact

It connects as ``conf/pipeline.yml`` says (Salesforce, an external emulator, or one started in
this process), subscribes to the topics of the enabled objects and lands them with
:class:`~pipelines.bronze.BronzeLanding`. The local lake engine writes Delta without a JVM:
no Spark session is started. SIGINT or SIGTERM stops it cleanly (open batches committed, exit
0); a second signal stops it at once, which is safe too: the next run resumes where the Delta
checkpoints say.

``sfcdc run --continuous`` starts this command as a child process with ``--report-progress``
(a JSON snapshot of the landing on stdout every few seconds, and a last one when it stops)
and ``--stop-on-eof`` (the parent holds the child's stdin open; if the parent dies, the
pipe closes and the landing stops cleanly instead of running on unattended).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any

from ingest.auth import SecretResolver
from ingest.errors import ConfigError, ReplayIdError
from pipelines.bronze.cometd import CometdLanding
from pipelines.bronze.landing import BronzeLanding
from pipelines.bronze.landing_state import LandingResult, TopicResult
from pipelines.cometd_pipeline import (
    cometd_landing,
    land_topics_and_streams,
    push_topic_provisioner,
)
from pipelines.commands.conf_options import (
    add_conf_options,
    add_metrics_option,
    conf_from_args,
    secrets_from_args,
)
from pipelines.connect import connect, secret_resolver
from pipelines.ops.metrics import PipelineMetrics, serve_metrics
from pipelines.ops.recorder import recorder_for
from pipelines.session import engine_for
from pipelines.spec.conf import Conf
from pipelines.spec.models import TopicSpec

__all__ = [
    "PROGRESS_PREFIX",
    "decode_progress",
    "encode_progress",
    "failed_objects",
    "land",
    "register",
    "report_failures",
    "select_topics",
]

_log = logging.getLogger(__name__)

# What `sfcdc ingest` runs: the Pub/Sub landing, or the Streaming API channels' alone when a
# conf/ has no Pub/Sub object (`sfcdc run` of channels only).
Landing = BronzeLanding | CometdLanding

# Marks the stdout lines that carry a landing snapshot, so a parent can tell them from the
# human-readable summary.
PROGRESS_PREFIX = "sfcdc-landing-progress "


def register(subparsers: Any) -> None:
    """Add ``ingest`` to the ``sfcdc`` command."""
    parser = subparsers.add_parser(
        "ingest",
        help="land Pub/Sub API events in bronze Delta tables, exactly once",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    add_conf_options(parser)
    until = parser.add_mutually_exclusive_group()
    until.add_argument(
        "--once",
        action="store_true",
        help="land what was published before the run started and stop once every topic has "
        "caught up (a keepalive, two responses the server could not fill, or "
        "ingest.once_quiet_seconds without an event while the server owes some), whatever the "
        "traffic",
    )
    until.add_argument(
        "--for",
        dest="seconds",
        type=_positive_seconds,
        metavar="SECONDS",
        help="land for this long (counted once the tables are ready), then stop cleanly",
    )
    parser.add_argument(
        "--objects",
        type=_names,
        metavar="NAMES",
        help="comma-separated object API names to land (default: every enabled object); a "
        "topic shared by several objects is landed whole",
    )
    parser.add_argument(
        "--report-progress",
        type=_positive_seconds,
        metavar="SECONDS",
        help="print a JSON snapshot of the landing (one line starting with "
        f"{PROGRESS_PREFIX.strip()!r}) this often and when it stops (used by sfcdc run)",
    )
    parser.add_argument(
        "--stop-on-eof",
        action="store_true",
        help="stop cleanly when standard input is closed (used by sfcdc run, so the landing "
        "ends with the process that started it)",
    )
    parser.add_argument(
        "--with-streams",
        action="store_true",
        help="land the Streaming API channels (kind: streaming_api object files) too, in the "
        "same process (used by sfcdc run; sfcdc streaming ingest lands them alone)",
    )
    add_metrics_option(parser)
    parser.set_defaults(handler=run)


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds (got {text!r})") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0 (got {text!r})")
    return value


def _names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError(
            f"expected object names such as Account,Contact (got {text!r})"
        )
    return names


def select_topics(
    conf: Conf, objects: Sequence[str] | None, *, streams: bool = False
) -> tuple[TopicSpec, ...]:
    """The topics to land: those of every enabled object, or of the named ones. With
    ``streams`` (the Streaming API channels land too) a conf/ of channels alone has none."""
    topics = conf.topics()
    if not objects:
        if not topics and not (streams and conf.enabled_streams()):
            if conf.enabled_streams():
                raise ConfigError(
                    f"{conf.conf_dir}: no enabled Pub/Sub object (kind change_events or "
                    "platform_event); its Streaming API channels (kind streaming_api) land with "
                    "`sfcdc streaming ingest` or `sfcdc run`"
                )
            raise ConfigError(f"{conf.conf_dir}: every object is disabled; nothing to land")
        return topics
    known = {o.api_name: o for o in conf.objects}
    problems = []
    for name in objects:
        obj = known.get(name)
        if obj is None:
            problems.append(
                f"--objects: no object {name!r} in {conf.conf_dir} (configured: "
                f"{', '.join(sorted(known))}; names are case-sensitive)"
            )
        elif not obj.enabled:
            problems.append(
                f"--objects: {name} is disabled (enabled: false in "
                f"{conf.object_files.get(name, conf.conf_dir)})"
            )
    if problems:
        raise ConfigError("cannot select the objects to land", problems)
    wanted = {known[name].topic for name in objects}
    return tuple(t for t in topics if t.topic in wanted)


@contextlib.contextmanager
def _stop_on_signals(landing: Landing) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[signal.Signals, Any] = {}

    def handle(signum: int, _frame: FrameType | None) -> None:
        landing.stop(f"received {signal.Signals(signum).name}")
        # A second signal acts as it normally would: stopping at any instant is safe.
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, handle)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def encode_progress(result: LandingResult) -> str:
    """``result`` as one stdout line: :data:`PROGRESS_PREFIX` and JSON."""
    return PROGRESS_PREFIX + json.dumps(dataclasses.asdict(result), separators=(",", ":"))


def decode_progress(line: str) -> LandingResult | None:
    """The snapshot an :func:`encode_progress` line carries; ``None`` for any other line.
    Raises ``ValueError`` naming what was expected when a marked line does not parse."""
    if not line.startswith(PROGRESS_PREFIX):
        return None
    text = line[len(PROGRESS_PREFIX) :].strip()
    try:
        data = json.loads(text)
        topics = tuple(
            TopicResult(**{**topic, "commit_seconds": tuple(topic.get("commit_seconds", ()))})
            for topic in data["topics"]
        )
        return LandingResult(topics, float(data["seconds"]), str(data["stopped"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"expected a landing snapshot after {PROGRESS_PREFIX.strip()!r} (JSON with topics, "
            f"seconds, stopped); got {text[:200]!r}: {exc}"
        ) from None


def _reporting(landing: Landing, every: float, write: Callable[[str], None]) -> Callable[[], None]:
    """Writes a snapshot of ``landing`` every ``every`` seconds until the returned function
    is called."""
    done = threading.Event()

    def report() -> None:
        while not done.wait(every):
            snapshot = landing.snapshot()
            # No topics yet: the landing is still preparing its tables and subscriptions.
            if snapshot.topics:
                write(encode_progress(snapshot))

    thread = threading.Thread(target=report, name="sfcdc-landing-progress", daemon=True)
    thread.start()

    def finish() -> None:
        done.set()
        thread.join()

    return finish


def _stop_on_eof(landing: Landing, fd: int) -> None:
    """Stops ``landing`` once the file descriptor ``fd`` (a pipe from the parent) reaches
    end of file."""

    def watch() -> None:
        # os.read, not sys.stdin: a daemon thread blocked inside a buffered reader aborts the
        # interpreter at exit (it cannot take the reader's lock while finalizing).
        with contextlib.suppress(OSError):
            while os.read(fd, 4096):
                pass
        landing.stop("standard input closed (the process that started the landing ended)")

    threading.Thread(target=watch, name="sfcdc-landing-stdin", daemon=True).start()


def land(
    conf: Conf,
    *,
    objects: Sequence[str] | None = None,
    once: bool = False,
    seconds: float | None = None,
    environ: dict[str, str] | None = None,
    secrets: SecretResolver | None = None,
    started: Callable[[Landing], Callable[[], None] | None] | None = None,
    streams: bool = False,
) -> LandingResult:
    """Connect as ``conf`` says and land its topics (what ``sfcdc ingest`` runs).

    ``secrets`` resolves the connection's secret references (default: from ``environ``).
    ``started`` is called with the landing before it runs (to watch it from other threads);
    the function it may return is called once the landing has stopped. ``streams``: the
    Streaming API channels are landed too, beside the topics (after them with ``once``), or
    alone when ``conf`` has no Pub/Sub object."""
    topics = select_topics(conf, objects, streams=streams)
    environ = environ or dict(os.environ)
    engine = engine_for(conf.pipeline.lake, write=True, environ=environ)
    if secrets is None:
        secrets = secret_resolver(environ=environ)
    ops = recorder_for(engine, conf)
    with (
        ops.watching("bronze"),
        connect(
            conf.pipeline.connection,
            secrets=secrets,
            topics=topics,
            on_start=push_topic_provisioner(conf) if streams else None,
        ) as source,
    ):
        landing: Landing
        if topics:
            landing = BronzeLanding(
                engine,
                topics,
                channel=source.channel,
                tokens=source.tokens,
                ingest=conf.pipeline.ingest,
                ops=ops,
            )
        else:
            landing = cometd_landing(
                conf, engine=engine, tokens=source.tokens, ca_file=source.ca_file, ops=ops
            )
        finish = started(landing) if started is not None else None
        with _stop_on_signals(landing), _serving_metrics(conf, landing):
            try:
                if isinstance(landing, CometdLanding):
                    return landing.run(once=once, duration=seconds)
                pubsub = landing
                result, _channels = land_topics_and_streams(
                    conf,
                    lambda: pubsub.run(once=once, duration=seconds),
                    streams=streams,
                    once=once,
                    engine=engine,
                    make_engine=lambda: engine_for(conf.pipeline.lake, environ=environ),
                    tokens=source.tokens,
                    ca_file=source.ca_file,
                    ops=ops,
                )
                return result
            except ReplayIdError as exc:
                raise ReplayIdError(
                    f"{exc}\nTo choose, set replay.on_corrupted to earliest or latest in the "
                    f"topic's object files under {conf.conf_dir / 'objects'} (or "
                    "defaults.replay.on_corrupted in pipeline.yml); until then the checkpoint "
                    "stays where it is and nothing is landed for any topic.",
                    status=exc.status,
                    error_code=exc.error_code,
                    rpc_id=exc.rpc_id,
                ) from exc
            finally:
                if finish is not None:
                    finish()


@contextlib.contextmanager
def _serving_metrics(conf: Conf, landing: Landing) -> Iterator[None]:
    """Serve ``landing``'s figures at ``/metrics`` while the block runs, when
    ``ops.prometheus.port`` is set."""
    prometheus = conf.pipeline.ops.prometheus
    if prometheus.port is None:
        yield
        return
    metrics = PipelineMetrics()
    metrics.watch_landing(landing.snapshot)
    with serve_metrics(metrics, port=prometheus.port, host=prometheus.host) as server:
        print(f"serving Prometheus metrics at {server.url}", file=sys.stderr, flush=True)
        yield


def _write_line(line: str) -> None:
    print(line, flush=True)


def run(args: argparse.Namespace) -> int:
    conf = conf_from_args(args)
    every: float | None = getattr(args, "report_progress", None)
    stop_on_eof: bool = getattr(args, "stop_on_eof", False)

    def started(landing: Landing) -> Callable[[], None] | None:
        if stop_on_eof:
            _stop_on_eof(landing, sys.stdin.fileno())
        if every is None:
            return None
        return _reporting(landing, every, _write_line)

    result = land(
        conf,
        objects=args.objects,
        once=args.once,
        seconds=args.seconds,
        secrets=secrets_from_args(args),
        started=started,
        streams=args.with_streams,
    )
    if every is not None:
        _write_line(encode_progress(result))
    print(f"sfcdc ingest: stopped after {result.seconds:.1f} s ({result.stopped})")
    for t in result.topics:
        extras = []
        if t.keepalive_commits:
            extras.append(f"{t.keepalive_commits} keepalive")
        if t.replay_gaps:
            extras.append(f"{t.replay_gaps} REPLAY GAP")
        if t.redelivered_skipped:
            extras.append(f"{t.redelivered_skipped} redelivered events skipped")
        detail = f" ({', '.join(extras)})" if extras else ""
        print(
            f"  {t.topic} -> {t.table}: {t.events} events, {t.payload_bytes / 1e6:.2f} MB in "
            f"{t.commits} commits{detail}; last replay id {t.last_replay_id or 'none'}"
        )
    return report_failures("sfcdc ingest", conf, result)


def failed_objects(conf: Conf, result: LandingResult) -> list[str]:
    """One line per topic that failed for good: its objects and why."""
    lines = []
    for t in result.failed:
        names = [o.api_name for o in conf.objects if o.topic == t.topic] or [t.topic]
        lines.append(f"{', '.join(names)} ({t.topic}): {t.error}")
    return lines


def report_failures(command: str, conf: Conf, result: LandingResult) -> int:
    """Print the objects whose topic failed to stderr; 1 when any did, else 0."""
    lines = failed_objects(conf, result)
    if not lines:
        return 0
    print(
        f"{command}: {len(lines)} of {len(result.topics)} topics FAILED (the others landed):",
        file=sys.stderr,
    )
    for line in lines:
        print(f"  {line}", file=sys.stderr)
    print(
        "  Fix or disable those objects (enabled: false in their files); `sfcdc validate "
        "--online` checks every topic.",
        file=sys.stderr,
    )
    return 1
