"""Publish, PublishStream and the schema cache against a Pub/Sub API server over a socket."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import fastavro
import grpc
import pytest

from ingest.auth import TokenManager
from ingest.client.publisher import Publisher
from ingest.client.schemas import SchemaCache
from ingest.client.stream import EventBatch
from ingest.client.subscriber import Subscription
from ingest.emulator.server import Emulator
from ingest.emulator.topics import EmittedEvent
from ingest.errors import PermanentError
from ingest.replay import Earliest
from tests.integration.client.conftest import CHANNEL, TOPIC, Recorder, encode, order, order_schema

pytestmark = pytest.mark.integration


def _decode(cache: SchemaCache, schema_id: str, payload: bytes) -> dict[str, object]:
    schema = cache.schema(schema_id)
    return fastavro.schemaless_reader(io.BytesIO(payload), schema.parsed)  # type: ignore[return-value]


def test_schema_cache_fetches_each_id_once_even_concurrently(
    channel: grpc.Channel, recorder: Recorder
) -> None:
    cache = SchemaCache(channel)
    sid = cache.topic_info(TOPIC).schema_id
    with ThreadPoolExecutor(8) as pool:
        schemas = list(pool.map(lambda _: cache.schema(sid), range(32)))
    assert all(s is schemas[0] for s in schemas)
    assert cache.get_schema_calls == 1 == recorder.unary.count("GetSchema")
    assert cache.topic_info(TOPIC) is cache.topic_info(TOPIC)
    assert cache.get_topic_calls == 1


def test_blank_channel_schema_is_explained(emulator: Emulator, channel: grpc.Channel) -> None:
    cache = SchemaCache(channel)
    assert cache.topic_info(CHANNEL).schema_id == ""
    with pytest.raises(ValueError, match="own schema_id"):
        cache.current_schema(CHANNEL)


def test_schema_change_mid_stream_decodes_each_event_with_its_own_schema(
    emulator: Emulator, channel: grpc.Channel
) -> None:
    v1, v2 = order_schema(), order_schema("Carrier__c")
    assert v1.schema_id != v2.schema_id
    emulator.append(
        EmittedEvent(TOPIC, v1.schema_id, encode(v1, order(i)), f"e{i}") for i in range(3)
    )
    emulator.catalogue.add_version(TOPIC, v2)
    emulator.append(
        EmittedEvent(TOPIC, v2.schema_id, encode(v2, {**order(i), "Carrier__c": f"C{i}"}), f"e{i}")
        for i in range(3, 6)
    )
    cache = SchemaCache(channel)
    decoders = cache.decoders()
    decoded = []
    with Subscription(channel, TOPIC, start=Earliest()) as sub:
        for item in sub:
            if isinstance(item, EventBatch):
                decoded.extend(
                    (e.schema_id, decoders.decoder(e.schema_id).decode(e.payload))
                    for e in item.events
                )
            if len(decoded) >= 6:
                break
    assert [sid for sid, _ in decoded] == [v1.schema_id] * 3 + [v2.schema_id] * 3
    assert "Carrier__c" not in decoded[0][1]
    assert decoded[5][1]["Carrier__c"] == "C5"
    assert decoded[2][1]["Order_Number__c"] == "O-2"
    assert cache.get_schema_calls == 2


def test_publish_batches_and_correlates_by_key(emulator: Emulator, channel: grpc.Channel) -> None:
    publisher = Publisher(channel)
    outcomes = publisher.publish(TOPIC, [order(i) for i in range(450)])
    assert [o.index for o in outcomes] == list(range(450))
    assert all(o.ok for o in outcomes)
    log = emulator.log(TOPIC)
    assert len(log) == 450
    # the fake answers in reverse order; outcomes still match their events
    by_rid = {e.replay_id: e for e in log}
    for o in outcomes:
        assert o.replay_id is not None
        assert by_rid[o.replay_id.value].event_id == o.event_id
    cache = SchemaCache(channel)
    first = log[0]
    assert _decode(cache, first.schema_id, first.payload)["Order_Number__c"] == "O-0"


@pytest.mark.parametrize("client_side_limit", [True, False])
def test_an_event_over_one_megabyte_fails_alone(
    emulator: Emulator, channel: grpc.Channel, client_side_limit: bool
) -> None:
    publisher = Publisher(
        channel, max_event_bytes=1024 * 1024 if client_side_limit else None, max_retries=1
    )
    records = [order(0), order(1, note="x" * (1024 * 1024 + 10)), order(2)]
    outcomes = publisher.publish(TOPIC, records)
    assert [o.ok for o in outcomes] == [True, False, True]
    assert outcomes[1].error
    assert "1,048,576 bytes" in outcomes[1].error or "1048576 bytes" in outcomes[1].error
    assert outcomes[1].attempts == (0 if client_side_limit else 2)
    assert len(emulator.log(TOPIC)) == 2


@pytest.mark.parametrize("ordered", [False, True])
def test_publish_stream_pipelined_and_ordered(
    emulator: Emulator, channel: grpc.Channel, ordered: bool
) -> None:
    publisher = Publisher(channel, max_batch_events=50)
    outcomes = publisher.publish_stream(TOPIC, [order(i) for i in range(230)], ordered=ordered)
    assert all(o.ok for o in outcomes)
    log = emulator.log(TOPIC)
    ids = {o.event_id for o in outcomes}
    assert {e.event_id for e in log} == ids
    if ordered:
        cache = SchemaCache(channel)
        numbers = [_decode(cache, e.schema_id, e.payload)["Order_Number__c"] for e in log]
        assert numbers == [f"O-{i}" for i in range(230)]


def test_bad_records_are_rejected_before_sending(emulator: Emulator, channel: grpc.Channel) -> None:
    publisher = Publisher(channel)
    with pytest.raises(ValueError, match=r"record 1 does not fit schema .*Order_Shipped__e"):
        publisher.publish(TOPIC, [order(0), {"CreatedDate": "yesterday"}])
    assert len(emulator.log(TOPIC)) == 0


def test_publish_to_unknown_topic_raises(channel: grpc.Channel) -> None:
    with pytest.raises(PermanentError, match=r"GetTopic .*topic\.not\.found"):
        Publisher(channel).publish("/event/Nope__e", [order(0)])


def test_batches_are_split_at_three_megabytes_and_two_hundred_events(
    emulator: Emulator, channel: grpc.Channel, recorder: Recorder
) -> None:
    big = [order(i, note="n" * 800_000) for i in range(7)]
    small = [order(100 + i) for i in range(450)]
    outcomes = Publisher(channel).publish(TOPIC, big + small)
    assert all(o.ok for o in outcomes)
    requests = [
        r for m, r in zip(recorder.unary, recorder.unary_requests, strict=True) if m == "Publish"
    ]
    assert all(r.ByteSize() <= 3 * 1024 * 1024 for r in requests)
    assert all(len(r.events) <= 200 for r in requests)
    assert sum(len(r.events) for r in requests) == 457
    assert len(requests) >= 5  # 7 x 800 KB need at least 2 requests, 450 small ones 3
    assert len({e.id for r in requests for e in r.events}) == 457  # one key per event


@pytest.mark.parametrize("stream", [False, True])
def test_publish_refreshes_an_expired_token_and_publishes_once(
    emulator: Emulator, channel: grpc.Channel, tokens: TokenManager, stream: bool
) -> None:
    publisher = Publisher(channel, tokens=tokens, max_batch_events=10)
    publisher.publish(TOPIC, [order(0)])  # schema and topic cached with the first token
    emulator.faults.expire_tokens()
    records = [order(i) for i in range(1, 31)]
    outcomes = (
        publisher.publish_stream(TOPIC, records) if stream else publisher.publish(TOPIC, records)
    )
    assert all(o.ok for o in outcomes)
    assert tokens.refreshes == 2
    assert len(emulator.log(TOPIC)) == 31  # nothing published twice


def test_schema_cache_refreshes_an_expired_token(
    emulator: Emulator, channel: grpc.Channel, tokens: TokenManager
) -> None:
    cache = SchemaCache(channel, tokens=tokens)
    cache.topic_info(TOPIC)
    emulator.faults.expire_tokens()
    assert cache.schema(cache.topic_info(TOPIC).schema_id).name.endswith("Order_Shipped__e")
    assert tokens.refreshes == 2
