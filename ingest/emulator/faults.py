"""Fault injection for the emulator, adjustable while it runs.

A :class:`Faults` object is shared by every part of a running emulator: set a fault and the
next response, stream or token check sees it. :class:`FaultSettings` is the same thing as a
frozen value, for :class:`~ingest.emulator.server.EmulatorConfig`.

Faults that act on the event bus (purges) need a running emulator; the others are plain
settings that the servers read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ingest.emulator.eventlog import decode_replay_id

__all__ = [
    "FaultSettings",
    "Faults",
    "StreamCut",
    "StreamCutCode",
]

StreamCutCode = Literal["service.unavailable", "subscription.internal.error"]
_CUT_CODES = ("service.unavailable", "subscription.internal.error")
# How GetSchema refuses a schema id: INVALID_ARGUMENT with schema.meta.permission (what
# Salesforce documents for an id it cannot read), or NOT_FOUND.
_SCHEMA_REFUSALS = ("schema.meta.permission", "schema.not.found")


@dataclass(frozen=True)
class StreamCut:
    """End Subscribe / ManagedSubscribe streams with UNAVAILABLE after ``after_events`` events.

    Events are counted per stream from the moment the cut is set (or the stream opened,
    whichever is later). With ``repeat=False`` only the first stream to reach the count is cut
    and the fault then clears itself; with ``repeat=True`` every stream is cut each time it
    delivers that many events.
    """

    after_events: int
    code: StreamCutCode = "service.unavailable"
    repeat: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.after_events, int) or self.after_events < 0:
            raise ValueError(
                f"StreamCut.after_events must be an int >= 0 (got {self.after_events!r})"
            )
        if self.code not in _CUT_CODES:
            raise ValueError(f"StreamCut.code must be one of {_CUT_CODES} (got {self.code!r})")


@dataclass(frozen=True)
class FaultSettings:
    """Faults active from the start. ``latency`` is seconds added before every response."""

    stream_cut: StreamCut | None = None
    latency: float = 0.0
    keepalive_only: bool = False

    def __post_init__(self) -> None:
        if self.latency < 0:
            raise ValueError(f"FaultSettings.latency must be >= 0 seconds (got {self.latency!r})")


Purger = Callable[[float | None, int | None], int]


class Faults:
    """The emulator's live fault switches. Thread-safe; every method takes effect at once."""

    def __init__(self, settings: FaultSettings | None = None) -> None:
        settings = settings or FaultSettings()
        self._lock = threading.Lock()
        self._stream_cut = settings.stream_cut
        self._cut_generation = 0
        self._latency = settings.latency
        self._keepalive_only = settings.keepalive_only
        self._token_generation = 0
        self._session_generation = 0
        self._poll_drops = 0
        self._handshake_denial: str | None = None
        self._subscribe_denial: str | None = None
        self._listeners: list[Callable[[], None]] = []
        self._purger: Purger | None = None
        self._rejected_through: int | None = None
        self._refused_schemas: dict[str, str] = {}
        self._losses: list[tuple[str | None, int]] = []
        self.lost_event_ids: list[str] = []

    def __repr__(self) -> str:
        return (
            f"Faults(stream_cut={self._stream_cut!r}, latency={self._latency!r}, "
            f"keepalive_only={self._keepalive_only!r}, token_generation={self._token_generation})"
        )

    # -- stream cuts -------------------------------------------------------------------------

    def cut_streams(
        self,
        after_events: int,
        *,
        code: StreamCutCode = "service.unavailable",
        repeat: bool = False,
    ) -> None:
        """End streams with UNAVAILABLE after ``after_events`` delivered events (see
        :class:`StreamCut`)."""
        cut = StreamCut(after_events, code, repeat)
        with self._lock:
            self._stream_cut = cut
            self._cut_generation += 1
        self._changed()

    def clear_stream_cut(self) -> None:
        with self._lock:
            self._stream_cut = None
            self._cut_generation += 1

    @property
    def stream_cut(self) -> tuple[int, StreamCut | None]:
        """The active cut and its generation (a new generation restarts per-stream counts)."""
        with self._lock:
            return self._cut_generation, self._stream_cut

    def fire_stream_cut(self, generation: int) -> StreamCut | None:
        """Claim the cut for one stream; ``None`` when another stream already used a one-shot
        cut of this generation (or it was cleared)."""
        with self._lock:
            if generation != self._cut_generation or self._stream_cut is None:
                return None
            cut = self._stream_cut
            if not cut.repeat:
                self._stream_cut = None
                self._cut_generation += 1
            return cut

    # -- latency and keepalive-only ----------------------------------------------------------

    @property
    def latency(self) -> float:
        """Seconds slept before each response, to emulate a real round trip."""
        return self._latency

    @latency.setter
    def latency(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"latency must be >= 0 seconds (got {seconds!r})")
        self._latency = float(seconds)

    @property
    def keepalive_only(self) -> bool:
        """While set, streams deliver no events, only keepalives."""
        return self._keepalive_only

    @keepalive_only.setter
    def keepalive_only(self, value: bool) -> None:
        self._keepalive_only = bool(value)
        self._changed()

    # -- tokens ------------------------------------------------------------------------------

    def expire_tokens(self) -> None:
        """Make every access token issued so far invalid (as after a Salesforce release)."""
        with self._lock:
            self._token_generation += 1

    @property
    def token_generation(self) -> int:
        """Tokens issued under an older generation are rejected."""
        return self._token_generation

    # -- Streaming API (CometD) ----------------------------------------------------------------

    def expire_sessions(self) -> None:
        """Forget every Streaming API client session: the next request of each client gets
        ``403::Unknown client`` (as after a missed reconnect deadline or a server move)."""
        with self._lock:
            self._session_generation += 1
        self._changed()

    @property
    def session_generation(self) -> int:
        """Streaming API sessions created under an older generation are unknown."""
        return self._session_generation

    def drop_polls(self, n: int = 1) -> None:
        """Close the connection of the next ``n`` Streaming API long polls (those waiting now
        first) without answering, as a network failure mid-poll would."""
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"drop_polls needs an int >= 0 (got {n!r})")
        with self._lock:
            self._poll_drops = n
        self._changed()

    def claim_poll_drop(self) -> bool:
        """Whether the long poll asking should be dropped (counts it)."""
        with self._lock:
            if self._poll_drops <= 0:
                return False
            self._poll_drops -= 1
            return True

    def deny_handshakes(self, failure_reason: str | None) -> None:
        """Answer Streaming API handshakes with ``403::Handshake denied`` and this
        ``ext.sfdc.failureReason`` (``None`` stops)."""
        with self._lock:
            self._handshake_denial = failure_reason

    @property
    def handshake_denial(self) -> str | None:
        return self._handshake_denial

    def deny_subscribes(self, error: str | None) -> None:
        """Answer Streaming API subscribes with this ``error`` (``"403::Organization total
        events daily limit exceeded"``; ``None`` stops)."""
        with self._lock:
            self._subscribe_denial = error

    @property
    def subscribe_denial(self) -> str | None:
        return self._subscribe_denial

    # -- purges ------------------------------------------------------------------------------

    def purge(self, *, before: float | None = None, through: bytes | None = None) -> int:
        """Drop events appended before epoch time ``before`` and/or up to and including replay
        id ``through``; their replay ids become corrupted for CUSTOM replay. Returns the number
        of events dropped. Needs a running emulator."""
        if before is None and through is None:
            raise ValueError("purge needs before=<epoch seconds> or through=<replay id bytes>")
        position: int | None = None
        if through is not None:
            position = decode_replay_id(through)
            if position is None:
                raise ValueError(
                    f"purge through= needs a replay id from this emulator: 10 bytes ending in two "
                    f"zero bytes (got {through.hex()!r}, {len(through)} bytes)"
                )
        with self._lock:
            purger = self._purger
        if purger is None:
            raise RuntimeError("purge needs a running emulator: call Emulator.start() first")
        return purger(before, position)

    # -- lost events ---------------------------------------------------------------------------

    def lose_events(self, count: int, *, topic: str | None = None) -> None:
        """The next ``count`` events appended (of ``topic``, or of any topic) are never
        stored: the record change happened (the ground truth has it) but no subscriber will
        ever receive its event, as Salesforce warns can happen in rare cases. Their event ids
        go to :attr:`lost_event_ids`."""
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"lose_events needs a count >= 0 (got {count!r})")
        with self._lock:
            self._losses.append((topic, count))

    def claim_loss(self, topic: str, event_id: str) -> bool:
        """Whether the event being appended is lost (counts it against the standing loss)."""
        with self._lock:
            for i, (wanted, left) in enumerate(self._losses):
                if left > 0 and (wanted is None or wanted == topic):
                    self._losses[i] = (wanted, left - 1)
                    self.lost_event_ids.append(event_id)
                    self._losses = [loss for loss in self._losses if loss[1] > 0]
                    return True
            return False

    # -- rejected replay ids and schema ids ---------------------------------------------------

    def reject_replay_ids(self, through: bytes | None) -> None:
        """Reject CUSTOM replay at any replay id up to and including ``through`` as corrupted
        while the events stay retained (as Salesforce does for a replay id it no longer
        accepts, e.g. after an org migration); ``None`` stops."""
        position: int | None = None
        if through is not None:
            position = decode_replay_id(through)
            if position is None:
                raise ValueError(
                    f"reject_replay_ids through= needs a replay id from this emulator "
                    f"(got {through.hex()!r})"
                )
        with self._lock:
            self._rejected_through = position

    def rejects_replay(self, position: int) -> bool:
        """Whether CUSTOM replay after ``position`` is refused by :meth:`reject_replay_ids`."""
        with self._lock:
            return self._rejected_through is not None and position <= self._rejected_through

    def refuse_schema(self, schema_id: str, code: str | None = "schema.meta.permission") -> None:
        """Answer GetSchema for ``schema_id`` with the error ``code`` (``schema.meta.permission``
        or ``schema.not.found``); ``None`` serves it again."""
        if code is not None and code not in _SCHEMA_REFUSALS:
            raise ValueError(f"refuse_schema code must be one of {_SCHEMA_REFUSALS} (got {code!r})")
        with self._lock:
            if code is None:
                self._refused_schemas.pop(schema_id, None)
            else:
                self._refused_schemas[schema_id] = code

    def schema_refusal(self, schema_id: str) -> str | None:
        """The error code GetSchema answers for ``schema_id`` with, or ``None``."""
        with self._lock:
            return self._refused_schemas.get(schema_id)

    def clear(self) -> None:
        """Remove every standing fault (stream cut, latency, keepalive-only, poll drops and
        Streaming API denials)."""
        with self._lock:
            self._stream_cut = None
            self._cut_generation += 1
            self._latency = 0.0
            self._keepalive_only = False
            self._poll_drops = 0
            self._handshake_denial = None
            self._subscribe_denial = None
            self._rejected_through = None
            self._refused_schemas.clear()
            self._losses = []
        self._changed()

    # -- wiring (used by the emulator) -------------------------------------------------------

    def attach(self, purger: Purger | None) -> None:
        """Connect (or with ``None`` disconnect) the running event bus that purges act on."""
        with self._lock:
            self._purger = purger

    def on_change(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever a fault that streams wait on changes."""
        with self._lock:
            self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if callback in self._listeners:
                self._listeners.remove(callback)

    def _changed(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for cb in listeners:
            cb()
