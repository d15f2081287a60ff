"""What the channel puts on the wire: auth headers and a trace id on every call."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from ingest.auth import Credentials, Secret, TokenManager
from ingest.client.channel import TlsSettings, connect
from ingest.client.schemas import SchemaCache
from ingest.pubsub import pb2, pb2_grpc

pytestmark = pytest.mark.integration


class HeaderEcho(pb2_grpc.PubSubServicer):
    """Answers GetTopic and remembers the metadata of every call."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []

    def GetTopic(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.seen.append({k: str(v) for k, v in context.invocation_metadata()})
        return pb2.TopicInfo(topic_name=request.topic_name, schema_id="sid", rpc_id="r")


class Rotating:
    name = "rotating"

    def __init__(self) -> None:
        self.n = 0

    def fetch(self) -> Credentials:
        self.n += 1
        return Credentials(
            Secret(f"00Dx!token-{self.n}"), "https://acme.my.salesforce.com", "00Dx", None, 0.0
        )


@pytest.fixture
def echo() -> Iterator[tuple[HeaderEcho, str]]:
    servicer = HeaderEcho()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb2_grpc.add_PubSubServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(0)


def test_every_call_carries_the_current_credentials_and_a_fresh_trace_id(
    echo: tuple[HeaderEcho, str],
) -> None:
    servicer, target = echo
    tokens = TokenManager(Rotating(), clock=lambda: 1.0)
    channel = connect(target, tokens=tokens, tls=TlsSettings(enabled=False))
    cache = SchemaCache(channel)
    cache.topic_info("/event/A__e")
    tokens.invalidate()
    cache.topic_info("/event/A__e", refresh=True)
    channel.close()
    first, second = servicer.seen
    assert first["accesstoken"] == "00Dx!token-1"
    assert second["accesstoken"] == "00Dx!token-2"  # a refreshed token, same channel
    assert first["instanceurl"] == "https://acme.my.salesforce.com"
    assert first["tenantid"] == "00Dx"
    assert first["x-client-trace-id"] != second["x-client-trace-id"]
    assert len(first["x-client-trace-id"]) == 36
