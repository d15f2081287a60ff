"""Bronze landing: every event of every topic into its bronze table, exactly once.

:class:`BronzeLanding` subscribes to the topics of the enabled objects (one stream each,
merged by :class:`~ingest.client.MultiSubscription`) and lands their events in batches, with
the replay checkpoint of each batch committed after it in Delta (the protocol, and why a kill
at any instant neither loses nor duplicates an event, are in :mod:`pipelines.bronze.checkpoint`).

Threads and memory. The consuming thread appends each received response to the topic's open
batch (plain lists: replay ids, event ids, schema ids, payloads) and seals the batch when it
reaches ``batching.max_events`` events or ``max_bytes`` payload bytes, or when its oldest
event is ``max_age_seconds`` old. A sealed batch goes to one committer thread, which builds
the Arrow columns, registers new schema ids, and commits bronze, then the checkpoint, then
(ManagedSubscribe) the server position, topic after topic in hand-over order. Handing over
waits while the committer still holds a batch, so memory is at most the open batches, the
batch being committed and the client's receive buffers; while the consumer waits, the client
stops asking the server for events (flow control), and the stream does not stall meanwhile:
responses keep arriving into those buffers.

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

Lag. Each events batch records its newest commit time (a change event batch: its last
event's, commit order being stream order; a platform event batch: the latest ``CreatedDate``
of all its events; decoded in the committer thread), and a keepalive whose position is
committed marks the topic caught up at the keepalive's time. Both go to the ``ops`` recorder
(the commits table, :mod:`pipelines.ops`), one record per commit, and into the snapshots with
the stream's flow-control figures; the recorder's rows are written beside the commits, by the
maintenance thread. Every ``ingest.maintain_every_commits`` commits a bronze table
(and the checkpoint table) is compacted and its Delta log checkpointed, in the committer
thread between commits.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import pyarrow as pa

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
from ingest.decoding import event_time_ms
from ingest.errors import CheckpointError, LeaseHeldError, PermanentError, PubSubError
from ingest.replay import After, Earliest, ReplayId, StartPosition
from pipelines.bronze.checkpoint import CheckpointRow, CheckpointStore, describe_position
from pipelines.bronze.lease import LeaseHolder, LeaseStore
from pipelines.bronze.tables import (
    BRONZE_LAYOUT,
    BRONZE_SCHEMA,
    BronzeTables,
    CheckpointKind,
    bronze_app_id,
    bronze_tables,
    ensure_tables,
)
from pipelines.engines.base import CommitResult, TableRef, Txn
from pipelines.memory import release_unused_memory
from pipelines.ops.durations import Durations
from pipelines.ops.table import CommitRecord, utc
from pipelines.progress import Progress, progress
from pipelines.spec import IngestSpec, TopicSpec

if TYPE_CHECKING:
    from pipelines.engines.base import LakeEngine
    from pipelines.ops.recorder import OpsRecorder

__all__ = ["BronzeLanding", "LandingResult", "TopicResult"]

_log = logging.getLogger(__name__)

_TICK = 0.05  # how often ages, progress and stop requests are checked (seconds)
# How often the free memory of the batches landed since is handed back (seconds).
_RELEASE_EVERY = 30.0
_WAIT = 0.1  # poll interval of waits that must notice a failed committer
_MICROS = 1_000_000
_REMEMBERED_POSITIONS = 10_000
_NO_EVENTS = EventColumns((), (), (), ())


@dataclass(frozen=True)
class TopicResult:
    """What one topic's landing did: events ``received`` (including those dropped for
    redelivery after a reconnect) and ``events`` landed (committed).

    ``newest_commit_at``: the Salesforce commit time (epoch seconds) of the newest event
    landed; ``caught_up_at``: the last time a keepalive showed nothing pending beyond what is
    committed. ``commit_seconds`` / ``commit_seconds_total``: events commits counted per
    :data:`~pipelines.ops.durations.COMMIT_SECONDS_BUCKETS` bucket, and their sum. The stream:
    ``window`` (events asked for per request), ``outstanding`` (asked for, not yet received),
    ``buffered`` (received, not yet taken), ``reconnects`` (streams reopened)."""

    topic: str
    table: str
    received: int
    events: int
    payload_bytes: int
    commits: int
    keepalive_commits: int
    replay_gaps: int
    redelivered_skipped: int
    last_replay_id: str | None
    error: str | None = None
    newest_commit_at: float | None = None
    caught_up_at: float | None = None
    commit_seconds: tuple[int, ...] = ()
    commit_seconds_total: float = 0.0
    window: int = 0
    outstanding: int = 0
    buffered: int = 0
    reconnects: int = 0


@dataclass(frozen=True)
class LandingResult:
    """What a landing run did, per topic, and why it stopped."""

    topics: tuple[TopicResult, ...]
    seconds: float
    stopped: str

    @property
    def events(self) -> int:
        """Events landed across topics."""
        return sum(t.events for t in self.topics)

    @property
    def failed(self) -> tuple[TopicResult, ...]:
        """The topics whose subscription failed for good (``error`` says why)."""
        return tuple(t for t in self.topics if t.error is not None)


class _OpenBatch:
    """Events received for a topic and not yet handed to the committer."""

    __slots__ = (
        "counts",
        "event_ids",
        "nbytes",
        "opened_at",
        "payloads",
        "position",
        "replay_ids",
        "schema_ids",
        "times",
    )

    def __init__(self) -> None:
        self.replay_ids: list[bytes] = []
        self.event_ids: list[str] = []
        self.schema_ids: list[str] = []
        self.payloads: list[bytes] = []
        # Run-length receive times: one entry per server response.
        self.times: list[int] = []
        self.counts: list[int] = []
        self.nbytes = 0
        self.position: ReplayId | None = None
        self.opened_at: float | None = None


@dataclass
class _Sealed:
    topic: str
    batch_id: int
    kind: CheckpointKind
    position: ReplayId | None
    batch: _OpenBatch
    gap: ReplayGap | None = None
    # Commit time (epoch ms) of the batch's last event, read before its columns are built.
    newest_ms: int | None = None


@dataclass
class _Topic:
    """A topic's state: the consumer's side (open batch, counters) and, under the landing's
    lock, what the committer has committed."""

    spec: TopicSpec
    table: TableRef
    sub: Subscription | ManagedSubscription
    next_batch: int
    position: StartPosition  # durable: where a new stream resumes
    open: _OpenBatch = field(default_factory=_OpenBatch)
    sealed_position: ReplayId | None = None
    drained: bool = False
    # Received everything published before the run started (a keepalive, or a response the
    # server could not fill): what --once waits for. Stays set while the stream goes on.
    caught_up: bool = False
    short_responses: int = 0  # consecutive responses holding fewer events than owed
    failed: str | None = None  # why the subscription failed for good (the others go on)
    skip: set[bytes] = field(default_factory=set)
    # The stream (re)starts at EARLIEST while bronze may hold events: the first delivered
    # event tells whether the server is delivering landed events again (see _check_redelivery).
    check_redelivery: bool = False
    received: int = 0
    received_bytes: int = 0
    progress_mark: tuple[float, int, int] = (0.0, 0, 0)
    # committed (written by the committer thread under the lock)
    events: int = 0
    payload_bytes: int = 0
    commits: int = 0
    keepalive_commits: int = 0
    gaps: int = 0
    skipped: int = 0
    last_replay_id: ReplayId | None = None
    since_maintenance: int = 0
    # ManagedSubscribe: batch of each recent checkpoint position (bounded; forgetting one only
    # makes a later skip set larger), the last batch the server acknowledged (for rows), and a
    # batch the server's position is known to be at or after whenever a stream opens.
    positions: OrderedDict[bytes, int] = field(default_factory=OrderedDict)
    acked_batch: int | None = None
    acked_floor: int | None = None
    # Lag (under the lock): newest commit time landed (epoch ms), the last keepalive not yet
    # known to be covered by a commit (time, position), the last time the topic was caught up.
    newest_ms: int | None = None
    idle_mark: tuple[float, bytes] | None = None
    caught_up_at: float | None = None
    durations: Durations = field(default_factory=Durations)

    @property
    def managed(self) -> bool:
        return isinstance(self.sub, ManagedSubscription)


class _Committer:
    """The one thread that writes Delta. Batches are committed in rounds: a round takes the
    oldest waiting batch of each topic (so each topic's batches stay in hand-over order) and
    ``commit`` lands them together, their checkpoint rows in one commit.

    Batches of ``limit`` topics, or of ``max_bytes`` payload bytes, may wait while a round is
    under way; :meth:`submit` waits beyond that, which bounds memory whatever the backlog.
    """

    def __init__(
        self,
        commit: Callable[[list[_Sealed]], None],
        *,
        logger: logging.Logger,
        limit: int = 1,
        max_bytes: int | None = None,
    ) -> None:
        self._commit = commit
        self._log = logger
        self._limit = max(1, limit)
        self._max_bytes = max_bytes
        self._cond = threading.Condition()
        self._pending: deque[_Sealed] = deque()
        self._pending_bytes = 0
        self._busy = False
        self._closing = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="sfcdc-committer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def check(self) -> None:
        """Raise the committer's failure, if it failed."""
        error = self._error
        if error is not None:
            raise error

    def _full(self) -> bool:
        if not self._pending:
            return False
        if len(self._pending) >= self._limit:
            return True
        return self._max_bytes is not None and self._pending_bytes >= self._max_bytes

    def submit(self, sealed: _Sealed) -> None:
        """Hand a batch over; waits while as many as the committer holds are waiting."""
        with self._cond:
            while self._full():
                self.check()
                self._cond.wait(_WAIT)
            self.check()
            self._pending.append(sealed)
            self._pending_bytes += sealed.batch.nbytes
            self._cond.notify_all()

    def wait_idle(self) -> None:
        """Wait until every batch handed over is committed."""
        with self._cond:
            while self._pending or self._busy:
                self.check()
                self._cond.wait(_WAIT)
        self.check()

    def close(self) -> None:
        """Let the round under way finish, then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    def _take_round(self) -> list[_Sealed]:
        # Under the lock: the oldest waiting batch of each topic, in hand-over order.
        taken: list[_Sealed] = []
        topics: set[str] = set()
        rest: deque[_Sealed] = deque()
        for sealed in self._pending:
            if sealed.topic in topics:
                rest.append(sealed)
            else:
                topics.add(sealed.topic)
                taken.append(sealed)
        self._pending = rest
        self._pending_bytes = sum(s.batch.nbytes for s in rest)
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
                self._log.error(
                    "committing %s failed: %s",
                    ", ".join(f"{s.topic} batch {s.batch_id}" for s in round_),
                    exc,
                )
                with self._cond:
                    self._error = exc
                    self._busy = False
                    self._cond.notify_all()
                return
            with self._cond:
                self._busy = False
                self._cond.notify_all()


class _Maintainer:
    """Runs table maintenance (compaction, a log checkpoint) on a thread of its own, one table at
    a time, so a round's commits never wait for it: landing's commits follow a version that
    maintenance took meanwhile (see :class:`~pipelines.bronze.files.LocalBronzeWriter`). A table
    asked for while it waits is maintained once. A failure is logged and leaves the table as it
    was, only slower to read; the next request tries again. :meth:`close` lets the maintenance
    under way and the waiting ones finish (as when maintenance ran between commits), then
    ignores further requests. The same thread writes the commit records (:meth:`request_call`),
    which must not wait in the committer either."""

    def __init__(self, maintain: Callable[[TableRef], object], *, logger: logging.Logger) -> None:
        self._maintain = maintain
        self._log = logger
        self._cond = threading.Condition()
        self._waiting: list[tuple[object, Callable[[], object]]] = []
        self._closing = False
        self._thread: threading.Thread | None = None

    def request(self, table: TableRef) -> None:
        self.request_call(table, functools.partial(self._maintain, table))

    def request_call(self, key: object, call: Callable[[], object]) -> None:
        """Run ``call`` on the thread (once, however often ``key`` is asked for meanwhile)."""
        with self._cond:
            if self._closing:
                return
            if all(k != key for k, _ in self._waiting):
                self._waiting.append((key, call))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="sfcdc-maintainer", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closing:
                    self._cond.wait()
                if not self._waiting:
                    return
                key, call = self._waiting.pop(0)
            try:
                call()
            except Exception as exc:  # maintenance must not stop landing
                self._log.error("maintenance of %s failed (landing goes on): %s", key, exc)


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
        self._bar: Progress | None = None
        self.tables: BronzeTables = bronze_tables(specs)
        self._store = CheckpointStore(engine, self.tables, clock=clock, logger=self._log)
        # A batch of each topic may wait while a round commits (within one batch's bytes).
        self._committer = _Committer(
            self._commit,
            logger=self._log,
            limit=len(specs),
            max_bytes=max(t.batching.max_bytes for t in specs),
        )
        # Maintenance runs beside the commits (appends follow the versions it takes).
        self._maintainer = _Maintainer(engine.maintain, logger=self._log)
        self._lock = threading.Lock()
        self._topics: dict[str, _Topic] = {}
        self._known_schemas: set[str] = set()
        # Schema ids GetSchema refused in this run (asked again by the next run).
        self._unavailable_schemas: set[str] = set()
        self._stop_reason: str | None = None
        self._stopped = ""
        self._deadline: float | None = None
        self._once = False
        self._next_tick = 0.0
        self._next_progress = 0.0
        self._next_release = 0.0
        self._checkpoint_commits = 0
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
        until every topic has caught up: it received a keepalive, or two responses in a row
        holding fewer events than the server owed (the server had no more to send), so every event
        published before the run started is landed; steady traffic cannot keep it going."""
        if self._ran:
            raise RuntimeError("a BronzeLanding runs once; create a new one to resume")
        self._ran = True
        if duration is not None and duration <= 0:
            raise ValueError(f"duration must be > 0 seconds (got {duration})")
        started = self._started = self._monotonic()
        self._once = once
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
                    self._bar = stack.enter_context(
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
            self._bar = None
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
        ensure_tables(self._engine, self.tables)
        self._known_schemas = self._store.registered_schemas()
        for spec in self._specs:
            default: StartPosition = spec.replay.start_position()
            recovery = self._store.recover(spec.topic, default_start=default)
            topic = _Topic(
                spec=spec,
                table=self.tables.bronze(spec.topic),
                sub=self._subscription(spec, recovery.start),
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
        self, spec: TopicSpec, start: StartPosition
    ) -> Subscription | ManagedSubscription:
        retry = self._ingest.retry
        policy = RetryPolicy(
            max_attempts=retry.max_attempts,
            initial_backoff=retry.initial_backoff_seconds,
            max_backoff=retry.max_backoff_seconds,
            multiplier=retry.multiplier,
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
            on_corrupted=spec.replay.on_corrupted,
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
            self._caught_up(t)
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

    def _add(self, t: _Topic, columns: EventColumns, received_at: float) -> None:
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

    def _topic_failed(self, t: _Topic, error: BaseException) -> None:
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

    def _check_redelivery(self, t: _Topic, first: bytes) -> None:
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

    def _skip_redelivered(self, t: _Topic, columns: EventColumns) -> EventColumns:
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

    def _resubscribed(self, t: _Topic, item: Resubscribed) -> None:
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
        t.open = _OpenBatch()
        if dropped:
            self._log.info(
                "%s: new stream (%s); dropping %d events not yet committed, the stream "
                "delivers them again",
                t.spec.topic,
                item.reason,
                dropped,
            )

    def _replay_gap(self, t: _Topic, gap: ReplayGap) -> None:
        self._log.warning(
            "%s: REPLAY GAP: the server rejected the stored position %s and "
            "replay.on_corrupted moved the subscription to %s (%s); events in between may "
            "be missing or repeated, so the objects of this topic need a re-sync",
            t.spec.topic,
            describe_position(gap.requested),
            describe_position(gap.resumed),
            gap.reason,
        )
        t.open = _OpenBatch()
        t.sealed_position = None
        t.check_redelivery = isinstance(gap.resumed, Earliest)
        sealed = _Sealed(t.spec.topic, t.next_batch, "replay_gap", None, _OpenBatch(), gap)
        t.next_batch += 1
        self._committer.submit(sealed)

    def _seal(self, t: _Topic) -> None:
        ob = t.open
        if not ob.replay_ids:
            if ob.position is None or ob.position == t.sealed_position:
                ob.opened_at = None
                return
            kind: CheckpointKind = "keepalive"
        else:
            kind = "events"
        t.open = _OpenBatch()
        t.sealed_position = ob.position
        sealed = _Sealed(t.spec.topic, t.next_batch, kind, ob.position, ob)
        t.next_batch += 1
        self._committer.submit(sealed)

    def _on_idle(self) -> bool:
        self._next_tick = 0.0
        return self._tick()

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
                "(a keepalive, or responses the server could not fill)"
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
                self._note_acks(t)

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
            topics = tuple(
                TopicResult(
                    topic=t.spec.topic,
                    table=str(t.table),
                    received=t.received,
                    events=t.events,
                    payload_bytes=t.payload_bytes,
                    commits=t.commits,
                    keepalive_commits=t.keepalive_commits,
                    replay_gaps=t.gaps,
                    redelivered_skipped=t.skipped,
                    last_replay_id=t.last_replay_id.hex() if t.last_replay_id else None,
                    error=t.failed,
                    newest_commit_at=t.newest_ms / 1000 if t.newest_ms is not None else None,
                    caught_up_at=t.caught_up_at,
                    commit_seconds=durations.counts,
                    commit_seconds_total=durations.total,
                    window=stats.window,
                    outstanding=stats.outstanding,
                    buffered=stats.buffered,
                    reconnects=max(0, stats.streams - 1),
                )
                for t, durations, stats in snapshots
            )
        return LandingResult(topics, seconds, stopped or self._stopped or "the subscriptions ended")

    # -- the committer thread -----------------------------------------------------------------

    def _note_acks(self, t: _Topic) -> None:
        # Under the lock. The server answers for the last of coalesced commits; whatever it
        # acknowledged, a later process's first stream starts at or after it.
        assert isinstance(t.sub, ManagedSubscription)
        last = t.sub.last_committed
        if last is not None and last.value in t.positions:
            t.acked_batch = max(t.positions[last.value], t.acked_batch or 0)

    def _commit(self, round_: list[_Sealed]) -> None:
        """Land a round (at most one batch per topic): each batch's schemas and events (steps
        0 and 1 of the protocol, topic by topic), then every batch's checkpoint row in one
        commit (step 2), then the ManagedSubscribe commits (step 3). Each topic's protocol is
        unchanged; the rows of a round share a commit so that a landing of many topics makes
        one checkpoint commit per round instead of one per batch."""
        started = self._monotonic()
        landed = [self._land_events(sealed) for sealed in round_]
        rows = [
            self._checkpoint_row(sealed, version)
            for sealed, (version, _) in zip(round_, landed, strict=True)
        ]
        results = self._store.write_all(rows)
        seconds = self._monotonic() - started
        for sealed, (version, new_schemas) in zip(round_, landed, strict=True):
            self._committed(sealed, new_schemas, seconds, version)
        self._maintain_checkpoints(len({r.version for r in results}))

    def _land_events(self, sealed: _Sealed) -> tuple[int | None, list[str]]:
        """Steps 0 and 1 for an events batch: (bronze version, schema ids registered)."""
        if sealed.kind != "events":
            return None, []
        t = self._topics[sealed.topic]
        batch = sealed.batch
        unseen = set(batch.schema_ids) - self._known_schemas - self._unavailable_schemas
        fetched = {}
        for sid in sorted(unseen):
            text = self._fetch_schema(sealed.topic, sid)
            if text is not None:
                fetched[sid] = text
        new_schemas = sorted(fetched)
        if new_schemas:
            self._store.register_schemas(sealed.topic, fetched)
            self._known_schemas.update(new_schemas)
        # Before the columns are built (that releases the batch's lists).
        sealed.newest_ms = self._newest_ms(batch, every=t.spec.kind.startswith("platform_event"))
        result = self._append(t.table, sealed)
        if result.skipped:
            raise CheckpointError(
                f"{sealed.topic}: bronze batch {sealed.batch_id} was already committed by "
                f"another writer; two landings of the same topic into {t.table} cannot run "
                "at once"
            )
        return result.version, new_schemas

    def _fetch_schema(self, topic: str, schema_id: str) -> str | None:
        """The schema's JSON, or None when the server refuses it for good (unknown id, no
        permission): the events still land, and the refusal is recorded for silver, which
        quarantines them with the server's message until the schema can be fetched."""
        try:
            return self._schemas.schema_json(schema_id)
        except PermanentError as exc:
            self._log.error(
                "%s: GetSchema %s failed (%s); its events land in bronze all the same and "
                "silver quarantines them as schema_unavailable until `sfcdc silver "
                "--retry-quarantine` can fetch it",
                topic,
                schema_id,
                exc,
            )
            self._store.record_schema_failure(
                topic,
                schema_id,
                status=exc.status or "UNKNOWN",
                error_code=exc.error_code,
                error=str(exc),
            )
            self._unavailable_schemas.add(schema_id)
            return None

    def _checkpoint_row(self, sealed: _Sealed, bronze_version: int | None) -> CheckpointRow:
        t = self._topics[sealed.topic]
        with self._lock:
            if t.managed:
                self._note_acks(t)
            acked = t.acked_batch if t.managed else None
        gap = sealed.gap
        return CheckpointRow(
            topic=sealed.topic,
            batch_id=sealed.batch_id,
            kind=sealed.kind,
            replay_id=sealed.position,
            event_count=len(sealed.batch.replay_ids),
            payload_bytes=sealed.batch.nbytes,
            bronze_version=bronze_version,
            gap_requested=describe_position(gap.requested) if gap else None,
            gap_resumed=gap.resumed.kind if gap else None,
            detail=gap.reason if gap else None,
            server_acked_batch_id=acked,
        )

    def _committed(
        self, sealed: _Sealed, new_schemas: list[str], seconds: float, version: int | None
    ) -> None:
        """After the checkpoint commit: the topic's durable position and counters, step 3,
        the commit's log line and record, and maintenance."""
        t = self._topics[sealed.topic]
        batch = sealed.batch
        count = len(batch.replay_ids)
        gap = sealed.gap
        position: StartPosition
        if gap is not None:
            position = gap.resumed
        else:
            assert sealed.position is not None
            position = After(sealed.position)
        with self._lock:
            t.position = position
            t.commits += 1
            t.events += count
            t.payload_bytes += batch.nbytes
            t.keepalive_commits += sealed.kind == "keepalive"
            t.gaps += sealed.kind == "replay_gap"
            if sealed.position is not None:
                t.last_replay_id = sealed.position
            if t.managed and sealed.position is not None:
                t.positions[sealed.position.value] = sealed.batch_id
                if len(t.positions) > _REMEMBERED_POSITIONS:
                    t.positions.popitem(last=False)
            if sealed.newest_ms is not None:
                t.newest_ms = max(t.newest_ms or sealed.newest_ms, sealed.newest_ms)
        if isinstance(t.sub, ManagedSubscription) and sealed.position is not None:
            t.sub.commit(sealed.position)
        self._log_commit(sealed, count, batch.nbytes, new_schemas, seconds)
        if sealed.kind == "events":
            t.durations.observe(seconds)
            if self._bar is not None:
                self._bar.advance(count)
        self._record(
            t, sealed=sealed, count=count, nbytes=batch.nbytes, seconds=seconds, version=version
        )
        self._caught_up(t)
        self._maintain(t, sealed.kind)

    def _newest_ms(self, batch: _OpenBatch, *, every: bool) -> int | None:
        """The newest commit time of the batch: its last event's (change events arrive in
        commit order), or, with ``every`` (platform events, whose ``CreatedDate`` the
        publisher sets and which one publish call may not order), the latest of all."""
        if not batch.payloads:
            return None
        indexes = range(len(batch.payloads)) if every else (len(batch.payloads) - 1,)
        newest: int | None = None
        for i in indexes:
            try:
                schema = self._schemas.schema(batch.schema_ids[i])
            except Exception as exc:  # measuring lag must never fail a commit
                self._log.debug("no commit time for the batch: %s", exc)
                return newest
            found = event_time_ms(schema, batch.payloads[i])
            if found is not None and (newest is None or found > newest):
                newest = found
        return newest

    def _record(
        self,
        t: _Topic,
        *,
        sealed: _Sealed,
        count: int,
        nbytes: int,
        seconds: float,
        version: int | None,
    ) -> None:
        if self._ops is None or sealed.kind == "keepalive":
            return
        gap = sealed.gap
        self._ops.record(
            CommitRecord(
                layer="bronze",
                kind="commit" if sealed.kind == "events" else "replay_gap",
                visible_at=datetime.fromtimestamp(self._clock(), tz=timezone.utc),
                topic=t.spec.topic,
                table=str(t.table),
                version=version,
                events=count,
                rows=count,
                payload_bytes=nbytes,
                newest_commit_at=utc(sealed.newest_ms / 1000) if sealed.newest_ms else None,
                duration_seconds=seconds,
                message=(
                    f"replay gap: {describe_position(gap.requested)} -> {gap.resumed.kind} "
                    f"({gap.reason})"
                    if gap is not None
                    else None
                ),
            )
        )

    def _caught_up(self, t: _Topic) -> None:
        """Record the topic caught up once the position of its last keepalive is committed:
        at the keepalive's time nothing was pending beyond it."""
        with self._lock:
            mark = t.idle_mark
            last = t.last_replay_id
            if mark is None or last is None or last.value != mark[1]:
                return
            t.idle_mark = None
            t.caught_up_at = mark[0]
        if self._ops is not None:
            self._ops.record(
                CommitRecord(
                    layer="bronze",
                    kind="caught_up",
                    visible_at=datetime.fromtimestamp(mark[0], tz=timezone.utc),
                    topic=t.spec.topic,
                    table=str(t.table),
                )
            )

    def _append(self, table: TableRef, sealed: _Sealed) -> CommitResult:
        rows = _arrow(sealed)
        txn = Txn(bronze_app_id(sealed.topic), sealed.batch_id)
        metadata = {"sfcdc.topic": sealed.topic, "sfcdc.kind": "events"}
        return self._engine.append(
            table, rows, txn=txn, metadata=metadata, evolve_schema=False, layout=BRONZE_LAYOUT
        )

    def _log_commit(
        self, sealed: _Sealed, count: int, nbytes: int, new_schemas: list[str], seconds: float
    ) -> None:
        if sealed.kind == "events":
            assert sealed.position is not None
            self._log.info(
                "landed %s batch %d: %d events, %.2f MB, replay id %s, %.3f s%s",
                sealed.topic,
                sealed.batch_id,
                count,
                nbytes / 1e6,
                sealed.position.hex(),
                seconds,
                f", new schemas {', '.join(new_schemas)}" if new_schemas else "",
            )
        elif sealed.kind == "keepalive":
            assert sealed.position is not None
            self._log.info(
                "landed %s batch %d: keepalive, replay id %s, %.3f s",
                sealed.topic,
                sealed.batch_id,
                sealed.position.hex(),
                seconds,
            )
        else:
            assert sealed.gap is not None
            self._log.info(
                "landed %s batch %d: replay gap recorded (%s -> %s), %.3f s",
                sealed.topic,
                sealed.batch_id,
                describe_position(sealed.gap.requested),
                sealed.gap.resumed.kind,
                seconds,
            )

    def _maintain(self, t: _Topic, kind: CheckpointKind) -> None:
        every = self._ingest.maintain_every_commits
        if every <= 0 or kind != "events":
            return
        t.since_maintenance += 1
        if t.since_maintenance >= every:
            t.since_maintenance = 0
            self._run_maintenance(t.table)

    def _maintain_checkpoints(self, commits: int) -> None:
        every = self._ingest.maintain_every_commits
        if every <= 0:
            return
        self._checkpoint_commits += commits
        if self._checkpoint_commits >= every:
            self._checkpoint_commits = 0
            self._run_maintenance(self.tables.checkpoints)

    def _run_maintenance(self, table: TableRef) -> None:
        self._maintainer.request(table)


def _binary(values: list[bytes]) -> pa.Array:
    """A binary column of ``values``: one join and the offsets, instead of a conversion per
    value (the payloads of a batch are megabytes, copied once here)."""
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, values), np.int64, len(values)), out=offsets[1:])
    if offsets[-1] >= 2**31:
        return pa.array(values, pa.binary())  # past 32-bit offsets: let Arrow chunk it
    data = pa.py_buffer(b"".join(values))
    return pa.Array.from_buffers(
        pa.binary(), len(values), [None, pa.py_buffer(offsets.astype(np.int32)), data]
    )


def _strings(values: list[str]) -> pa.Array:
    """A string column of ``values`` (event and schema ids are ASCII: their lengths in
    characters are their lengths in bytes)."""
    first = values[0] if values else ""
    if values.count(first) == len(values):
        return pa.repeat(pa.scalar(first, pa.string()), len(values))
    joined = "".join(values)
    if not joined.isascii():
        return pa.array(values, pa.string())
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(np.fromiter(map(len, values), np.int32, len(values)), out=offsets[1:])
    data = pa.py_buffer(joined.encode("ascii"))
    return pa.Array.from_buffers(pa.string(), len(values), [None, pa.py_buffer(offsets), data])


def _arrow(sealed: _Sealed) -> pa.Table:
    """The bronze rows of a batch, built column by column from the received values; the
    batch's lists are released as soon as their column is built."""
    batch = sealed.batch
    n = len(batch.replay_ids)
    received = np.repeat(
        np.asarray(batch.times, dtype=np.int64), np.asarray(batch.counts, dtype=np.int64)
    )
    payloads = _binary(batch.payloads)
    batch.payloads = []
    event_ids = _strings(batch.event_ids)
    batch.event_ids = []
    schema_ids = _strings(batch.schema_ids)
    batch.schema_ids = []
    columns = [
        _binary(batch.replay_ids),
        event_ids,
        schema_ids,
        payloads,
        pa.repeat(pa.scalar(sealed.topic, pa.string()), n),
        pa.array(received, BRONZE_SCHEMA.field("received_at").type),
        pa.array(np.full(n, sealed.batch_id, dtype=np.int64)),
        pa.array(np.arange(n, dtype=np.int32)),
    ]
    return pa.Table.from_arrays(columns, schema=BRONZE_SCHEMA)
