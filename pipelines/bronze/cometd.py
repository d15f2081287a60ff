"""Streaming API landing: every notification of every channel into its bronze table, exactly
once.

:class:`CometdLanding` makes or checks the PushTopics and stores the describes
(:mod:`pipelines.bronze.cometd_setup`), then subscribes to every channel in one CometD
session (:class:`~ingest.cometd.CometdSubscription`) and lands what it yields:

- a :class:`~ingest.cometd.NotificationBatch`: each notification joins its channel's open
  batch (raw JSON, replay id, ``createdDate``, event type, ``EventUuid``, receive time);
- a :class:`~ingest.cometd.MalformedMessage`: it joins its channel's open batch too, with
  the reason in ``malformed`` (silver quarantines it); a body that names no channel (not JSON
  at all) goes to the first channel's table, with a null channel;
- a :class:`~ingest.cometd.ReplayGap`: a ``replay_gap`` checkpoint row (gold records a
  whole-object re-sync for it), after the channel's open batch;
- an :class:`~ingest.cometd.IdleConnect`: with ``once``, nothing is pending on any channel
  and the landing stops. A ``once`` landing asks the server to hold each long poll at most
  ``ingest.once_quiet_seconds`` (Salesforce holds one for 110 s otherwise), so it stops within
  that time of the last notification.

A batch is sealed when it reaches ``batching.max_events`` notifications or ``max_bytes``
characters of JSON, or when its oldest message is ``max_age_seconds`` old (checked by a ticker
thread, since a long poll may hold the consuming thread for up to 110 s), and handed to the
committer thread, which lands it with the protocol of
:mod:`pipelines.bronze.cometd_checkpoints`. When the subscription reconnects it asks for
each channel's durable position (in the consuming thread): the open batches are committed
first, so the new session resumes right after the last notification received.

This module is the receiving side (the consuming thread and the ticker); the committing side
is :mod:`pipelines.bronze.cometd_commit` (in the thread of
:mod:`pipelines.bronze.commit_thread`), the batches :mod:`pipelines.bronze.cometd_batches`
and a channel's state :mod:`pipelines.bronze.cometd_state` (their public names are
re-exported here).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ingest.auth import TokenManager
from ingest.client import RetryPolicy, TlsSettings
from ingest.cometd import (
    CometdSubscription,
    IdleConnect,
    MalformedMessage,
    NotificationBatch,
    Reconnected,
    ReplayGap,
)
from ingest.rest import RestClient
from pipelines.bookkeeping import ensure_bookkeeping
from pipelines.bronze.bookkeeping import BOOKKEEPING
from pipelines.bronze.cometd_batches import (
    CometdOpenBatch,
    CometdSealedBatch,
    cometd_rows,
    newest_created,
    shown_position,
)
from pipelines.bronze.cometd_checkpoints import REPLAY_ALL, REPLAY_NEW, CometdCheckpoints
from pipelines.bronze.cometd_commit import CometdCommitter
from pipelines.bronze.cometd_setup import StreamSetup, prepare_streams
from pipelines.bronze.cometd_state import StreamState
from pipelines.bronze.cometd_tables import cometd_tables, ensure_cometd_tables
from pipelines.bronze.commit_thread import CommitThread
from pipelines.bronze.landing_state import LandingResult
from pipelines.spec.models import CometdApiSpec, IngestSpec

if TYPE_CHECKING:
    from pathlib import Path

    import httpx

    from ingest.cometd.setup import RestApi
    from pipelines.engines.base import LakeEngine
    from pipelines.ops.recorder import OpsRecorder
    from pipelines.spec.cometd import CometdObjectSpec

__all__ = [
    "CometdCommitter",
    "CometdLanding",
    "CometdOpenBatch",
    "CometdSealedBatch",
    "StreamState",
    "cometd_rows",
    "newest_created",
    "shown_position",
]

_log = logging.getLogger(__name__)

_TICK = 0.05
_MICROS = 1_000_000


class CometdLanding:
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
        streams: Sequence[CometdObjectSpec],
        *,
        tokens: TokenManager,
        ca_file: Path | str | None = None,
        streaming: CometdApiSpec | None = None,
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
        self._streaming = streaming or CometdApiSpec()
        self._ingest = ingest or IngestSpec()
        self._rest = rest
        self._http = http
        self._ops = ops
        self._clock = clock
        self._monotonic = monotonic
        self._log = logger or _log
        self.tables = cometd_tables(specs)
        self._checkpoints = CometdCheckpoints(engine, self.tables, clock=clock, logger=self._log)
        self._open_lock = threading.RLock()
        self._state_lock = threading.Lock()
        self._streams: dict[str, StreamState] = {}
        self._by_channel: dict[str, StreamState] = {}
        self._sub: CometdSubscription | None = None
        self._stop_reason: str | None = None
        self._stopped = ""
        # The commit side (pipelines.bronze.cometd_commit): its thread logs a failed round
        # with this module's logger, its commits with the landing's.
        self._batch_committer = CometdCommitter(
            engine,
            self._checkpoints.store,
            streams=self._streams,
            lock=self._state_lock,
            maintain_every=self._ingest.maintain_every_commits,
            ops=ops,
            logger=self._log,
            clock=clock,
            monotonic=monotonic,
        )
        self._committer = CommitThread(
            self._batch_committer.commit,
            stream=CometdCommitter.stream,
            describe=CometdCommitter.describe,
            name="sfcdc-streaming-committer",
            logger=_log,
            limit=len(specs),
        )
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
            raise RuntimeError("a CometdLanding runs once; create a new one to resume")
        self._ran = True
        if duration is not None and duration <= 0:
            raise ValueError(f"duration must be > 0 seconds (got {duration})")
        started = self._started = self._monotonic()
        deadline = started + duration if duration is not None else None
        self._engine.ensure_writable()
        positions = self._prepare()
        policy = self._specs[0].replay.on_corrupted
        retry = self._ingest.retry
        sub = CometdSubscription(
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
                first_contact=retry.first_contact_seconds,
            ),
            poll_timeout=self._ingest.once_quiet_seconds if once else None,
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
        ensure_bookkeeping(self._engine, BOOKKEEPING, logger=self._log)
        ensure_cometd_tables(self._engine, self.tables)
        positions: dict[str, int] = {}
        for spec in self._specs:
            default = REPLAY_ALL if spec.replay.start == "earliest" else REPLAY_NEW
            recovery = self._checkpoints.recover(spec.key, default_start=default)
            stream = StreamState(
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
                shown_position(recovery.position),
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
                ", ".join(f"{c} {shown_position(p)}" for c, p in sorted(item.positions.items())),
            )
        return False

    def _add(self, item: NotificationBatch) -> None:
        stamp = int(item.received_at * _MICROS)
        with self._open_lock:
            touched: dict[str, StreamState] = {}
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
        # An empty connect: every channel is caught up as of now, once what it has received
        # is committed (at once when it already is). A channel whose open batch holds
        # notifications is caught up at that batch's position, when it is committed (a --once
        # run seals it as it stops; without this mark its last notifications' commit times,
        # on the org's clock, would be the only measure of its lag).
        now = self._clock()
        with self._open_lock:
            marks = [
                (s, s.sealed_position if s.open.position is None else s.open.position)
                for s in self._streams.values()
                # (malformed messages alone have no position: the next empty connect tells)
                if not len(s.open) or s.open.position is not None
            ]
        for stream, position in marks:
            with self._state_lock:
                committed = stream.position == position
                stream.idle_mark = None if committed else (now, position)
            if committed:
                self._batch_committer.record_caught_up(stream, now)

    @staticmethod
    def _stamp(ob: CometdOpenBatch, stamp: int) -> None:
        # Receive times are kept run-length: the messages added since the last stamp.
        pending = len(ob) - ob.stamped
        if pending > 0:
            ob.times.append(stamp)
            ob.counts.append(pending)
            ob.stamped += pending

    def _first(self) -> StreamState:
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
        stream: StreamState,
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
            sealed = CometdSealedBatch(
                stream.spec.key,
                stream.next_batch,
                "replay_gap",
                gap.resumed,
                CometdOpenBatch(),
                gap,
            )
            stream.next_batch += 1
            stream.sealed_position = gap.resumed
            self._committer.submit(sealed)

    def _seal(self, stream: StreamState) -> None:
        # Under the open-batch lock.
        ob = stream.open
        if not len(ob):
            ob.opened_at = None
            return
        position = ob.position if ob.position is not None else stream.sealed_position
        stream.open = CometdOpenBatch()
        stream.sealed_position = position
        sealed = CometdSealedBatch(stream.spec.key, stream.next_batch, "events", position, ob)
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

    def _result(self, seconds: float, stopped: str) -> LandingResult:
        with self._state_lock:
            topics = tuple(s.result() for s in self._streams.values())
        return LandingResult(topics, seconds, stopped)


def _path(value: str | None) -> Path | None:
    from pathlib import Path

    return Path(value) if value is not None else None
