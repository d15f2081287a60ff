"""The committed stubs are exactly what the committed proto generates, and the proto has the
field numbers Salesforce's service uses (spot-checked here against the published tables)."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from ingest import protogen
from ingest.pubsub import pb2, pb2_grpc

ROOT = Path(__file__).resolve().parents[2]


def test_regenerating_the_stubs_changes_nothing(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    for generated in protogen.generate(tmp_path):
        committed = ROOT / "ingest" / "pubsub" / generated.name
        assert committed.read_text() == generated.read_text(), (
            f"{committed.relative_to(ROOT)} is stale: run `python -m ingest.protogen`"
        )


def test_the_stubs_accept_older_protobuf_and_grpcio_runtimes() -> None:
    # protoc's and the gRPC plugin's version checks would refuse the protobuf and grpcio of a
    # Databricks runtime (ingest/protogen.py); the committed stubs must not carry them.
    pubsub = ROOT / "ingest" / "pubsub"
    assert "runtime_version" not in (pubsub / "pubsub_api_pb2.py").read_text()
    assert "_version_not_supported" not in (pubsub / "pubsub_api_pb2_grpc.py").read_text()


def _fields(message: type) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            pb2.TopicInfo,
            {
                "topic_name": 1,
                "tenant_guid": 2,
                "can_publish": 3,
                "can_subscribe": 4,
                "schema_id": 5,
                "rpc_id": 6,
            },
        ),
        (pb2.TopicRequest, {"topic_name": 1}),
        (pb2.EventHeader, {"key": 1, "value": 2}),
        (pb2.ProducerEvent, {"id": 1, "schema_id": 2, "payload": 3, "headers": 4}),
        (pb2.ConsumerEvent, {"event": 1, "replay_id": 2}),
        (pb2.PublishResult, {"replay_id": 1, "error": 2, "correlation_key": 3}),
        (pb2.Error, {"code": 1, "msg": 2}),
        (
            pb2.FetchRequest,
            {
                "topic_name": 1,
                "replay_preset": 2,
                "replay_id": 3,
                "num_requested": 4,
                "auth_refresh": 5,
            },
        ),
        (
            pb2.FetchResponse,
            {"events": 1, "latest_replay_id": 2, "rpc_id": 3, "pending_num_requested": 4},
        ),
        (pb2.SchemaRequest, {"schema_id": 1}),
        (pb2.SchemaInfo, {"schema_json": 1, "schema_id": 2, "rpc_id": 3}),
        (pb2.PublishRequest, {"topic_name": 1, "events": 2, "auth_refresh": 3}),
        (pb2.PublishResponse, {"results": 1, "schema_id": 2, "rpc_id": 3}),
        (
            pb2.ManagedFetchRequest,
            {
                "subscription_id": 1,
                "developer_name": 2,
                "num_requested": 3,
                "auth_refresh": 4,
                "commit_replay_id_request": 5,
            },
        ),
        (
            pb2.ManagedFetchResponse,
            {
                "events": 1,
                "latest_replay_id": 2,
                "rpc_id": 3,
                "pending_num_requested": 4,
                "commit_response": 5,
            },
        ),
        (pb2.CommitReplayRequest, {"commit_request_id": 1, "replay_id": 2}),
        (
            pb2.CommitReplayResponse,
            {"commit_request_id": 1, "replay_id": 2, "error": 3, "process_time": 4},
        ),
    ],
)
def test_message_fields_match_salesforce(message: type, expected: dict[str, int]) -> None:
    assert _fields(message) == expected


def test_repeated_fields() -> None:
    # Read from the file's descriptor proto: the field descriptors' own way of saying this
    # changed between protobuf 5 (``label``) and 7 (``is_repeated``), and the stubs run on both.
    file = descriptor_pb2.FileDescriptorProto()
    pb2.DESCRIPTOR.CopyToProto(file)
    repeated = {
        (m.name, f.name)
        for m in file.message_type
        for f in m.field
        if f.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    }
    assert repeated == {
        ("ProducerEvent", "headers"),
        ("FetchResponse", "events"),
        ("PublishRequest", "events"),
        ("PublishResponse", "results"),
        ("ManagedFetchResponse", "events"),
    }


def test_enums_and_package() -> None:
    assert pb2.DESCRIPTOR.package == "eventbus.v1"
    assert dict(pb2.ErrorCode.items()) == {"UNKNOWN": 0, "PUBLISH": 1, "COMMIT": 2}
    assert dict(pb2.ReplayPreset.items()) == {"LATEST": 0, "EARLIEST": 1, "CUSTOM": 2}
    options = pb2.DESCRIPTOR.GetOptions()
    assert options.java_package == "com.salesforce.eventbus.protobuf"
    assert options.java_outer_classname == "PubSubProto"
    assert options.java_multiple_files


def test_service_methods_and_streaming_kinds() -> None:
    service = pb2.DESCRIPTOR.services_by_name["PubSub"]
    kinds = {
        m.name: (m.input_type.name, m.output_type.name, m.client_streaming, m.server_streaming)
        for m in service.methods
    }
    assert kinds == {
        "Subscribe": ("FetchRequest", "FetchResponse", True, True),
        "GetSchema": ("SchemaRequest", "SchemaInfo", False, False),
        "GetTopic": ("TopicRequest", "TopicInfo", False, False),
        "Publish": ("PublishRequest", "PublishResponse", False, False),
        "PublishStream": ("PublishRequest", "PublishResponse", True, True),
        "ManagedSubscribe": ("ManagedFetchRequest", "ManagedFetchResponse", True, True),
    }
    assert hasattr(pb2_grpc, "PubSubStub") and hasattr(pb2_grpc, "add_PubSubServicer_to_server")


def test_wire_bytes_of_a_fetch_request_are_salesforce_s() -> None:
    # topic_name (1, "t"), replay_preset CUSTOM (2, 2), replay_id (3, 0x01), num_requested (4, 100)
    raw = pb2.FetchRequest(
        topic_name="t", replay_preset=pb2.CUSTOM, replay_id=b"\x01", num_requested=100
    ).SerializeToString()
    assert raw == b"\x0a\x01t\x10\x02\x1a\x01\x01\x20\x64"
