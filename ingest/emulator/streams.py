"""The emulator's Subscribe and ManagedSubscribe call streams and the frames they send.

Each call is a :class:`Stream`: a request-reader thread takes FetchRequests (or
ManagedFetchRequests, with their commits) and a response generator hands out events, keepalives
and commit responses as the client's outstanding requests allow.

Subscribe streams are served from bytes encoded once per event on append: a ``FetchResponse``
is the concatenation of its events' wire bytes plus the trailing scalar fields, passed through
an identity serializer. The ``message`` encoding builds protobuf messages instead; it exists as
a cross-check and as the benchmark baseline.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import grpc

from ingest.emulator.eventlog import (
    EventBus,
    LoggedEvent,
    decode_replay_id,
    encode_replay_id,
    encode_varint,
)
from ingest.emulator.faults import Faults
from ingest.emulator.managed import ManagedSubscription, ManagedSubscriptions
from ingest.emulator.rpc_errors import RpcFailure, abort_with, failure
from ingest.emulator.service_settings import ResponseEncoding, ServiceSettings
from ingest.emulator.topics import TopicDef
from ingest.pubsub import pb2

__all__ = ["ManagedStream", "Stream", "StreamHost", "SubscribeStream"]

# The servicer's log lines stay under the service's logger, whichever module writes them.
logger = logging.getLogger("ingest.emulator.service")


class StreamHost(Protocol):
    """What a stream takes from the servicer that runs it
    (:class:`~ingest.emulator.service.PubSubService`)."""

    settings: ServiceSettings
    bus: EventBus
    faults: Faults
    managed: ManagedSubscriptions
    clock: Callable[[], float]

    def note_requested(self, outstanding: int) -> None: ...

    def forget(self, stream: Stream) -> None: ...

    def require_topic(self, name: str) -> TopicDef: ...


# -- response framing -------------------------------------------------------------------------


class _Frames:
    """Builds FetchResponse / ManagedFetchResponse frames for one stream."""

    def __init__(self, rpc_id: str, encoding: ResponseEncoding, *, managed: bool) -> None:
        self._rpc_id = rpc_id
        self._rpc_field = b"\x1a" + encode_varint(len(rpc_id)) + rpc_id.encode("ascii")
        self._prebuilt = encoding == "prebuilt"
        self._message = pb2.ManagedFetchResponse if managed else pb2.FetchResponse

    def batch(self, events: Sequence[LoggedEvent], latest: bytes, pending: int) -> Any:
        if self._prebuilt:
            tail = b"\x12\x0a" + latest + self._rpc_field
            if pending:
                tail += b"\x20" + encode_varint(pending)
            if not events:
                return tail
            return b"".join([ev.wire for ev in events]) + tail
        return self._message(
            events=[ev.consumer_event() for ev in events],
            latest_replay_id=latest,
            rpc_id=self._rpc_id,
            pending_num_requested=pending,
        )

    def commit(self, response: pb2.CommitReplayResponse, latest: bytes, pending: int) -> Any:
        if self._prebuilt:
            body = response.SerializeToString()
            frame: bytes = self.batch((), latest, pending)
            return frame + b"\x2a" + encode_varint(len(body)) + body
        return pb2.ManagedFetchResponse(
            latest_replay_id=latest,
            rpc_id=self._rpc_id,
            pending_num_requested=pending,
            commit_response=response,
        )


# -- streams ----------------------------------------------------------------------------------


class Stream:
    """One Subscribe or ManagedSubscribe call: a request-reader thread and the response
    generator share this state under ``cond``."""

    managed = False

    def __init__(self, service: StreamHost, context: grpc.ServicerContext, rpc_id: str):
        self.service = service
        self.context = context
        self.rpc_id = rpc_id
        s = service.settings
        self.frames = _Frames(rpc_id, s.response_encoding, managed=self.managed)
        self.cond = threading.Condition()
        self.topic = ""
        self.seq = 0
        self.pending = 0
        self.started = False
        self.closed = False
        self.error: RpcFailure | None = None
        now = time.monotonic()
        self.opened = now
        self.last_sent = now
        self.latest = b""
        self.max_sent = -1  # highest position handed to this client (event or keepalive)
        self.cut_generation = -1
        self.cut_count = 0
        self.delivered = 0
        # Leave room for the trailing scalar fields (and a commit response) of a frame.
        self.budget = max(1, s.max_response_bytes - 256)

    # -- lifecycle ---------------------------------------------------------------------------

    def wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def close(self, error: RpcFailure | None = None) -> None:
        with self.cond:
            if error is not None and self.error is None and not self.closed:
                self.error = error
            else:
                self.closed = True
            self.cond.notify_all()

    def _cleanup(self) -> None:
        with self.cond:
            self.closed = True
        if self.topic:
            self.service.bus.unlisten(self.topic, self.wake)
        self.service.forget(self)

    def serve(self, requests: Iterator[Any]) -> Iterator[Any]:
        reader = threading.Thread(
            target=self._read, args=(requests,), name=f"sfcdc-emulator-reader-{self.rpc_id}"
        )
        reader.daemon = True
        reader.start()
        faults = self.service.faults
        try:
            while True:
                frame = self._next_frame()
                if frame is None:
                    return
                if faults.latency:
                    time.sleep(faults.latency)
                yield frame
        except RpcFailure as exc:
            abort_with(self.context, self.rpc_id, exc)
        finally:
            self._cleanup()

    def _read(self, requests: Iterator[Any]) -> None:
        try:
            for request in requests:
                with self.cond:
                    if self.closed or self.error is not None:
                        return
                    try:
                        self.handle(request)
                    except RpcFailure as exc:
                        self.error = exc
                    self.cond.notify_all()
        except Exception:
            with self.cond:
                self.closed = True
                self.cond.notify_all()

    # -- requests ----------------------------------------------------------------------------

    def handle(self, request: Any) -> None:
        raise NotImplementedError

    def start_at(self, topic: str, seq: int, pending: int) -> None:
        self.topic = topic
        self.seq = seq
        self.service.note_requested(pending)
        self.pending = min(self.service.settings.max_pending, pending)
        self.started = True
        self.service.bus.listen(topic, self.wake)

    def add_pending(self, n: int) -> None:
        # Salesforce caps what a stream may have outstanding; asking for more counts as the cap.
        self.service.note_requested(self.pending + n)
        self.pending = min(self.service.settings.max_pending, self.pending + n)

    def resolve_start(self, topic: str, preset: int, replay_id: bytes) -> int:
        bus = self.service.bus
        if preset == pb2.LATEST:
            return bus.end(topic)
        if preset == pb2.EARLIEST:
            return bus.start(topic)
        if preset == pb2.CUSTOM:
            if not replay_id:
                raise failure("subscription.fetch.replayid.validation.failed")
            position = decode_replay_id(replay_id)
            if (
                position is None
                or not bus.is_valid(position)
                or self.service.faults.rejects_replay(position)
            ):
                raise failure("subscription.fetch.replayid.corrupted")
            return bus.seq_after(topic, position)
        raise failure(
            "subscription.fetch.request.invalid",
            detail=f"replay_preset must be LATEST (0), EARLIEST (1) or CUSTOM (2), got {preset}",
        )

    # -- responses ---------------------------------------------------------------------------

    def extra_deadline(self, now: float) -> float:
        return float("inf")

    def pop_control_frame(self) -> Any | None:
        return None

    def _next_frame(self) -> Any | None:
        service = self.service
        settings = service.settings
        faults = service.faults
        bus = service.bus
        with self.cond:
            while True:
                if self.error is not None:
                    raise self.error
                if self.closed:
                    return None
                control = self.pop_control_frame()
                if control is not None:
                    return control
                now = time.monotonic()
                if self.started:
                    limit = self.pending
                    generation, cut = faults.stream_cut
                    if generation != self.cut_generation:
                        self.cut_generation = generation
                        self.cut_count = 0
                    if cut is not None:
                        remaining = cut.after_events - self.cut_count
                        if remaining <= 0:
                            fired = faults.fire_stream_cut(generation)
                            if fired is not None:
                                logger.info(
                                    "stream %s cut by fault after %d events",
                                    self.rpc_id,
                                    self.cut_count,
                                )
                                raise failure(fired.code)
                            continue
                        limit = min(limit, remaining)
                    if limit > 0 and not faults.keepalive_only:
                        events, self.seq = bus.read(self.topic, self.seq, limit, self.budget)
                        if events:
                            n = len(events)
                            self.pending -= n
                            self.cut_count += n
                            self.delivered += n
                            self.latest = events[-1].replay_id
                            self.max_sent = max(self.max_sent, events[-1].position)
                            self.last_sent = now
                            return self.frames.batch(events, self.latest, self.pending)
                    if self.pending > 0:
                        deadline = self.last_sent + settings.keepalive_interval
                        if now >= deadline:
                            frame = self._keepalive(now)
                            if frame is not None:
                                return frame
                            continue
                    else:
                        deadline = self.last_sent + settings.idle_timeout
                else:
                    deadline = self.opened + settings.idle_timeout
                if self.pending <= 0 and now >= deadline:
                    logger.info(
                        "stream %s closed: no fetch request within %gs of the last response",
                        self.rpc_id,
                        settings.idle_timeout,
                    )
                    return None
                deadline = min(deadline, self.extra_deadline(now))
                self.cond.wait(max(0.0, deadline - now))

    def _keepalive(self, now: float) -> Any | None:
        bus = self.service.bus
        if self.service.faults.keepalive_only:
            # The fault withholds waiting events on purpose.
            position = bus.advance()
        else:
            # None: an event arrived since the read above; deliver it instead.
            moved = bus.advance_past(self.topic, self.seq)
            if moved is None:
                return None
            position = moved
        self.note_keepalive(position)
        self.latest = encode_replay_id(position)
        self.max_sent = max(self.max_sent, position)
        self.last_sent = now
        return self.frames.batch((), self.latest, self.pending)

    def note_keepalive(self, position: int) -> None:
        pass


class SubscribeStream(Stream):
    def handle(self, request: pb2.FetchRequest) -> None:
        service = self.service
        if not self.started:
            topic = request.topic_name
            service.require_topic(topic)
            seq = self.resolve_start(topic, request.replay_preset, request.replay_id)
            if request.num_requested <= 0:
                raise failure(
                    "subscription.fetch.requested.events.invalid", n=request.num_requested
                )
            self.start_at(topic, seq, request.num_requested)
            logger.info(
                "subscribe %s: topic=%s preset=%s num_requested=%d",
                self.rpc_id,
                topic,
                pb2.ReplayPreset.Name(request.replay_preset),
                request.num_requested,
            )
            return
        if request.topic_name and request.topic_name != self.topic:
            raise failure(
                "subscription.fetch.topic.mismatch",
                expected=self.topic,
                received=request.topic_name,
            )
        if request.num_requested <= 0:
            raise failure("subscription.fetch.requested.events.invalid", n=request.num_requested)
        self.add_pending(request.num_requested)


class ManagedStream(Stream):
    managed = True

    def __init__(self, service: StreamHost, context: grpc.ServicerContext, rpc_id: str):
        super().__init__(service, context, rpc_id)
        self.subscription: ManagedSubscription | None = None
        self.leased = False
        self.commits: deque[pb2.CommitReplayResponse] = deque()
        self.keepalives: set[int] = set()
        self.last_commit = self.opened

    def note_keepalive(self, position: int) -> None:
        self.keepalives.add(position)

    def extra_deadline(self, now: float) -> float:
        if not self.started:
            return float("inf")
        deadline = self.last_commit + self.service.settings.no_commit_timeout
        if now >= deadline:
            raise failure(
                "managed.subscription.commit.timeout",
                seconds=self.service.settings.no_commit_timeout,
            )
        return deadline

    def pop_control_frame(self) -> Any | None:
        if not self.commits:
            return None
        response = self.commits.popleft()
        return self.frames.commit(response, self.latest, self.pending)

    def _cleanup(self) -> None:
        super()._cleanup()
        if self.leased and self.subscription is not None:
            self.leased = False
            self.service.managed.release(self.subscription.config.subscription_id)

    def handle(self, request: pb2.ManagedFetchRequest) -> None:
        if not self.started:
            self._first(request)
            return
        if request.num_requested < 0:
            raise failure(
                "managed.subscription.fetch.request.events.invalid", n=request.num_requested
            )
        has_commit = request.HasField("commit_replay_id_request")
        if not has_commit and request.num_requested == 0:
            raise failure(
                "managed.subscription.fetch.request.invalid",
                detail="a request after the first needs num_requested > 0 or a "
                "commit_replay_id_request",
            )
        if has_commit:
            self.commits.append(self._commit(request.commit_replay_id_request))
            self.last_commit = time.monotonic()
        if request.num_requested:
            self.add_pending(request.num_requested)

    def _first(self, request: pb2.ManagedFetchRequest) -> None:
        service = self.service
        org = service.settings.org_id
        if request.HasField("commit_replay_id_request"):
            raise failure("managed.subscription.fetch.request.commit.request.restricted")
        sub_id = request.subscription_id
        name = request.developer_name
        if not sub_id and not name:
            raise failure("managed.subscription.id.or.developer.name.empty")
        if sub_id:
            if len(sub_id) not in (15, 18) or not sub_id.startswith("18x"):
                raise failure("managed.subscription.subscription.id.invalid", sub_id=sub_id)
            sub = service.managed.by_id(sub_id)
            if sub is None:
                raise failure(
                    "managed.subscription.subscription.id.not.found", sub_id=sub_id, org=org
                )
            if name and name != sub.config.developer_name:
                raise failure(
                    "managed.subscription.fetch.request.invalid",
                    detail=f"subscription_id {sub_id} belongs to "
                    f"{sub.config.developer_name}, not {name}",
                )
        else:
            sub = service.managed.by_name(name)
            if sub is None:
                raise failure("managed.subscription.developer.name.not.found", name=name, org=org)
        config = sub.config
        if config.state == "STOP":
            raise failure("managed.subscription.config.stopped", name=config.developer_name)
        service.require_topic(config.topic)
        if request.num_requested < 0:
            raise failure(
                "managed.subscription.fetch.request.events.invalid", n=request.num_requested
            )
        if not service.managed.acquire(config.subscription_id):
            raise failure("managed.subscription.already.active", name=config.developer_name)
        self.leased = True
        self.subscription = sub
        seq, how = self._start_seq(sub)
        self.start_at(config.topic, seq, request.num_requested)
        logger.info(
            "managed subscribe %s: %s topic=%s start=%s",
            self.rpc_id,
            config.developer_name,
            config.topic,
            how,
        )

    def _start_seq(self, sub: ManagedSubscription) -> tuple[int, str]:
        bus = self.service.bus
        topic = sub.config.topic
        committed = self.service.managed.committed(sub.config.subscription_id)
        if committed is not None:
            position = decode_replay_id(committed)
            if position is not None and bus.is_valid(position):
                self.max_sent = position
                return bus.seq_after(topic, position), "after committed replay id"
            preset = sub.config.error_recovery_replay
            how = f"{preset} (committed replay id no longer valid)"
        else:
            preset = sub.config.default_replay
            how = f"{preset} (nothing committed)"
        if preset == "EARLIEST":
            return bus.start(topic), how
        return bus.end(topic), how

    def _commit(self, request: pb2.CommitReplayRequest) -> pb2.CommitReplayResponse:
        service = self.service
        assert self.subscription is not None
        sub_id = self.subscription.config.subscription_id
        response = pb2.CommitReplayResponse(
            commit_request_id=request.commit_request_id,
            replay_id=request.replay_id,
            process_time=int(service.clock() * 1000),
        )
        problem = self._commit_problem(sub_id, request.replay_id)
        if problem:
            response.error.code = pb2.COMMIT
            response.error.msg = problem
            logger.info("managed commit %s refused: %s", self.rpc_id, problem)
        else:
            # Kept in the form the emulator issues, whichever form the client sent.
            position = decode_replay_id(request.replay_id)
            assert position is not None  # _commit_problem refused anything else
            service.managed.commit(sub_id, encode_replay_id(position))
        return response

    def _commit_problem(self, sub_id: str, replay_id: bytes) -> str:
        bus = self.service.bus
        if not replay_id:
            return "The commit request has no replay ID."
        position = decode_replay_id(replay_id)
        if position is None:
            return f"The replay ID {replay_id.hex()} is malformed."
        committed = self.service.managed.committed(sub_id)
        committed_position = decode_replay_id(committed) if committed else None
        if committed_position is not None and position < committed_position:
            return (
                f"The replay ID {replay_id.hex()} is older than the committed replay ID "
                f"{committed.hex() if committed else ''}."
            )
        if position > self.max_sent:
            return f"The replay ID {replay_id.hex()} hasn't been delivered on this stream yet."
        if not bus.is_valid(position):
            return f"The replay ID {replay_id.hex()} is no longer retained."
        if not (
            position == committed_position
            or position in self.keepalives
            or bus.holds(self.topic, position)
        ):
            return f"The replay ID {replay_id.hex()} is unknown on topic {self.topic}."
        return ""
