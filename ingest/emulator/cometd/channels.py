"""Where Streaming API messages wait for subscribers: one log per channel, one condition.

Two kinds of channel logs:

- PushTopic (``/topic/<Name>``) and generic (``/u/<Name>``) channels keep their own messages,
  numbered 1, 2, 3... per channel, for ``retention`` (24 hours on Salesforce);
- platform event and change event channels (``/event/...``, ``/data/...``) read the event bus
  the gRPC side serves, the bus position being the replay id (retained 72 hours, the bus's own
  retention).

A subscriber's place in a channel is the replay id of the last message it received; ``-1``
starts at the tip and ``-2`` before the oldest retained message. A stored replay id is valid
from the newest message that has expired (or 0) up to the newest one; outside that window it
names messages the server no longer has.

Every append notifies :attr:`Hub.changed`, the condition long polls wait on.
"""

from __future__ import annotations

import bisect
import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from ingest.emulator.cometd.busjson import BusJson
from ingest.emulator.eventlog import EventBus

__all__ = ["ChannelKind", "Delivery", "Hub", "channel_kind"]

ChannelKind = Literal["topic", "generic", "event", "data"]
_NEW = -1
_ALL = -2


def channel_kind(channel: str) -> ChannelKind | None:
    """What kind of channel a name is, by its prefix (``None`` for anything else)."""
    for prefix, kind in (("/topic/", "topic"), ("/u/", "generic"), ("/event/", "event")):
        if channel.startswith(prefix) and len(channel) > len(prefix):
            return kind  # type: ignore[return-value]
    if channel.startswith("/data/") and len(channel) > len("/data/"):
        return "data"
    return None


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message for one subscriber: its channel, replay id and ``data`` as JSON text."""

    channel: str
    replay_id: int
    data_json: str

    def message(self, client_id: str) -> str:
        """The whole Bayeux message as JSON text."""
        return (
            f'{{"clientId":{json.dumps(client_id)},"channel":{json.dumps(self.channel)},'
            f'"data":{self.data_json}}}'
        )


@dataclass(slots=True)
class _Entry:
    replay_id: int
    time: float
    data_json: str
    users: frozenset[str] | None


@dataclass
class _Log:
    entries: list[_Entry] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    next_id: int = 1
    dropped_through: int = 0


class Hub:
    """The channel logs of one emulated org (see the module docstring). Thread-safe."""

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        retention: float,
        bus: Callable[[], EventBus],
        bus_json: BusJson,
        bus_channels: Callable[[], Iterable[str]],
    ) -> None:
        self._clock = clock
        self._retention = retention
        self._bus = bus
        self._json = bus_json
        self._bus_channels = bus_channels
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self._logs: dict[str, _Log] = {}

    # -- channel set ---------------------------------------------------------------------

    def open(self, channel: str) -> None:
        """Start keeping messages for a PushTopic or generic channel (idempotent)."""
        with self.lock:
            self._logs.setdefault(channel, _Log())

    def close(self, channel: str) -> None:
        """Forget a channel and its messages (its PushTopic or StreamingChannel was deleted)."""
        with self.lock:
            self._logs.pop(channel, None)
            self.changed.notify_all()

    def rename(self, old: str, new: str) -> None:
        with self.lock:
            log = self._logs.pop(old, None)
            if log is not None:
                self._logs[new] = log
            self.changed.notify_all()

    def exists(self, channel: str) -> bool:
        kind = channel_kind(channel)
        if kind in ("event", "data"):
            return channel in set(self._bus_channels())
        with self.lock:
            return channel in self._logs

    def channels(self) -> list[str]:
        with self.lock:
            return [*self._logs, *self._bus_channels()]

    def wake(self) -> None:
        """Wake every waiting long poll (a fault changed, the server stops)."""
        with self.lock:
            self.changed.notify_all()

    # -- own logs --------------------------------------------------------------------------

    def append(
        self,
        channel: str,
        build: Callable[[int], dict[str, Any]],
        *,
        users: frozenset[str] | None = None,
    ) -> int:
        """Append one message to a PushTopic or generic channel; ``build(replay_id)`` makes
        its ``data``. Returns the replay id."""
        with self.lock:
            log = self._logs[channel]
            replay_id = log.next_id
            log.next_id += 1
            data = json.dumps(build(replay_id), separators=(",", ":"), ensure_ascii=False)
            log.entries.append(_Entry(replay_id, self._clock(), data, users))
            log.ids.append(replay_id)
            self.changed.notify_all()
            return replay_id

    def _expire(self, log: _Log) -> None:
        cutoff = self._clock() - self._retention
        n = 0
        while n < len(log.entries) and log.entries[n].time < cutoff:
            n += 1
        if n:
            log.dropped_through = log.entries[n - 1].replay_id
            del log.entries[:n]
            del log.ids[:n]

    def purge(self, channel: str, *, through: int) -> int:
        """Drop a PushTopic or generic channel's messages up to ``through``; returns how many."""
        with self.lock:
            log = self._logs[channel]
            n = bisect.bisect_right(log.ids, through)
            if n:
                log.dropped_through = log.ids[n - 1]
                del log.entries[:n]
                del log.ids[:n]
            return n

    # -- positions ---------------------------------------------------------------------------

    def tip(self, channel: str) -> int:
        """The position a ``-1`` subscriber starts from: after everything sent so far."""
        if channel_kind(channel) in ("event", "data"):
            return self._bus().position
        with self.lock:
            log = self._logs.get(channel)
            return log.next_id - 1 if log else 0

    def start(self, channel: str) -> int:
        """The position a ``-2`` subscriber starts from: before the oldest retained message."""
        if channel_kind(channel) in ("event", "data"):
            bus = self._bus()
            bus.enforce_retention()
            return bus.floor - 1
        with self.lock:
            log = self._logs.get(channel)
            if log is None:
                return 0
            self._expire(log)
            return log.dropped_through

    def resolve(self, channel: str, replay: int) -> int | None:
        """The position to read after for a subscribe's replay value, or ``None`` when the
        replay id is outside the retained window."""
        if replay == _NEW:
            return self.tip(channel)
        if replay == _ALL:
            return self.start(channel)
        if replay < 0:
            return None
        if self.start(channel) <= replay <= self.tip(channel):
            return replay
        return None

    # -- reads ---------------------------------------------------------------------------

    def read(
        self, channel: str, after: int, limit: int, user_id: str
    ) -> tuple[list[Delivery], int]:
        """Up to ``limit`` messages after position ``after`` that ``user_id`` may receive, and
        the position after them."""
        if limit <= 0:
            return [], after
        if channel_kind(channel) in ("event", "data"):
            return self._read_bus(channel, after, limit)
        with self.lock:
            log = self._logs.get(channel)
            if log is None:
                return [], after
            self._expire(log)
            i = bisect.bisect_right(log.ids, after)
            out: list[Delivery] = []
            position = after
            for entry in log.entries[i:]:
                position = entry.replay_id
                if entry.users is None or user_id in entry.users:
                    out.append(Delivery(channel, entry.replay_id, entry.data_json))
                    if len(out) >= limit:
                        break
            return out, position

    def _read_bus(self, channel: str, after: int, limit: int) -> tuple[list[Delivery], int]:
        bus = self._bus()
        seq = bus.seq_after(channel, after)
        events, _ = bus.read(channel, seq, limit, 1 << 62)
        out = [
            Delivery(
                channel,
                ev.position,
                json.dumps(self._json.data(ev), separators=(",", ":"), ensure_ascii=False),
            )
            for ev in events
        ]
        return out, (events[-1].position if events else after)
