"""Several topics at once: one stream and one flow-control window per topic, one consumer loop.

Bronze landing runs a single loop that batches events per topic and commits each topic's
checkpoint with its events, so :class:`MultiSubscription` merges the items of all its
:class:`~ingest.client.subscriber.Subscription` (or
:class:`~ingest.client.managed.ManagedSubscription`) objects into one iterator. Every item names
its topic; items of one topic keep their order; topics interleave as their events arrive.

Each topic has a pump thread that takes items from its subscription into a shared queue, at
most ``items_per_topic`` at a time: a consumer that falls behind stops the pumps, which stops
each subscription's top-ups, so memory stays bounded per topic and a busy topic cannot crowd
out a quiet one.

Positions are resolved in the consumer's thread. When a topic's stream must be reopened, its
pump waits while the consumer's loop reaches the reconnect point in that topic's order; only
then is the topic's ``durable_position()`` read and the :class:`Resubscribed` item yielded,
so a checkpoint that the consumer commits for *any* topic in between is taken into account.

A consumer that must act while nothing arrives (write a batch that grew old on a quiet topic,
log progress, notice a stop request) passes ``on_idle``: it is called in the consumer's thread
whenever no item has come for ``idle_interval`` seconds, so it needs no lock against the loop,
and returning ``True`` from it ends the iteration (which closes the subscriptions).

A single subscription has no pump: the consumer's thread runs it itself, which saves a
thread hand-over per server response (at 100 events per response, that hand-over costs as
much CPU as handling the events). Its stream then wakes the consumer after ``idle_interval``
seconds without a response, and reconnect backoff waits in steps of ``idle_interval``, so
``on_idle`` is called as often as with pumps.

A topic that fails for good (a permanent error, a corrupted replay id under ``"fail"``,
exhausted retries) closes every subscription and raises from the loop: a job then stops
with the reason instead of silently ingesting only some topics. Failures of the types given
as ``isolate`` (a topic that does not exist, or that the user cannot read) end that topic
alone instead: the loop yields a :class:`~ingest.client.stream.TopicFailed` item for it and
goes on with the others, so the consumer decides what a partial run means.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ingest.client.managed import ManagedSubscription
from ingest.client.stream import _IDLE, Item, Resubscribed, TopicFailed
from ingest.client.subscriber import Subscription, _NeedPosition

__all__ = ["MultiSubscription"]

_log = logging.getLogger(__name__)
_POLL = 0.05

AnySubscription = Subscription | ManagedSubscription


@dataclass(frozen=True, slots=True)
class _Reconnect:
    sub: Subscription
    need: _NeedPosition
    reply: queue.SimpleQueue[Any]


@dataclass(frozen=True, slots=True)
class _Done:
    sub: AnySubscription


@dataclass(frozen=True, slots=True)
class _Failed:
    sub: AnySubscription
    error: BaseException


class MultiSubscription:
    """Subscriptions to several topics iterated as one stream of items.

    Each subscription keeps its own start, durable position callback, corrupted-replay policy
    and flow control. Topics must be distinct. ``on_idle`` is called in the iterating thread
    after each ``idle_interval`` seconds without an item (see the module notes).
    """

    def __init__(
        self,
        subscriptions: Sequence[AnySubscription],
        *,
        items_per_topic: int = 4,
        on_idle: Callable[[], bool | None] | None = None,
        idle_interval: float = _POLL,
        isolate: tuple[type[BaseException], ...] = (),
        logger: logging.Logger | None = None,
    ) -> None:
        subs = list(subscriptions)
        if not subs:
            raise ValueError("MultiSubscription needs at least one subscription")
        topics = [s.topic for s in subs]
        duplicates = sorted({t for t in topics if topics.count(t) > 1})
        if duplicates:
            raise ValueError(f"each topic may be subscribed once (duplicated: {duplicates})")
        if items_per_topic < 1:
            raise ValueError(f"items_per_topic must be >= 1 (got {items_per_topic})")
        if idle_interval <= 0:
            raise ValueError(f"idle_interval must be > 0 seconds (got {idle_interval})")
        self._on_idle = on_idle
        self._idle_interval = idle_interval
        self._isolate = isolate
        self._subs = subs
        self._slots = {id(s): threading.BoundedSemaphore(items_per_topic) for s in subs}
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = threading.Event()
        self._log = logger or _log
        self._threads: list[threading.Thread] = []
        self._started = False

    @property
    def subscriptions(self) -> tuple[AnySubscription, ...]:
        return tuple(self._subs)

    def __enter__(self) -> MultiSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every subscription and stop the pumps."""
        self._closed.set()
        for sub in self._subs:
            sub.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def __iter__(self) -> Iterator[Item]:
        if self._started:
            raise RuntimeError("a MultiSubscription can be iterated once")
        self._started = True
        if len(self._subs) == 1:
            return self._iterate_one(self._subs[0])
        return self._iterate_pumped()

    def _iterate_one(self, sub: AnySubscription) -> Iterator[Item]:
        stop: list[BaseException | None] = []
        if sub._sleep == sub._wait_closed:
            sub._sleep = self._idle_sleep(sub, stop)
        sub._idle_interval = self._idle_interval
        items: Generator[Any, Any, None] = sub._items()
        reply: Any = None
        try:
            while not self._closed.is_set():
                try:
                    out = items.send(reply)
                except StopIteration:
                    break
                except BaseException as exc:
                    if not stop:
                        self._log.error("subscription to %s failed: %s", sub.topic, exc)
                    if not stop and isinstance(exc, self._isolate):
                        yield TopicFailed(sub.topic, exc)
                        return
                    raise
                reply = None
                if out is _IDLE:
                    if self._on_idle is not None and self._on_idle():
                        return
                    continue
                if isinstance(out, _NeedPosition) and isinstance(sub, Subscription):
                    reply = sub._resume_position(out)
                    yield Resubscribed(sub.topic, reply, out.attempt, out.reason)
                    continue
                sub._note_handed(out)
                yield out
            if stop and stop[0] is not None:
                raise stop[0]
        finally:
            items.close()
            self.close()

    def _idle_sleep(
        self, sub: AnySubscription, stop: list[BaseException | None]
    ) -> Callable[[float], None]:
        """A backoff wait that calls ``on_idle`` every ``idle_interval`` and ends the
        subscription when it asks to stop (or fails: the failure is raised by the loop)."""

        def wait(seconds: float) -> None:
            deadline = time.monotonic() + seconds
            while not sub.closed and not stop:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                sub._wait_closed(min(left, self._idle_interval))
                if self._on_idle is None or sub.closed:
                    continue
                try:
                    done = self._on_idle()
                except BaseException as exc:  # raised by the loop, not as the topic's failure
                    stop.append(exc)
                    sub.close()
                    return
                if done:
                    stop.append(None)
                    sub.close()

        return wait

    def _iterate_pumped(self) -> Iterator[Item]:
        for sub in self._subs:
            thread = threading.Thread(
                target=self._pump, args=(sub,), name=f"sfcdc-pump {sub.topic}", daemon=True
            )
            self._threads.append(thread)
            thread.start()
        active = len(self._subs)
        try:
            while active and not self._closed.is_set():
                try:
                    entry = self._queue.get(timeout=self._idle_interval)
                except queue.Empty:
                    if self._on_idle is not None and self._on_idle():
                        return
                    continue
                if isinstance(entry, _Done):
                    active -= 1
                    continue
                if isinstance(entry, _Failed):
                    self._log.error("subscription to %s failed: %s", entry.sub.topic, entry.error)
                    if isinstance(entry.error, self._isolate):
                        # That topic alone ends; its pump has stopped.
                        active -= 1
                        yield TopicFailed(entry.sub.topic, entry.error)
                        continue
                    raise entry.error
                if isinstance(entry, _Reconnect):
                    self._slots[id(entry.sub)].release()
                    position = entry.sub._resume_position(entry.need)
                    entry.reply.put(position)
                    yield Resubscribed(
                        entry.sub.topic, position, entry.need.attempt, entry.need.reason
                    )
                    continue
                sub, item = entry
                self._slots[id(sub)].release()
                sub._note_handed(item)
                yield item
        finally:
            self.close()

    def _acquire(self, sub: AnySubscription) -> bool:
        slot = self._slots[id(sub)]
        while not self._closed.is_set():
            if slot.acquire(timeout=_POLL):
                return True
        return False

    def _pump(self, sub: AnySubscription) -> None:
        items: Generator[Any, Any, None] = sub._items()
        reply: Any = None
        try:
            while not self._closed.is_set():
                out = items.send(reply)
                reply = None
                if not self._acquire(sub):
                    return
                if isinstance(out, _NeedPosition) and isinstance(sub, Subscription):
                    box: queue.SimpleQueue[Any] = queue.SimpleQueue()
                    self._queue.put(_Reconnect(sub, out, box))
                    while reply is None:
                        if self._closed.is_set():
                            return
                        try:
                            reply = box.get(timeout=_POLL)
                        except queue.Empty:
                            continue
                else:
                    self._queue.put((sub, out))
        except StopIteration:
            self._queue.put(_Done(sub))
        except BaseException as exc:  # delivered to the consumer's thread and raised there
            self._queue.put(_Failed(sub, exc))
        finally:
            items.close()
