"""What a subscription yields, and the flow-controlled stream underneath it.

Iterating a subscription yields first-class lifecycle items:

- :class:`EventBatch`: the events of one server response, in replay order;
- :class:`Keepalive`: an empty response; its ``latest_replay_id`` may be stored as the
  checkpoint even though no event came (Salesforce recommends exactly that);
- :class:`Resubscribed`: a new stream is about to start after a failure; events handed out
  earlier but not yet durably stored must be dropped, because they come again;
- :class:`ReplayGap`: the stored position was rejected and the corrupted-replay policy moved
  the subscription elsewhere; both positions are reported, never silently;
- :class:`CommitFailed` (ManagedSubscribe only): the server refused a commit.

Flow control. Salesforce lets at most 100 events be outstanding on a stream. A reader thread
receives responses into a buffer; a :class:`FlowWindow` decides how many more events to ask
for: whenever the consumer takes events from the buffer (so requests go out while the
consumer is still working on what it took) and whenever events arrive while the buffer has
room. Events outstanding at the server plus events buffered never exceed ``buffer_events``
(and nothing is requested while ``buffer_bytes`` are buffered), so a slow consumer stops the
requests and memory stays bounded, while a consumer busy with a slow commit finds the next
events already received when it comes back. If nothing is outstanding for
``idle_fetch_after`` seconds (the consumer is stuck on a slow commit and the buffer is full),
a one-event request keeps the server from closing the stream under its 60-second rule.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import FrozenInstanceError, dataclass, field
from typing import Any, Generic, TypeVar

import grpc

from ingest.client.errors import Failure, classify, classify_status
from ingest.replay import ReplayId, StartPosition

__all__ = [
    "DEFAULT_BUFFER_BYTES",
    "DEFAULT_BUFFER_EVENTS",
    "MAX_REQUESTED",
    "CommitFailed",
    "EventBatch",
    "EventColumns",
    "FlowWindow",
    "Item",
    "Keepalive",
    "ReceivedEvent",
    "ReplayGap",
    "Resubscribed",
    "StreamStats",
]

MAX_REQUESTED = 100
# Enough to keep receiving through a slow Delta commit; with typical 1-3 KB change events this
# is a few MB, and the byte bound caps it for large ones.
DEFAULT_BUFFER_EVENTS = 1000
DEFAULT_BUFFER_BYTES = 32 * 1024 * 1024

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReceivedEvent:
    """One delivered event: its replay id, event id (UUID), writer schema id and Avro bytes."""

    replay_id: ReplayId
    event_id: str
    schema_id: str
    payload: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class EventColumns:
    """The events of one server response as parallel columns, in replay order: what a
    consumer that stores events column by column (bronze landing) reads, without one
    :class:`ReceivedEvent` per event."""

    replay_ids: tuple[bytes, ...]
    event_ids: tuple[str, ...]
    schema_ids: tuple[str, ...]
    payloads: tuple[bytes, ...] = field(repr=False)

    def __post_init__(self) -> None:
        sizes = {
            len(self.replay_ids),
            len(self.event_ids),
            len(self.schema_ids),
            len(self.payloads),
        }
        if len(sizes) != 1:
            raise ValueError(
                "EventColumns needs columns of one length (got replay_ids "
                f"{len(self.replay_ids)}, event_ids {len(self.event_ids)}, schema_ids "
                f"{len(self.schema_ids)}, payloads {len(self.payloads)})"
            )

    def __len__(self) -> int:
        return len(self.replay_ids)

    @classmethod
    def of(cls, events: Sequence[ReceivedEvent]) -> EventColumns:
        """The columns of ``events``."""
        return cls(
            tuple([e.replay_id.value for e in events]),
            tuple([e.event_id for e in events]),
            tuple([e.schema_id for e in events]),
            tuple([e.payload for e in events]),
        )

    def events(self) -> tuple[ReceivedEvent, ...]:
        """One :class:`ReceivedEvent` per row."""
        new_replay_id = ReplayId.__new__
        set_value = object.__setattr__
        out = []
        for rid, event_id, schema_id, payload in zip(
            self.replay_ids, self.event_ids, self.schema_ids, self.payloads, strict=True
        ):
            # Bytes from the server or from a ReplayId already; skip re-validating them.
            replay_id = new_replay_id(ReplayId)
            set_value(replay_id, "value", rid)
            out.append(ReceivedEvent(replay_id, event_id, schema_id, payload))
        return tuple(out)


class EventBatch:
    """The events of one server response. ``latest_replay_id`` is the stream position after
    the batch; ``pending_num_requested`` is what the server still owes the stream.

    The events are held in one of two forms and the other is derived on first use (and
    kept): :attr:`events`, one :class:`ReceivedEvent` each, and :attr:`columns`, parallel
    columns. The client builds batches from columns (:meth:`of_columns`), which costs no
    object per event for consumers that read only the columns. Immutable.
    """

    __slots__ = (
        "_columns",
        "_events",
        "latest_replay_id",
        "pending_num_requested",
        "received_at",
        "rpc_id",
        "topic",
    )
    __match_args__ = (
        "topic",
        "events",
        "latest_replay_id",
        "rpc_id",
        "received_at",
        "pending_num_requested",
    )

    topic: str
    latest_replay_id: ReplayId
    rpc_id: str
    received_at: float
    pending_num_requested: int
    _events: tuple[ReceivedEvent, ...] | None
    _columns: EventColumns | None

    # Positional like the dataclass it replaced, so existing callers keep working.
    def __init__(  # noqa: PLR0917
        self,
        topic: str,
        events: tuple[ReceivedEvent, ...],
        latest_replay_id: ReplayId,
        rpc_id: str,
        received_at: float,
        pending_num_requested: int = 0,
    ) -> None:
        self._init(topic, latest_replay_id, rpc_id, received_at, pending_num_requested)
        _set(self, "_events", events)
        _set(self, "_columns", None)

    @classmethod
    def of_columns(
        cls,
        topic: str,
        columns: EventColumns,
        *,
        latest_replay_id: ReplayId,
        rpc_id: str,
        received_at: float,
        pending_num_requested: int = 0,
    ) -> EventBatch:
        """A batch holding ``columns``; :attr:`events` is built only if asked for."""
        batch = cls.__new__(cls)
        batch._init(topic, latest_replay_id, rpc_id, received_at, pending_num_requested)
        _set(batch, "_events", None)
        _set(batch, "_columns", columns)
        return batch

    def _init(
        self,
        topic: str,
        latest_replay_id: ReplayId,
        rpc_id: str,
        received_at: float,
        pending_num_requested: int,
    ) -> None:
        _set(self, "topic", topic)
        _set(self, "latest_replay_id", latest_replay_id)
        _set(self, "rpc_id", rpc_id)
        _set(self, "received_at", received_at)
        _set(self, "pending_num_requested", pending_num_requested)

    @property
    def events(self) -> tuple[ReceivedEvent, ...]:
        """The events, one :class:`ReceivedEvent` each, in replay order."""
        events = self._events
        if events is None:
            assert self._columns is not None
            events = self._columns.events()
            _set(self, "_events", events)
        return events

    @property
    def columns(self) -> EventColumns:
        """The events as parallel columns, in replay order."""
        columns = self._columns
        if columns is None:
            assert self._events is not None
            columns = EventColumns.of(self._events)
            _set(self, "_columns", columns)
        return columns

    def __len__(self) -> int:
        columns = self._columns
        return len(columns) if columns is not None else len(self.events)

    def _key(self) -> tuple[Any, ...]:
        return (
            self.topic,
            self.columns,
            self.latest_replay_id,
            self.rpc_id,
            self.received_at,
            self.pending_num_requested,
        )

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, EventBatch)
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            EventBatch,
            (
                self.topic,
                self.events,
                self.latest_replay_id,
                self.rpc_id,
                self.received_at,
                self.pending_num_requested,
            ),
        )

    def __repr__(self) -> str:
        return (
            f"EventBatch(topic={self.topic!r}, events=<{len(self)} events>, "
            f"latest_replay_id={self.latest_replay_id!r}, rpc_id={self.rpc_id!r}, "
            f"received_at={self.received_at!r}, "
            f"pending_num_requested={self.pending_num_requested!r})"
        )


_set = object.__setattr__


@dataclass(frozen=True, slots=True)
class Keepalive:
    """An empty response: the stream is healthy and its position is ``latest_replay_id``."""

    topic: str
    latest_replay_id: ReplayId
    rpc_id: str
    received_at: float
    pending_num_requested: int = 0


@dataclass(frozen=True, slots=True)
class Resubscribed:
    """A new stream starts at ``position`` after a failure (``reason``).

    Drop events that were handed out but are not yet durably stored: the new stream delivers
    them again. ``attempt`` counts the consecutive failed streams before this one.
    ``position`` is ``None`` for managed subscriptions, where the server resumes after the
    last committed replay id.
    """

    topic: str
    position: StartPosition | None
    attempt: int
    reason: str


@dataclass(frozen=True, slots=True)
class ReplayGap:
    """The server rejected ``requested`` (unknown or expired replay id); the configured policy
    resumed at ``resumed`` instead. Events between the two may be missing (``latest``) or
    repeated (``earliest``)."""

    topic: str
    requested: StartPosition
    resumed: StartPosition
    reason: str


@dataclass(frozen=True, slots=True)
class CommitFailed:
    """The server refused a ManagedSubscribe commit of ``replay_id``. The server-side position
    did not advance past it; events after the last successful commit will be delivered again
    on the next stream."""

    topic: str
    commit_request_id: str
    replay_id: ReplayId
    error: str


@dataclass(frozen=True, slots=True)
class TopicFailed:
    """The topic's subscription failed for good (``error``, e.g. the topic does not exist or
    the user cannot read it) and ended; the other topics of a
    :class:`~ingest.client.multi.MultiSubscription` go on."""

    topic: str
    error: BaseException


Item = EventBatch | Keepalive | Resubscribed | ReplayGap | CommitFailed | TopicFailed


@dataclass(frozen=True, slots=True)
class StreamStats:
    """Counters of one subscription since it was created."""

    events: int
    batches: int
    keepalives: int
    fetch_requests: int
    streams: int
    outstanding: int
    buffered: int
    server_pending: int
    # The flow-control window: events asked for at most per FetchRequest (num_requested).
    window: int = 0
    # A stream is open, and the seconds since its last request or response (its silence).
    open: bool = False
    quiet_seconds: float = 0.0


class FlowWindow:
    """How many events to request, and when. Thread-safe; no I/O.

    ``window`` (at most 100) bounds events outstanding at the server; ``buffer_events``
    bounds outstanding plus received-but-not-taken events, and no request goes out while
    ``buffer_bytes`` or more are buffered (so memory stays below ``buffer_bytes`` plus one
    window of events). A request is granted once the free room reaches ``min_request`` (a
    quarter of the window), so a trickle of single events does not cause a request per event.
    """

    def __init__(
        self,
        window: int = MAX_REQUESTED,
        buffer_events: int | None = None,
        buffer_bytes: int | None = None,
    ) -> None:
        if not 1 <= window <= MAX_REQUESTED:
            raise ValueError(
                f"num_requested must be between 1 and {MAX_REQUESTED} (got {window}); "
                "Salesforce treats anything above 100 as 100"
            )
        buffer_events = window if buffer_events is None else buffer_events
        if buffer_events < window:
            raise ValueError(
                f"buffer_events must be >= num_requested ({window}) (got {buffer_events})"
            )
        if buffer_bytes is not None and buffer_bytes <= 0:
            raise ValueError(f"buffer_bytes must be > 0 (got {buffer_bytes})")
        self.window = window
        self.buffer_events = buffer_events
        self.buffer_bytes = buffer_bytes
        self.min_request = max(1, window // 4)
        self._lock = threading.Lock()
        self.outstanding = 0
        self.buffered = 0
        self.buffered_bytes = 0
        self.server_pending = 0
        self.overdelivered = 0

    def _room(self) -> int:
        if self.buffer_bytes is not None and self.buffered_bytes >= self.buffer_bytes:
            return 0
        return min(
            self.window - self.outstanding, self.buffer_events - self.outstanding - self.buffered
        )

    def _grant_locked(self, minimum: int) -> int:
        room = self._room()
        if room < minimum or room <= 0:
            return 0
        self.outstanding += room
        return room

    def initial(self) -> int:
        """The ``num_requested`` of a new stream's first request (resets the counters)."""
        with self._lock:
            self.outstanding = 0
            self.buffered = 0
            self.buffered_bytes = 0
            self.server_pending = 0
            return self._grant_locked(1)

    def received(self, events: int, server_pending: int, nbytes: int = 0) -> int:
        """Events arrived; returns how many more to request now (0 for none)."""
        with self._lock:
            if events > self.outstanding:
                self.overdelivered += events - self.outstanding
            self.outstanding = max(self.outstanding - events, 0)
            self.buffered += events
            self.buffered_bytes += nbytes
            self.server_pending = server_pending
            return self._grant_locked(self.min_request)

    def taken(self, events: int, nbytes: int = 0) -> int:
        """The consumer took events from the buffer; returns how many more to request now."""
        with self._lock:
            self.buffered = max(self.buffered - events, 0)
            self.buffered_bytes = max(self.buffered_bytes - nbytes, 0)
            return self._grant_locked(self.min_request)

    def idle_ping(self) -> int:
        """Nothing is outstanding: ask for one event so the server keeps the stream open."""
        with self._lock:
            if self.outstanding > 0:
                return 0
            self.outstanding += 1
            return 1

    def idle(self) -> bool:
        with self._lock:
            return self.outstanding == 0


def _byte_size(response: Any) -> int:
    return int(response.ByteSize())


class _SizedParser:
    """A gRPC response deserializer that keeps the wire size of the message it parsed last.

    Flow control counts the bytes of every response; asking the parsed message for its size
    walks every event again, while the wire size is known for free when parsing. gRPC parses
    a stream's responses one at a time, each just before the reader receives it, so
    :meth:`size_of` right after receiving a response reads that response's size.

    A stream may also :meth:`listen`: then each response is handed to the listener as soon as
    it is parsed, on gRPC's own thread, and the parser yields ``(response, size)`` pairs.
    """

    __slots__ = ("_last", "_listener", "_parse")

    def __init__(self, parse: Callable[[bytes], Any]) -> None:
        self._parse = parse
        self._last = -1
        self._listener: Callable[[Any, int], None] | None = None

    def __call__(self, data: bytes) -> Any:
        response = self._parse(data)
        listener = self._listener
        if listener is None:
            self._last = len(data)
            return response
        listener(response, len(data))
        return (response, len(data))

    def listen(self, listener: Callable[[Any, int], None]) -> None:
        """Call ``listener(response, wire_size)`` for each response right after parsing it."""
        self._listener = listener

    def size_of(self, response: Any) -> int:
        """The wire size of ``response``, the message parsed last (measured if unknown)."""
        size, self._last = self._last, -1
        return size if size >= 0 else _byte_size(response)


Req = TypeVar("Req")
Resp = TypeVar("Resp")

_STOP = object()


class _Idle:
    """Yielded by a stream iterated with an idle interval when nothing came for that long."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "IDLE"


_IDLE = _Idle()


@dataclass(frozen=True, slots=True)
class _End:
    failure: Failure | None


class _Stream(Generic[Req, Resp]):
    """One open bidi stream: request queue, reader thread and bounded buffer of responses.

    The reader thread does as little as possible while holding the GIL: it counts the events
    of each response, sends the top-up the window allows, and queues the raw response with
    its arrival time (``inspect`` may turn part of a response into items first, for commit
    answers that must be seen even while the consumer is busy). Responses are converted into
    items on the consumer's side, when taken. Iterating yields the items in order, then
    ends; after the end, :attr:`failure` says why the stream stopped (``None`` when it was
    closed locally).
    """

    def __init__(
        self,
        *,
        name: str,
        call: Callable[..., Any],
        first_request: Callable[[int], Req],
        fetch_request: Callable[[int], Req],
        convert: Callable[[Resp, float], list[Any]],
        window: FlowWindow,
        idle_fetch_after: float,
        logger: logging.Logger,
        inspect: Callable[[Resp], list[Any]] | None = None,
        clock: Callable[[], float] = time.time,
        size_of: Callable[[Any], int] | None = None,
        parser: _SizedParser | None = None,
        idle_interval: float | None = None,
    ) -> None:
        self._name = name
        # Count responses as gRPC parses them (see _arrived), when the caller parses them.
        self._early = parser is not None
        self._idle_interval = idle_interval
        self._size_of = size_of if size_of is not None else _byte_size
        self._fetch_request = fetch_request
        self._convert = convert
        self._inspect = inspect
        self._clock = clock
        self._window = window
        self._idle_after = idle_fetch_after
        self._log = logger
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closing = threading.Event()
        self._last_traffic = time.monotonic()
        self.failure: Failure | None = None
        self.fetch_requests = 1
        self.responses = 0
        self._requests.put(first_request(window.initial()))
        if parser is not None:
            parser.listen(self._arrived)
        self._call = call(self._request_iter())
        self._reader = threading.Thread(target=self._read, name=f"sfcdc-reader {name}", daemon=True)
        self._reader.start()

    # -- requests (consumed by grpc's own thread) --

    def _request_iter(self) -> Iterator[Any]:
        wait = max(min(self._idle_after / 4, 1.0), 0.005)
        while True:
            try:
                request = self._requests.get(timeout=wait)
            except queue.Empty:
                if self._closing.is_set():
                    return
                if (
                    time.monotonic() - self._last_traffic >= self._idle_after
                    and self._window.idle_ping()
                ):
                    self._log.debug("%s: nothing outstanding, asking for 1 event", self._name)
                    self._last_traffic = time.monotonic()
                    self.fetch_requests += 1
                    yield self._fetch_request(1)
                continue
            if request is _STOP:
                return
            self._last_traffic = time.monotonic()
            yield request

    def quiet_seconds(self) -> float:
        """Seconds since this stream's last request went out or response came in."""
        return max(time.monotonic() - self._last_traffic, 0.0)

    def send(self, request: Any) -> None:
        """Queue another request on this stream (a top-up or a commit)."""
        if not self._closing.is_set():
            self._requests.put(request)

    def top_up(self, events: int) -> None:
        if events > 0:
            self.fetch_requests += 1
            self.send(self._fetch_request(events))

    # -- responses (reader thread) --

    def _arrived(self, response: Any, size: int) -> None:
        """Count a response and send the top-up the window allows.

        With a listening parser this runs on gRPC's thread as soon as the response is parsed,
        before the reader thread gets it: the server has at most ``window`` events outstanding,
        so every thread hand-over between receiving a response and asking for more is time
        the stream stands still. Otherwise the reader thread calls it. Either way the count
        precedes the hand-over, so the consumer's take never comes first."""
        self._last_traffic = time.monotonic()
        events = len(response.events)
        more = self._window.received(events, response.pending_num_requested, size if events else 0)
        if more:
            self.top_up(more)

    def _read(self) -> None:
        failure: Failure | None = None
        items = self._items
        inspect = self._inspect
        clock = self._clock
        size_of = self._size_of
        early = self._early
        try:
            for received in self._call:
                self.responses += 1
                if early:
                    response, size = received  # counted by the parser already
                else:
                    response = received
                    size = size_of(response) if response.events else 0
                    self._arrived(response, size)
                if inspect is not None:
                    for item in inspect(response):
                        items.put(item)
                items.put((response, clock(), size if response.events else 0))
            if not self._closing.is_set():
                failure = classify_status("OK", description="the server ended the stream")
        except grpc.RpcError as exc:
            if not self._closing.is_set():
                failure = classify(exc)
        except Exception as exc:  # a bug here must end the stream loudly, not hang it
            self._log.exception("%s: reading the stream failed", self._name)
            failure = classify(exc)
        items.put(_End(failure))

    # -- consumer side --

    def __iter__(self) -> Iterator[Any]:
        items = self._items
        window = self._window
        convert = self._convert
        idle = self._idle_interval
        while True:
            if idle is None:
                entry = items.get()
            else:
                try:
                    entry = items.get(timeout=idle)
                except queue.Empty:
                    yield _IDLE
                    continue
            if isinstance(entry, _End):
                self.failure = entry.failure
                return
            if not isinstance(entry, tuple):
                yield entry  # an item made by inspect
                continue
            response, received_at, size = entry
            events = len(response.events)
            if events:
                self.top_up(window.taken(events, size))
            yield from convert(response, received_at)

    def close(self) -> None:
        """End the stream: cancel the call and stop the request iterator."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._requests.put(_STOP)
        cancel = getattr(self._call, "cancel", None)
        if cancel is not None:
            cancel()
        self._reader.join(timeout=5)
