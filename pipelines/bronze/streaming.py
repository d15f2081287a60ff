"""Streaming API landing: every notification of every channel into its bronze table, exactly
once.

:class:`StreamingLanding` makes or checks the PushTopics and stores the describes
(:mod:`pipelines.bronze.streaming_setup`), then subscribes to every channel in one CometD
session (:class:`~ingest.streaming.StreamingSubscription`) and lands what it yields:

- a :class:`~ingest.streaming.NotificationBatch`: each notification joins its channel's open
  batch (raw JSON, replay id, ``createdDate``, event type, ``EventUuid``, receive time);
- a :class:`~ingest.streaming.MalformedMessage`: it joins its channel's open batch too, with
  the reason in ``malformed`` (silver quarantines it); a body that names no channel (not JSON
  at all) goes to the first channel's table, with a null channel;
- a :class:`~ingest.streaming.ReplayGap`: a ``replay_gap`` checkpoint row (gold records a
  whole-object re-sync for it), after the channel's open batch;
- an :class:`~ingest.streaming.IdleConnect`: with ``once``, nothing is pending on any channel
  and the landing stops.

A batch is sealed when it reaches ``batching.max_events`` notifications or ``max_bytes``
characters of JSON, or when its oldest message is ``max_age_seconds`` old (checked by a ticker
thread, since a long poll may hold the consuming thread for up to 110 s), and handed to the
committer thread, which lands it with the protocol of
:mod:`pipelines.bronze.streaming_checkpoints`. When the subscription reconnects it asks for
each channel's durable position (in the consuming thread): the open batches are committed
first, so the new session resumes right after the last notification received.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ingest.auth import TokenManager
from ingest.client import RetryPolicy, TlsSettings
from ingest.errors import CheckpointError
from ingest.replay import ReplayId
from ingest.rest import RestClient
from ingest.streaming import (
    IdleConnect,
    MalformedMessage,
    NotificationBatch,
    Reconnected,
    ReplayGap,
    StreamingSubscription,
)
from pipelines.bronze.checkpoint import CheckpointRow
from pipelines.bronze.landing import LandingResult, TopicResult
from pipelines.bronze.streaming_checkpoints import REPLAY_ALL, REPLAY_NEW, StreamingCheckpoints
from pipelines.bronze.streaming_setup import StreamSetup, prepare_streams
from pipelines.bronze.streaming_tables import (
    STREAMING_BRONZE_LAYOUT,
    STREAMING_BRONZE_SCHEMA,
    ensure_streaming_tables,
    replay_bytes,
    streaming_tables,
)
from pipelines.bronze.tables import bronze_app_id
from pipelines.engines.base import TableRef, Txn
from pipelines.ops.table import CommitRecord
from pipelines.spec import IngestSpec, StreamingApiSpec

if TYPE_CHECKING:
    from pathlib import Path

    import httpx

    from ingest.streaming.setup import RestApi
    from pipelines.engines.base import LakeEngine
    from pipelines.ops.recorder import OpsRecorder
    from pipelines.spec_streaming import StreamingObjectSpec

__all__ = ["StreamingLanding"]

_log = logging.getLogger(__name__)

_TICK = 0.05
_WAIT = 0.1
_MICROS = 1_000_000


class _OpenBatch:
    """Messages received for a channel and not yet handed to the committer."""

    __slots__ = (
        "channels",
        "counts",
        "created",
        "events",
        "malformed",
        "nbytes",
        "opened_at",
        "position",
        "raws",
        "replay_ids",
        "stamped",
        "times",
        "types",
        "uuids",
    )

    def __init__(self) -> None:
        self.replay_ids: list[int | None] = []
        self.channels: list[str | None] = []
        self.types: list[str | None] = []
        self.created: list[str | None] = []
        self.uuids: list[str | None] = []
        self.raws: list[str] = []
        self.malformed: list[str | None] = []
        self.times: list[int] = []  # run-length receive times: one entry per connect reply
        self.counts: list[int] = []
        self.stamped = 0  # messages covered by times/counts
        self.events = 0
        self.nbytes = 0
        self.position: int | None = None  # replay id of the last notification
        self.opened_at: float | None = None

    def __len__(self) -> int:
        return len(self.raws)


@dataclass
class _Sealed:
    key: str
    batch_id: int
    kind: str  # events | replay_gap
    position: int
    batch: _OpenBatch
    gap: ReplayGap | None = None


@dataclass
class _Stream:
    """A channel's state: the consumer's side (open batch, counters) and, under the landing's
    state lock, what the committer has committed."""

    spec: StreamingObjectSpec
    table: TableRef
    next_batch: int
    position: int  # durable: where a new session resumes
    open: _OpenBatch = field(default_factory=_OpenBatch)
    sealed_position: int = 0
    received: int = 0
    progress_mark: tuple[float, int] = (0.0, 0)
    # committed (by the committer thread, under the state lock)
    events: int = 0
    malformed: int = 0
    nbytes: int = 0
    commits: int = 0
    gaps: int = 0
    last_replay_id: int | None = None
    since_maintenance: int = 0
    # (time, position) of an empty connect while nothing of the channel was open: once that
    # position is committed, the channel was caught up at that time (a commits-table row).
    idle_mark: tuple[float, int] | None = None


class _Committer:
    """The one thread that writes Delta: rounds of at most one batch per channel (so each
    channel's batches stay in order), their checkpoint rows in one commit. :meth:`submit`
    waits while a batch of every channel is already waiting, which bounds memory."""

    def __init__(self, commit: Callable[[list[_Sealed]], None], *, limit: int) -> None:
        self._commit = commit
        self._limit = max(1, limit)
        self._cond = threading.Condition()
        self._pending: deque[_Sealed] = deque()
        self._busy = False
        self._closing = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, name="sfcdc-streaming-committer", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def check(self) -> None:
        if self._error is not None:
            raise self._error

    def submit(self, sealed: _Sealed) -> None:
        with self._cond:
            while len(self._pending) >= self._limit:
                self.check()
                self._cond.wait(_WAIT)
            self.check()
            self._pending.append(sealed)
            self._cond.notify_all()

    def wait_idle(self) -> None:
        with self._cond:
            while self._pending or self._busy:
                self.check()
                self._cond.wait(_WAIT)
        self.check()

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    def _take_round(self) -> list[_Sealed]:
        taken: list[_Sealed] = []
        keys: set[str] = set()
        rest: deque[_Sealed] = deque()
        for sealed in self._pending:
            if sealed.key in keys:
                rest.append(sealed)
            else:
                keys.add(sealed.key)
                taken.append(sealed)
        self._pending = rest
        return taken

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending:
                    return
                round_, self._busy = self._take_round(), True
                self._cond.notify_all()
            try:
                self._commit(round_)
            except BaseException as exc:  # surfaced in the consuming thread, which stops
                _log.error("streaming: committing %s failed: %s", [s.key for s in round_], exc)
                with self._cond:
                    self._error = exc
                    self._busy = False
                    self._cond.notify_all()
                return
            with self._cond:
                self._busy = False
                self._cond.notify_all()


class StreamingLanding:
    """Lands the notifications of ``streams`` (Streaming API object files) through
    ``engine``; see the module docstring.

    ``tokens`` supplies the access token and instance URL; ``ca_file`` the CA to trust (the
    emulator's); ``streaming`` the API version; ``ingest`` the retry policy, progress and
    maintenance intervals. ``rest`` replaces the REST client of the setup step and ``http``
    the subscription's HTTP client (tests). ``ops`` receives a commit record per commit, gap
    and catch-up, and is flushed from the committer thread. ``clock`` stamps rows;
    ``monotonic`` times ages and progress.
    """

    def __init__(
        self,
        engine: LakeEngine,
        streams: Sequence[StreamingObjectSpec],
        *,
        tokens: TokenManager,
        ca_file: Path | str | None = None,
        streaming: StreamingApiSpec | None = None,
        ingest: IngestSpec | None = None,
        rest: RestApi | None = None,
        http: httpx.Client | None = None,
        ops: OpsRecorder | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        logger: logging.Logger | None = None,
    ) -> None:
        specs = sorted(streams, key=lambda s: s.key)
        if not specs:
            raise ValueError("nothing to land: no Streaming API channel was given")
        policies = {s.replay.on_corrupted for s in specs}
        if len(policies) > 1:
            raise ValueError(
                "the channels of one landing share a CometD session and its replay policy: "
                f"replay.on_corrupted must agree (got {sorted(policies)})"
            )
        self._engine = engine
        self._specs = specs
        self._tokens = tokens
        self._ca_file = str(ca_file) if ca_file is not None else None
        self._streaming = streaming or StreamingApiSpec()
        self._ingest = ingest or IngestSpec()
        self._rest = rest
        self._http = http
        self._ops = ops
        self._clock = clock
        self._monotonic = monotonic
        self._log = logger or _log
        self.tables = streaming_tables(specs)
        self._checkpoints = StreamingCheckpoints(engine, self.tables, clock=clock, logger=self._log)
        self._committer = _Committer(self._commit, limit=len(specs))
        self._open_lock = threading.RLock()
        self._state_lock = threading.Lock()
        self._streams: dict[str, _Stream] = {}
        self._by_channel: dict[str, _Stream] = {}
        self._sub: StreamingSubscription | None = None
        self._stop_reason: str | None = None
        self._stopped = ""
        self._done = threading.Event()
        self._started = self._monotonic()
        self._ran = False
        self.setup: list[StreamSetup] = []

    # -- public -------------------------------------------------------------------------------

    def stop(self, reason: str = "stop requested") -> None:
        """Ask the landing to stop: open batches are committed, then :meth:`run` returns.
        Safe from a signal handler and from any thread (it only records the request)."""
        if self._stop_reason is None:
            self._stop_reason = reason

    def snapshot(self) -> LandingResult:
        """Progress so far (safe from any thread)."""
        return self._result(self._monotonic() - self._started, self._stopped or "running")

    def run(self, *, once: bool = False, duration: float | None = None) -> LandingResult:
        """Land until stopped, for ``duration`` seconds, or with ``once`` until a connect
        comes back empty (nothing pending on any channel)."""
        if self._ran:
            raise RuntimeError("a StreamingLanding runs once; create a new one to resume")
        self._ran = True
        if duration is not None and duration <= 0:
            raise ValueError(f"duration must be > 0 seconds (got {duration})")
        started = self._started = self._monotonic()
        deadline = started + duration if duration is not None else None
        positions = self._prepare()
        policy = self._specs[0].replay.on_corrupted
        retry = self._ingest.retry
        sub = StreamingSubscription(
            self._tokens,
            positions,
            api_version=self._streaming.api_version,
            durable_position=self._durable,
            on_corrupted=policy,
            http=self._http,
            ca_file=self._ca_file,
            retry=RetryPolicy(
                max_attempts=retry.max_attempts,
                initial_backoff=retry.initial_backoff_seconds,
                max_backoff=retry.max_backoff_seconds,
                multiplier=retry.multiplier,
            ),
            clock=self._clock,
            logger=self._log,
        )
        self._sub = sub
        self._committer.start()
        ticker = threading.Thread(
            target=self._tick_loop, args=(deadline,), name="sfcdc-streaming-ticker", daemon=True
        )
        ticker.start()
        stopped = "the subscription ended"
        try:
            with sub:
                for item in sub:
                    if self._handle(item, once=once):
                        stopped = "drained: a connect came back empty on every channel"
                        break
                    if self._stop_reason is not None:
                        break
            stopped = self._stop_reason or stopped
            self._finish(stopped)
        finally:
            self._done.set()
            ticker.join()
            self._committer.close()
            if self._ops is not None:
                self._ops.flush()
        return self._result(self._monotonic() - started, stopped)

    # -- start --------------------------------------------------------------------------------

    def _prepare(self) -> dict[str, int]:
        ensure_streaming_tables(self._engine, self.tables)
        positions: dict[str, int] = {}
        for spec in self._specs:
            default = REPLAY_ALL if spec.replay.start == "earliest" else REPLAY_NEW
            recovery = self._checkpoints.recover(spec.key, default_start=default)
            stream = _Stream(
                spec=spec,
                table=self.tables.bronze(spec.key),
                next_batch=recovery.next_batch_id,
                position=recovery.position,
                sealed_position=recovery.position,
                last_replay_id=recovery.last_replay_id,
            )
            self._streams[spec.key] = stream
            self._by_channel[spec.channel] = stream
            positions[spec.channel] = recovery.position
            self._log.info(
                "%s: landing into %s from %s; next batch %d",
                spec.channel,
                stream.table,
                _shown(recovery.position),
                recovery.next_batch_id,
            )
        rest = self._rest
        owned = None
        if rest is None:
            owned = rest = RestClient(
                self._tokens,
                api_version=f"v{self._streaming.api_version}",
                tls=TlsSettings(ca_file=_path(self._ca_file)),
                logger=self._log,
            )
        try:
            self.setup = prepare_streams(
                self._engine, self.tables, self._specs, rest, clock=self._clock, logger=self._log
            )
        finally:
            if owned is not None:
                owned.close()
        return positions

    # -- the consuming thread ----------------------------------------------------------------

    def _durable(self, channel: str) -> int:
        # Called by the subscription before it subscribes again, in this (consuming) thread,
        # after every item of the old session was handled: committing the open batches lets
        # the new session resume right after the last notification received.
        self._seal_all()
        self._committer.wait_idle()
        stream = self._by_channel.get(channel)
        if stream is None:
            return REPLAY_NEW
        with self._state_lock:
            return stream.position

    def _handle(self, item: Any, *, once: bool) -> bool:
        """Land one item; True when a ``once`` landing is drained."""
        self._committer.check()
        if isinstance(item, NotificationBatch):
            self._add(item)
        elif isinstance(item, MalformedMessage):
            self._add_malformed(item)
        elif isinstance(item, IdleConnect):
            self._idle()
            return once
        elif isinstance(item, ReplayGap):
            self._replay_gap(item)
        elif isinstance(item, Reconnected):
            self._log.info(
                "streaming: new session after %s; resuming at %s",
                item.reason,
                ", ".join(f"{c} {_shown(p)}" for c, p in sorted(item.positions.items())),
            )
        return False

    def _add(self, item: NotificationBatch) -> None:
        stamp = int(item.received_at * _MICROS)
        with self._open_lock:
            touched: dict[str, _Stream] = {}
            for n in item.notifications:
                stream = self._by_channel.get(n.channel)
                if stream is None:
                    self._append_malformed(
                        self._first(),
                        n.raw,
                        f"a notification on {n.channel}, which this landing did not subscribe to",
                        channel=n.channel,
                        replay_id=n.replay_id,
                        stamp=stamp,
                    )
                    continue
                ob = stream.open
                ob.replay_ids.append(n.replay_id)
                ob.channels.append(n.channel)
                ob.types.append(n.event_type)
                ob.created.append(n.created_date)
                ob.uuids.append(n.event_uuid)
                ob.raws.append(n.raw)
                ob.malformed.append(None)
                ob.events += 1
                ob.nbytes += len(n.raw)
                ob.position = n.replay_id
                if ob.opened_at is None:
                    ob.opened_at = self._monotonic()
                stream.received += 1
                touched[stream.spec.key] = stream
                limits = stream.spec.batching
                if len(ob) >= limits.max_events or ob.nbytes >= limits.max_bytes:
                    self._stamp(ob, stamp)
                    self._seal(stream)
            for stream in touched.values():
                self._stamp(stream.open, stamp)

    def _idle(self) -> None:
        # An empty connect: every channel with nothing open is caught up as of now, once what
        # it sealed is committed (at once when it already is).
        now = self._clock()
        with self._open_lock:
            marks = [(s, s.sealed_position) for s in self._streams.values() if not len(s.open)]
        for stream, position in marks:
            with self._state_lock:
                committed = stream.position == position
                stream.idle_mark = None if committed else (now, position)
            if committed:
                self._record_caught_up(stream, now)

    def _record_caught_up(self, stream: _Stream, at: float) -> None:
        if self._ops is not None:
            self._ops.record(
                CommitRecord(
                    layer="bronze",
                    kind="caught_up",
                    visible_at=datetime.fromtimestamp(at, tz=timezone.utc),
                    topic=stream.spec.key,
                    table=str(stream.table),
                )
            )

    @staticmethod
    def _stamp(ob: _OpenBatch, stamp: int) -> None:
        # Receive times are kept run-length: the messages added since the last stamp.
        pending = len(ob) - ob.stamped
        if pending > 0:
            ob.times.append(stamp)
            ob.counts.append(pending)
            ob.stamped += pending

    def _first(self) -> _Stream:
        return self._streams[self._specs[0].key]

    def _add_malformed(self, item: MalformedMessage) -> None:
        stream = self._by_channel.get(item.channel or "") or self._first()
        self._log.warning(
            "%s: a malformed message (%s) is landed for the quarantine",
            item.channel or "(no channel)",
            item.reason,
        )
        stamp = int((item.received_at or self._clock()) * _MICROS)
        with self._open_lock:
            self._append_malformed(
                stream,
                item.raw,
                item.reason,
                channel=item.channel,
                replay_id=item.replay_id,
                stamp=stamp,
            )

    def _append_malformed(
        self,
        stream: _Stream,
        raw: str,
        reason: str,
        *,
        channel: str | None,
        replay_id: int | None,
        stamp: int,
    ) -> None:
        ob = stream.open
        self._stamp(ob, stamp)
        ob.replay_ids.append(replay_id)
        ob.channels.append(channel)
        ob.types.append(None)
        ob.created.append(None)
        ob.uuids.append(None)
        ob.raws.append(raw)
        ob.malformed.append(reason)
        ob.nbytes += len(raw)
        if ob.opened_at is None:
            ob.opened_at = self._monotonic()
        self._stamp(ob, stamp)

    def _replay_gap(self, gap: ReplayGap) -> None:
        stream = self._by_channel.get(gap.channel)
        if stream is None:
            return
        self._log.warning(
            "%s: REPLAY GAP: the server rejected replay id %d and replay.on_corrupted moved the "
            "subscription to %d (%s); notifications in between may be missing, so gold records "
            "a re-sync of the whole object",
            gap.channel,
            gap.rejected,
            gap.resumed,
            gap.reason,
        )
        with self._open_lock:
            self._seal(stream)
            sealed = _Sealed(
                stream.spec.key, stream.next_batch, "replay_gap", gap.resumed, _OpenBatch(), gap
            )
            stream.next_batch += 1
            stream.sealed_position = gap.resumed
            self._committer.submit(sealed)

    def _seal(self, stream: _Stream) -> None:
        # Under the open-batch lock.
        ob = stream.open
        if not len(ob):
            ob.opened_at = None
            return
        position = ob.position if ob.position is not None else stream.sealed_position
        stream.open = _OpenBatch()
        stream.sealed_position = position
        sealed = _Sealed(stream.spec.key, stream.next_batch, "events", position, ob)
        stream.next_batch += 1
        self._committer.submit(sealed)

    def _seal_all(self) -> None:
        with self._open_lock:
            for stream in self._streams.values():
                self._seal(stream)

    def _finish(self, reason: str) -> None:
        self._log.info("streaming: stopping (%s): committing the open batches", reason)
        self._stopped = reason
        self._seal_all()
        self._committer.wait_idle()

    # -- the ticker thread ----------------------------------------------------------------------

    def _tick_loop(self, deadline: float | None) -> None:
        next_progress = self._monotonic() + self._ingest.progress_interval_seconds
        for stream in self._streams.values():
            stream.progress_mark = (self._monotonic(), 0)
        while not self._done.wait(_TICK):
            now = self._monotonic()
            with self._open_lock:
                for stream in self._streams.values():
                    opened = stream.open.opened_at
                    if opened is not None and now - opened >= stream.spec.batching.max_age_seconds:
                        try:
                            self._seal(stream)
                        except BaseException:  # the committer failed: the consumer raises it
                            break
            if deadline is not None and now >= deadline:
                self.stop("duration reached")
            if now >= next_progress:
                self._progress(now)
                next_progress = now + self._ingest.progress_interval_seconds
            if self._stop_reason is not None and self._sub is not None and not self._sub.closed:
                # Ends a waiting long poll at once; the consumer then commits what is open.
                self._sub.close()

    def _progress(self, now: float) -> None:
        for stream in self._streams.values():
            since, received = stream.progress_mark
            with self._state_lock:
                landed, commits, last = stream.events, stream.commits, stream.last_replay_id
            self._log.info(
                "progress %s: %.0f notifications/s received, %d in the open batch; %d in bronze "
                "after %d commits, last replay id %s",
                stream.spec.channel,
                (stream.received - received) / max(now - since, 1e-9),
                len(stream.open),
                landed,
                commits,
                last if last is not None else "none",
            )
            stream.progress_mark = (now, stream.received)

    # -- the committer thread -----------------------------------------------------------------

    def _commit(self, round_: list[_Sealed]) -> None:
        started = self._monotonic()
        versions = [self._land(sealed) for sealed in round_]
        rows = [self._row(s, v) for s, v in zip(round_, versions, strict=True)]
        self._checkpoints.store.write_all(rows)
        seconds = self._monotonic() - started
        for sealed, version in zip(round_, versions, strict=True):
            self._committed(sealed, seconds)
            self._record(sealed, version, seconds)
        if self._ops is not None and self._ops.due():
            self._ops.flush()

    def _record(self, sealed: _Sealed, version: int | None, seconds: float) -> None:
        stream = self._streams[sealed.key]
        with self._state_lock:
            mark = stream.idle_mark
            if mark is not None and stream.position == mark[1]:
                stream.idle_mark = None
            else:
                mark = None
        if self._ops is None:
            return
        batch, gap = sealed.batch, sealed.gap
        self._ops.record(
            CommitRecord(
                layer="bronze",
                kind="commit" if sealed.kind == "events" else "replay_gap",
                visible_at=datetime.fromtimestamp(self._clock(), tz=timezone.utc),
                topic=sealed.key,
                table=str(stream.table),
                version=version,
                events=batch.events,
                rows=len(batch),
                payload_bytes=batch.nbytes,
                newest_commit_at=_newest(batch.created),
                duration_seconds=seconds,
                message=(
                    f"replay gap: {gap.rejected} -> {_shown(gap.resumed)} ({gap.reason})"
                    if gap is not None
                    else None
                ),
            )
        )
        if mark is not None:
            self._record_caught_up(stream, mark[0])

    def _land(self, sealed: _Sealed) -> int | None:
        if sealed.kind != "events":
            return None
        stream = self._streams[sealed.key]
        result = self._engine.append(
            stream.table,
            _arrow(sealed),
            txn=Txn(bronze_app_id(sealed.key), sealed.batch_id),
            metadata={"sfcdc.topic": sealed.key, "sfcdc.kind": "events"},
            evolve_schema=False,
            layout=STREAMING_BRONZE_LAYOUT,
        )
        if result.skipped:
            raise CheckpointError(
                f"{sealed.key}: bronze batch {sealed.batch_id} was already committed by another "
                f"writer; two landings of the same channel into {stream.table} cannot run at once"
            )
        return result.version

    @staticmethod
    def _row(sealed: _Sealed, version: int | None) -> CheckpointRow:
        gap = sealed.gap
        if gap is not None:
            return CheckpointRow(
                topic=sealed.key,
                batch_id=sealed.batch_id,
                kind="replay_gap",
                replay_id=None,
                gap_requested=str(gap.rejected),
                gap_resumed="earliest" if gap.resumed == REPLAY_ALL else "latest",
                detail=gap.reason,
            )
        return CheckpointRow(
            topic=sealed.key,
            batch_id=sealed.batch_id,
            kind="events",
            replay_id=ReplayId(replay_bytes(sealed.position)),
            event_count=sealed.batch.events,
            payload_bytes=sealed.batch.nbytes,
            bronze_version=version,
        )

    def _committed(self, sealed: _Sealed, seconds: float) -> None:
        stream = self._streams[sealed.key]
        batch = sealed.batch
        with self._state_lock:
            stream.position = sealed.position
            stream.commits += 1
            stream.events += batch.events
            stream.malformed += len(batch) - batch.events
            stream.nbytes += batch.nbytes
            stream.gaps += sealed.kind == "replay_gap"
            if sealed.position >= 0:
                stream.last_replay_id = sealed.position
        if sealed.kind == "replay_gap":
            self._log.info(
                "landed %s batch %d: replay gap recorded, resuming at %d, %.3f s",
                sealed.key,
                sealed.batch_id,
                sealed.position,
                seconds,
            )
            return
        self._log.info(
            "landed %s batch %d: %d notifications%s, %.2f MB, resuming after %s, %.3f s",
            sealed.key,
            sealed.batch_id,
            batch.events,
            f" and {len(batch) - batch.events} malformed" if len(batch) > batch.events else "",
            batch.nbytes / 1e6,
            _shown(sealed.position),
            seconds,
        )
        every = self._ingest.maintain_every_commits
        stream.since_maintenance += 1
        if every > 0 and stream.since_maintenance >= every:
            stream.since_maintenance = 0
            try:
                self._engine.maintain(stream.table)
            except Exception as exc:  # maintenance must not stop landing
                self._log.error("maintenance of %s failed (landing goes on): %s", stream.table, exc)

    def _result(self, seconds: float, stopped: str) -> LandingResult:
        with self._state_lock:
            topics = tuple(
                TopicResult(
                    topic=s.spec.key,
                    table=str(s.table),
                    received=s.received,
                    events=s.events,
                    payload_bytes=s.nbytes,
                    commits=s.commits,
                    keepalive_commits=0,
                    replay_gaps=s.gaps,
                    redelivered_skipped=0,
                    last_replay_id=str(s.last_replay_id) if s.last_replay_id is not None else None,
                )
                for s in self._streams.values()
            )
        return LandingResult(topics, seconds, stopped)


def _shown(position: int) -> str:
    if position == REPLAY_ALL:
        return "-2 (every retained notification)"
    if position == REPLAY_NEW:
        return "-1 (new notifications only)"
    return f"replay id {position}"


def _newest(created: Sequence[str | None]) -> datetime | None:
    """The latest ``createdDate`` of a batch (ISO 8601; ``None`` when none parses)."""
    newest = None
    for text in created:
        if not text:
            continue
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            continue
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        if newest is None or value > newest:
            newest = value
    return newest


def _path(value: str | None) -> Path | None:
    from pathlib import Path

    return Path(value) if value is not None else None


def _arrow(sealed: _Sealed) -> pa.Table:
    """The bronze rows of a batch, built column by column."""
    batch = sealed.batch
    n = len(batch)
    received = np.repeat(
        np.asarray(batch.times, dtype=np.int64), np.asarray(batch.counts, dtype=np.int64)
    )
    schema = STREAMING_BRONZE_SCHEMA
    columns = [
        pa.array(batch.replay_ids, pa.int64()),
        pa.array(batch.channels, pa.string()),
        pa.array(batch.types, pa.string()),
        pa.array(batch.created, pa.string()),
        pa.array(batch.uuids, pa.string()),
        pa.array(batch.raws, pa.string()),
        pa.array(batch.malformed, pa.string()),
        pa.array(received, schema.field("received_at").type),
        pa.array(np.full(n, sealed.batch_id, dtype=np.int64)),
        pa.array(np.arange(n, dtype=np.int32)),
    ]
    return pa.Table.from_arrays(columns, schema=schema)
