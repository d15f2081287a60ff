"""Publish platform events with Publish (unary) or PublishStream (bidi).

Records are Avro-encoded with the topic's current schema and sent in batches of at most 200
events and 3 MB (Salesforce's recommendations; a request over 4 MB fails as a whole). Each
event gets a UUID id, which the server echoes as ``correlation_key`` in its result, so
results are matched by key, never by position. Events that fail are re-sent a bounded number
of times. Per-event failures come back in the :class:`PublishOutcome` list; a failure of a
whole request (auth, unknown topic, a broken stream) raises.
"""

from __future__ import annotations

import functools
import io
import logging
import queue
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import fastavro
import grpc

from ingest.auth import TokenManager
from ingest.client.errors import classify
from ingest.client.retry import call_refreshing
from ingest.client.schemas import SchemaCache
from ingest.errors import TransientError
from ingest.pubsub import pb2, pb2_grpc
from ingest.replay import ReplayId
from ingest.schema import EventSchema

__all__ = ["PublishOutcome", "Publisher"]

_log = logging.getLogger(__name__)

MAX_BATCH_EVENTS = 200
MAX_BATCH_BYTES = 3 * 1024 * 1024
MAX_EVENT_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class PublishOutcome:
    """What happened to one record. ``index`` is its position in the input; ``event_id`` its
    correlation key; ``replay_id`` is set on success, ``error`` on failure."""

    index: int
    event_id: str
    replay_id: ReplayId | None
    error: str | None
    attempts: int
    schema_id: str

    @property
    def ok(self) -> bool:
        return self.error is None and self.replay_id is not None


@dataclass
class _Pending:
    index: int
    event: pb2.ProducerEvent
    size: int
    attempts: int = 0
    replay_id: ReplayId | None = None
    error: str | None = None


_STOP = object()


class Publisher:
    """Publishes records to platform event topics.

    ``max_event_bytes`` rejects oversized events before sending (Salesforce's limit is 1 MB
    per event; ``None`` lets the server decide). ``max_retries`` bounds re-sends of events
    whose result was an error. With ``tokens``, a call the server rejects for its credentials
    (which publishes nothing) is sent again after a token refresh.
    """

    def __init__(
        self,
        channel: grpc.Channel,
        schema_cache: SchemaCache | None = None,
        *,
        max_batch_events: int = MAX_BATCH_EVENTS,
        max_batch_bytes: int = MAX_BATCH_BYTES,
        max_event_bytes: int | None = MAX_EVENT_BYTES,
        max_retries: int = 2,
        max_in_flight: int = 8,
        tokens: TokenManager | None = None,
        id_factory: Callable[[], str] = lambda: str(uuid.uuid4()),
        logger: logging.Logger | None = None,
    ) -> None:
        if not 1 <= max_batch_events <= MAX_BATCH_EVENTS:
            raise ValueError(
                f"max_batch_events must be between 1 and {MAX_BATCH_EVENTS} "
                f"(got {max_batch_events})"
            )
        if max_batch_bytes <= 0 or max_batch_bytes > 4 * 1024 * 1024:
            raise ValueError(
                f"max_batch_bytes must be > 0 and at most 4 MiB, the gRPC request limit "
                f"(got {max_batch_bytes})"
            )
        if max_retries < 0 or max_in_flight < 1:
            raise ValueError(
                f"max_retries must be >= 0 and max_in_flight >= 1 "
                f"(got {max_retries}, {max_in_flight})"
            )
        self._stub = pb2_grpc.PubSubStub(channel)
        self._schemas = (
            schema_cache if schema_cache is not None else SchemaCache(channel, tokens=tokens)
        )
        self._max_events = max_batch_events
        self._max_bytes = max_batch_bytes
        self._max_event = max_event_bytes
        self._max_retries = max_retries
        self._max_in_flight = max_in_flight
        self._new_id = id_factory
        self._tokens = tokens
        self._log = logger or _log

    # -- public ----------------------------------------------------------------------------

    def publish(self, topic: str, records: Sequence[Mapping[str, Any]]) -> list[PublishOutcome]:
        """Publish with unary Publish calls, one batch at a time; failed events are re-sent
        in later batches."""
        schema, pending = self._prepare(topic, records)
        batches = deque(self._batches([p for p in pending if p.error is None]))
        while batches:
            batch = batches.popleft()
            request = self._request(topic, batch)
            response = call_refreshing(
                self._tokens,
                functools.partial(self._stub.Publish, request),
                _progress(f"Publish to {topic}", pending),
            )
            batches.extend(self._batches(self._settle(batch, response)))
        return self._outcomes(pending, schema)

    def publish_stream(
        self,
        topic: str,
        records: Sequence[Mapping[str, Any]],
        *,
        ordered: bool = False,
    ) -> list[PublishOutcome]:
        """Publish over one PublishStream.

        By default requests are pipelined (up to ``max_in_flight`` unanswered) and failed
        events are re-sent after the batches already queued. ``ordered=True`` waits for each
        response, and re-sends that batch's failures, before sending the next batch, which
        keeps batches in order on the bus at the cost of one round trip per batch.
        """
        schema, pending = self._prepare(topic, records)
        batches = deque(self._batches([p for p in pending if p.error is None]))
        limit = 1 if ordered else self._max_in_flight
        rejections = 0
        while batches:
            credentials = self._tokens.current() if self._tokens is not None else None
            answered, error = self._stream_session(topic, batches, limit, ordered)
            if error is None:
                break
            failure = classify(error)
            # Rejected before any answer: nothing was published, so reopen with a fresh token.
            if (
                failure.disposition == "auth"
                and answered == 0
                and self._tokens is not None
                and rejections < 2
            ):
                rejections += 1
                self._tokens.invalidate(credentials)
                continue
            raise failure.exception(_progress(f"PublishStream to {topic}", pending)) from None
        return self._outcomes(pending, schema)

    def _stream_session(
        self, topic: str, batches: deque[list[_Pending]], limit: int, ordered: bool
    ) -> tuple[int, grpc.RpcError | None]:
        """Send ``batches`` over one PublishStream until none is left. Returns how many
        responses answered batches and the error that ended the stream early (its unanswered
        batches are put back at the front of ``batches``)."""
        requests: queue.SimpleQueue[Any] = queue.SimpleQueue()

        def request_iter() -> Iterator[Any]:
            while True:
                item = requests.get()
                if item is _STOP:
                    return
                yield item

        call = self._stub.PublishStream(request_iter())
        in_flight: deque[list[_Pending]] = deque()
        answered = 0
        try:
            responses = iter(call)
            while batches or in_flight:
                while batches and len(in_flight) < limit:
                    batch = batches.popleft()
                    requests.put(self._request(topic, batch))
                    in_flight.append(batch)
                response = next(responses, None)
                if response is None:
                    raise _stream_ended(topic)
                if not response.results:
                    continue  # an empty response keeps the stream alive; it answers nothing
                answered += 1
                retry = self._batches(self._settle(self._answered(in_flight, response), response))
                if ordered:
                    batches.extendleft(reversed(retry))
                else:
                    batches.extend(retry)
        except grpc.RpcError as exc:
            batches.extendleft(reversed(in_flight))
            return answered, exc
        finally:
            requests.put(_STOP)
            call.cancel()  # type: ignore[no-untyped-call]
        return answered, None

    # -- internals -------------------------------------------------------------------------

    def _prepare(
        self, topic: str, records: Sequence[Mapping[str, Any]]
    ) -> tuple[EventSchema, list[_Pending]]:
        if isinstance(records, Mapping) or not isinstance(records, Sequence):
            raise TypeError(
                f"records must be a sequence of mappings (got a {type(records).__name__})"
            )
        schema = self._schemas.current_schema(topic)
        pending: list[_Pending] = []
        for index, record in enumerate(records):
            if not isinstance(record, Mapping):
                raise TypeError(
                    f"record {index} must be a mapping of field names to values "
                    f"(got a {type(record).__name__})"
                )
            payload = _encode(schema, record, index)
            event = pb2.ProducerEvent(
                id=self._new_id(), schema_id=schema.schema_id, payload=payload
            )
            item = _Pending(index, event, event.ByteSize())
            if self._max_event is not None and len(payload) > self._max_event:
                item.error = (
                    f"event is {len(payload):,} bytes encoded; Salesforce accepts at most "
                    f"{self._max_event:,} bytes per event"
                )
            pending.append(item)
        return schema, pending

    def _batches(self, items: Sequence[_Pending]) -> list[list[_Pending]]:
        batches: list[list[_Pending]] = []
        current: list[_Pending] = []
        size = 0
        for item in items:
            if current and (len(current) >= self._max_events or size + item.size > self._max_bytes):
                batches.append(current)
                current, size = [], 0
            current.append(item)
            size += item.size
        if current:
            batches.append(current)
        return batches

    def _request(self, topic: str, batch: list[_Pending]) -> pb2.PublishRequest:
        for item in batch:
            item.attempts += 1
        return pb2.PublishRequest(topic_name=topic, events=[p.event for p in batch])

    def _answered(self, in_flight: deque[list[_Pending]], response: Any) -> list[_Pending]:
        keys = {r.correlation_key for r in response.results}
        for position, batch in enumerate(in_flight):
            if any(p.event.id in keys for p in batch):
                del in_flight[position]
                return batch
        # No key matched a batch in flight: the oldest request is the one answered.
        return in_flight.popleft()

    def _settle(self, batch: list[_Pending], response: Any) -> list[_Pending]:
        """Record results by correlation key; return the events to send again."""
        by_key = {p.event.id: p for p in batch}
        seen: set[str] = set()
        for result in response.results:
            item = by_key.get(result.correlation_key)
            if item is None:
                self._log.warning(
                    "publish result for unknown correlation key %s (rpc-id %s)",
                    result.correlation_key,
                    response.rpc_id,
                )
                continue
            seen.add(item.event.id)
            if result.HasField("error"):
                item.error = result.error.msg or pb2.ErrorCode.Name(result.error.code)
            elif result.replay_id:
                item.replay_id = ReplayId(result.replay_id)
                item.error = None
            else:
                item.error = "the server returned neither a replay id nor an error"
        for item in batch:
            if item.event.id not in seen:
                item.error = f"no result for this event (rpc-id {response.rpc_id})"
        retry = [p for p in batch if p.error is not None and p.attempts <= self._max_retries]
        if retry:
            self._log.info(
                "re-sending %d of %d events that failed (rpc-id %s)",
                len(retry),
                len(batch),
                response.rpc_id,
            )
        return retry

    def _outcomes(self, pending: list[_Pending], schema: EventSchema) -> list[PublishOutcome]:
        return [
            PublishOutcome(
                index=p.index,
                event_id=p.event.id,
                replay_id=p.replay_id if p.error is None else None,
                error=p.error,
                attempts=p.attempts,
                schema_id=schema.schema_id,
            )
            for p in pending
        ]


def _encode(schema: EventSchema, record: Mapping[str, Any], index: int) -> bytes:
    buffer = io.BytesIO()
    try:
        fastavro.schemaless_writer(buffer, schema.parsed, dict(record))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        names = ", ".join(f.name for f in schema.fields)
        raise ValueError(
            f"record {index} does not fit schema {schema.name} ({schema.schema_id}) with "
            f"fields [{names}]: {exc}"
        ) from None
    return buffer.getvalue()


def _progress(action: str, pending: list[_Pending]) -> str:
    # Events published before a request failed stay published; say how many, so a caller
    # re-publishing the batch knows it will create duplicates of those.
    done = sum(1 for p in pending if p.replay_id is not None and p.error is None)
    return f"{action} ({done} of {len(pending)} events were published before this failure)"


def _stream_ended(topic: str) -> TransientError:
    return TransientError(
        f"PublishStream to {topic}: the server ended the stream before answering every "
        "request; events without an outcome may or may not have been published",
        status="OK",
    )
