"""Bronze landing: every event of every topic into its bronze table, exactly once.

:class:`BronzeLanding` subscribes to the topics of the enabled objects (one stream each,
merged by :class:`~ingest.client.MultiSubscription`) and lands their events in batches, with
the replay checkpoint of each batch committed after it in Delta (the protocol, and why a kill
at any instant neither loses nor duplicates an event, are in :mod:`pipelines.bronze.checkpoint`).
This module is the receiving side; the committing side is :mod:`pipelines.bronze.committer`
(in the thread of :mod:`pipelines.bronze.commit_thread`).

Threads and memory. The consuming thread appends each received response to the topic's open
batch (plain lists: replay ids, event ids, schema ids, payloads; :mod:`pipelines.bronze.batches`)
and seals the batch when it reaches ``batching.max_events`` events or ``max_bytes`` payload
bytes, or when its oldest event is ``max_age_seconds`` old. A sealed batch goes to one committer
thread, which builds the Arrow columns, registers new schema ids, and commits bronze, then the
checkpoint, then (ManagedSubscribe) the server position, topic after topic in hand-over order.
Handing over waits while the committer still holds a batch, so memory is at most the open
batches, the batch being committed and the client's receive buffers; while the consumer waits,
the client stops asking the server for events (flow control), and the stream does not stall
meanwhile: responses keep arriving into those buffers.

Reconnects. A subscription that reopens its stream asks landing for its durable position, in
the consuming thread, once every item of the old stream has been handled: landing hands the
topic's open batch (those items, in order) to the committer, waits until everything handed
over is committed, and answers after the last committed replay id, so the new stream starts
right after the last event received and streams that fail often still make progress. On the
``Resubscribed`` item that follows, anything still open is dropped (the new stream delivers it
again). A ManagedSubscribe server resumes after the last position *it* acknowledged instead, so
on ``Resubscribed`` landing commits the open batch and skips the replay ids it has committed
since that position when they are delivered again. A ``ReplayGap`` (the corrupted-replay policy
moved a subscription) is logged as a warning and recorded as a ``replay_gap`` checkpoint row.

Logging: one INFO line per landing commit (topic, batch, events, bytes, replay id, duration)
and a progress line per topic every ``ingest.progress_interval_seconds``; payloads and
credentials are never logged.

Lag and maintenance: each commit is recorded with the ``ops`` recorder (the commits table,
:mod:`pipelines.ops`), and a keepalive whose position is committed marks the topic caught up;
every ``ingest.maintain_every_commits`` commits a bronze table (and the checkpoint table) is
compacted and its Delta log checkpointed on the maintenance thread (see
:mod:`pipelines.bronze.committer`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from ingest.auth import TokenManager
from ingest.client import (
    CommitFailed,
    EventBatch,
    EventColumns,
    Keepalive,
    ManagedSubscription,
    MultiSubscription,
    ReplayGap,
    Resubscribed,
    RetryPolicy,
    SchemaCache,
    Subscription,
    TopicFailed,
)
from ingest.errors import LeaseHeldError, PermanentError, PubSubError
from ingest.replay import After, Earliest, ReplayId, StartPosition
from pipelines.bookkeeping import ensure_bookkeeping
from pipelines.bronze.batches import OpenBatch, SealedBatch
from pipelines.bronze.bookkeeping import BOOKKEEPING
from pipelines.bronze.checkpoint import CheckpointStore, describe_position
from pipelines.bronze.commit_thread import CommitThread
from pipelines.bronze.committer import BatchCommitter, Maintainer
from pipelines.bronze.landing_state import LandingResult, TopicResult, TopicState
from pipelines.bronze.lease import LeaseHolder, LeaseStore
from pipelines.bronze.tables import BronzeTables, CheckpointKind, bronze_tables, ensure_tables
from pipelines.memory import release_unused_memory
from pipelines.progress import progress
from pipelines.spec.models import IngestSpec, TopicSpec

if TYPE_CHECKING:
    from pipelines.engines.base import LakeEngine
    from pipelines.ops.recorder import OpsRecorder

__all__ = ["BronzeLanding", "LandingResult", "TopicResult"]

_log = logging.getLogger(__name__)

_TICK = 0.05  # how often ages, progress and stop requests are checked (seconds)
# How often the free memory of the batches landed since is handed back (seconds).
_RELEASE_EVERY = 30.0
_MICROS = 1_000_000
_NO_EVENTS = EventColumns((), (), (), ())


class BronzeLanding:
    """Lands the events of ``topics`` in their bronze tables through ``engine``.

    ``channel`` and ``tokens`` reach the Pub/Sub API (see :func:`pipelines.connect.connect`);
    ``schemas`` fetches schemas for the registry (one is built on ``channel`` by default).
    ``ingest`` supplies flow control, retries, the progress interval and the maintenance
    interval. ``clock`` (epoch seconds) stamps rows; ``monotonic`` times batch ages,
    progress and ``duration``, so tests can drive them. ``ops`` receives a record of every
    commit (and of every time a topic was caught up) and is flushed beside the commits.
    """

    def __init__(
        self,
        engine: LakeEngine,
        topics: Sequence[TopicSpec],
        *,
        channel: grpc.Channel,
        tokens: TokenManager | None,
        ingest: IngestSpec | None = None,
        schemas: SchemaCache | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        ack_timeout: float = 5.0,
        logger: logging.Logger | None = None,
        ops: OpsRecorder | None = None,
    ) -> None:
        specs = list(topics)
        if not specs:
            raise ValueError("nothing to land: no topic was given (are all objects disabled?)")
        self._engine = engine
        self._specs = specs
        self._channel = channel
        self._tokens = tokens
        self._ingest = ingest or IngestSpec()
        self._schemas = schemas or SchemaCache(channel, tokens=tokens)
        self._clock = clock
        self._monotonic = monotonic
        self._ack_timeout = ack_timeout
        self._log = logger or _log
        self._ops = ops
        self.tables: BronzeTables = bronze_tables(specs)
        self._store = CheckpointStore(engine, self.tables, clock=clock, logger=self._log)
        # Maintenance runs beside the commits (appends follow the versions it takes).
        self._maintainer = Maintainer(engine.maintain, logger=self._log)
        self._lock = threading.Lock()
        self._topics: dict[str, TopicState] = {}
        # The commit side: the topics' committed state is shared with it, under the lock.
        self._batch_committer = BatchCommitter(
            engine,
            self._store,
            self._schemas,
            topics=self._topics,
            lock=self._lock,
            checkpoints=self.tables.checkpoints,
            maintainer=self._maintainer,
            maintain_every=self._ingest.maintain_every_commits,
            ops=ops,
            logger=self._log,
            clock=clock,
            monotonic=monotonic,
        )
        # A batch of each topic may wait while a round commits (within one batch's bytes).
        self._committer = CommitThread(
            self._batch_committer.commit,
            stream=BatchCommitter.stream,
            describe=BatchCommitter.describe,
            name="sfcdc-committer",
            logger=self._log,
            limit=len(specs),
            max_bytes=max(t.batching.max_bytes for t in specs),
        )
        self._stop_reason: str | None = None
        self._stopped = ""
        self._deadline: float | None = None
        self._once = False
        self._next_tick = 0.0
        self._next_progress = 0.0
        self._next_release = 0.0
        self._started = self._monotonic()
        self._ran = False
        self._leases = LeaseHolder(
            LeaseStore(engine, clock=clock),
            [spec.topic for spec in specs],
            seconds=self._ingest.lease_seconds,
            on_lost=self._lease_lost,
            logger=self._log,
        )
        self._lost_lease: LeaseHeldError | None = None

    # -- public -------------------------------------------------------------------------------

    def stop(self, reason: str = "stop requested") -> None:
        """Ask the landing to stop: the open batches are committed, then :meth:`run` returns.
        Safe from a signal handler and from any thread (it only records the request)."""
        if self._stop_reason is None:
            self._stop_reason = reason

    def snapshot(self) -> LandingResult:
        """Progress so far (safe to call from any thread while :meth:`run` runs)."""
        return self._result(self._monotonic() - self._started, stopped=self._stopped or "running")

    def run(self, *, once: bool = False, duration: float | None = None) -> LandingResult:
        """Land until stopped (:meth:`stop`), for ``duration`` seconds, or with ``once``
        until every topic has caught up, so every event published before the run started is
        landed and steady traffic cannot keep it going. A topic has caught up when its server
        had nothing more to send: it sent a keepalive, or two responses in a row holding fewer
        events than it owed, or, while it owed events and everything it sent was landed, it
        sent nothing for ``ingest.once_quiet_seconds`` (a server with events sends them as
        soon as they are owed; Salesforce's keepalive comes only after about 270 s)."""
        if self._ran:
            raise RuntimeError("a BronzeLanding runs once; create a new one to resume")
        self._ran = True
        if duration is not None and duration <= 0:
            raise ValueError(f"duration must be > 0 seconds (got {duration})")
        started = self._started = self._monotonic()
        self._once = once
        # A lake that cannot be written is said as such, before a lease commit fails on it.
        self._engine.ensure_writable()
        # Refused at once, naming the holder, when another landing has one of the topics.
        self._leases.acquire()
        try:
            self._prepare()
        except BaseException:
            self._leases.release()
            raise
        # The duration is time spent landing: it starts once the tables are ready, not while
        # the engine starts (a Spark driver can take a minute on a busy machine).
        self._deadline = self._monotonic() + duration if duration is not None else None
        interval = self._ingest.progress_interval_seconds
        self._next_progress = started + interval
        for t in self._topics.values():
            t.progress_mark = (started, 0, 0)
        self._committer.start()
        multi = MultiSubscription(
            [t.sub for t in self._topics.values()],
            on_idle=self._on_idle,
            idle_interval=_TICK,
            # A topic that does not exist (or CDC is off for it, or the user cannot read it)
            # fails alone: the other topics keep landing.
            isolate=(PermanentError,),
            logger=self._log,
        )
        try:
            with contextlib.ExitStack() as stack:
                if once:
                    # Draining a backlog: how many events are left is unknown (the Pub/Sub
                    # API does not say), so the bar counts and shows the rate.
                    self._batch_committer.bar = stack.enter_context(
                        progress(total=None, unit="events", label="landing")
                    )
                for item in multi:
                    self._handle(item)
                    if self._tick():
                        break
        finally:
            multi.close()
            self._committer.close()
            self._maintainer.close()
            self._batch_committer.bar = None
            if self._ops is not None:
                self._ops.flush()
            if self._lost_lease is None:
                self._leases.release()
        if self._lost_lease is not None:
            raise self._lost_lease
        return self._result(self._monotonic() - started)

    def _lease_lost(self, error: LeaseHeldError) -> None:
        self._log.error("%s", error)
        self._lost_lease = error
        self.stop("the lease was taken over by another landing")

    # -- start --------------------------------------------------------------------------------

    def _prepare(self) -> None:
        ensure_bookkeeping(self._engine, BOOKKEEPING, logger=self._log)
        ensure_tables(self._engine, self.tables)
        self._batch_committer.load_schemas()
        starts: dict[str, StartPosition] = {
            spec.topic: spec.replay.start_position() for spec in self._specs
        }
        recoveries = self._store.recover_all(starts)
        for spec in self._specs:
            recovery = recoveries[spec.topic]
            topic = TopicState(
                spec=spec,
                table=self.tables.bronze(spec.topic),
                sub=self._subscription(
                    spec, recovery.start, stored=recovery.checkpoint is not None
                ),
                next_batch=recovery.next_batch_id,
                position=recovery.start,
                check_redelivery=spec.managed_subscription is None
                and isinstance(recovery.start, Earliest),
            )
            if recovery.checkpoint is not None:
                topic.last_replay_id = recovery.checkpoint.replay_id
                if topic.managed:
                    # The server acknowledged at least this batch before the last process
                    # stopped; anything landed after it may come again.
                    acked = recovery.checkpoint.server_acked_batch_id
                    topic.acked_batch = topic.acked_floor = acked
                    topic.skip = self._store.landed_after(spec.topic, acked)
            with self._lock:
                self._topics[spec.topic] = topic
            if topic.managed:
                self._log.info(
                    "%s: landing into %s from managed subscription %s (%d landed events may be "
                    "delivered again and will be skipped); next batch %d",
                    spec.topic,
                    topic.table,
                    spec.managed_subscription,
                    len(topic.skip),
                    recovery.next_batch_id,
                )
            else:
                self._log.info(
                    "%s: landing into %s from %s; next batch %d",
                    spec.topic,
                    topic.table,
                    describe_position(recovery.start),
                    recovery.next_batch_id,
                )

    def _subscription(
        self, spec: TopicSpec, start: StartPosition, *, stored: bool
    ) -> Subscription | ManagedSubscription:
        retry = self._ingest.retry
        policy = RetryPolicy(
            max_attempts=retry.max_attempts,
            initial_backoff=retry.initial_backoff_seconds,
            max_backoff=retry.max_backoff_seconds,
            multiplier=retry.multiplier,
            first_contact=retry.first_contact_seconds,
        )
        if spec.managed_subscription is not None:
            return ManagedSubscription(
                self._channel,
                developer_name=spec.managed_subscription,
                topic=spec.topic,
                num_requested=spec.num_requested or self._ingest.num_requested,
                retry=policy,
                tokens=self._tokens,
                clock=self._clock,
                logger=self._log,
            )
        return Subscription(
            self._channel,
            spec.topic,
            start=start,
            durable_position=functools.partial(self._durable, spec.topic),
            on_corrupted=spec.replay.corrupted_policy(stored=stored),
            num_requested=spec.num_requested or self._ingest.num_requested,
            retry=policy,
            tokens=self._tokens,
            clock=self._clock,
            logger=self._log,
        )

    # -- the consuming thread ----------------------------------------------------------------

    def _durable(self, topic: str) -> StartPosition:
        # Called by the subscription when it reopens its stream, in this (consuming) thread,
        # after every item the old stream delivered has been handled: the open batch holds
        # them in order, so committing it lets the new stream start right after the last
        # event received. (Dropping it instead would make no progress when streams fail
        # faster than a batch fills.)
        t = self._topics[topic]
        self._seal(t)
        self._committer.wait_idle()
        with self._lock:
            return t.position

    def _handle(self, item: Any) -> None:
        if isinstance(item, EventBatch):
            t = self._topics[item.topic]
            self._add(t, item.columns, item.received_at)
            # The server sent fewer events than it owed: it had no more when it sent them,
            # so everything published before then (after this run started) has been
            # received. Two such responses in a row on one stream, because one alone can be
            # a response cut short (the stream then ends, or the size cap was reached).
            # Under steady traffic this comes long before a keepalive.
            t.short_responses = t.short_responses + 1 if item.pending_num_requested > 0 else 0
            if t.short_responses >= 2:
                t.caught_up = True
        elif isinstance(item, Keepalive):
            t = self._topics[item.topic]
            t.open.position = item.latest_replay_id
            if t.open.opened_at is None:
                t.open.opened_at = self._monotonic()
            t.drained = True
            t.caught_up = True
            with self._lock:
                t.idle_mark = (item.received_at, item.latest_replay_id.value)
            self._batch_committer.caught_up(t)
        elif isinstance(item, Resubscribed):
            self._resubscribed(self._topics[item.topic], item)
        elif isinstance(item, ReplayGap):
            self._replay_gap(self._topics[item.topic], item)
        elif isinstance(item, TopicFailed):
            self._topic_failed(self._topics[item.topic], item.error)
        elif isinstance(item, CommitFailed):
            self._log.info(
                "%s: the server did not take commit %s (%s); the Delta checkpoint is "
                "unaffected and events it already holds are skipped if delivered again",
                item.topic,
                item.replay_id.hex(),
                item.error,
            )

    def _add(self, t: TopicState, columns: EventColumns, received_at: float) -> None:
        if t.check_redelivery and columns.replay_ids:
            self._check_redelivery(t, columns.replay_ids[0])
        if t.skip:
            columns = self._skip_redelivered(t, columns)
        t.drained = False
        limits = t.spec.batching
        stamp = int(received_at * _MICROS)
        # Whole columns are appended at once: the client hands them over without an object
        # per event, and landing keeps it that way.
        replay_ids, event_ids, schema_ids, payloads = (
            columns.replay_ids,
            columns.event_ids,
            columns.schema_ids,
            columns.payloads,
        )
        while replay_ids:
            ob = t.open
            room = limits.max_events - len(ob.replay_ids)
            if len(replay_ids) > room:
                part, replay_ids = replay_ids[:room], replay_ids[room:]
                ids, event_ids = event_ids[:room], event_ids[room:]
                sids, schema_ids = schema_ids[:room], schema_ids[room:]
                data, payloads = payloads[:room], payloads[room:]
            else:
                part, ids, sids, data = replay_ids, event_ids, schema_ids, payloads
                replay_ids = ()
            count = len(part)
            nbytes = sum(map(len, data))
            ob.replay_ids.extend(part)
            ob.event_ids.extend(ids)
            ob.schema_ids.extend(sids)
            ob.payloads.extend(data)
            ob.times.append(stamp)
            ob.counts.append(count)
            ob.nbytes += nbytes
            ob.position = ReplayId(part[-1])
            if ob.opened_at is None:
                ob.opened_at = self._monotonic()
            t.received += count
            t.received_bytes += nbytes
            if len(ob.replay_ids) >= limits.max_events or ob.nbytes >= limits.max_bytes:
                self._seal(t)

    def _topic_failed(self, t: TopicState, error: BaseException) -> None:
        objects = ", ".join(o.api_name for o in t.spec.objects) or t.spec.topic
        self._log.error(
            "%s (%s) failed and stops; the other topics go on: %s", t.spec.topic, objects, error
        )
        self._seal(t)  # what it delivered before failing is landed
        self._committer.wait_idle()
        t.failed = str(error)
        t.caught_up = True
        status = error.status if isinstance(error, PubSubError) else type(error).__name__
        code = error.error_code if isinstance(error, PubSubError) else ""
        self._store.record_topic_failure(
            t.spec.topic, objects, status=status or "UNKNOWN", error_code=code, error=str(error)
        )

    def _check_redelivery(self, t: TopicState, first: bytes) -> None:
        # A stream that starts at EARLIEST (a corrupted-replay recovery, or a restart after
        # one) delivers every retained event, and the retained ones may already be in bronze.
        # Stream order is bronze order, so if the first delivered event is in bronze, the
        # redelivered events are exactly the bronze rows from its batch on: skip those replay
        # ids until the first event bronze does not hold (as for ManagedSubscribe). Memory is
        # bounded by what bronze holds from that batch on, read once.
        t.check_redelivery = False
        self._committer.wait_idle()  # the engine is free to read until the next hand-over
        landed = self._store.landed_from(t.spec.topic, first)
        if landed:
            self._log.warning(
                "%s: the stream restarted at the earliest retained event and delivers events "
                "already in bronze (from replay id %s); %d landed events will be skipped",
                t.spec.topic,
                first.hex(),
                len(landed),
            )
            t.skip = landed

    def _skip_redelivered(self, t: TopicState, columns: EventColumns) -> EventColumns:
        # Delivery is in stream order, so the first event bronze does not hold ends the run
        # of redelivered ones.
        skip = t.skip
        for i, rid in enumerate(columns.replay_ids):
            if rid not in skip:
                t.skipped += i
                self._log.info(
                    "%s: skipped %d events the server delivered again (already in bronze); "
                    "landing resumes at %s",
                    t.spec.topic,
                    t.skipped,
                    rid.hex(),
                )
                t.skip = set()
                if i == 0:
                    return columns
                return EventColumns(
                    columns.replay_ids[i:],
                    columns.event_ids[i:],
                    columns.schema_ids[i:],
                    columns.payloads[i:],
                )
        t.skipped += len(columns)
        return _NO_EVENTS

    def _resubscribed(self, t: TopicState, item: Resubscribed) -> None:
        t.drained = False
        # A new stream: short responses count afresh. Having caught up stays true: the
        # durable position answered for this stream committed everything received before it.
        t.short_responses = 0
        if t.managed:
            # The new stream resumes after the position the server had committed when it
            # opened, which the item reports as far as this process saw it acknowledged (acks
            # arriving later, on the new stream, do not move its start). Commit what the old
            # stream delivered, then skip every landed event after that position.
            self._seal(t)
            self._committer.wait_idle()
            position = item.position
            with self._lock:
                if isinstance(position, After) and position.replay_id.value in t.positions:
                    batch = t.positions[position.replay_id.value]
                    t.acked_floor = max(batch, t.acked_floor or 0)
                floor = t.acked_floor
            # The committer is idle until the next hand-over, so the engine is free to read.
            t.skip = self._store.landed_after(t.spec.topic, floor)
            return
        # Subscribe: the durable position (asked just before) committed the open batch. What
        # is still open is not covered by it, and the new stream delivers it again.
        dropped = len(t.open.replay_ids)
        t.open = OpenBatch()
        if dropped:
            self._log.info(
                "%s: new stream (%s); dropping %d events not yet committed, the stream "
                "delivers them again",
                t.spec.topic,
                item.reason,
                dropped,
            )

    def _replay_gap(self, t: TopicState, gap: ReplayGap) -> None:
        self._log.warning(
            "%s: REPLAY GAP: the server rejected the stored position %s and "
            "replay.on_corrupted (or on_expired) moved the subscription to %s (%s); events in "
            "between may be missing or repeated, so the objects of this topic need a re-sync",
            t.spec.topic,
            describe_position(gap.requested),
            describe_position(gap.resumed),
            gap.reason,
        )
        t.open = OpenBatch()
        t.sealed_position = None
        t.check_redelivery = isinstance(gap.resumed, Earliest)
        sealed = SealedBatch(t.spec.topic, t.next_batch, "replay_gap", None, OpenBatch(), gap)
        t.next_batch += 1
        self._committer.submit(sealed)

    def _seal(self, t: TopicState) -> None:
        ob = t.open
        if not ob.replay_ids:
            if ob.position is None or ob.position == t.sealed_position:
                ob.opened_at = None
                return
            kind: CheckpointKind = "keepalive"
        else:
            kind = "events"
        t.open = OpenBatch()
        t.sealed_position = ob.position
        sealed = SealedBatch(t.spec.topic, t.next_batch, kind, ob.position, ob)
        t.next_batch += 1
        self._committer.submit(sealed)

    def _on_idle(self) -> bool:
        self._next_tick = 0.0
        if self._once:
            self._quiet_topics()
        return self._tick()

    def _quiet_topics(self) -> None:
        # Only when nothing is waiting to be handled (on_idle): a response the consumer has not
        # taken yet is not silence. The stream's own clock counts from its last request or
        # response, so a top-up sent just now restarts it.
        quiet = self._ingest.once_quiet_seconds
        for t in self._topics.values():
            if t.caught_up:
                continue
            stats = t.sub.stats()
            if (
                stats.open
                and stats.outstanding > 0
                and stats.buffered == 0
                and stats.quiet_seconds >= quiet
            ):
                t.caught_up = True
                self._log.info(
                    "%s: caught up: the server owed %d events and sent nothing for %.1f s "
                    "(ingest.once_quiet_seconds)",
                    t.spec.topic,
                    stats.outstanding,
                    stats.quiet_seconds,
                )

    def _tick(self) -> bool:
        """Seal aged batches, log progress, and stop when asked; True once stopped."""
        now = self._monotonic()
        if now < self._next_tick:
            return False
        self._next_tick = now + _TICK
        self._committer.check()
        for t in self._topics.values():
            opened = t.open.opened_at
            if opened is not None and now - opened >= t.spec.batching.max_age_seconds:
                self._seal(t)
        if now >= self._next_progress:
            self._progress(now)
            self._next_progress = now + self._ingest.progress_interval_seconds
        if now >= self._next_release:
            release_unused_memory()
            self._next_release = now + _RELEASE_EVERY
        ops = self._ops
        if ops is not None and ops.due():
            self._maintainer.request_call("commit records", ops.flush)
        reason = self._stop_reason
        if reason is None and self._deadline is not None and now >= self._deadline:
            reason = "duration reached"
        if reason is None and self._once and all(t.caught_up for t in self._topics.values()):
            reason = (
                "drained: every topic received all events published before the run started "
                "(a keepalive, responses the server could not fill, or its silence while it "
                "owed events)"
            )
        if reason is None:
            return False
        self._finish(reason)
        return True

    def _finish(self, reason: str) -> None:
        self._log.info("stopping (%s): committing the open batches", reason)
        self._stopped = reason
        for t in self._topics.values():
            self._seal(t)
        self._committer.wait_idle()
        managed = [t for t in self._topics.values() if t.managed]
        if not managed:
            return
        # The streams stay open until the server has answered the final commits.
        deadline = self._monotonic() + self._ack_timeout
        waiting = threading.Event()
        while self._monotonic() < deadline:
            subs = [t.sub for t in managed if isinstance(t.sub, ManagedSubscription)]
            if not any(s.outstanding_commits for s in subs):
                break
            waiting.wait(0.01)
        with self._lock:
            for t in managed:
                t.note_acks()

    def _progress(self, now: float) -> None:
        for t in self._topics.values():
            since, events, nbytes = t.progress_mark
            seconds = max(now - since, 1e-9)
            stats = t.sub.stats()
            with self._lock:
                landed, commits, last = t.events, t.commits, t.last_replay_id
            self._log.info(
                "progress %s: %.0f events/s, %.2f MB/s received; %d buffered + %d pending at "
                "the server, %d in the open batch; %d events in bronze after %d commits, last "
                "replay id %s",
                t.spec.topic,
                (t.received - events) / seconds,
                (t.received_bytes - nbytes) / seconds / 1e6,
                stats.buffered,
                stats.server_pending,
                len(t.open.replay_ids),
                landed,
                commits,
                last.hex() if last is not None else "none",
            )
            t.progress_mark = (now, t.received, t.received_bytes)

    def _result(self, seconds: float, *, stopped: str | None = None) -> LandingResult:
        # Counters read without the landing's lock: each has its own, or is read racily
        # (progress figures).
        snapshots = [(t, t.durations.snapshot(), t.sub.stats()) for t in self._topics.values()]
        with self._lock:
            topics = tuple(t.result(durations, stats) for t, durations, stats in snapshots)
        return LandingResult(topics, seconds, stopped or self._stopped or "the subscriptions ended")
