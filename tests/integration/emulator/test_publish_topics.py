"""Publish, PublishStream, GetTopic and GetSchema over a socket, and the auth metadata checks
every RPC makes."""

from __future__ import annotations

import uuid

import grpc
import pytest

from ingest.pubsub import pb2
from tests.emulator_helpers import (
    ACCOUNT,
    ACCOUNT_TOPIC,
    CHANNEL,
    ORDER,
    ORDER_TOPIC,
    StreamDriver,
    assert_sf_error,
    change_event_schema,
    fetch,
    order_payload,
)

pytestmark = pytest.mark.integration


def _event(number: str, event_id: str = "", payload: bytes | None = None) -> pb2.ProducerEvent:
    return pb2.ProducerEvent(
        id=event_id,
        schema_id=ORDER.schema_id,
        payload=order_payload(number) if payload is None else payload,
    )


def _raises(call):
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


# -- GetTopic / GetSchema ---------------------------------------------------------------------


def test_get_topic_for_each_kind(emulator, stub, md):
    cdc = stub.GetTopic(pb2.TopicRequest(topic_name=ACCOUNT_TOPIC), metadata=md)
    assert (cdc.topic_name, cdc.schema_id, cdc.can_publish, cdc.can_subscribe) == (
        ACCOUNT_TOPIC,
        ACCOUNT.schema_id,
        False,
        True,
    )
    assert cdc.tenant_guid == emulator.org_id and cdc.rpc_id
    pe = stub.GetTopic(pb2.TopicRequest(topic_name=ORDER_TOPIC), metadata=md)
    assert pe.can_publish and pe.schema_id == ORDER.schema_id
    channel = stub.GetTopic(pb2.TopicRequest(topic_name=CHANNEL), metadata=md)
    assert channel.schema_id == "" and channel.can_subscribe and not channel.can_publish


def test_get_topic_unknown_is_not_found_and_case_sensitive(emulator, stub, md):
    for name in (
        "/data/OpportunityChangeEvent",
        "/data/accountChangeEvent",
        "/event/order_event__e",
    ):
        err = assert_sf_error(
            _raises(lambda n=name: stub.GetTopic(pb2.TopicRequest(topic_name=n), metadata=md)),
            grpc.StatusCode.NOT_FOUND,
            "topic.not.found",
            f"The topic information for org CORE/prod/{emulator.org_id} and topic {name} not "
            f"found. Ensure the topic name is correct and that the topic exists.",
        )
        assert name in err.details
    assert_sf_error(
        _raises(lambda: stub.GetTopic(pb2.TopicRequest(topic_name=""), metadata=md)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "topic.validation.empty",
    )


def test_get_schema_serves_every_version(emulator, stub, md):
    v1 = stub.GetSchema(pb2.SchemaRequest(schema_id=ACCOUNT.schema_id), metadata=md)
    assert v1.schema_json == ACCOUNT.json and v1.schema_id == ACCOUNT.schema_id and v1.rpc_id
    v2 = change_event_schema("Account", extra_field=True)
    emulator.catalogue.add_version(ACCOUNT_TOPIC, v2)
    topic = stub.GetTopic(pb2.TopicRequest(topic_name=ACCOUNT_TOPIC), metadata=md)
    assert topic.schema_id == v2.schema_id != ACCOUNT.schema_id
    for schema in (ACCOUNT, v2):
        got = stub.GetSchema(pb2.SchemaRequest(schema_id=schema.schema_id), metadata=md)
        assert got.schema_json == schema.json


def test_get_schema_blank_and_unknown(stub, md):
    assert_sf_error(
        _raises(lambda: stub.GetSchema(pb2.SchemaRequest(schema_id=""), metadata=md)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "schema.validation.failed",
        "Schema validation failed. The schema ID can't be blank.",
    )
    err = assert_sf_error(
        _raises(lambda: stub.GetSchema(pb2.SchemaRequest(schema_id="nope"), metadata=md)),
        grpc.StatusCode.NOT_FOUND,
        "schema.meta.permission",
    )
    assert "nope" in err.details


# -- auth metadata ----------------------------------------------------------------------------


def test_tenant_id_forms_and_header_aliases_are_accepted(emulator, stub):
    token = emulator.issue_token()
    org = emulator.org_id
    request = pb2.TopicRequest(topic_name=ORDER_TOPIC)
    for tenant in (org, org[:15], f"core/emulator/{org}", f"CORE/prod/{org[:15]}", org.lower()):
        md = (
            ("accesstoken", token.access_token),
            ("instanceurl", token.instance_url + "/"),
            ("tenantid", tenant),
        )
        assert stub.GetTopic(request, metadata=md).topic_name == ORDER_TOPIC
    legacy = (
        ("x-sfdc-api-session-token", token.access_token),
        ("x-sfdc-instance-url", token.instance_url),
        ("x-sfdc-tenant-id", org),
    )
    assert stub.GetTopic(request, metadata=legacy).topic_name == ORDER_TOPIC


def _auth_cases(emulator, token):
    org = emulator.org_id
    good = dict(token.metadata())
    other_org = "00D000000000001AAA"
    return [
        {**good, "accesstoken": "00D000000000001!bogus"},
        {**good, "instanceurl": "https://other.my.salesforce.com"},
        {**good, "tenantid": other_org},
        {**good, "tenantid": org[:15].lower()},  # the 15-character id is case-sensitive
        {**good, "tenantid": f"core/x/{other_org}"},
        {**good, "tenantid": org[:14]},
    ]


def test_bad_auth_metadata_is_unauthenticated_on_every_rpc(emulator, stub):
    token = emulator.issue_token()
    calls = [
        lambda m: stub.GetTopic(pb2.TopicRequest(topic_name=ORDER_TOPIC), metadata=m),
        lambda m: stub.GetSchema(pb2.SchemaRequest(schema_id=ORDER.schema_id), metadata=m),
        lambda m: stub.Publish(
            pb2.PublishRequest(topic_name=ORDER_TOPIC, events=[_event("1")]), metadata=m
        ),
        lambda m: list(
            stub.PublishStream(
                iter([pb2.PublishRequest(topic_name=ORDER_TOPIC, events=[_event("1")])]),
                metadata=m,
            )
        ),
        lambda m: list(stub.Subscribe(iter([fetch(ORDER_TOPIC, 1)]), metadata=m)),
        lambda m: list(
            stub.ManagedSubscribe(
                iter([pb2.ManagedFetchRequest(developer_name="X", num_requested=1)]), metadata=m
            )
        ),
    ]
    for metadata in _auth_cases(emulator, token):
        for call in calls:
            assert_sf_error(
                _raises(lambda c=call, m=metadata: c(tuple(m.items()))),
                grpc.StatusCode.UNAUTHENTICATED,
                "service.auth.error",
                "An authentication exception occurred. Provide valid authentication via "
                "metadata headers.",
            )
    assert emulator.log(ORDER_TOPIC) == ()


def test_blank_or_missing_auth_headers(emulator, stub):
    token = dict(emulator.issue_token().metadata())
    request = pb2.TopicRequest(topic_name=ORDER_TOPIC)
    for missing in ("accesstoken", "instanceurl", "tenantid"):
        metadata = tuple((k, v) for k, v in token.items() if k != missing)
        assert_sf_error(
            _raises(lambda m=metadata: stub.GetTopic(request, metadata=m)),
            grpc.StatusCode.UNAUTHENTICATED,
            "service.auth.headers.invalid",
        )
    assert_sf_error(
        _raises(lambda: stub.GetTopic(request)),
        grpc.StatusCode.UNAUTHENTICATED,
        "service.auth.headers.invalid",
    )


def test_expired_token_is_rejected(emulator, stub, clock):
    token = emulator.issue_token()
    request = pb2.TopicRequest(topic_name=ORDER_TOPIC)
    clock.advance(7199)
    assert stub.GetTopic(request, metadata=token.metadata()).topic_name == ORDER_TOPIC
    clock.advance(2)
    assert_sf_error(
        _raises(lambda: stub.GetTopic(request, metadata=token.metadata())),
        grpc.StatusCode.UNAUTHENTICATED,
        "service.auth.error",
    )


# -- Publish ----------------------------------------------------------------------------------


def test_publish_results_in_order_and_delivered_to_subscribers(emulator, stub, md):
    subscriber = StreamDriver(stub.Subscribe, md).send(fetch(ORDER_TOPIC, 10))
    subscriber.next()  # subscribed (keepalive)
    given = str(uuid.uuid4())
    response = stub.Publish(
        pb2.PublishRequest(
            topic_name=ORDER_TOPIC,
            events=[_event("1", given), _event("2"), _event("3", "custom-key")],
        ),
        metadata=md,
    )
    assert response.schema_id == ORDER.schema_id and response.rpc_id
    keys = [r.correlation_key for r in response.results]
    assert keys[0] == given and keys[2] == "custom-key"
    assert uuid.UUID(keys[1])  # generated by the server
    assert all(not r.HasField("error") for r in response.results)
    delivered = subscriber.events(3)
    assert [e.replay_id for e in delivered] == [r.replay_id for r in response.results]
    assert [e.event.id for e in delivered] == keys
    assert delivered[0].event.payload == order_payload("1")
    logged = emulator.log(ORDER_TOPIC)
    assert [e.event_id for e in logged] == keys
    subscriber.close()


def test_publish_headers_are_kept(emulator, stub, md):
    event = _event("1", "with-headers")
    event.headers.add(key="trace", value=b"abc")
    stub.Publish(pb2.PublishRequest(topic_name=ORDER_TOPIC, events=[event]), metadata=md)
    assert emulator.log(ORDER_TOPIC)[0].headers == (("trace", b"abc"),)


def test_oversized_event_fails_alone(emulator, stub, md):
    big = _event("2", "big", payload=b"\x00" * (1024 * 1024 + 1))
    response = stub.Publish(
        pb2.PublishRequest(
            topic_name=ORDER_TOPIC, events=[_event("1", "a"), big, _event("3", "c")]
        ),
        metadata=md,
    )
    ok1, bad, ok2 = response.results
    assert bad.error.code == pb2.PUBLISH and "exceeds" in bad.error.msg and bad.replay_id == b""
    assert bad.correlation_key == "big"
    assert ok1.replay_id and ok2.replay_id and ok1.replay_id < ok2.replay_id
    assert [e.event_id for e in emulator.log(ORDER_TOPIC)] == ["a", "c"]


def test_publishing_to_change_event_topics_fails_per_event(emulator, stub, md):
    event = pb2.ProducerEvent(id="x", schema_id=ACCOUNT.schema_id, payload=b"\x00")
    for topic in (ACCOUNT_TOPIC, CHANNEL):
        response = stub.Publish(pb2.PublishRequest(topic_name=topic, events=[event]), metadata=md)
        (result,) = response.results
        assert result.error.code == pb2.PUBLISH and "subscribe-only" in result.error.msg
    assert emulator.log(ACCOUNT_TOPIC) == ()


def test_unknown_schema_id_fails_per_event(stub, md):
    event = pb2.ProducerEvent(id="x", schema_id=ACCOUNT.schema_id, payload=b"\x00")
    response = stub.Publish(pb2.PublishRequest(topic_name=ORDER_TOPIC, events=[event]), metadata=md)
    assert response.results[0].error.code == pb2.PUBLISH
    assert ACCOUNT.schema_id in response.results[0].error.msg


def test_payload_is_not_validated(emulator, stub, md):
    response = stub.Publish(
        pb2.PublishRequest(topic_name=ORDER_TOPIC, events=[_event("1", "junk", b"not avro")]),
        metadata=md,
    )
    assert response.results[0].replay_id
    assert emulator.log(ORDER_TOPIC)[0].payload == b"not avro"


@pytest.mark.parametrize(
    ("request_", "status", "code"),
    [
        (
            pb2.PublishRequest(topic_name=ORDER_TOPIC),
            grpc.StatusCode.INVALID_ARGUMENT,
            "publish.event.count.invalid",
        ),
        (
            pb2.PublishRequest(events=[_event("1")]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "publish.topic.validation.empty",
        ),
        (
            pb2.PublishRequest(topic_name=ORDER_TOPIC, events=[_event("1")], auth_refresh="x"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "publish.auth.refresh.invalid",
        ),
        (
            pb2.PublishRequest(topic_name="/event/Nope__e", events=[_event("1")]),
            grpc.StatusCode.NOT_FOUND,
            "topic.not.found",
        ),
    ],
)
def test_publish_request_errors(stub, md, request_, status, code):
    assert_sf_error(_raises(lambda: stub.Publish(request_, metadata=md)), status, code)


def test_request_above_the_grpc_limit_fails_the_call(emulator, stub, md):
    events = [_event(str(i), payload=b"\x00" * 900_000) for i in range(5)]
    with pytest.raises(grpc.RpcError) as info:
        stub.Publish(pb2.PublishRequest(topic_name=ORDER_TOPIC, events=events), metadata=md)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert emulator.log(ORDER_TOPIC) == ()


def test_publish_stream_one_response_per_request(emulator, stub, md):
    s = StreamDriver(stub.PublishStream, md)
    s.send(pb2.PublishRequest(topic_name=ORDER_TOPIC, events=[_event("1", "a")]))
    first = s.next()
    s.send(pb2.PublishRequest(events=[_event("2", "b"), _event("3", "c")]))  # topic may be omitted
    second = s.next()
    s.send(pb2.PublishRequest(topic_name=ORDER_TOPIC, events=[_event("4", "d")]))
    third = s.next()
    assert [len(r.results) for r in (first, second, third)] == [1, 2, 1]
    assert first.rpc_id == second.rpc_id == third.rpc_id
    assert [e.event_id for e in emulator.log(ORDER_TOPIC)] == ["a", "b", "c", "d"]
    s.send(pb2.PublishRequest(topic_name=ACCOUNT_TOPIC, events=[_event("5")]))
    err = assert_sf_error(s.wait_end(), grpc.StatusCode.INVALID_ARGUMENT, "publish.topic.mismatch")
    assert ACCOUNT_TOPIC in err.details
    s.close()


def test_publish_stream_first_request_rules(stub, md):
    s = StreamDriver(stub.PublishStream, md)
    s.send(pb2.PublishRequest(topic_name=ORDER_TOPIC, events=[_event("1")], auth_refresh="t"))
    assert_sf_error(s.wait_end(), grpc.StatusCode.INVALID_ARGUMENT, "publish.auth.refresh.invalid")
    s.close()
    s = StreamDriver(stub.PublishStream, md)
    s.send(pb2.PublishRequest(topic_name=ORDER_TOPIC, events=[_event("1")]))
    s.next()
    s.send(pb2.PublishRequest(topic_name=ORDER_TOPIC))
    assert_sf_error(s.wait_end(), grpc.StatusCode.INVALID_ARGUMENT, "publish.event.count.invalid")
    s.close()
