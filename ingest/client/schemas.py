"""Schemas by id and topic metadata, fetched once and shared.

Every delivered event names the schema it was written with; a topic's current schema can
change at any time (an admin adds a field) while older events keep their old ids. So events
are decoded by *their* schema id, fetched with GetSchema the first time the id is seen and
parsed once. ``/data/ChangeEvents`` and other multi-entity channels have no schema of their
own: GetTopic reports a blank schema id there.

:meth:`SchemaCache.decoders` hands the schemas to :class:`~ingest.decoding.DecoderCache`, which
builds one decoder per schema id.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import grpc

from ingest.auth import TokenManager
from ingest.client.retry import call_refreshing
from ingest.decoding.cache import DecoderCache
from ingest.pubsub import pb2, pb2_grpc
from ingest.schema import EventSchema, parse_event_schema

__all__ = ["SchemaCache", "TopicInfo"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """GetTopic's answer. ``schema_id`` is blank for multi-entity channels."""

    topic_name: str
    tenant_guid: str
    can_publish: bool
    can_subscribe: bool
    schema_id: str
    rpc_id: str


class SchemaCache:
    """GetSchema once per schema id and GetTopic once per topic, thread-safe.

    Concurrent requests for the same unknown id wait for one GetSchema call. Schemas are
    parsed once into :class:`~ingest.schema.EventSchema` (whose fastavro form is itself
    parsed once), so decoding never re-parses per event. With ``tokens``, a call rejected for
    its credentials is repeated after a token refresh.
    """

    def __init__(
        self,
        channel: grpc.Channel,
        *,
        tokens: TokenManager | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self._stub = pb2_grpc.PubSubStub(channel)
        self._tokens = tokens
        self._log = logger or _log
        self._lock = threading.Lock()
        self._schemas: dict[str, EventSchema] = {}
        self._fetching: dict[str, threading.Lock] = {}
        self._topics: dict[str, TopicInfo] = {}
        self._decoders: DecoderCache | None = None
        self.get_schema_calls = 0
        self.get_topic_calls = 0

    def schema(self, schema_id: str) -> EventSchema:
        """The schema with this id, fetched with GetSchema the first time."""
        if not isinstance(schema_id, str) or not schema_id:
            raise ValueError(
                f"a schema id is a non-empty string (got {schema_id!r}); multi-entity "
                "channels such as /data/ChangeEvents have no topic schema: use each event's "
                "own schema_id"
            )
        cached = self._schemas.get(schema_id)
        if cached is not None:
            return cached
        with self._lock:
            gate = self._fetching.setdefault(schema_id, threading.Lock())
        with gate:
            cached = self._schemas.get(schema_id)
            if cached is not None:
                return cached
            request = pb2.SchemaRequest(schema_id=schema_id)
            info = call_refreshing(
                self._tokens, lambda: self._stub.GetSchema(request), f"GetSchema {schema_id}"
            )
            self.get_schema_calls += 1
            try:
                schema = parse_event_schema(info.schema_json, expected_id=schema_id)
            except (ValueError, KeyError) as exc:
                raise ValueError(
                    f"GetSchema {schema_id} returned a schema that is not an Avro record: {exc}"
                ) from exc
            self._schemas[schema_id] = schema
            self._log.info("fetched schema %s (%s)", schema_id, schema.name)
            return schema

    __call__ = schema

    def schema_json(self, schema_id: str) -> str:
        """The schema's JSON text: the loader a :class:`~ingest.decoding.DecoderCache` takes."""
        return self.schema(schema_id).json

    def decoders(self) -> DecoderCache:
        """The :class:`~ingest.decoding.DecoderCache` fed by this cache (one per cache), so
        each schema id costs one GetSchema and one decoder build, however many events."""
        with self._lock:
            if self._decoders is None:
                self._decoders = DecoderCache(self.schema_json)
            return self._decoders

    def add(self, schema: EventSchema) -> None:
        """Prime the cache (for example from a schema registry table) without a call."""
        self._schemas.setdefault(schema.schema_id, schema)

    def known(self) -> Mapping[str, EventSchema]:
        """A snapshot of every schema fetched or added so far, by id."""
        return dict(self._schemas)

    def topic_info(self, topic: str, *, refresh: bool = False) -> TopicInfo:
        """GetTopic for ``topic``, cached; ``refresh=True`` asks the server again (the
        current schema id changes when the event definition changes)."""
        if not refresh:
            cached = self._topics.get(topic)
            if cached is not None:
                return cached
        request = pb2.TopicRequest(topic_name=topic)
        info = call_refreshing(
            self._tokens, lambda: self._stub.GetTopic(request), f"GetTopic {topic}"
        )
        self.get_topic_calls += 1
        result = TopicInfo(
            topic_name=info.topic_name or topic,
            tenant_guid=info.tenant_guid,
            can_publish=info.can_publish,
            can_subscribe=info.can_subscribe,
            schema_id=info.schema_id,
            rpc_id=info.rpc_id,
        )
        self._topics[topic] = result
        return result

    def current_schema(self, topic: str, *, refresh: bool = False) -> EventSchema:
        """The topic's current schema (the one to publish with)."""
        info = self.topic_info(topic, refresh=refresh)
        if not info.schema_id:
            raise ValueError(
                f"topic {topic} has no schema of its own (GetTopic returned a blank schema "
                "id, as for multi-entity channels like /data/ChangeEvents); decode each event "
                "with its own schema_id"
            )
        return self.schema(info.schema_id)
