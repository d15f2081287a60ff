"""Bounded reads of one topic: between two offsets (a micro-batch read again after a crash)
and from a position until the topic goes quiet (a batch read).

Both open a subscription of their own and close it when done; the streaming query's warm
subscription (:mod:`pipelines.spark_source.feed`) is not involved.
"""

from __future__ import annotations

import logging
import time

from ingest.client import (
    CorruptedReplayPolicy,
    EventBatch,
    MultiSubscription,
    ReplayGap,
    Subscription,
)
from ingest.replay import Earliest
from pipelines.connect import Source
from pipelines.spark_source.errors import ReplayMismatchError
from pipelines.spark_source.feed import Events
from pipelines.spark_source.offsets import TopicOffset

__all__ = ["read_between", "read_until_quiet"]

_log = logging.getLogger(__name__)


def read_between(
    source: Source,
    topic: str,
    start: TopicOffset,
    end: TopicOffset,
    *,
    on_corrupted: CorruptedReplayPolicy,
    num_requested: int = 100,
    timeout: float = 120.0,
) -> Events:
    """The ``end.count`` events after ``start`` that end with ``end.last``: the events of the
    micro-batch between the two offsets. A batch that began at ``latest`` is found again from
    the earliest retained event, from ``end.first`` on. Raises :class:`ReplayMismatchError`
    when they cannot be found (retention passed, or no event arrives for ``timeout``
    seconds)."""
    out = Events()
    if end.count == 0 or end.last is None:
        return out
    first = end.first
    position = Earliest() if start.after is None and first is not None else start.position()
    last = end.last.value
    waiting_for_first = first is not None and start.after is None
    deadline = time.monotonic() + timeout
    done = False

    def idle() -> bool:
        return time.monotonic() > deadline

    sub = Subscription(
        source.channel,
        topic,
        start=position,
        on_corrupted=on_corrupted,
        num_requested=num_requested,
        tokens=source.tokens,
    )
    with MultiSubscription([sub], on_idle=idle, idle_interval=0.1) as multi:
        for item in multi:
            if not isinstance(item, EventBatch):
                continue
            deadline = time.monotonic() + timeout
            ids = item.columns.replay_ids
            begin = 0
            if waiting_for_first:
                assert first is not None
                if first.value not in ids:
                    continue
                begin = ids.index(first.value)
                waiting_for_first = False
            stop = ids.index(last, begin) + 1 if last in ids[begin:] else len(ids)
            out.add_batch(item, begin, stop)
            if stop < len(ids) or ids[-1] == last:
                done = True
                break
            if len(out) > end.count:
                break
    if not done or len(out) != end.count:
        raise ReplayMismatchError(
            f"{topic}: re-reading the micro-batch after {start.to_json()} found {len(out)} "
            f"events where its offsets record {end.count} ending at replay id "
            f"{end.last.hex()}; the events are no longer retained (72 hours on Salesforce) "
            "or the stream changed. Restart the query from a new checkpoint."
        )
    return out


def read_until_quiet(
    source: Source,
    topic: str,
    start: TopicOffset,
    *,
    on_corrupted: CorruptedReplayPolicy,
    quiet_seconds: float,
    max_events: int,
    num_requested: int = 100,
    logger: logging.Logger | None = None,
) -> Events:
    """Events of ``topic`` after ``start`` until none has come for ``quiet_seconds`` (or
    ``max_events`` were read), with the replay gaps met on the way."""
    out = Events()
    deadline = time.monotonic() + quiet_seconds

    def idle() -> bool:
        return time.monotonic() > deadline

    sub = Subscription(
        source.channel,
        topic,
        start=start.position(),
        on_corrupted=on_corrupted,
        num_requested=num_requested,
        tokens=source.tokens,
        logger=logger or _log,
    )
    with MultiSubscription([sub], on_idle=idle, idle_interval=0.1) as multi:
        for item in multi:
            if isinstance(item, ReplayGap):
                out.add_gap(item)
                continue
            if not isinstance(item, EventBatch):
                continue
            deadline = time.monotonic() + quiet_seconds
            take = min(len(item), max_events - len(out))
            out.add_batch(item, 0, take)
            if len(out) >= max_events:
                break
    return out
