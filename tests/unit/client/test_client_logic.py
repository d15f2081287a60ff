"""Pure parts of the client: error classification, backoff, the flow-control window, and
channel safety checks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.auth import Secret, StaticToken, TokenManager
from ingest.client.channel import TlsSettings, connect, is_loopback
from ingest.client.errors import classify, classify_status
from ingest.client.retry import RetryPolicy
from ingest.client.stream import FlowWindow
from ingest.errors import (
    AuthRejectedError,
    ConfigError,
    PermanentError,
    ReplayIdError,
    TransientError,
)
from ingest.tls import verification_failure

P = "sfdc.platform.eventbus.grpc."


@pytest.mark.parametrize(
    ("status", "code", "disposition"),
    [
        ("UNAVAILABLE", "", "transient"),
        ("UNAVAILABLE", P + "service.unavailable", "transient"),
        ("INTERNAL", P + "subscription.internal.error", "transient"),
        ("INTERNAL", "", "transient"),  # RST_STREAM as grpc reports it
        ("DEADLINE_EXCEEDED", "", "transient"),
        ("OK", "", "transient"),  # the server ended the stream
        ("UNAUTHENTICATED", P + "service.auth.error", "auth"),
        ("UNAUTHENTICATED", "", "auth"),
        ("INVALID_ARGUMENT", P + "subscription.fetch.replayid.corrupted", "replay"),
        ("INVALID_ARGUMENT", P + "subscription.fetch.replayid.validation.failed", "replay"),
        ("NOT_FOUND", P + "topic.not.found", "permanent"),
        ("PERMISSION_DENIED", P + "subscription.topic.cannot.subscribe", "permanent"),
        ("PERMISSION_DENIED", P + "service.tenant.license", "permanent"),
        ("RESOURCE_EXHAUSTED", P + "subscription.limit.exceeded", "permanent"),
        ("FAILED_PRECONDITION", P + "managed.subscription.config.stopped", "permanent"),
        ("ALREADY_EXISTS", P + "managed.subscription.already.active", "transient"),
        ("INVALID_ARGUMENT", P + "managed.subscription.something.new", "permanent"),
        ("DEADLINE_EXCEEDED", P + "managed.subscription.something.new", "transient"),
        ("DEADLINE_EXCEEDED", P + "managed.subscription.commit.timeout", "transient"),
        ("INVALID_ARGUMENT", "", "permanent"),
    ],
)
def test_classification_reads_status_and_trailer(status: str, code: str, disposition: str) -> None:
    assert classify_status(status, error_code=code).disposition == disposition


def test_trailer_wins_over_status_and_description_is_a_fallback() -> None:
    # a trailer-less replay failure is recognised from Salesforce's documented text
    failure = classify_status(
        "INVALID_ARGUMENT",
        description="The Replay ID validation failed. Ensure that the Replay ID is valid. "
        "rpcId: 2f6b4cee-3525-49d1-8fdb-0bd3d662062f",
    )
    assert failure.disposition == "replay"
    too_big = classify_status("RESOURCE_EXHAUSTED", description="Received message larger than max")
    assert too_big.disposition == "permanent"


GRPC_UNTRUSTED = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:7443: Tls "
    "handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL routines:"
    "OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate: OK"
)
PYTHON_UNTRUSTED = (
    "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer "
    "certificate (_ssl.c:1006)"
)


@pytest.mark.parametrize("text", [GRPC_UNTRUSTED, PYTHON_UNTRUSTED])
def test_the_verification_failure_is_read_out_of_grpc_and_openssl_text(text: str) -> None:
    assert verification_failure(text) == (
        "CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate"
    )
    assert verification_failure(ConnectionError(text)) == verification_failure(text)


def test_an_outage_is_not_a_verification_failure() -> None:
    refused = (
        "failed to connect to all addresses; last error: UNKNOWN: ipv6:%5B::1%5D:7443: "
        "Failed to connect to remote host: Connection refused"
    )
    assert verification_failure(refused) is None
    assert classify_status("UNAVAILABLE", description=refused).disposition == "transient"


def test_an_untrusted_certificate_in_the_status_text_is_permanent_with_the_fix() -> None:
    failure = classify_status("UNAVAILABLE", description=GRPC_UNTRUSTED)
    assert failure.disposition == "permanent"
    message = str(failure.exception("Subscribe to /data/X"))
    assert "is not trusted (CERTIFICATE_VERIFY_FAILED: unable to get local issuer" in message
    assert "ca_file" in message


def test_exceptions_carry_status_code_rpc_id_and_the_fix() -> None:
    failure = classify_status(
        "NOT_FOUND",
        error_code=P + "topic.not.found",
        rpc_id="rpc-1",
        description="The topic information for org CORE/prod/00D and topic /data/X not found.",
    )
    exc = failure.exception("Subscribe to /data/X")
    assert isinstance(exc, PermanentError)
    assert (exc.status, exc.error_code, exc.rpc_id) == ("NOT_FOUND", P + "topic.not.found", "rpc-1")
    assert "Subscribe to /data/X failed with NOT_FOUND" in str(exc)
    assert "Change Data Capture is enabled" in str(exc)
    assert "rpc-1" in str(exc)
    assert failure.summary() == "NOT_FOUND topic.not.found rpc-id rpc-1"
    kinds = {
        "transient": TransientError,
        "auth": AuthRejectedError,
        "replay": ReplayIdError,
    }
    for disposition, cls in kinds.items():
        code = {"transient": "UNAVAILABLE", "auth": "UNAUTHENTICATED"}.get(disposition, "")
        f = (
            classify_status(code)
            if code
            else classify_status(
                "INVALID_ARGUMENT", error_code=P + "subscription.fetch.replayid.corrupted"
            )
        )
        assert f.disposition == disposition
        assert isinstance(f.exception("x"), cls)


def test_non_grpc_exceptions_are_never_retried() -> None:
    assert classify(ValueError("bug")).disposition == "permanent"


def test_full_jitter_backoff_is_bounded_and_exponential() -> None:
    policy = RetryPolicy(initial_backoff=0.5, max_backoff=8, multiplier=2)
    assert [policy.cap(a) for a in range(1, 7)] == [0.5, 1, 2, 4, 8, 8]
    assert policy.delay(3, rand=lambda: 1.0) == 2
    assert policy.delay(3, rand=lambda: 0.0) == 0
    assert policy.cap(10_000) == 8  # no float overflow on long outages
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="initial_backoff"):
        RetryPolicy(initial_backoff=5, max_backoff=1)


@given(
    st.integers(1, 100),
    st.integers(0, 300),
    st.lists(st.tuples(st.booleans(), st.integers(1, 100)), max_size=200),
)
def test_flow_window_never_exceeds_its_bounds(
    window: int, extra: int, steps: list[tuple[bool, int]]
) -> None:
    flow = FlowWindow(window, window + extra)
    outstanding = flow.initial()
    buffered = 0
    for arrive, size in steps:
        if arrive:
            n = min(size, outstanding)  # the server never sends more than requested
            if n == 0:
                continue
            outstanding -= n
            buffered += n
            outstanding += flow.received(n, outstanding)
        else:
            n = min(size, buffered)
            if n == 0:
                continue
            buffered -= n
            outstanding += flow.taken(n)
        assert outstanding == flow.outstanding <= window
        assert outstanding + buffered <= window + extra
        # the window is never left empty while there is room for a worthwhile request
        room = min(window - outstanding, window + extra - outstanding - buffered)
        assert room < flow.min_request or (outstanding + buffered == 0 and room == 0) or room < 1


def test_flow_window_tops_up_by_what_the_consumer_takes() -> None:
    flow = FlowWindow(100)
    assert flow.initial() == 100
    assert flow.received(100, 0) == 0  # buffer full: nothing more until the consumer takes
    assert flow.taken(60) == 60
    assert flow.taken(10) == 0  # below a quarter of the window: wait for more room
    assert flow.taken(30) == 40
    assert flow.idle_ping() == 0  # events are outstanding
    prefetch = FlowWindow(100, 300)
    assert prefetch.initial() == 100
    assert prefetch.received(100, 0) == 100  # room in the buffer: ask again at once
    with pytest.raises(ValueError, match="between 1 and 100"):
        FlowWindow(101)
    with pytest.raises(ValueError, match="buffer_events"):
        FlowWindow(100, 50)


def test_idle_ping_asks_for_one_event_only_when_nothing_is_outstanding() -> None:
    flow = FlowWindow(10)
    flow.initial()
    flow.received(10, 0)
    assert flow.idle_ping() == 1
    assert flow.idle_ping() == 0


def test_channel_refuses_plaintext_off_loopback() -> None:
    tokens = TokenManager(StaticToken(Secret("t"), instance_url="https://a.b", tenant_id="00D"))
    with pytest.raises(ConfigError, match="loopback"):
        connect("api.pubsub.salesforce.com:7443", tokens=tokens, tls=TlsSettings(enabled=False))
    with pytest.raises(ConfigError, match="does not exist"):
        connect(
            "api.pubsub.salesforce.com:7443", tokens=tokens, tls=TlsSettings(ca_file="/nope.pem")
        )  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="host:port"):
        connect("api.pubsub.salesforce.com", tokens=tokens)
    assert is_loopback("127.0.0.1:7443") and is_loopback("[::1]:7443")
    assert is_loopback("localhost:1") and not is_loopback("10.0.0.1:7443")
    connect("api.pubsub.salesforce.com:7443", tokens=tokens).close()  # TLS, public roots
