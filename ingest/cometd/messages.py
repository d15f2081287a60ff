"""What a Streaming API subscription yields, and how received messages become those items.

Iterating a :class:`~ingest.cometd.subscriber.CometdSubscription` yields:

- :class:`NotificationBatch`: the event messages of one ``/meta/connect`` reply, in the order
  the server sent them, each a :class:`Notification` keeping the raw JSON text;
- :class:`IdleConnect`: a connect came back with nothing (the caller may tick, flush, report);
- :class:`Reconnected`: the client handshook and subscribed again after a failure, from the
  positions it reports; notifications handed out earlier but not yet stored come again;
- :class:`ReplayGap`: a stored replay id was rejected and the ``on_corrupted`` policy moved the
  channel to ``-2`` or ``-1``; both positions are reported;
- :class:`MalformedMessage`: a message (or a whole body) that is not a usable notification,
  with its raw text and, when they could be read, its channel and replay id: quarantine it.

A body is split into its messages' exact texts (:func:`split_messages`), so the raw text of a
notification is byte for byte what the server sent for it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

__all__ = [
    "REPLAY_ALL",
    "REPLAY_NEW",
    "ChannelKind",
    "IdleConnect",
    "MalformedMessage",
    "Notification",
    "NotificationBatch",
    "Reconnected",
    "ReplayGap",
    "StreamItem",
    "channel_kind",
    "parse_notification",
    "split_messages",
]

REPLAY_NEW = -1
"""Subscribe for events sent after subscribing only."""
REPLAY_ALL = -2
"""Subscribe for every retained event (24 h for PushTopic/generic, 72 h for platform/CDC)."""

ChannelKind = Literal["pushtopic", "generic", "platform_event", "change_event", "other"]

_DECODER = json.JSONDecoder()
_WS = " \t\n\r"


def channel_kind(channel: str) -> ChannelKind:
    """The kind of a channel by its prefix."""
    if channel.startswith("/topic/"):
        return "pushtopic"
    if channel.startswith("/u/"):
        return "generic"
    if channel.startswith("/event/"):
        return "platform_event"
    if channel.startswith("/data/"):
        return "change_event"
    return "other"


@dataclass(frozen=True, slots=True)
class Notification:
    """One event message: what bronze keeps of it.

    ``raw`` is the message's JSON text exactly as received; ``replay_id`` the integer
    ``data.event.replayId`` (increasing per channel, never contiguous); ``created_date`` the
    ``data.event.createdDate`` text when the channel sends one (PushTopic and generic); and
    ``event_type`` a PushTopic's ``created`` / ``updated`` / ``deleted`` / ``undeleted``.
    ``data`` is the parsed ``data`` object (read-only); it holds record values, so it is left
    out of the repr.
    """

    channel: str
    replay_id: int
    created_date: str | None
    event_type: str | None
    raw: str = field(repr=False)
    data: Mapping[str, Any] = field(repr=False, compare=False, hash=False)

    @property
    def kind(self) -> ChannelKind:
        return channel_kind(self.channel)

    @property
    def event_uuid(self) -> str | None:
        """A platform event's ``EventUuid``, when the server sent one."""
        event = self.data.get("event")
        value = event.get("EventUuid") if isinstance(event, Mapping) else None
        return value if isinstance(value, str) else None


@dataclass(frozen=True, slots=True)
class MalformedMessage:
    """A message that is not a usable notification, or a body that is not a JSON array of
    messages. ``channel`` and ``replay_id`` are set when they could be read."""

    raw: str = field(repr=False)
    reason: str
    channel: str | None = None
    replay_id: int | None = None
    received_at: float = 0.0


@dataclass(frozen=True, slots=True)
class NotificationBatch:
    """The notifications of one connect reply. ``latest`` maps each channel in the batch to
    the replay id of its last notification."""

    notifications: tuple[Notification, ...]
    received_at: float
    client_id: str

    @property
    def latest(self) -> Mapping[str, int]:
        out: dict[str, int] = {}
        for n in self.notifications:
            out[n.channel] = n.replay_id
        return MappingProxyType(out)

    def __len__(self) -> int:
        return len(self.notifications)


@dataclass(frozen=True, slots=True)
class IdleConnect:
    """A connect reply without events (the server's poll timed out)."""

    received_at: float
    client_id: str


@dataclass(frozen=True, slots=True)
class Reconnected:
    """A new session was made after ``reason``; ``positions`` are the replay values it
    subscribed with, per channel. Drop what was handed out but not stored: it comes again."""

    reason: str
    attempt: int
    positions: Mapping[str, int]
    client_id: str


@dataclass(frozen=True, slots=True)
class ReplayGap:
    """The server rejected ``rejected`` on ``channel``; the subscription resumed at
    ``resumed`` (``-2`` all retained, ``-1`` new only). Events between may be lost (``-1``)
    or come again (``-2``)."""

    channel: str
    rejected: int
    resumed: int
    reason: str


StreamItem = NotificationBatch | IdleConnect | Reconnected | ReplayGap | MalformedMessage


def split_messages(body: str) -> list[tuple[str, Any]]:
    """The messages of a Bayeux body (a JSON array, or one object) as ``(exact text, value)``
    pairs. Raises ``ValueError`` when the body is not JSON of that shape."""
    i = 0
    n = len(body)
    while i < n and body[i] in _WS:
        i += 1
    if i < n and body[i] == "{":
        value, end = _DECODER.raw_decode(body, i)
        if body[end:].strip(_WS):
            raise ValueError(f"unexpected text after the message at position {end}")
        return [(body[i:end], value)]
    if i >= n or body[i] != "[":
        raise ValueError("expected a JSON array of messages")
    i += 1
    out: list[tuple[str, Any]] = []
    expect_value = True
    while True:
        while i < n and body[i] in _WS:
            i += 1
        if i >= n:
            raise ValueError("the array of messages is not closed")
        if body[i] == "]" and (not out or not expect_value):
            i += 1
            break
        if not expect_value:
            if body[i] != ",":
                raise ValueError(f"expected ',' or ']' at position {i}")
            i += 1
            expect_value = True
            continue
        value, end = _DECODER.raw_decode(body, i)
        out.append((body[i:end], value))
        i = end
        expect_value = False
    if body[i:].strip(_WS):
        raise ValueError(f"unexpected text after the array at position {i}")
    return out


def _int(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def parse_notification(
    raw: str, message: Mapping[str, Any], *, received_at: float
) -> Notification | MalformedMessage:
    """A :class:`Notification` from one event message, or a :class:`MalformedMessage` naming
    what is missing (with the channel and replay id when they are readable)."""
    channel = message.get("channel")
    channel = channel if isinstance(channel, str) and channel else None
    data = message.get("data")
    event = data.get("event") if isinstance(data, Mapping) else None
    replay_id = _int(event.get("replayId")) if isinstance(event, Mapping) else None

    def bad(reason: str) -> MalformedMessage:
        return MalformedMessage(raw, reason, channel, replay_id, received_at)

    if channel is None:
        return bad("the message has no channel")
    if not isinstance(data, Mapping):
        return bad(f"expected a data object on {channel} (got {type(data).__name__})")
    if not isinstance(event, Mapping):
        return bad(f"expected data.event on {channel}")
    if replay_id is None:
        got = event.get("replayId")
        return bad(f"expected an integer data.event.replayId on {channel} (got {got!r})")
    created = event.get("createdDate")
    kind = event.get("type")
    return Notification(
        channel,
        replay_id,
        created if isinstance(created, str) else None,
        kind if isinstance(kind, str) else None,
        raw,
        MappingProxyType(dict(data)),
    )
