"""Client pieces without a server: splitting bodies into exact message texts, the error table,
request packing, and malformed input handed out for quarantine (a scripted fake transport)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from ingest.auth import Secret, StaticToken, TokenManager
from ingest.client.retry import RetryPolicy
from ingest.cometd import (
    CometdSubscription,
    IdleConnect,
    MalformedMessage,
    NotificationBatch,
    Reconnected,
    classify,
    pack,
    split_messages,
)
from ingest.errors import (
    ChannelError,
    HandshakeDeniedError,
    RequestTooLargeError,
    StreamingAuthError,
    StreamingLimitError,
    StreamingProtocolError,
    StreamingReplayError,
    StreamingUnavailableError,
    UnknownClientError,
)

pytestmark = pytest.mark.streaming_api


def test_split_keeps_each_message_text_exactly() -> None:
    body = '[ {"a": 1,  "b": [1,2]} ,{"c":"x]"}]'
    assert split_messages(body) == [
        ('{"a": 1,  "b": [1,2]}', {"a": 1, "b": [1, 2]}),
        ('{"c":"x]"}', {"c": "x]"}),
    ]
    assert split_messages('{"one": true}') == [('{"one": true}', {"one": True})]
    for bad in ("", "nope", "[1,", "[1 2]", "[1] x", "[,1]"):
        with pytest.raises(ValueError):
            split_messages(bad)


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (
            {"error": "400::API version in the URI is mandatory. URI format: '/cometd/62.0'"},
            StreamingProtocolError,
        ),
        (
            {"error": "400::Unsupported API version. Only API versions '23.0' and above"},
            StreamingProtocolError,
        ),
        ({"error": "400::Invalid connection type websocket"}, StreamingProtocolError),
        (
            {"error": "400::The channel you requested to subscribe to does not exist /topic/X"},
            ChannelError,
        ),
        ({"error": "400::Channel name not specified"}, ChannelError),
        ({"error": "400::Channel subscriptions must start with a leading '/'"}, ChannelError),
        ({"error": "400::Query fields Foo do not exist on the topic entity"}, ChannelError),
        (
            {"error": "400::Client abc has established a session, but no BAYEUX_BROWSER cookie"},
            StreamingProtocolError,
        ),
        ({"error": "400::The replayId 5 you provided was invalid."}, StreamingReplayError),
        ({"error": "401::Authentication invalid"}, StreamingAuthError),
        ({"error": "401::Request requires authentication"}, StreamingAuthError),
        ({"error": "403::Cannot create channel /u/x"}, ChannelError),
        (
            {"error": "403::Subscriber does not have access to the entity in this topic"},
            ChannelError,
        ),
        (
            {"error": "403::Subscriber does not have access to all fields referenced in the where"},
            ChannelError,
        ),
        (
            {
                "error": "403::Handshake denied",
                "ext": {
                    "sfdc": {"failureReason": "403::Organization concurrent user limit exceeded"}
                },
            },
            HandshakeDeniedError,
        ),
        (
            {
                "error": "403::Handshake denied",
                "ext": {"sfdc": {"failureReason": "401::Authentication invalid"}},
            },
            StreamingAuthError,
        ),
        ({"error": "403::Client has not completed handshake"}, UnknownClientError),
        ({"error": "403::Organization concurrent user limit exceeded"}, StreamingLimitError),
        ({"error": "403::Organization total events daily limit exceeded"}, StreamingLimitError),
        ({"error": "403::Restricted channel"}, ChannelError),
        ({"error": "403::User not enabled for streaming"}, ChannelError),
        (
            {"error": "403::User not allowed to subscribe CDC without View All Data permissions"},
            ChannelError,
        ),
        ({"error": "403::Subscription limit exceeded for this topic"}, StreamingLimitError),
        ({"error": "403::Unknown client"}, UnknownClientError),
        (
            {"error": "403::Unable to create channel dynamically, maximum channel limit has been"},
            StreamingLimitError,
        ),
        ({"error": "403::No access on channel"}, ChannelError),
        ({"error": "404::channel names may not vary only by case"}, ChannelError),
        ({"error": "404::Unknown channel"}, ChannelError),
        ({"error": "413::Maximum Request Size Exceeded"}, RequestTooLargeError),
    ],
)
def test_every_error_of_the_guide_has_a_class(
    reply: dict[str, Any], error: type[Exception]
) -> None:
    exc = classify({"channel": "/meta/subscribe", "successful": False, **reply}, stage="subscribe")
    assert type(exc) is error
    assert exc.error == reply["error"] and exc.code == int(reply["error"][:3])


def test_pack_splits_under_the_limit_and_refuses_oversized_messages() -> None:
    messages = [
        {"channel": "/meta/subscribe", "subscription": f"/u/{'x' * 90}{i}"} for i in range(50)
    ]
    bodies = list(pack(messages, limit=1024))
    assert len(bodies) > 1 and all(len(b.encode()) <= 1024 for b in bodies)
    assert [m for b in bodies for m in json.loads(b)] == messages
    with pytest.raises(RequestTooLargeError, match="32768"):
        list(pack([{"channel": "/meta/subscribe", "subscription": "/u/" + "y" * 40_000}]))


def _tokens() -> TokenManager:
    return TokenManager(
        StaticToken(Secret("00D!token"), instance_url="http://127.0.0.1:1", tenant_id="00D")
    )


def _scripted(
    connects: list[str], disconnects: list[str] | None = None
) -> Callable[[httpx.Request], httpx.Response]:
    def answer(request: httpx.Request) -> httpx.Response:
        (message,) = json.loads(request.content)
        channel = message["channel"]
        if channel == "/meta/disconnect":
            if disconnects is not None:
                disconnects.append(message["clientId"])
            return httpx.Response(200, json=[{**message, "successful": True}])
        if channel == "/meta/handshake":
            body = [
                {
                    **message,
                    "successful": True,
                    "clientId": "c1",
                    "supportedConnectionTypes": ["long-polling"],
                }
            ]
            return httpx.Response(200, json=body)
        if channel == "/meta/subscribe":
            return httpx.Response(200, json=[{**message, "successful": True}])
        text = connects.pop(0) if connects else "[]"
        return httpx.Response(200, text=text.replace("ID", message["id"]))

    return answer


def test_malformed_messages_are_handed_out_with_what_could_be_read() -> None:
    reply = '{"channel":"/meta/connect","id":"ID","successful":true}'
    good = '{"channel":"/u/A","data":{"payload":"p","event":{"replayId":4}}}'
    no_id = '{"channel":"/u/A","data":{"payload":"p","event":{"replayId":"x"}}}'
    no_data = '{"channel":"/u/A"}'
    connects = [f"[{good},{no_id},{no_data},7,{reply}]", "this is not json", f"[{reply}]"]
    disconnects: list[str] = []
    http = httpx.Client(transport=httpx.MockTransport(_scripted(connects, disconnects)))
    sub = CometdSubscription(
        _tokens(),
        ["/u/A"],
        http=http,
        sleep=lambda s: None,
        retry=RetryPolicy(max_attempts=2, initial_backoff=0, max_backoff=0),
    )
    items = iter(sub)
    batch = next(items)
    assert isinstance(batch, NotificationBatch) and batch.notifications[0].raw == good
    bad = [next(items) for _ in range(3)]
    assert all(isinstance(b, MalformedMessage) for b in bad)
    assert [b.raw for b in bad] == [no_id, no_data, "7"]
    assert [(b.channel, b.replay_id) for b in bad] == [("/u/A", None), ("/u/A", None), (None, None)]
    body = next(items)
    assert isinstance(body, MalformedMessage) and body.raw == "this is not json"
    assert isinstance(next(items), Reconnected)
    # The session whose connect answered with a body that was not JSON may still be open on
    # the server: it was disconnected before the new handshake.
    assert disconnects == ["c1"]
    assert isinstance(next(items), IdleConnect)
    sub.close()
    assert disconnects == ["c1", "c1"]


def test_network_failures_are_bounded() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    waits: list[float] = []
    sub = CometdSubscription(
        _tokens(),
        ["/u/A"],
        http=httpx.Client(transport=httpx.MockTransport(down)),
        sleep=waits.append,
        rand=lambda: 1.0,
        retry=RetryPolicy(max_attempts=3, initial_backoff=1, max_backoff=4),
    )
    with pytest.raises(StreamingUnavailableError, match="gave up after 3"):
        next(iter(sub))
    assert waits == [1.0, 2.0, 4.0]


def test_token_never_in_errors() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    sub = CometdSubscription(
        _tokens(),
        ["/u/A"],
        http=httpx.Client(transport=httpx.MockTransport(down)),
        sleep=lambda s: None,
        retry=RetryPolicy(max_attempts=1),
    )
    with pytest.raises(StreamingUnavailableError) as caught:
        next(iter(sub))
    assert "00D!token" not in str(caught.value) and "00D!token" not in repr(caught.value.__cause__)


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match=r"leading '/'.*replay must be"):
        CometdSubscription(_tokens(), {"topic/x": -3})
    with pytest.raises(ValueError, match=r"37\.0 or later"):
        CometdSubscription(_tokens(), ["/u/A"], api_version="36.0")
