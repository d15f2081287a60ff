"""The emulator's ``eventbus.v1.PubSub`` servicer: Subscribe, ManagedSubscribe, Publish,
PublishStream, GetTopic and GetSchema, with Salesforce's errors.

Errors are built by :mod:`ingest.emulator.rpc_errors`; the Subscribe and ManagedSubscribe
streams and their pre-encoded response frames live in :mod:`ingest.emulator.streams`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from ingest.emulator.eventlog import EventBus, NewEvent
from ingest.emulator.faults import Faults
from ingest.emulator.managed import ManagedSubscriptions
from ingest.emulator.oauth import GrantInfo, TokenStore
from ingest.emulator.rpc_errors import ERROR_CODE_PREFIX, RpcFailure, abort_with, failure
from ingest.emulator.service_settings import ResponseEncoding, ServiceSettings
from ingest.emulator.streams import ManagedStream, Stream, SubscribeStream
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


def _same_url(a: str, b: str) -> bool:
    return a.strip().rstrip("/").lower() == b.strip().rstrip("/").lower()


def _identity(data: bytes) -> bytes:
    return data


def _serialize(message: Any) -> bytes:
    return bytes(message.SerializeToString())


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
        self._streams: set[Stream] = set()
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

    def _track(self, stream: Stream) -> None:
        with self._lock:
            self._streams.add(stream)

    def forget(self, stream: Stream) -> None:
        """``stream`` has ended: shutdown and fault changes no longer reach it."""
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
        topic = self.catalogue.topics.get(name)
        # An entity whose Change Data Capture is off has no change event topic.
        if topic is None or (topic.kind == "change_events" and not self.catalogue.publishes(name)):
            raise failure("topic.not.found", org=self.settings.org_id, topic=name)
        return topic

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
        return self._open(SubscribeStream, request_iterator, context)

    def ManagedSubscribe(
        self, request_iterator: Iterator[pb2.ManagedFetchRequest], context: grpc.ServicerContext
    ) -> Iterator[Any]:
        return self._open(ManagedStream, request_iterator, context)

    def _open(
        self,
        kind: type[Stream],
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
