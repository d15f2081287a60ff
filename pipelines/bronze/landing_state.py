"""What bronze landing knows about its topics: :class:`TopicState` while it runs, shared by the
consuming thread (:class:`~pipelines.bronze.landing.BronzeLanding`) and the committer
(:class:`~pipelines.bronze.committer.BatchCommitter`): the consumer's side is the consuming
thread's alone, what the committer has committed is read and written under the landing's lock;
and what a run reports (:class:`TopicResult`, :class:`LandingResult`, also importable from
:mod:`pipelines.bronze.landing`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from ingest.client import ManagedSubscription, StreamStats, Subscription
from ingest.replay import ReplayId, StartPosition
from pipelines.bronze.batches import OpenBatch
from pipelines.engines.base import TableRef
from pipelines.ops.durations import Durations, DurationsSnapshot
from pipelines.spec.models import TopicSpec

__all__ = ["LandingResult", "TopicResult", "TopicState"]


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


@dataclass
class TopicState:
    """A topic's state: the consumer's side (open batch, counters) and, under the landing's
    lock, what the committer has committed."""

    spec: TopicSpec
    table: TableRef
    sub: Subscription | ManagedSubscription
    next_batch: int
    position: StartPosition  # durable: where a new stream resumes
    open: OpenBatch = field(default_factory=OpenBatch)
    sealed_position: ReplayId | None = None
    drained: bool = False
    # Received everything published before the run started (a keepalive, or a response the
    # server could not fill): what --once waits for. Stays set while the stream goes on.
    caught_up: bool = False
    short_responses: int = 0  # consecutive responses holding fewer events than owed
    failed: str | None = None  # why the subscription failed for good (the others go on)
    skip: set[bytes] = field(default_factory=set)
    # The stream (re)starts at EARLIEST while bronze may hold events: the first delivered
    # event tells whether the server is delivering landed events again (see
    # BronzeLanding._check_redelivery).
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

    def note_acks(self) -> None:
        # Under the landing's lock. The server answers for the last of coalesced commits;
        # whatever it acknowledged, a later process's first stream starts at or after it.
        assert isinstance(self.sub, ManagedSubscription)
        last = self.sub.last_committed
        if last is not None and last.value in self.positions:
            self.acked_batch = max(self.positions[last.value], self.acked_batch or 0)

    def result(self, durations: DurationsSnapshot, stats: StreamStats) -> TopicResult:
        """What the topic's landing did (under the landing's lock), with its commit
        ``durations`` and stream ``stats`` read before."""
        return TopicResult(
            topic=self.spec.topic,
            table=str(self.table),
            received=self.received,
            events=self.events,
            payload_bytes=self.payload_bytes,
            commits=self.commits,
            keepalive_commits=self.keepalive_commits,
            replay_gaps=self.gaps,
            redelivered_skipped=self.skipped,
            last_replay_id=self.last_replay_id.hex() if self.last_replay_id else None,
            error=self.failed,
            newest_commit_at=self.newest_ms / 1000 if self.newest_ms is not None else None,
            caught_up_at=self.caught_up_at,
            commit_seconds=durations.counts,
            commit_seconds_total=durations.total,
            window=stats.window,
            outstanding=stats.outstanding,
            buffered=stats.buffered,
            reconnects=max(0, stats.streams - 1),
        )
