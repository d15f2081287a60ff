"""What the Streaming API landing knows about a channel while it runs: :class:`StreamState`,
shared by the consuming thread (:class:`~pipelines.bronze.cometd.CometdLanding`, and its
ticker) and the committer (:class:`~pipelines.bronze.cometd_commit.CometdCommitter`). The
consumer's side is the consuming thread's (and the ticker's, under the open-batch lock); what
the committer has committed is read and written under the landing's state lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipelines.bronze.cometd_batches import CometdOpenBatch
from pipelines.bronze.landing_state import TopicResult
from pipelines.engines.base import TableRef

if TYPE_CHECKING:
    from pipelines.spec.cometd import CometdObjectSpec

__all__ = ["StreamState"]


@dataclass
class StreamState:
    """A channel's state: the consumer's side (open batch, counters) and, under the landing's
    state lock, what the committer has committed."""

    spec: CometdObjectSpec
    table: TableRef
    next_batch: int
    position: int  # durable: where a new session resumes
    open: CometdOpenBatch = field(default_factory=CometdOpenBatch)
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
    # (time, position) of an empty connect: the position of the last notification received
    # then (open or sealed). Once it is committed, the channel was caught up at that time (a
    # commits-table row).
    idle_mark: tuple[float, int] | None = None

    def result(self) -> TopicResult:
        """What the channel's landing did (under the landing's state lock)."""
        return TopicResult(
            topic=self.spec.key,
            table=str(self.table),
            received=self.received,
            events=self.events,
            payload_bytes=self.nbytes,
            commits=self.commits,
            keepalive_commits=0,
            replay_gaps=self.gaps,
            redelivered_skipped=0,
            last_replay_id=str(self.last_replay_id) if self.last_replay_id is not None else None,
        )
