"""The warm subscription behind a streaming query: one Subscribe stream per topic, kept open
across micro-batches, received into a bounded buffer.

A thread iterates a :class:`~ingest.client.MultiSubscription` and appends what arrives to a
per-topic queue: each event, and each position a response or keepalive reports beyond its
last event. :meth:`Feed.take` hands out up to N events and the offset after them. When the
buffer holds ``buffer_events`` events the thread stops taking items, so the pumps and then
flow control stop asking the server for more; the window refills as soon as a micro-batch
takes events. A failure of the subscription (a rejected replay id under ``fail``, exhausted
retries) is raised by the next :meth:`Feed.take` once the events before it are taken.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from ingest.client import (
    CorruptedReplayPolicy,
    EventBatch,
    Keepalive,
    MultiSubscription,
    ReplayGap,
    Subscription,
)
from ingest.replay import ReplayId
from pipelines.connect import Source
from pipelines.spark_source.offsets import GapMark, TopicOffset, describe_position

__all__ = ["Events", "Feed"]

_log = logging.getLogger(__name__)


@dataclass
class Events:
    """Events of one topic as parallel columns, in replay order."""

    replay_ids: list[bytes] = field(default_factory=list)
    event_ids: list[str] = field(default_factory=list)
    schema_ids: list[str] = field(default_factory=list)
    payloads: list[bytes] = field(default_factory=list)
    received_at: list[float] = field(default_factory=list)
    gaps: list[GapMark] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.replay_ids)

    def add_batch(self, batch: EventBatch, start: int = 0, stop: int | None = None) -> None:
        cols = batch.columns
        n = len(cols) if stop is None else stop
        self.replay_ids.extend(cols.replay_ids[start:n])
        self.event_ids.extend(cols.event_ids[start:n])
        self.schema_ids.extend(cols.schema_ids[start:n])
        self.payloads.extend(cols.payloads[start:n])
        self.received_at.extend([batch.received_at] * (n - start))

    def add_gap(self, gap: ReplayGap) -> None:
        """Mark a replay gap before the next event added."""
        self.gaps.append(
            GapMark(
                at=len(self),
                requested=describe_position(gap.requested),
                resumed=describe_position(gap.resumed),
                reason=gap.reason,
            )
        )


@dataclass
class _Entry:
    """A received response: its events (from ``used`` on), then the position after it; or a
    replay gap (no events, no position)."""

    batch: EventBatch | None
    position: ReplayId | None
    used: int = 0
    gap: ReplayGap | None = None

    def left(self) -> int:
        return 0 if self.batch is None else len(self.batch) - self.used


class Feed:
    """Subscriptions to ``starts``' topics from their positions, received in the background."""

    def __init__(
        self,
        source: Source,
        starts: Mapping[str, TopicOffset],
        *,
        on_corrupted: CorruptedReplayPolicy,
        num_requested: int = 100,
        buffer_events: int = 20_000,
        logger: logging.Logger | None = None,
    ) -> None:
        self.starts = dict(starts)
        self._log = logger or _log
        self._buffer_events = buffer_events
        self._queues: dict[str, deque[_Entry]] = {t: deque() for t in starts}
        self._buffered = 0
        self._turn = 0
        self._cond = threading.Condition()
        self._closed = threading.Event()
        self._error: BaseException | None = None
        self.gaps: list[ReplayGap] = []
        subs = [
            Subscription(
                source.channel,
                topic,
                start=offset.position(),
                on_corrupted=on_corrupted,
                num_requested=num_requested,
                tokens=source.tokens,
                logger=self._log,
            )
            for topic, offset in starts.items()
        ]
        self._multi = MultiSubscription(subs, on_idle=self._closed.is_set, logger=self._log)
        self._thread = threading.Thread(target=self._run, name="sfcdc-spark-feed", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for item in self._multi:
                if isinstance(item, EventBatch):
                    self._put(item.topic, _Entry(item, item.latest_replay_id), len(item))
                elif isinstance(item, Keepalive):
                    self._put(item.topic, _Entry(None, item.latest_replay_id), 0)
                elif isinstance(item, ReplayGap):
                    self._log.warning(
                        "%s: %s; continuing at %s", item.topic, item.reason, item.resumed.kind
                    )
                    self.gaps.append(item)
                    self._put(item.topic, _Entry(None, None, gap=item), 0)
                if self._closed.is_set():
                    return
        except BaseException as exc:
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def _put(self, topic: str, entry: _Entry, events: int) -> None:
        with self._cond:
            while self._buffered >= self._buffer_events and not self._closed.is_set():
                self._cond.wait(0.2)
            self._queues[topic].append(entry)
            self._buffered += events
            self._cond.notify_all()

    def take(
        self, offsets: Mapping[str, TopicOffset], max_events: int, wait: float
    ) -> tuple[dict[str, Events], dict[str, TopicOffset]]:
        """Up to ``max_events`` events (all topics) after ``offsets``, waiting at most ``wait``
        seconds for the first ones, and the offset after what was taken. Topics with nothing
        new keep their offset (made ``resting``)."""
        deadline = time.monotonic() + wait
        with self._cond:
            while not any(self._queues.values()) and self._error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            taken: dict[str, Events] = {}
            ends: dict[str, TopicOffset] = {}
            budget = max_events
            # Each take starts with the next topic, so a busy topic cannot use up every
            # micro-batch's budget while a quieter one waits.
            topics = list(self._queues)
            self._turn = (self._turn + 1) % len(topics)
            for topic in topics[self._turn :] + topics[: self._turn]:
                queue = self._queues[topic]
                offset = offsets[topic]
                events = Events()
                after = offset.after
                while queue and budget > 0:
                    entry = queue[0]
                    if entry.gap is not None:
                        events.add_gap(entry.gap)
                        queue.popleft()
                        continue
                    n = min(entry.left(), budget)
                    if entry.batch is not None and n:
                        events.add_batch(entry.batch, entry.used, entry.used + n)
                        entry.used += n
                        budget -= n
                        after = ReplayId(events.replay_ids[-1])
                    if entry.left() == 0:
                        after = entry.position
                        queue.popleft()
                self._buffered -= len(events)
                if not events.gaps and (after is None or (after == offset.after and not events)):
                    ends[topic] = offset.resting()
                    continue
                first = None
                if events and offset.after is None and offset.start == "latest":
                    first = ReplayId(events.replay_ids[0])
                last = ReplayId(events.replay_ids[-1]) if events else None
                ends[topic] = TopicOffset(
                    after=after,
                    start=offset.start,
                    count=len(events),
                    last=last,
                    first=first,
                    gaps=tuple(events.gaps),
                )
                taken[topic] = events
            self._cond.notify_all()
            if self._error is not None and not taken and not any(self._queues.values()):
                raise self._error
        return taken, ends

    def close(self) -> None:
        self._closed.set()
        with self._cond:
            self._cond.notify_all()
        self._multi.close()
        self._thread.join(timeout=5)
