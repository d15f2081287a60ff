"""Bayeux messages of the Streaming API: building requests, reading advice, naming errors.

Every error of the Streaming API guide's table maps to a class of :mod:`ingest.errors`
(:func:`classify`); the subscriber decides the recovery by class:

=======================================================  ==========================  ==========
error (``code::message``)                                 class                       recovery
=======================================================  ==========================  ==========
400 API version mandatory / unsupported, invalid          StreamingProtocolError      raise
connection type, no BAYEUX_BROWSER cookie
400 channel does not exist / not specified / leading      ChannelError                raise
'/', query fields do not exist; 403 cannot create
channel, no access to entity or WHERE fields,
restricted channel, user not enabled, CDC without View
All Data, no access on channel; 404 unknown channel,
names varying only by case
400 invalid replayId                                      StreamingReplayError        on_corrupted
401 Authentication invalid / Request requires             StreamingAuthError          new token,
authentication                                                                        handshake
403 Handshake denied (+ ``ext.sfdc.failureReason``)       HandshakeDeniedError        by reason
403 Unknown client / Client has not completed handshake   UnknownClientError          handshake
403 concurrent user limit, daily events limit,            StreamingLimitError         raise
subscription limit, channel limit; simultaneous
connections (a handshake failure reason)                                              backoff
413 Maximum Request Size Exceeded                         RequestTooLargeError        raise
=======================================================  ==========================  ==========
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ingest.errors import (
    ChannelError,
    HandshakeDeniedError,
    RequestTooLargeError,
    StreamingAuthError,
    StreamingError,
    StreamingLimitError,
    StreamingProtocolError,
    StreamingReplayError,
    UnknownClientError,
)

__all__ = [
    "MAX_REQUEST_BYTES",
    "Advice",
    "classify",
    "connect_message",
    "disconnect_message",
    "failure_reason",
    "handshake_message",
    "pack",
    "subscribe_message",
]

MAX_REQUEST_BYTES = 32_768

_CHANNEL_MARKERS = (
    "channel you requested to subscribe to does not exist",
    "channel name not specified",
    "must start with a leading",
    "do not exist on the topic entity",
    "cannot create channel",
    "does not have access",
    "restricted channel",
    "not enabled for streaming",
    "view all data",
    "no access on channel",
    "unknown channel",
    "may not vary only by case",
)
_LIMIT_MARKERS = (
    "limit exceeded",
    "maximum channel limit",
    "simultaneous connections",
)


@dataclass(frozen=True, slots=True)
class Advice:
    """A reply's ``advice``: ``reconnect`` (``retry``, ``handshake`` or ``none``),
    ``interval`` and ``timeout`` in seconds."""

    reconnect: Literal["retry", "handshake", "none"] = "retry"
    interval: float = 0.0
    timeout: float = 110.0

    @classmethod
    def read(cls, message: Mapping[str, Any], previous: Advice) -> Advice:
        """``previous`` updated with what ``message``'s advice says (fields it omits keep)."""
        advice = message.get("advice")
        if not isinstance(advice, Mapping):
            return previous
        reconnect = advice.get("reconnect", previous.reconnect)
        if reconnect not in ("retry", "handshake", "none"):
            reconnect = previous.reconnect
        interval = _seconds(advice.get("interval"), previous.interval)
        timeout = _seconds(advice.get("timeout"), previous.timeout)
        return cls(reconnect, interval, timeout)


def _seconds(value: object, default: float) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value) / 1000.0
    return default


def handshake_message(message_id: str) -> dict[str, Any]:
    return {
        "channel": "/meta/handshake",
        "version": "1.0",
        "minimumVersion": "1.0",
        "supportedConnectionTypes": ["long-polling"],
        "advice": {"timeout": 60000, "interval": 0},
        "id": message_id,
    }


def subscribe_message(
    client_id: str, channel: str, replay: int | None, message_id: str
) -> dict[str, Any]:
    """A ``/meta/subscribe`` with the replay extension (``-1``, ``-2`` or a replay id)."""
    message: dict[str, Any] = {
        "channel": "/meta/subscribe",
        "clientId": client_id,
        "subscription": channel,
        "id": message_id,
    }
    if replay is not None:
        message["ext"] = {"replay": {channel: replay}}
    return message


def connect_message(
    client_id: str, message_id: str, *, timeout: float | None = None
) -> dict[str, Any]:
    """A ``/meta/connect``; ``timeout`` (seconds) asks the server to hold this long poll at
    most that long: Bayeux's client advice, which CometD servers keep as the session's
    transient timeout (the CometD JavaScript client sends ``{"timeout": 0}`` on its first
    connect for an immediate answer)."""
    message: dict[str, Any] = {
        "channel": "/meta/connect",
        "clientId": client_id,
        "connectionType": "long-polling",
        "id": message_id,
    }
    if timeout is not None:
        message["advice"] = {"timeout": max(0, round(timeout * 1000))}
    return message


def disconnect_message(client_id: str, message_id: str) -> dict[str, Any]:
    return {"channel": "/meta/disconnect", "clientId": client_id, "id": message_id}


def _encoded(message: Mapping[str, Any]) -> str:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False)


def pack(messages: Iterable[Mapping[str, Any]], *, limit: int = MAX_REQUEST_BYTES) -> Iterator[str]:
    """The messages as JSON array bodies of at most ``limit`` bytes each, in order (the guide
    asks for fewer messages per request rather than bodies over 32,768 bytes). A single
    message over the limit raises :class:`~ingest.errors.RequestTooLargeError`."""
    batch: list[str] = []
    size = 2
    for message in messages:
        text = _encoded(message)
        length = len(text.encode("utf-8"))
        if length + 2 > limit:
            what = message.get("subscription") or message.get("channel")
            raise RequestTooLargeError(
                f"a {message.get('channel')} message for {what} is {length + 2} bytes as a "
                f"request body; the Streaming API accepts at most {limit} bytes per request "
                "(shorten the channel name or the ext fields)",
                error="413::Maximum Request Size Exceeded",
                code=413,
                channel=str(what),
            )
        extra = length + (1 if batch else 0)
        if batch and size + extra > limit:
            yield "[" + ",".join(batch) + "]"
            batch, size = [], 2
            extra = length
        batch.append(text)
        size += extra
    if batch:
        yield "[" + ",".join(batch) + "]"


def failure_reason(message: Mapping[str, Any]) -> str:
    """A denied handshake's ``ext.sfdc.failureReason`` (empty when absent)."""
    ext = message.get("ext")
    sfdc = ext.get("sfdc") if isinstance(ext, Mapping) else None
    reason = sfdc.get("failureReason") if isinstance(sfdc, Mapping) else None
    return reason if isinstance(reason, str) else ""


def _code(error: str) -> int:
    head = error.split("::", 1)[0].strip()
    return int(head) if head.isdigit() else 0


def classify(message: Mapping[str, Any], *, stage: str) -> StreamingError:
    """The error an unsuccessful reply stands for, with a message naming ``stage``, what the
    server said and the fix."""
    error = str(message.get("error") or "")
    channel = str(message.get("subscription") or message.get("channel") or "")
    reason = failure_reason(message)
    code = _code(error)
    lowered = f"{error} {reason}".lower()
    kwargs: dict[str, Any] = {
        "error": error,
        "code": code,
        "channel": channel,
        "failure_reason": reason,
    }
    said = f"{stage}: the server answered {error!r}" + (
        f" (failureReason {reason!r})" if reason else ""
    )
    if "handshake denied" in lowered and "403::handshake denied" in error.lower():
        if reason.startswith("401"):
            return StreamingAuthError(f"{said}: log in again", **kwargs)
        return HandshakeDeniedError(f"{said}; the failure reason says what to change", **kwargs)
    if code == 401:
        return StreamingAuthError(f"{said}: the token is missing, revoked or expired", **kwargs)
    if "unknown client" in lowered or "not completed handshake" in lowered:
        return UnknownClientError(f"{said}: the session is gone; handshake again", **kwargs)
    if code == 413:
        return RequestTooLargeError(
            f"{said}: request bodies are limited to {MAX_REQUEST_BYTES} bytes", **kwargs
        )
    if "replayid" in lowered:
        return StreamingReplayError(
            f"{said}: the replay id is outside the retention window; subscribe with -2 "
            "(all retained) or -1 (new only), or choose an on_corrupted policy",
            **kwargs,
        )
    if any(marker in lowered for marker in _LIMIT_MARKERS):
        return StreamingLimitError(f"{said}: an allocation is exhausted", **kwargs)
    if any(marker in lowered for marker in _CHANNEL_MARKERS):
        return ChannelError(
            f"{said}: check the channel name (case-sensitive, leading '/') and that it "
            "exists and the user may read it",
            **kwargs,
        )
    return StreamingProtocolError(
        f"{said or stage}: expected a successful reply (check the API version in the "
        "/cometd/<version> path, the long-polling connection type and that cookies are kept)",
        **kwargs,
    )
