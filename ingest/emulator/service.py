"""The emulator's ``eventbus.v1.PubSub`` servicer: Subscribe, ManagedSubscribe, Publish,
PublishStream, GetTopic and GetSchema, with Salesforce's errors.

Errors are reported the way Salesforce reports them: a gRPC status, a description ending in
`` rpcId: <uuid>``, and the trailers ``error-code`` (``sfdc.platform.eventbus.grpc.<code>``)
and ``rpc-id``. Every response message carries the call's ``rpc_id`` as well.

Subscribe streams are served from bytes encoded once per event on append: a ``FetchResponse``
is the concatenation of its events' wire bytes plus the trailing scalar fields, passed through
an identity serializer. The ``message`` encoding builds protobuf messages instead; it exists as
a cross-check and as the benchmark baseline.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

import grpc

from ingest.emulator.eventlog import (
    EventBus,
    LoggedEvent,
    NewEvent,
    decode_replay_id,
    encode_replay_id,
    encode_varint,
)
from ingest.emulator.faults import Faults
from ingest.emulator.managed import ManagedSubscription, ManagedSubscriptions
from ingest.emulator.oauth import GrantInfo, TokenStore
from ingest.emulator.topics import Catalogue, TopicDef
from ingest.pubsub import pb2, pb2_grpc
from ingest.schema import EventSchema

__all__ = [
    "ERROR_CODE_PREFIX",
    "SERVICE_NAME",
    "PubSubService",
    "ResponseEncoding",
    "RpcFailure",
    "ServiceSettings",
    "abort_with",
    "failure",
]

logger = logging.getLogger(__name__)

SERVICE_NAME = "eventbus.v1.PubSub"
ERROR_CODE_PREFIX = "sfdc.platform.eventbus.grpc."
ResponseEncoding = Literal["prebuilt", "message"]

_S = grpc.StatusCode
# code -> (status, description). Descriptions are Salesforce's where it documents one.
_ERRORS: dict[str, tuple[grpc.StatusCode, str]] = {
    "service.auth.error": (
        _S.UNAUTHENTICATED,
        "An authentication exception occurred. Provide valid authentication via metadata headers.",
    ),
    "service.auth.headers.invalid": (
        _S.UNAUTHENTICATED,
        "The auth headers value for the specified key is invalid. Provide valid auth headers. "
        "The auth headers can't be blank.",
    ),
    "service.unavailable": (_S.UNAVAILABLE, "The Pub/Sub API service is unavailable."),
    "subscription.internal.error": (
        _S.UNAVAILABLE,
        "The subscription encountered an internal error and can't continue. "
        "Try restarting the subscription.",
    ),
    "topic.not.found": (
        _S.NOT_FOUND,
        "The topic information for org CORE/prod/{org} and topic {topic} not found. "
        "Ensure the topic name is correct and that the topic exists.",
    ),
    "topic.validation.empty": (
        _S.INVALID_ARGUMENT,
        "An error occurred while validating the topic information provided. "
        "The topic can't be blank.",
    ),
    "schema.validation.failed": (
        _S.INVALID_ARGUMENT,
        "Schema validation failed. The schema ID can't be blank.",
    ),
    # Salesforce does not document the status for an unknown schema id; NOT_FOUND says what
    # happened and is not retried by clients that retry UNAVAILABLE/INTERNAL.
    "schema.meta.permission": (
        _S.NOT_FOUND,
        "An error occurred while getting the schema for schema ID {schema_id}. Possible reasons "
        "are an incorrect schema ID or incorrect credentials.",
    ),
    "schema.not.found": (
        _S.NOT_FOUND,
        "The schema for schema ID {schema_id} was not found.",
    ),
    "subscription.fetch.requested.events.invalid": (
        _S.INVALID_ARGUMENT,
        "The requested number of events in a fetch request must be greater than zero. "
        "Received: {n}.",
    ),
    "subscription.fetch.topic.mismatch": (
        _S.INVALID_ARGUMENT,
        "There is a mismatch of topic names between requests. "
        "Expected {expected}, received {received}.",
    ),
    "subscription.fetch.replayid.validation.failed": (
        _S.INVALID_ARGUMENT,
        "The Replay ID validation failed. Provide a Replay ID in the custom preset.",
    ),
    "subscription.fetch.replayid.corrupted": (
        _S.INVALID_ARGUMENT,
        "The Replay ID validation failed. Ensure that the Replay ID is valid.",
    ),
    "subscription.fetch.request.invalid": (
        _S.INVALID_ARGUMENT,
        "The fetch request is invalid: {detail}.",
    ),
    "publish.topic.validation.empty": (
        _S.INVALID_ARGUMENT,
        "An error occurred while validating the provided topic information. "
        "The topic can't be blank.",
    ),
    "publish.event.count.invalid": (_S.INVALID_ARGUMENT, "The request contains no events."),
    "publish.topic.mismatch": (
        _S.INVALID_ARGUMENT,
        "There is a mismatch of topic names between requests. "
        "Expected {expected}, received {received}.",
    ),
    "publish.auth.refresh.invalid": (
        _S.INVALID_ARGUMENT,
        "The refresh token shouldn't be provided in the initial request.",
    ),
    "managed.subscription.id.or.developer.name.empty": (
        _S.INVALID_ARGUMENT,
        "The first managed fetch request must set subscription_id or developer_name; "
        "both are blank.",
    ),
    "managed.subscription.subscription.id.invalid": (
        _S.INVALID_ARGUMENT,
        "The managed subscription ID must be a 15- or 18-character ID with key prefix 18x. "
        "Received: {sub_id}.",
    ),
    "managed.subscription.subscription.id.not.found": (
        _S.NOT_FOUND,
        "No managed subscription with ID {sub_id} exists in org {org}.",
    ),
    "managed.subscription.developer.name.not.found": (
        _S.NOT_FOUND,
        "No managed subscription with developer name {name} exists in org {org}.",
    ),
    "managed.subscription.config.stopped": (
        _S.FAILED_PRECONDITION,
        "The managed subscription {name} is in state STOP. Set its state to RUN to subscribe.",
    ),
    "managed.subscription.already.active": (
        _S.ALREADY_EXISTS,
        "The managed subscription {name} already has an active client. "
        "Only one client can subscribe at a time.",
    ),
    "managed.subscription.fetch.request.commit.request.restricted": (
        _S.INVALID_ARGUMENT,
        "A commit request isn't allowed in the first managed fetch request.",
    ),
    "managed.subscription.fetch.request.events.invalid": (
        _S.INVALID_ARGUMENT,
        "The requested number of events in a managed fetch request must be zero or greater. "
        "Received: {n}.",
    ),
    "managed.subscription.fetch.request.invalid": (
        _S.INVALID_ARGUMENT,
        "The managed fetch request is invalid: {detail}.",
    ),
    # Observed on Salesforce as DEADLINE_EXCEEDED with this text; the error-code trailer of
    # that close is not documented, so the emulator names it after the managed family.
    "managed.subscription.commit.timeout": (
        _S.DEADLINE_EXCEEDED,
        "No CommitReplayRequests sent in the last {seconds:g} seconds. "
        "Closing managed subscription.",
    ),
}


class RpcFailure(Exception):
    """A failure to report to the client as a gRPC status with Salesforce trailers."""

    def __init__(self, status: grpc.StatusCode, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def failure(code: str, **details: object) -> RpcFailure:
    """The :class:`RpcFailure` for a Salesforce error code (without its common prefix)."""
    status, template = _ERRORS[code]
    return RpcFailure(status, code, template.format(**details))


def abort_with(context: grpc.ServicerContext, rpc_id: str, error: RpcFailure) -> NoReturn:
    """End the call with ``error``: status, description ending ``rpcId: <id>``, trailers."""
    context.set_trailing_metadata(
        (("error-code", ERROR_CODE_PREFIX + error.code), ("rpc-id", rpc_id))
    )
    logger.info("rpc %s failed: %s %s", rpc_id, error.status.name, error.code)
    context.abort(error.status, f"{error.message} rpcId: {rpc_id}")
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


@dataclass(frozen=True)
class ServiceSettings:
    """The servicer's knobs; see :class:`~ingest.emulator.server.EmulatorConfig`."""

    org_id: str
    instance_url: str
    keepalive_interval: float = 270.0
    idle_timeout: float = 60.0
    no_commit_timeout: float = 1800.0
    max_pending: int = 100
    max_response_bytes: int = 3 * 1024 * 1024
    max_event_bytes: int = 1024 * 1024
    response_encoding: ResponseEncoding = "prebuilt"


def _same_url(a: str, b: str) -> bool:
    return a.strip().rstrip("/").lower() == b.strip().rstrip("/").lower()


def _identity(data: bytes) -> bytes:
    return data


def _serialize(message: Any) -> bytes:
    return bytes(message.SerializeToString())


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


class _Stream:
    """One Subscribe or ManagedSubscribe call: a request-reader thread and the response
    generator share this state under ``cond``."""

    managed = False

    def __init__(self, service: PubSubService, context: grpc.ServicerContext, rpc_id: str):
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
        self.service._forget(self)

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


class _SubscribeStream(_Stream):
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


class _ManagedStream(_Stream):
    managed = True

    def __init__(self, service: PubSubService, context: grpc.ServicerContext, rpc_id: str):
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


# -- the servicer -----------------------------------------------------------------------------


class PubSubService(pb2_grpc.PubSubServicer):
    """The ``eventbus.v1.PubSub`` servicer over an :class:`EventBus`.

    Register it with :meth:`register` (not the generated ``add_PubSubServicer_to_server``):
    Subscribe and ManagedSubscribe need the pre-encoded response serializer.
    """

    def __init__(
        self,
        *,
        catalogue: Catalogue,
        bus: EventBus,
        tokens: TokenStore,
        managed: ManagedSubscriptions,
        faults: Faults,
        settings: ServiceSettings,
        clock: Callable[[], float],
    ) -> None:
        self.catalogue = catalogue
        self.bus = bus
        self.tokens = tokens
        self.managed = managed
        self.faults = faults
        self.settings = settings
        self.clock = clock
        self._lock = threading.Lock()
        self._streams: set[_Stream] = set()
        # The most events any client had asked for and not yet received on one stream, before
        # the cap applies: a well-behaved client keeps it <= max_pending.
        self.peak_requested = 0
        self._served_schemas: dict[str, EventSchema] = {}
        self._org15 = settings.org_id[:15]
        faults.on_change(self._wake_all)

    # -- wiring ------------------------------------------------------------------------------

    def method_handlers(self) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
        """The six RPCs as gRPC method handlers, keyed by method name."""
        stream_out = _identity if self.settings.response_encoding == "prebuilt" else _serialize
        return {
            "Subscribe": grpc.stream_stream_rpc_method_handler(
                self.Subscribe,
                request_deserializer=pb2.FetchRequest.FromString,
                response_serializer=stream_out,
            ),
            "GetSchema": grpc.unary_unary_rpc_method_handler(
                self.GetSchema,
                request_deserializer=pb2.SchemaRequest.FromString,
                response_serializer=_serialize,
            ),
            "GetTopic": grpc.unary_unary_rpc_method_handler(
                self.GetTopic,
                request_deserializer=pb2.TopicRequest.FromString,
                response_serializer=_serialize,
            ),
            "Publish": grpc.unary_unary_rpc_method_handler(
                self.Publish,
                request_deserializer=pb2.PublishRequest.FromString,
                response_serializer=_serialize,
            ),
            "PublishStream": grpc.stream_stream_rpc_method_handler(
                self.PublishStream,
                request_deserializer=pb2.PublishRequest.FromString,
                response_serializer=_serialize,
            ),
            "ManagedSubscribe": grpc.stream_stream_rpc_method_handler(
                self.ManagedSubscribe,
                request_deserializer=pb2.ManagedFetchRequest.FromString,
                response_serializer=stream_out,
            ),
        }

    def register(self, server: grpc.Server) -> None:
        """Serve this servicer's six RPCs on ``server``."""
        handlers = self.method_handlers()
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),)
        )
        server.add_registered_method_handlers(SERVICE_NAME, handlers)  # type: ignore[attr-defined]

    def shutdown(self) -> None:
        """End every open stream with UNAVAILABLE (the service is going away)."""
        with self._lock:
            streams = list(self._streams)
        for stream in streams:
            stream.close(failure("service.unavailable"))
        self.faults.remove_listener(self._wake_all)

    def _wake_all(self) -> None:
        with self._lock:
            streams = list(self._streams)
        for stream in streams:
            stream.wake()

    def note_requested(self, outstanding: int) -> None:
        """A client now has ``outstanding`` events requested and undelivered on a stream."""
        self.peak_requested = max(self.peak_requested, outstanding)

    def _track(self, stream: _Stream) -> None:
        with self._lock:
            self._streams.add(stream)

    def _forget(self, stream: _Stream) -> None:
        with self._lock:
            self._streams.discard(stream)

    # -- common checks -----------------------------------------------------------------------

    def authenticate(self, context: grpc.ServicerContext) -> GrantInfo:
        """Check ``accesstoken`` / ``instanceurl`` / ``tenantid`` (or their ``x-sfdc-*``
        aliases). Raises :class:`RpcFailure` when they are missing or wrong."""
        headers: dict[str, str] = {}
        for key, value in context.invocation_metadata():
            if isinstance(value, str):
                headers.setdefault(key.lower(), value)
        token = headers.get("accesstoken") or headers.get("x-sfdc-api-session-token") or ""
        instance = headers.get("instanceurl") or headers.get("x-sfdc-instance-url") or ""
        tenant = headers.get("tenantid") or headers.get("x-sfdc-tenant-id") or ""
        if not token.strip() or not instance.strip() or not tenant.strip():
            missing = [
                name
                for name, value in (
                    ("accesstoken", token),
                    ("instanceurl", instance),
                    ("tenantid", tenant),
                )
                if not value.strip()
            ]
            logger.info("rpc rejected: blank auth headers %s", missing)
            raise failure("service.auth.headers.invalid")
        grant = self.tokens.check(token.strip())
        reason = ""
        if grant is None:
            reason = "access token unknown, expired or revoked"
        elif grant.org_id != self.settings.org_id:
            reason = "access token issued for another org"
        elif not _same_url(instance, self.settings.instance_url):
            reason = "instanceurl does not match this org's instance"
        elif not self._tenant_matches(tenant.strip()):
            reason = "tenantid does not name this org"
        if grant is None or reason:
            logger.info("rpc rejected: %s", reason)
            raise failure("service.auth.error")
        return grant

    def _tenant_matches(self, tenant: str) -> bool:
        org = tenant
        if "/" in tenant:
            parts = tenant.split("/")
            if len(parts) != 3 or parts[0].lower() != "core" or not parts[1]:
                return False
            org = parts[2]
        if len(org) == 15:
            return org == self._org15
        return len(org) == 18 and org.lower() == self.settings.org_id.lower()

    def require_topic(self, name: str) -> TopicDef:
        """The catalogue's topic ``name`` (case-sensitive) or the Salesforce error for it."""
        if not name:
            raise failure("topic.validation.empty")
        if name not in self.catalogue:
            raise failure("topic.not.found", org=self.settings.org_id, topic=name)
        return self.catalogue.topic(name)

    def _unary(self, context: grpc.ServicerContext, rpc_id: str, body: Callable[[], Any]) -> Any:
        try:
            self.authenticate(context)
            response = body()
        except RpcFailure as exc:
            abort_with(context, rpc_id, exc)
        if self.faults.latency:
            time.sleep(self.faults.latency)
        return response

    # -- RPCs --------------------------------------------------------------------------------

    def GetTopic(self, request: pb2.TopicRequest, context: grpc.ServicerContext) -> pb2.TopicInfo:
        rpc_id = str(uuid.uuid4())

        def body() -> pb2.TopicInfo:
            topic = self.require_topic(request.topic_name)
            schema = topic.current_schema
            if schema is not None:
                self._remember(schema)
            return pb2.TopicInfo(
                topic_name=topic.name,
                tenant_guid=self.settings.org_id,
                can_publish=topic.publishable,
                can_subscribe=True,
                # /data/ChangeEvents has no schema of its own: its events carry their
                # objects' schema ids.
                schema_id=schema.schema_id if schema is not None else "",
                rpc_id=rpc_id,
            )

        result: pb2.TopicInfo = self._unary(context, rpc_id, body)
        return result

    def GetSchema(
        self, request: pb2.SchemaRequest, context: grpc.ServicerContext
    ) -> pb2.SchemaInfo:
        rpc_id = str(uuid.uuid4())

        def body() -> pb2.SchemaInfo:
            schema_id = request.schema_id.strip()
            if not schema_id:
                raise failure("schema.validation.failed")
            refusal = self.faults.schema_refusal(schema_id)
            if refusal is not None:
                refused = failure(refusal, schema_id=schema_id)
                if refusal == "schema.meta.permission":
                    # A refused schema id as Salesforce reports a permission problem.
                    refused.status = grpc.StatusCode.INVALID_ARGUMENT
                raise refused
            schema = self._schema(schema_id)
            if schema is None:
                raise failure("schema.meta.permission", schema_id=schema_id)
            return pb2.SchemaInfo(schema_json=schema.json, schema_id=schema_id, rpc_id=rpc_id)

        result: pb2.SchemaInfo = self._unary(context, rpc_id, body)
        return result

    def _remember(self, schema: EventSchema) -> None:
        with self._lock:
            self._served_schemas.setdefault(schema.schema_id, schema)

    def _schema(self, schema_id: str) -> EventSchema | None:
        # Every version ever served stays resolvable, even if the catalogue later forgets it:
        # stored events keep pointing at the schema they were written with.
        schema = self.catalogue.schemas.get(schema_id)
        if schema is not None:
            self._remember(schema)
            return schema
        with self._lock:
            return self._served_schemas.get(schema_id)

    def Publish(
        self, request: pb2.PublishRequest, context: grpc.ServicerContext
    ) -> pb2.PublishResponse:
        rpc_id = str(uuid.uuid4())
        result: pb2.PublishResponse = self._unary(
            context, rpc_id, lambda: self._publish(request, rpc_id, stream_topic=None)
        )
        return result

    def PublishStream(
        self, request_iterator: Iterator[pb2.PublishRequest], context: grpc.ServicerContext
    ) -> Iterator[pb2.PublishResponse]:
        rpc_id = str(uuid.uuid4())
        try:
            self.authenticate(context)
        except RpcFailure as exc:
            abort_with(context, rpc_id, exc)
        return self._publish_stream(request_iterator, context, rpc_id)

    def _publish_stream(
        self,
        request_iterator: Iterator[pb2.PublishRequest],
        context: grpc.ServicerContext,
        rpc_id: str,
    ) -> Iterator[pb2.PublishResponse]:
        topic: str | None = None
        try:
            for request in request_iterator:
                response = self._publish(request, rpc_id, stream_topic=topic)
                topic = topic or request.topic_name
                if self.faults.latency:
                    time.sleep(self.faults.latency)
                yield response
        except RpcFailure as exc:
            abort_with(context, rpc_id, exc)

    def _publish(
        self, request: pb2.PublishRequest, rpc_id: str, *, stream_topic: str | None
    ) -> pb2.PublishResponse:
        if stream_topic is None:
            if not request.topic_name:
                raise failure("publish.topic.validation.empty")
            if request.auth_refresh:
                raise failure("publish.auth.refresh.invalid")
            topic_name = request.topic_name
        else:
            if request.topic_name and request.topic_name != stream_topic:
                raise failure(
                    "publish.topic.mismatch", expected=stream_topic, received=request.topic_name
                )
            topic_name = stream_topic
        topic = self.require_topic(topic_name)
        if not request.events:
            raise failure("publish.event.count.invalid")
        schema_ids = {s.schema_id for s in topic.schemas}
        results: list[pb2.PublishResult] = []
        accepted: list[tuple[int, NewEvent]] = []
        for ev in request.events:
            event_id = ev.id or str(uuid.uuid4())
            result = pb2.PublishResult(correlation_key=event_id)
            problem = self._publish_problem(topic, ev, schema_ids)
            if problem:
                result.error.code = pb2.PUBLISH
                result.error.msg = "com.salesforce.eventbus.exceptions.PublishException: " + problem
            else:
                accepted.append(
                    (
                        len(results),
                        NewEvent(
                            topic=topic.name,
                            schema_id=ev.schema_id,
                            payload=ev.payload,
                            event_id=event_id,
                            headers=tuple((h.key, h.value) for h in ev.headers),
                        ),
                    )
                )
            results.append(result)
        logged = self.bus.append(e for _, e in accepted) if accepted else []
        for (index, _), entry in zip(accepted, logged, strict=True):
            results[index].replay_id = entry.replay_id
        logger.info(
            "publish %s: topic=%s events=%d published=%d",
            rpc_id,
            topic.name,
            len(results),
            len(logged),
        )
        current = topic.current_schema
        return pb2.PublishResponse(
            results=results,
            schema_id=current.schema_id if current is not None else "",
            rpc_id=rpc_id,
        )

    def _publish_problem(self, topic: TopicDef, ev: pb2.ProducerEvent, schema_ids: set[str]) -> str:
        if not topic.publishable:
            return (
                f"Unsupported topic [{topic.name}]. Change data capture topics are subscribe-only; "
                f"only platform events can be published."
            )
        size = ev.ByteSize()
        if size > self.settings.max_event_bytes:
            return (
                f"Event size of {size} bytes exceeds the maximum of "
                f"{self.settings.max_event_bytes} bytes."
            )
        if ev.schema_id not in schema_ids:
            return (
                f"Schema ID [{ev.schema_id}] is not a schema of topic [{topic.name}]; "
                f"use the schema ID from GetTopic."
            )
        return ""

    def Subscribe(
        self, request_iterator: Iterator[pb2.FetchRequest], context: grpc.ServicerContext
    ) -> Iterator[Any]:
        return self._open(_SubscribeStream, request_iterator, context)

    def ManagedSubscribe(
        self, request_iterator: Iterator[pb2.ManagedFetchRequest], context: grpc.ServicerContext
    ) -> Iterator[Any]:
        return self._open(_ManagedStream, request_iterator, context)

    def _open(
        self,
        kind: type[_Stream],
        request_iterator: Iterator[Any],
        context: grpc.ServicerContext,
    ) -> Iterator[Any]:
        rpc_id = str(uuid.uuid4())
        try:
            self.authenticate(context)
        except RpcFailure as exc:
            abort_with(context, rpc_id, exc)
        stream = kind(self, context, rpc_id)
        self._track(stream)
        context.add_callback(stream.close)
        return stream.serve(request_iterator)
