"""The whole pipeline in one process: bronze landing, then silver and gold.

:class:`Pipeline` runs ``ingest -> silver -> gold`` for the enabled objects of a ``conf/``:

- :meth:`Pipeline.run_once` lands what was published before it started (the landing stops
  once every topic has caught up, whatever the traffic), then runs one silver and one gold
  pass;
- :meth:`Pipeline.run_continuous` lands in the background while the calling thread runs
  silver and gold as micro-batches every ``interval`` seconds; :meth:`Pipeline.stop` (from a
  signal handler or another thread) ends it cleanly: the landing commits its open batches,
  then one last silver and gold pass picks them up. Every ``maintenance.every_seconds`` of
  the run, every table is maintained as ``sfcdc maintain`` does (:mod:`pipelines.maintenance`),
  one table after each pass, so that no pass waits for all of them (a table whose maintenance
  fails is logged and tried again in the next round).

Continuous landing runs in a thread of this process, or, given a :class:`LandingProcess`
(what ``sfcdc run --continuous`` does), as a child process (``sfcdc ingest``): the passes
then cannot take the GIL or the CPU from the thread that receives and commits events, which
is what keeps bronze fresh while a pass runs. The child reports its progress as JSON lines on
stdout, stops on SIGTERM (committing its open batches) and stops by itself when this process
dies (its stdin, a pipe from here, closes). A child that exits with an error fails the run,
except the exit after a final report naming topics that failed alone (the run reports those).

Each layer keeps its own exactly-once bookkeeping in Delta (replay checkpoints, app
transactions), so a run that is killed at any instant resumes where the tables say.

With the spark engine, the Spark session silver and gold need is started before the landing
connects: launching the JVM forks this process, and a fork while gRPC's
threads run can leave the child unable to start Java.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ingest.auth import SecretResolver
from ingest.bulk import BulkQueryClient
from ingest.errors import LakeError, ReplayIdError, SfcdcError
from pipelines.bootstrap import SnapshotResult, rebootstrap_due, resync_objects
from pipelines.bronze.cometd import CometdLanding
from pipelines.bronze.landing import BronzeLanding
from pipelines.bronze.landing_state import LandingResult
from pipelines.cometd_pipeline import (
    CometdPassResult,
    cometd_landing,
    land_topics_and_streams,
    push_topic_provisioner,
    run_cometd_pass,
)
from pipelines.commands.bootstrap import open_rest
from pipelines.commands.conf_options import METRICS_PORT_KEY
from pipelines.connect import connect, secret_resolver
from pipelines.formulas import FormulaResult, formulas_due, refresh_formulas
from pipelines.gold.job import GoldResult, run_gold
from pipelines.maintenance import describe, maintain_tables, tables_to_maintain
from pipelines.memory import release_unused_memory
from pipelines.ops.recorder import OpsRecorder, recorder_for
from pipelines.polled.poll import PollResult, due, poll_objects, select_polled
from pipelines.polled.tables import poll_state
from pipelines.reconcile import last_reconcile_at, reconcile_objects
from pipelines.session import engine_for
from pipelines.silver.job import SilverResult, run_silver
from pipelines.snapshot_read import BulkRecords, SnapshotSource
from pipelines.spec.conf import Conf

if TYPE_CHECKING:
    from pipelines.engines.base import LakeEngine, TableRef
    from pipelines.ops.metrics import PipelineMetrics

__all__ = [
    "KEPT_PASSES",
    "LandingProcess",
    "PassLog",
    "PassResult",
    "PassTotals",
    "Pipeline",
    "RunResult",
    "progress_lines",
]

_log = logging.getLogger(__name__)

_ROOT = Path(__file__).resolve().parent.parent
# Lines of the child's stderr kept for the error message when it fails.
_STDERR_TAIL = 20


@dataclass(frozen=True)
class PassResult:
    """One silver pass followed by one gold pass."""

    silver: SilverResult
    gold: GoldResult
    seconds: float
    # The Streaming API channels' silver and gold (None without any).
    streaming: CometdPassResult | None = None
    # Objects whose stored position had expired, read again whole (replay.on_expired).
    rebootstrapped: tuple[SnapshotResult, ...] = ()
    # The polls of objects without change events that were due (before silver).
    polled: tuple[PollResult, ...] = ()
    # The formula refreshes that were due (after gold).
    formulas: tuple[FormulaResult, ...] = ()

    @property
    def silver_rows(self) -> int:
        """Rows appended to silver tables (quarantined rows excluded)."""
        return sum(o.rows for t in self.silver.topics for o in t.objects)

    @property
    def merged(self) -> Mapping[str, int]:
        """Gold rows inserted, updated or deleted, per object."""
        out: dict[str, int] = {}
        for obj in self.gold.objects:
            m = obj.merge
            out[obj.object] = 0 if m is None else m.inserted + m.updated + m.deleted
        return out


@dataclass(frozen=True)
class PassTotals:
    """Sums over every pass of a run."""

    count: int = 0
    silver_rows: int = 0
    quarantined: int = 0
    merged: Mapping[str, int] = field(default_factory=dict)

    def plus(self, p: PassResult) -> PassTotals:
        merged = dict(self.merged)
        for name, n in p.merged.items():
            merged[name] = merged.get(name, 0) + n
        return PassTotals(
            self.count + 1,
            self.silver_rows + p.silver_rows,
            self.quarantined + p.silver.quarantined,
            merged,
        )


# Passes a run's result keeps (older ones are in its totals only): a continuous run of weeks
# makes hundreds of thousands of passes.
KEPT_PASSES = 100


class PassLog:
    """The latest :data:`KEPT_PASSES` passes of a run, and totals over all of them."""

    def __init__(self) -> None:
        self.recent: collections.deque[PassResult] = collections.deque(maxlen=KEPT_PASSES)
        self.totals = PassTotals()

    def append(self, p: PassResult) -> PassResult:
        self.recent.append(p)
        self.totals = self.totals.plus(p)
        return p

    def result(self, landing: LandingResult, seconds: float, stopped: str) -> RunResult:
        """The :class:`RunResult` of a run whose passes these were."""
        return RunResult(landing, tuple(self.recent), seconds, stopped, totals=self.totals)


@dataclass(frozen=True)
class RunResult:
    """What a run did: the landing, its silver/gold passes in order (the latest
    :data:`KEPT_PASSES` of them; ``totals`` sums every pass), and why it stopped."""

    landing: LandingResult
    passes: tuple[PassResult, ...]
    seconds: float
    stopped: str
    # The Streaming API channels' landing (run_once only; None without any).
    streaming: LandingResult | None = None
    totals: PassTotals | None = None

    def _totals(self) -> PassTotals:
        if self.totals is not None:
            return self.totals
        totals = PassTotals()
        for p in self.passes:
            totals = totals.plus(p)
        return totals

    @property
    def pass_count(self) -> int:
        return self._totals().count

    @property
    def silver_rows(self) -> int:
        return self._totals().silver_rows

    @property
    def quarantined(self) -> int:
        return self._totals().quarantined

    def merged(self) -> dict[str, int]:
        """Gold rows inserted, updated or deleted per object, over every pass."""
        return dict(self._totals().merged)


def progress_lines(
    landing: LandingResult,
    previous: LandingResult | None,
    seconds: float,
    last_pass: PassResult | None,
) -> list[str]:
    """Progress of a continuous run: per topic the landing rate over the last ``seconds``,
    the events received but not yet committed to bronze (lag) and the last replay id; per
    object the gold rows the last pass merged and how long the pass took."""
    before = {t.topic: t for t in previous.topics} if previous is not None else {}
    lines = []
    for t in landing.topics:
        if t.error is not None:
            lines.append(f"{t.topic}: FAIL, {t.events} landed: {t.error}")
            continue
        prior = before.get(t.topic)
        rate = (t.events - (prior.events if prior else 0)) / max(seconds, 1e-9)
        lines.append(
            f"{t.topic}: {rate:.0f} events/s, {t.events} landed, lag {t.received - t.events} "
            f"events, last replay id {t.last_replay_id or 'none'}"
        )
    if last_pass is not None:
        merged = ", ".join(f"{k} {v}" for k, v in sorted(last_pass.merged.items()))
        lines.append(
            f"silver/gold pass: {last_pass.silver_rows} silver rows, merged {merged or 'nothing'} "
            f"in {last_pass.seconds:.1f} s"
        )
    return lines


@dataclass(frozen=True)
class LandingProcess:
    """How :meth:`Pipeline.run_continuous` starts the landing as a child process: ``sfcdc
    ingest`` on ``conf_dir`` with the ``--set`` ``overrides`` (key, value) the parent's
    configuration was loaded with, ``cli_options`` before the subcommand (``-v``, ``-q``),
    reporting its progress every ``progress_seconds``; ``streams``: it lands the Streaming API
    channels too (when every object is landed). ``environ`` is the child's
    environment (default: this process's); ``python`` the interpreter to run."""

    conf_dir: Path
    # Not in the repr: a --set value may be a credential.
    overrides: tuple[tuple[str, Any], ...] = field(default=(), repr=False)
    cli_options: tuple[str, ...] = ()
    progress_seconds: float = 1.0
    # The child lands the Streaming API channels too (ingest --with-streams).
    streams: bool = False
    environ: Mapping[str, str] | None = field(default=None, repr=False)
    python: str = sys.executable

    def __post_init__(self) -> None:
        if self.progress_seconds <= 0:
            raise ValueError(f"progress_seconds must be > 0 (got {self.progress_seconds})")

    def argv(self, *, objects: Sequence[str] | None, duration: float | None) -> list[str]:
        """The child's command line."""
        argv = [self.python, "-m", "pipelines.cli", *self.cli_options, "ingest"]
        argv += ["--conf", str(Path(self.conf_dir).resolve())]
        for key, value in self.overrides:
            # JSON is YAML, which is how --set reads its value.
            argv += ["--set", f"{key}={json.dumps(value)}"]
        # The parent serves the metrics (the child's figures come with its snapshots).
        argv += ["--set", f"{METRICS_PORT_KEY}=null"]
        if objects:
            argv += ["--objects", ",".join(objects)]
        if duration is not None:
            argv += ["--for", repr(duration)]
        if self.streams and not objects:
            argv.append("--with-streams")
        argv += ["--report-progress", repr(self.progress_seconds), "--stop-on-eof"]
        return argv

    @staticmethod
    def shown(argv: Sequence[str]) -> str:
        """``argv`` (without the interpreter) for logs and errors: ``--set`` values are left
        out, since one may be a credential."""
        return " ".join(
            arg.split("=", 1)[0] + "=..." if argv[i - 1] == "--set" else arg
            for i, arg in enumerate(argv[1:], start=1)
        )

    def env(self) -> dict[str, str]:
        """The child's environment: ``environ`` with this copy of sfcdc first on its path (a
        checkout run with ``python -m`` is not importable otherwise)."""
        env = dict(os.environ if self.environ is None else self.environ)
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([str(_ROOT), *(p for p in paths if p != str(_ROOT))])
        return env


class _ChildLanding:
    """A running ``sfcdc ingest`` child: its latest progress snapshot, its stop and its end."""

    def __init__(
        self,
        spec: LandingProcess,
        *,
        objects: Sequence[str] | None,
        duration: float | None,
        ended: Callable[[], None],
        logger: logging.Logger,
    ) -> None:
        from pipelines.commands.ingest import decode_progress

        self._decode = decode_progress
        self._log = logger
        self._ended = ended
        self._lock = threading.Lock()
        self._latest: LandingResult | None = None
        self._signalled = False
        self._stderr: collections.deque[str] = collections.deque(maxlen=_STDERR_TAIL)
        self.argv = spec.argv(objects=objects, duration=duration)
        self.shown = spec.shown(self.argv)
        # A session of its own: a terminal's Ctrl-C reaches this process only, which stops
        # the child once, with SIGTERM (a second signal would stop it at once).
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=spec.env(),
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        self._log.info("landing runs in process %d: %s", self.proc.pid, self.shown)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            threading.Thread(
                target=self._read_stdout,
                args=(self.proc.stdout,),
                name="sfcdc-landing-stdout",
                daemon=True,
            ),
            threading.Thread(
                target=self._read_stderr,
                args=(self.proc.stderr,),
                name="sfcdc-landing-stderr",
                daemon=True,
            ),
        ]
        for reader in self._readers:
            reader.start()

    def _read_stdout(self, stream: IO[str]) -> None:
        try:
            for line in stream:
                try:
                    snapshot = self._decode(line)
                except ValueError as exc:
                    self._log.warning("landing process %d: %s", self.proc.pid, exc)
                    continue
                if snapshot is not None:
                    with self._lock:
                        self._latest = snapshot
                elif line.strip():
                    self._log.debug("landing process %d: %s", self.proc.pid, line.rstrip())
        finally:
            # End of its stdout: the child has exited (or closed it on its way out).
            self._ended()

    def _read_stderr(self, stream: IO[str]) -> None:
        # The child's log lines go where this process's would; the tail is kept for errors.
        for line in stream:
            self._stderr.append(line.rstrip())
            sys.stderr.write(line)

    def snapshot(self) -> LandingResult | None:
        """The child's latest progress report (``None`` before its first)."""
        with self._lock:
            return self._latest

    def stop(self) -> None:
        """Ask the child to stop cleanly (SIGTERM, once). Safe from a signal handler."""
        with self._lock:
            if self._signalled or self.proc.returncode is not None:
                return
            self._signalled = True
        with contextlib.suppress(ProcessLookupError):  # it has just exited
            self.proc.send_signal(signal.SIGTERM)

    def wait(self) -> LandingResult:
        """Wait for the child to exit; its last report, or an error naming its exit code."""
        code = self.proc.wait()
        for reader in self._readers:
            reader.join()
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        latest = self.snapshot()
        # `sfcdc ingest` exits 1 after its final report when some topics failed for good while
        # the others landed: a result the run reports, not a crash of the landing.
        if code == 1 and latest is not None and latest.stopped != "running" and latest.failed:
            return latest
        if code != 0 or latest is None or latest.stopped == "running":
            tail = "\n".join(f"  {line}" for line in self._stderr)
            how = (
                f"was killed by signal {signal.Signals(-code).name}"
                if code < 0
                else f"exited with code {code}"
            )
            raise SfcdcError(
                f"the landing process (pid {self.proc.pid}: {self.shown}) {how}"
                + ("" if code else " without reporting its result")
                + "; silver and gold passes stopped"
                + (f". Its last output:\n{tail}" if tail else "")
            )
        return latest

    def kill(self) -> None:
        """End the child at once (the Delta checkpoints make that safe)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class Pipeline:
    """Runs landing, silver and gold for ``conf`` (optionally only ``objects``).

    ``landing_engine`` makes the engine the landing writes with, ``engine`` the one silver and
    gold read and write with (called once, before the landing connects: a Spark session
    starts then); both default to :func:`~pipelines.session.engine_for` of the lake.
    ``report`` receives progress lines of a continuous run; ``secrets`` resolves secret
    references (default: from ``environ``) for landings in this process; a landing child
    reads environment variables. ``monotonic`` times passes and intervals.
    ``landing_process``: continuous runs land in that child process instead of a thread
    (:meth:`run_once` always lands in this process). Every commit (and failure) of each
    layer is recorded in the commits table (``ops`` in ``pipeline.yml``) and handed to
    ``metrics`` when given, which also reads the landing's snapshots.
    """

    def __init__(
        self,
        conf: Conf,
        *,
        objects: Sequence[str] | None = None,
        landing_engine: Callable[[], LakeEngine] | None = None,
        engine: Callable[[], LakeEngine] | None = None,
        report: Callable[[str], None] | None = None,
        environ: dict[str, str] | None = None,
        secrets: SecretResolver | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        logger: logging.Logger | None = None,
        landing_process: LandingProcess | None = None,
        metrics: PipelineMetrics | None = None,
    ) -> None:
        from pipelines.commands.ingest import select_topics

        self.conf = conf
        self.objects = tuple(objects) if objects else None
        # A conf/ of Streaming API channels or polled objects alone has no topic: the
        # channels land by themselves, polled objects are read by polls.
        self._topics = (
            ()
            if not conf.topics() and conf.polled_objects()
            else select_topics(conf, self.objects, streams=self.objects is None)
        )
        # run_once polls every polled object; continuous passes poll those that are due.
        self._poll_all = False
        # Two engines: the landing commits from its own thread (or process) while passes run.
        self._landing_engine = landing_engine or (
            lambda: engine_for(conf.pipeline.lake, write=True, environ=environ or os.environ)
        )
        self._engine_factory = engine or (lambda: engine_for(conf.pipeline.lake, write=True))
        self._pass_engine: LakeEngine | None = None
        self._log = logger or _log
        self._report = report or (lambda line: self._log.info("%s", line))
        self._environ = environ
        self._secrets = secrets
        self._monotonic = monotonic
        self._stop = threading.Event()
        self._stop_reason: str | None = None
        self._landing: BronzeLanding | CometdLanding | None = None
        self._landing_process = landing_process
        self._child: _ChildLanding | None = None
        self._lock = threading.Lock()
        # Streaming API channels ride along when every object is selected (run_once lands
        # them after the Pub/Sub topics, on the same connection; a continuous run beside
        # them, in a thread of the landing).
        self._streams = bool(conf.enabled_streams()) and self.objects is None
        self._cometd_landing: LandingResult | None = None
        self._metrics = metrics
        self._pass_ops: OpsRecorder | None = None
        self._next_maintenance: float | None = None
        self._maintenance_due: collections.deque[TableRef] = collections.deque()
        self._next_reconcile: float | None = None
        if metrics is not None:
            metrics.watch_landing(self._snapshot)

    def _snapshot(self) -> LandingResult | None:
        with self._lock:
            landing, child = self._landing, self._child
        if landing is not None:
            return landing.snapshot()
        if child is not None:
            return child.snapshot()
        return None

    def _ops(self) -> OpsRecorder:
        if self._pass_ops is None:
            listeners = [self._metrics.record] if self._metrics is not None else []
            self._pass_ops = recorder_for(
                self._engine(), self.conf, listeners=listeners, logger=self._log
            )
        return self._pass_ops

    def _flush_ops(self) -> None:
        if self._pass_ops is not None:
            self._pass_ops.flush()

    def stop(self, reason: str = "stop requested") -> None:
        """Ask the run to stop cleanly: the landing commits its open batches, then one last
        silver and gold pass runs. Safe from a signal handler and from any thread."""
        with self._lock:
            if self._stop_reason is None:
                self._stop_reason = reason
            landing = self._landing
            child = self._child
        self._stop.set()
        if landing is not None:
            landing.stop(reason)
        if child is not None:
            child.stop()

    @property
    def landing_pid(self) -> int | None:
        """The process id of the landing child of a running continuous run (``None`` when
        the landing runs in this process, or has ended)."""
        with self._lock:
            child = self._child
        if child is None or child.proc.poll() is not None:
            return None
        return child.proc.pid

    def run_once(self) -> RunResult:
        """Drain what the source has into bronze, then one silver and one gold pass."""
        started = self._monotonic()
        self._engine()  # before any gRPC channel exists: see the module docstring
        landing = self._land(once=True, duration=None)
        self._poll_all = True
        try:
            passes = (self.run_pass(),)
        finally:
            self._poll_all = False
            self._flush_ops()
        return RunResult(
            landing,
            passes,
            self._monotonic() - started,
            landing.stopped,
            streaming=self._cometd_landing,
        )

    def run_continuous(self, *, interval: float, duration: float | None = None) -> RunResult:
        """Land continuously; run silver and gold at once and then every ``interval`` seconds
        (back to back when a pass takes longer) until :meth:`stop` (or for ``duration``
        seconds), then a last pass."""
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds (got {interval})")
        every = self.conf.pipeline.maintenance.every_seconds
        self._next_maintenance = self._monotonic() + every if every > 0 else None
        try:
            if self._landing_process is not None and self._topics:
                return self._run_with_child(self._landing_process, interval, duration)
            return self._run_with_thread(interval, duration)
        finally:
            self._flush_ops()

    def _run_with_thread(self, interval: float, duration: float | None) -> RunResult:
        started = self._monotonic()
        self._engine()  # before any gRPC channel exists: see the module docstring
        outcome: list[LandingResult] = []
        failure: list[BaseException] = []
        ready = threading.Event()

        def land() -> None:
            try:
                outcome.append(self._land(once=False, duration=duration, ready=ready))
            except BaseException as exc:  # handed to the calling thread, which raises it
                failure.append(exc)
            finally:
                ready.set()
                self._stop.set()

        thread = threading.Thread(target=land, name="sfcdc-landing", daemon=True)
        thread.start()
        passes = PassLog()
        ready.wait()
        previous: LandingResult | None = None
        mark = self._monotonic()
        # The first pass runs at once (it catches up with what bronze already holds); later
        # ones start every `interval` seconds, or right away when a pass took longer.
        next_pass = mark
        try:
            while not failure:
                if self._stop.wait(max(0.0, next_pass - self._monotonic())):
                    break
                next_pass = self._monotonic() + interval
                passes.append(self.run_pass())
                self._maintain_if_due()
                self._reconcile_if_due()
                now = self._monotonic()
                landing = self._landing
                if landing is not None:
                    snapshot = landing.snapshot()
                    for line in progress_lines(snapshot, previous, now - mark, passes.recent[-1]):
                        self._report(line)
                    previous = snapshot
                mark = now
        except KeyboardInterrupt:
            # A second signal: stop at once (the Delta checkpoints make that safe).
            raise
        except BaseException:
            self.stop("a silver/gold pass failed")
            thread.join()
            raise
        thread.join()
        if failure:
            raise failure[0]
        result = outcome[0]
        # The landing committed its open batches when it stopped: fold them in too.
        passes.append(self.run_pass())
        stopped = self._stop_reason or result.stopped
        return passes.result(result, self._monotonic() - started, stopped)

    def _run_with_child(
        self, spec: LandingProcess, interval: float, duration: float | None
    ) -> RunResult:
        started = self._monotonic()
        # Spark first, as with a landing thread: a run "for" some seconds lands for that long
        # while passes run, not while the JVM starts.
        self._engine()
        child = _ChildLanding(
            spec,
            objects=self.objects,
            duration=duration,
            ended=self._stop.set,
            logger=self._log,
        )
        with self._lock:
            self._child = child
            stopping = self._stop_reason is not None
        if stopping:
            child.stop()
        passes = PassLog()
        previous: LandingResult | None = None
        try:
            mark = next_pass = self._monotonic()
            while True:
                if self._stop.wait(max(0.0, next_pass - self._monotonic())):
                    break
                next_pass = self._monotonic() + interval
                passes.append(self.run_pass())
                self._maintain_if_due()
                self._reconcile_if_due()
                now = self._monotonic()
                snapshot = child.snapshot()
                if snapshot is not None:
                    for line in progress_lines(snapshot, previous, now - mark, passes.recent[-1]):
                        self._report(line)
                    previous = snapshot
                    mark = now
        except KeyboardInterrupt:
            # A second signal: stop at once (the Delta checkpoints make that safe).
            child.kill()
            raise
        except BaseException:
            self.stop("a silver/gold pass failed")
            try:
                child.wait()
            except SfcdcError as exc:
                self._log.warning("%s", exc)
            raise
        child.stop()
        landing = child.wait()
        # The landing committed its open batches when it stopped: fold them in too.
        passes.append(self.run_pass())
        stopped = self._stop_reason or landing.stopped
        return passes.result(landing, self._monotonic() - started, stopped)

    def run_pass(self) -> PassResult:
        """One silver pass, then one gold pass, over what bronze holds now."""
        engine = self._engine()
        started = self._monotonic()
        names = list(self.objects) if self.objects else None
        ops = self._ops()
        with self._failing(ops, "bronze"):
            polled = self._poll(engine, names, ops)
        with self._failing(ops, "silver"):
            silver = run_silver(engine, self.conf, objects=names, on_commit=ops.record)
        with self._failing(ops, "gold"):
            gold = run_gold(engine, self.conf, objects=names, on_commit=ops.record)
        with self._failing(ops, "gold"):
            rebootstrapped = self._rebootstrap(engine, names)
        with self._failing(ops, "gold"):
            formulas = self._refresh_formulas(engine, names, ops)
        streaming = None
        if self._streams:
            streaming = run_cometd_pass(engine, self.conf, on_commit=ops.record)
        ops.flush_if_due()
        # What the pass allocated is free again: give it back rather than keep the largest
        # pass's worth for the rest of the run.
        release_unused_memory()
        return PassResult(
            silver,
            gold,
            self._monotonic() - started,
            streaming,
            rebootstrapped,
            tuple(polled),
            tuple(formulas),
        )

    def _poll(
        self, engine: LakeEngine, names: Sequence[str] | None, ops: OpsRecorder
    ) -> list[PollResult]:
        """Poll the polled objects that are due (every one in :meth:`run_once`), before
        silver, so the pass carries their records to gold."""
        now = datetime.now(timezone.utc)
        wanted = [
            o
            for o in select_polled(self.conf, names)
            if self._poll_all or due(poll_state(engine, o), o, now)
        ]
        if not wanted:
            return []
        api_names = [o.api_name for o in wanted]
        with open_rest(self.conf, secrets=self._secrets) as (_source, rest):
            bulk = BulkRecords(BulkQueryClient(rest), describe=rest.describe)
            return poll_objects(
                engine,
                self.conf,
                api_names,
                rest=rest,
                bulk=bulk,
                force=True,
                on_commit=ops.record,
            )

    def _refresh_formulas(
        self, engine: LakeEngine, names: Sequence[str] | None, ops: OpsRecorder
    ) -> list[FormulaResult]:
        """Refresh the formula fields of the objects whose refresh is due, after gold."""
        wanted = formulas_due(engine, self.conf, names, now=datetime.now(timezone.utc))
        if not wanted:
            return []
        api_names = [o.api_name for o in wanted]
        with open_rest(self.conf, secrets=self._secrets) as (_source, rest):
            bulk = BulkRecords(BulkQueryClient(rest), describe=rest.describe)
            return refresh_formulas(
                engine,
                self.conf,
                api_names,
                rest=rest,
                bulk=bulk,
                force=True,
                on_record=ops.record,
            )

    def _rebootstrap(
        self, engine: LakeEngine, names: Sequence[str] | None
    ) -> tuple[SnapshotResult, ...]:
        """Objects whose stored position expired (``replay.on_expired: rebootstrap``) are read
        again whole, Bulk API for large ones, once the stream has resumed after the gap."""
        due = rebootstrap_due(engine, self.conf, names)
        if not due:
            return ()
        wanted = [o.api_name for o in due]
        self._log.warning(
            "rebootstrap: the stored position of %s expired; reading every record again",
            ", ".join(wanted),
        )
        with open_rest(self.conf, secrets=self._secrets) as (_source, rest):
            bulk = BulkRecords(BulkQueryClient(rest), describe=rest.describe)
            source = SnapshotSource(rest, bulk=bulk, api="auto")
            results = resync_objects(engine, self.conf, wanted, rest=source)
        for result in results:
            self._log.info(
                "rebootstrap: %s: %d records read over %s, %d re-sync rows resolved",
                result.object,
                result.read,
                "the Bulk API" if result.api == "bulk" else "REST",
                result.resolved,
            )
        return tuple(results)

    def _maintain_if_due(self) -> None:
        """Maintain the next table of the current maintenance round, if one is under way or
        ``maintenance.every_seconds`` have passed since the last round started: one table per
        call (after each pass), so a round costs each pass at most one table's compaction and
        VACUUM rather than every table's at once."""
        every = self.conf.pipeline.maintenance.every_seconds
        if not self._maintenance_due:
            due = self._next_maintenance
            if due is None or self._monotonic() < due:
                return
            self._next_maintenance = self._monotonic() + every
            try:
                tables = tables_to_maintain(self._engine(), self.conf, self.objects)
            except LakeError as exc:
                self._log.warning("maintenance failed (next try in %g s): %s", every, exc)
                return
            self._log.info("maintenance: %d tables, one after each pass", len(tables))
            self._maintenance_due.extend(tables)
            if not tables:
                return
        table = self._maintenance_due.popleft()
        try:
            for item in maintain_tables(
                self._engine(), self.conf, objects=self.objects, tables=[table]
            ):
                self._log.info("maintenance: %s", describe(item))
        except LakeError as exc:
            # Compaction can conflict with the landing's own; the next round tries again.
            self._log.warning("maintenance of %s failed (next try in %g s): %s", table, every, exc)

    def _reconcile_if_due(self) -> None:
        """Reconcile every change event object when ``reconcile.every_hours`` have passed since
        the last reconcile the lake recorded (so a restarted run keeps the schedule)."""
        spec = self.conf.pipeline.reconcile
        if spec.every_hours <= 0:
            return
        now = time.time()
        if self._next_reconcile is None:
            last = last_reconcile_at(self._engine())
            start = last.timestamp() if last is not None else now - spec.every_hours * 3600
            self._next_reconcile = start + spec.every_hours * 3600
        if now < self._next_reconcile:
            return
        self._next_reconcile = now + spec.every_hours * 3600
        names = list(self.objects) if self.objects else None
        try:
            with open_rest(self.conf, secrets=self._secrets) as (_source, rest):
                bulk = BulkRecords(BulkQueryClient(rest), describe=rest.describe)
                results = reconcile_objects(
                    self._engine(),
                    self.conf,
                    names,
                    source=SnapshotSource(rest, bulk=bulk, api=spec.api),
                    repair=spec.repair,
                    lookback=timedelta(seconds=spec.lookback_seconds),
                    on_record=self._ops().record,
                )
        except SfcdcError as exc:
            self._log.warning("reconcile failed (next try in %g h): %s", spec.every_hours, exc)
            return
        for result in results:
            if self._metrics is not None:
                self._metrics.record_reconcile(result)

    @staticmethod
    @contextlib.contextmanager
    def _failing(ops: OpsRecorder, layer: str) -> Iterator[None]:
        # A failed pass is recorded (and written at once: the run is about to end).
        try:
            yield
        except Exception as exc:
            ops.error(layer, exc)
            ops.flush()
            raise

    def engine(self) -> LakeEngine:
        """The engine silver and gold use (made on the first call)."""
        return self._engine()

    # -----------------------------------------------------------------------------------------

    def _engine(self) -> LakeEngine:
        if self._pass_engine is None:
            self._pass_engine = self._engine_factory()
        return self._pass_engine

    def _land(
        self, *, once: bool, duration: float | None, ready: threading.Event | None = None
    ) -> LandingResult:
        conf = self.conf
        engine = self._landing_engine()
        ops = recorder_for(engine, conf, logger=self._log)
        with ops.watching("bronze"):
            return self._land_with(engine, ops, once=once, duration=duration, ready=ready)

    def _register(
        self, landing: BronzeLanding | CometdLanding, ready: threading.Event | None
    ) -> None:
        """Make ``landing`` the one :meth:`stop` stops (at once when a stop came first)."""
        with self._lock:
            self._landing = landing
            reason = self._stop_reason
        if reason is not None:
            landing.stop(reason)
        if ready is not None:
            ready.set()

    def _land_with(
        self,
        engine: LakeEngine,
        ops: OpsRecorder,
        *,
        once: bool,
        duration: float | None,
        ready: threading.Event | None,
    ) -> LandingResult:
        conf = self.conf
        if not self._topics and not self._streams:
            # Only polled objects: nothing to subscribe to; the passes poll.
            if ready is not None:
                ready.set()
            started = self._monotonic()
            if not once:
                self._stop.wait(duration)
            return LandingResult((), self._monotonic() - started, "no topic to land")
        secrets = self._secrets or secret_resolver(environ=self._environ)
        provision = push_topic_provisioner(conf) if self._streams else None
        with connect(
            conf.pipeline.connection, secrets=secrets, topics=self._topics, on_start=provision
        ) as source:
            if not self._topics:
                alone = cometd_landing(
                    conf, engine=engine, tokens=source.tokens, ca_file=source.ca_file, ops=ops
                )
                self._register(alone, ready)
                return alone.run(once=once, duration=duration)
            landing = BronzeLanding(
                engine,
                self._topics,
                channel=source.channel,
                tokens=source.tokens,
                ingest=conf.pipeline.ingest,
                ops=ops,
            )
            self._register(landing, ready)
            try:
                result, channels = land_topics_and_streams(
                    conf,
                    lambda: landing.run(once=once, duration=duration),
                    streams=self._streams,
                    once=once,
                    engine=engine,
                    make_engine=self._landing_engine,
                    tokens=source.tokens,
                    ca_file=source.ca_file,
                    ops=ops,
                    logger=self._log,
                    streams_after=lambda: self._stop_reason is None,
                )
                if channels is not None:
                    self._cometd_landing = channels
                return result
            except ReplayIdError as exc:
                raise ReplayIdError(
                    f"{exc}\nTo choose, set replay.on_corrupted to earliest or latest in the "
                    f"topic's object files under {conf.conf_dir / 'objects'} (or "
                    "defaults.replay.on_corrupted in pipeline.yml).",
                    status=exc.status,
                    error_code=exc.error_code,
                    rpc_id=exc.rpc_id,
                ) from exc
