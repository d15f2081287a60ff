"""The emulated org's event bus: one position counter for the whole org and a log per topic.

Salesforce's event bus is shared by many orgs, so the replay ids one org sees are increasing but
never contiguous. The emulator reproduces that with a seeded random gap between positions, both
between events and whenever a keepalive reports the bus's current position.

Replay ids are 10 bytes, as observed on real orgs: an 8-byte big-endian position followed by two
zero bytes. Each event is encoded once, on append, into the exact bytes it occupies inside a
``FetchResponse`` (field 1, tag and length prefix included), so serving a batch is a
concatenation rather than a protobuf build.

With a ``state_dir`` the log is journaled to disk and reloaded on start, so a restarted emulator
serves the same events under the same replay ids.
"""

from __future__ import annotations

import bisect
import json
import logging
import random
import struct
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ingest.emulator.topics import Catalogue, EmittedEvent
from ingest.pubsub import pb2

__all__ = [
    "REPLAY_ID_LENGTH",
    "Clock",
    "EventBus",
    "LoggedEvent",
    "NewEvent",
    "decode_replay_id",
    "encode_replay_id",
    "encode_varint",
]

logger = logging.getLogger(__name__)

Clock = Callable[[], float]

REPLAY_ID_LENGTH = 10
_COUNTER_LENGTH = 8
_REPLAY_SUFFIX = b"\x00\x00"
_JOURNAL = "events.log"
_STATE = "bus.json"
_RECORD = struct.Struct(">IQdH")  # record length, position, time, topic length


def encode_varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: int, data: bytes) -> bytes:
    return bytes((tag,)) + encode_varint(len(data)) + data


def encode_replay_id(position: int) -> bytes:
    """The 10-byte replay id of a bus position."""
    return position.to_bytes(_COUNTER_LENGTH, "big") + _REPLAY_SUFFIX


def decode_replay_id(replay_id: bytes) -> int | None:
    """The bus position a replay id names, or ``None`` when it is not one of ours.

    Besides the 10-byte form the emulator issues, the 8-byte form (the counter alone, as a
    big-endian unsigned integer) names the same position: clients that store a replay id as
    a number send it back that way, and have done so against real orgs for years.
    """
    if len(replay_id) == _COUNTER_LENGTH:
        return int.from_bytes(replay_id, "big")
    if len(replay_id) != REPLAY_ID_LENGTH or replay_id[_COUNTER_LENGTH:] != _REPLAY_SUFFIX:
        return None
    return int.from_bytes(replay_id[:_COUNTER_LENGTH], "big")


@dataclass(frozen=True, slots=True)
class LoggedEvent:
    """One event held by the bus.

    ``wire`` is the event's encoding as a ``FetchResponse.events`` entry (tag 1, length,
    ``ConsumerEvent``); ``ManagedFetchResponse`` uses the same field number, so the bytes serve
    both. The payload is kept only inside ``wire`` to hold each event in memory once.
    """

    topic: str
    position: int
    replay_id: bytes
    event_id: str
    schema_id: str
    time: float
    wire: bytes = field(repr=False)
    payload_offset: int = field(repr=False)
    payload_length: int = field(repr=False)
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def payload(self) -> bytes:
        """The Avro payload exactly as it was appended or published."""
        return self.wire[self.payload_offset : self.payload_offset + self.payload_length]

    def consumer_event(self) -> pb2.ConsumerEvent:
        """The event as a protobuf ``ConsumerEvent`` (what a subscriber receives)."""
        return pb2.ConsumerEvent(
            event=pb2.ProducerEvent(
                id=self.event_id,
                schema_id=self.schema_id,
                payload=self.payload,
                headers=[pb2.EventHeader(key=k, value=v) for k, v in self.headers],
            ),
            replay_id=self.replay_id,
        )


def _build_event(
    topic: str,
    position: int,
    *,
    time: float,
    event_id: str,
    schema_id: str,
    payload: bytes,
    headers: tuple[tuple[str, bytes], ...] = (),
) -> LoggedEvent:
    # Hand-encoded so the payload offset inside the wire bytes is known; a unit test checks the
    # result is byte-identical to protobuf's own serialization.
    producer = bytearray()
    if event_id:
        producer += _field(0x0A, event_id.encode("utf-8"))
    if schema_id:
        producer += _field(0x12, schema_id.encode("utf-8"))
    payload_start = -1
    if payload:
        producer += b"\x1a" + encode_varint(len(payload))
        payload_start = len(producer)
        producer += payload
    for key, value in headers:
        header = bytearray()
        if key:
            header += _field(0x0A, key.encode("utf-8"))
        if value:
            header += _field(0x12, value)
        producer += _field(0x22, bytes(header))
    replay_id = encode_replay_id(position)
    consumer_prefix = b"\x0a" + encode_varint(len(producer))
    consumer = consumer_prefix + producer + _field(0x12, replay_id)
    outer_prefix = b"\x0a" + encode_varint(len(consumer))
    offset = len(outer_prefix) + len(consumer_prefix) + payload_start if payload else 0
    return LoggedEvent(
        topic=topic,
        position=position,
        replay_id=replay_id,
        event_id=event_id,
        schema_id=schema_id,
        time=time,
        wire=outer_prefix + consumer,
        payload_offset=offset,
        payload_length=len(payload),
        headers=headers,
    )


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append: what :class:`EmittedEvent` says plus optional publish headers."""

    topic: str
    schema_id: str
    payload: bytes
    event_id: str
    headers: tuple[tuple[str, bytes], ...] = ()


def _unwrap(wire: bytes) -> bytes:
    """The ``ConsumerEvent`` bytes inside a ``FetchResponse.events`` entry."""
    i = 1
    while wire[i] & 0x80:
        i += 1
    return wire[i + 1 :]


def _journal_records(events: Sequence[LoggedEvent]) -> bytes:
    chunks = []
    for ev in events:
        topic = ev.topic.encode("utf-8")
        length = _RECORD.size - 4 + len(topic) + len(ev.wire)
        chunks.append(_RECORD.pack(length, ev.position, ev.time, len(topic)) + topic + ev.wire)
    return b"".join(chunks)


class _TopicLog:
    """Events of one topic (or channel) in position order; ``base`` counts purged entries so a
    sequence number stays valid across purges."""

    __slots__ = ("base", "events", "positions")

    def __init__(self) -> None:
        self.events: list[LoggedEvent] = []
        self.positions: list[int] = []
        self.base = 0

    @property
    def end(self) -> int:
        return self.base + len(self.events)

    def drop_through(self, position: int) -> int:
        cut = bisect.bisect_right(self.positions, position)
        if cut:
            del self.events[:cut]
            del self.positions[:cut]
            self.base += cut
        return cut


Listener = Callable[[], None]


class EventBus:
    """The org's event bus: appends events, hands out positions, serves reads, enforces
    retention and purges. Thread-safe.

    ``clock`` (epoch seconds) drives retention and event times, so a test can move time forward
    72 hours without waiting.
    """

    def __init__(
        self,
        catalogue: Catalogue,
        *,
        clock: Clock,
        retention: float,
        seed: int = 0,
        max_gap: int = 24,
        start_position: int = 1_000_000,
        state_dir: Path | None = None,
    ) -> None:
        if retention <= 0:
            raise ValueError(f"retention must be positive seconds (got {retention!r})")
        if max_gap < 1:
            raise ValueError(f"max_gap must be at least 1 (got {max_gap!r})")
        self._catalogue = catalogue
        self._clock = clock
        self._retention = retention
        self._rng = random.Random(seed)
        self._max_gap = max_gap
        self._lock = threading.Lock()
        self._logs: dict[str, _TopicLog] = {}
        # Every appended event once (its own topic), in bus order, for time-based purges.
        self._times: list[float] = []
        self._order: list[int] = []
        self._position = start_position
        self._floor = start_position
        self._listeners: dict[str, set[Listener]] = {}
        self._state_dir = state_dir
        self._journal: BinaryIO | None = None
        self._oldest_time = float("inf")
        if state_dir is not None:
            self._load(state_dir)

    # -- positions ---------------------------------------------------------------------------

    @property
    def position(self) -> int:
        """The bus's current position: the last one handed out (event or keepalive)."""
        with self._lock:
            return self._position

    @property
    def floor(self) -> int:
        """The oldest position still valid for replay; everything before it was purged."""
        with self._lock:
            return self._floor

    def _next_position(self) -> int:
        self._position += self._rng.randint(1, self._max_gap)
        return self._position

    def advance(self) -> int:
        """Move the position past other orgs' traffic (a keepalive) and return it."""
        with self._lock:
            position = self._next_position()
            self._save_state()
            return position

    def advance_past(self, topic: str, seq: int) -> int | None:
        """A keepalive position for a reader of ``topic`` that has read up to sequence
        ``seq``: the bus moves on and the new position is returned, unless events of
        ``topic`` from ``seq`` on are waiting, in which case nothing moves and ``None`` is
        returned.

        Checked and moved under one lock: an event appended between a reader's last read and
        a plain :meth:`advance` gets a position below the keepalive's, so a subscriber that
        stores the keepalive position and resumes after it would never receive that event.
        """
        with self._lock:
            log = self._logs.get(topic)
            if log is not None and log.end > max(seq, log.base):
                return None
            position = self._next_position()
            self._save_state()
            return position

    def is_valid(self, position: int) -> bool:
        """Whether a replay position is inside the retained window of the bus."""
        self.enforce_retention()
        with self._lock:
            return self._floor <= position <= self._position

    # -- append ------------------------------------------------------------------------------

    def channels_of(self, topic: str) -> tuple[str, ...]:
        """The multi-entity channels that carry ``topic``'s events, besides the topic itself."""
        return tuple(
            t.name
            for t in self._catalogue
            if t.kind == "change_event_channel" and topic in self._catalogue.channel_members(t.name)
        )

    def append(self, events: Iterable[EmittedEvent | NewEvent]) -> list[LoggedEvent]:
        """Append events in order; each gets the next position. Returns them as logged."""
        logged: list[LoggedEvent] = []
        touched: set[str] = set()
        channels: dict[str, tuple[str, ...]] = {}
        with self._lock:
            now = self._clock()
            for ev in events:
                headers = ev.headers if isinstance(ev, NewEvent) else ()
                event_id = ev.event_id or str(uuid.uuid4())
                entry = _build_event(
                    ev.topic,
                    self._next_position(),
                    time=now,
                    event_id=event_id,
                    schema_id=ev.schema_id,
                    payload=ev.payload,
                    headers=headers,
                )
                if ev.topic not in channels:
                    channels[ev.topic] = self.channels_of(ev.topic)
                self._store(entry, channels[ev.topic])
                touched.add(ev.topic)
                touched.update(channels[ev.topic])
                logged.append(entry)
            if logged:
                self._journal_events(logged)
                self._save_state()
            listeners = [cb for t in touched for cb in self._listeners.get(t, ())]
        for cb in listeners:
            cb()
        return logged

    def _store(self, entry: LoggedEvent, channels: Sequence[str]) -> None:
        for name in (entry.topic, *channels):
            log = self._logs.get(name)
            if log is None:
                log = self._logs[name] = _TopicLog()
            log.events.append(entry)
            log.positions.append(entry.position)
        if not self._times:
            self._oldest_time = entry.time
        self._times.append(entry.time)
        self._order.append(entry.position)

    # -- reads -------------------------------------------------------------------------------

    def log(self, topic: str) -> Sequence[LoggedEvent]:
        """A snapshot of what the bus retains for ``topic`` (a channel lists its members')."""
        self.enforce_retention()
        with self._lock:
            log = self._logs.get(topic)
            return tuple(log.events) if log else ()

    def end(self, topic: str) -> int:
        """Sequence number after the topic's last event (where LATEST starts)."""
        with self._lock:
            log = self._logs.get(topic)
            return log.end if log else 0

    def start(self, topic: str) -> int:
        """Sequence number of the topic's oldest retained event (where EARLIEST starts)."""
        self.enforce_retention()
        with self._lock:
            log = self._logs.get(topic)
            return log.base if log else 0

    def seq_after(self, topic: str, position: int) -> int:
        """Sequence number of the topic's first event strictly after ``position``."""
        with self._lock:
            log = self._logs.get(topic)
            if log is None:
                return 0
            return log.base + bisect.bisect_right(log.positions, position)

    def holds(self, topic: str, position: int) -> bool:
        """Whether ``position`` is a retained event of ``topic``."""
        with self._lock:
            log = self._logs.get(topic)
            if log is None:
                return False
            i = bisect.bisect_left(log.positions, position)
            return i < len(log.positions) and log.positions[i] == position

    def read(
        self, topic: str, seq: int, max_events: int, max_bytes: int
    ) -> tuple[list[LoggedEvent], int]:
        """Up to ``max_events`` events from sequence ``seq`` whose wire size fits ``max_bytes``
        (at least one event when any is available). Returns them and the next sequence."""
        if self._oldest_time < self._clock() - self._retention:
            self.enforce_retention()
        with self._lock:
            log = self._logs.get(topic)
            if log is None or max_events <= 0:
                return [], seq
            # Events purged under a reader are skipped: Salesforce does not promise them either.
            seq = max(seq, log.base)
            i = seq - log.base
            chunk = log.events[i : i + max_events]
        size = 0
        for n, ev in enumerate(chunk):
            size += len(ev.wire)
            if size > max_bytes and n:
                return chunk[:n], seq + n
        return chunk, seq + len(chunk)

    # -- retention and purges ----------------------------------------------------------------

    def enforce_retention(self) -> int:
        """Drop events older than the retention window (by the injected clock)."""
        cutoff = self._clock() - self._retention
        with self._lock:
            if not self._times or self._times[0] >= cutoff:
                return 0
            n = bisect.bisect_left(self._times, cutoff)
            return self._drop_through(self._order[n - 1]) if n else 0

    def purge(self, *, before: float | None = None, through: int | None = None) -> int:
        """Drop events appended before epoch time ``before`` and/or at or before position
        ``through``. Replay ids of dropped events stop being valid. Returns how many events
        (counted once, on their own topic) were dropped."""
        dropped = 0
        with self._lock:
            if before is not None and self._times:
                n = bisect.bisect_left(self._times, before)
                if n:
                    dropped += self._drop_through(self._order[n - 1])
            if through is not None:
                dropped += self._drop_through(through)
        return dropped

    def _drop_through(self, position: int) -> int:
        position = min(position, self._position)
        if position < self._floor:
            return 0
        for log in self._logs.values():
            log.drop_through(position)
        n = bisect.bisect_right(self._order, position)
        del self._times[:n]
        del self._order[:n]
        self._oldest_time = self._times[0] if self._times else float("inf")
        self._floor = position + 1
        self._save_state()
        # The journal keeps purged records until the next load compacts it; the saved floor
        # already makes them unreachable.
        if n:
            logger.info("event bus purged %d events through position %d", n, position)
        return n

    # -- listeners ---------------------------------------------------------------------------

    def listen(self, topic: str, callback: Listener) -> None:
        """Call ``callback`` (without arguments, outside the bus lock) after each append that
        adds events to ``topic``."""
        with self._lock:
            self._listeners.setdefault(topic, set()).add(callback)

    def unlisten(self, topic: str, callback: Listener) -> None:
        with self._lock:
            self._listeners.get(topic, set()).discard(callback)

    # -- persistence -------------------------------------------------------------------------

    def close(self) -> None:
        """Flush and close the journal (a no-op without ``state_dir``)."""
        with self._lock:
            self._save_state()
            handle = self._journal
            self._journal = None
        if handle is not None:
            handle.close()

    def _load(self, state_dir: Path) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        state_path = state_dir / _STATE
        if state_path.exists():
            state = json.loads(state_path.read_text())
            self._position = int(state["position"])
            self._floor = int(state["floor"])
            # A fresh generator seeded from the saved position keeps gaps reproducible per run
            # without persisting the generator's internal state.
            self._rng = random.Random(self._position)
        journal = state_dir / _JOURNAL
        if journal.exists():
            self._replay_journal(journal)
            self._rewrite_journal()
        else:
            self._open_journal()

    def _replay_journal(self, journal: Path) -> None:
        data = journal.read_bytes()
        offset = 0
        loaded = 0
        while offset + _RECORD.size <= len(data):
            length, position, time, topic_len = _RECORD.unpack_from(data, offset)
            end = offset + 4 + length
            if end > len(data):
                break
            start = offset + _RECORD.size
            topic = data[start : start + topic_len].decode("utf-8")
            wire = data[start + topic_len : end]
            offset = end
            if position < self._floor:
                continue
            consumer = pb2.ConsumerEvent.FromString(_unwrap(wire))
            entry = _build_event(
                topic,
                position,
                time=time,
                event_id=consumer.event.id,
                schema_id=consumer.event.schema_id,
                payload=consumer.event.payload,
                headers=tuple((h.key, h.value) for h in consumer.event.headers),
            )
            self._store(entry, self.channels_of(topic))
            self._position = max(self._position, position)
            loaded += 1
        if offset != len(data):
            # A torn final record (the process died mid-write) is dropped; every record before
            # it was flushed whole.
            logger.warning("event journal %s ends with a partial record; dropped it", journal)
        logger.info("event bus reloaded %d events from %s", loaded, journal)

    def _open_journal(self) -> None:
        if self._state_dir is not None:
            self._journal = (self._state_dir / _JOURNAL).open("ab")

    def _journal_events(self, events: Sequence[LoggedEvent]) -> None:
        handle = self._journal
        if handle is None:
            return
        handle.write(_journal_records(events))
        handle.flush()

    def _rewrite_journal(self) -> None:
        if self._state_dir is None:
            return
        retained: dict[int, LoggedEvent] = {}
        for log in self._logs.values():
            for ev in log.events:
                retained.setdefault(ev.position, ev)
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        path = self._state_dir / _JOURNAL
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(_journal_records([retained[p] for p in sorted(retained)]))
        tmp.replace(path)
        self._open_journal()

    def _save_state(self) -> None:
        if self._state_dir is None:
            return
        path = self._state_dir / _STATE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"position": self._position, "floor": self._floor}))
        tmp.replace(path)
