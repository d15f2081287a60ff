"""A server certificate that fails verification is a configuration error, not an outage.

The emulator serves TLS with a CA of its own; a client that does not trust that CA must fail
at once (no backoff, no retries), saying the certificate was not trusted and how to trust
it, whether the failure happens on the gRPC channel or on the HTTPS login and REST calls.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ingest.auth import ClientCredentials, Secret, StaticToken, TokenManager
from ingest.client import SchemaCache
from ingest.client.channel import TlsSettings, connect
from ingest.client.retry import RetryPolicy
from ingest.client.subscriber import Subscription
from ingest.emulator.server import DEFAULT_CLIENT, Emulator, EmulatorConfig
from ingest.emulator.tls import CA_CERT
from ingest.errors import (
    AuthError,
    AuthUnavailableError,
    PermanentError,
    RestError,
    TransientError,
)
from ingest.rest import RestClient
from pipelines.connect import connect as connect_source
from pipelines.connect import secret_resolver
from pipelines.spec import ConnectionSpec, EmulatorSpec, EmulatorTls
from tests.integration.client.conftest import TOPIC, make_catalogue

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# The subscriber's own default: before verification failures were told apart, these ten
# attempts took 68-143 s of backoff before giving up.
DEFAULT_RETRY = RetryPolicy()


@pytest.fixture
def tls_emulator(make_emulator: Callable[..., Emulator]) -> Emulator:
    return make_emulator(tls=True)


@pytest.fixture
def other_ca(tmp_path: Path) -> Iterator[Path]:
    """The CA of another emulator: a real CA file that did not sign the server's certificate."""
    other = Emulator(make_catalogue(), EmulatorConfig(tls=True, cert_dir=tmp_path / "other"))
    other.start()
    other.close()
    yield tmp_path / "other" / CA_CERT


class Sleeps:
    """Records the backoff a subscriber asks for instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def _static_tokens(emulator: Emulator) -> TokenManager:
    issued = emulator.issue_token()
    return TokenManager(
        StaticToken(
            Secret(issued.access_token),
            instance_url=emulator.instance_url,
            tenant_id=emulator.org_id,
        )
    )


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _assert_names_verification(message: str) -> None:
    assert "CERTIFICATE_VERIFY_FAILED" in message, message
    assert "not trusted" in message, message
    assert "ca_file" in message, message
    assert "Connection refused" not in message, message
    assert "::1" not in message, message


def _subscribe(channel: object, tokens: TokenManager, sleeps: Sleeps) -> None:
    with Subscription(
        channel,  # type: ignore[arg-type]
        TOPIC,
        tokens=tokens,
        retry=DEFAULT_RETRY,
        sleep=sleeps,
    ) as sub:
        for _ in sub:
            pass


def test_subscribe_to_localhost_with_an_untrusted_certificate_fails_at_once(
    tls_emulator: Emulator,
) -> None:
    # `localhost`, as a user writes it: where it also resolves to ::1 (the emulator listens on
    # 127.0.0.1), gRPC reported "Connection refused" for ::1 after ten attempts.
    channel = connect(
        f"localhost:{tls_emulator.grpc_port}", tokens=None, tls=TlsSettings(enabled=True)
    )
    sleeps = Sleeps()
    with pytest.raises(PermanentError) as caught:
        _subscribe(channel, _static_tokens(tls_emulator), sleeps)
    channel.close()
    assert sleeps.delays == []
    _assert_names_verification(str(caught.value))
    assert "public root certificates" in str(caught.value)


def test_the_failure_is_found_when_grpc_reports_another_address_last(
    tls_emulator: Emulator,
) -> None:
    # Two addresses for one target, as `localhost` has on a dual-stack machine: the server on
    # the first, nothing on the second. gRPC's error then names only the refused address.
    target = f"ipv4:127.0.0.1:{tls_emulator.grpc_port},127.0.0.1:{_closed_port()}"
    channel = connect(target, tokens=None, tls=TlsSettings(enabled=True))
    sleeps = Sleeps()
    with pytest.raises(PermanentError) as caught:
        _subscribe(channel, _static_tokens(tls_emulator), sleeps)
    channel.close()
    assert sleeps.delays == []
    _assert_names_verification(str(caught.value))
    assert f"127.0.0.1:{tls_emulator.grpc_port}" in str(caught.value)


def test_a_ca_file_that_did_not_sign_the_certificate_is_named(
    tls_emulator: Emulator, other_ca: Path
) -> None:
    channel = connect(
        tls_emulator.grpc_target, tokens=None, tls=TlsSettings(enabled=True, ca_file=other_ca)
    )
    with pytest.raises(PermanentError) as caught:
        SchemaCache(channel, tokens=_static_tokens(tls_emulator)).topic_info(TOPIC)
    channel.close()
    _assert_names_verification(str(caught.value))
    assert str(other_ca) in str(caught.value)


def test_an_unreachable_server_is_still_retried_as_an_outage() -> None:
    channel = connect(f"localhost:{_closed_port()}", tokens=None, tls=TlsSettings(enabled=True))
    sleeps = Sleeps()
    retry = RetryPolicy(max_attempts=2, initial_backoff=0.0, max_backoff=0.0)
    with (
        pytest.raises(
            TransientError, match="gave up after 2 consecutive failed attempts"
        ) as caught,
        Subscription(channel, TOPIC, retry=retry, sleep=sleeps) as sub,
    ):
        for _ in sub:
            pass
    channel.close()
    assert len(sleeps.delays) == 2
    assert "CERTIFICATE_VERIFY_FAILED" not in str(caught.value)


def test_an_oauth_login_to_an_untrusted_server_is_refused_not_retried(
    tls_emulator: Emulator,
) -> None:
    provider = ClientCredentials(
        tls_emulator.http_url.replace("127.0.0.1", "localhost"),
        client_id=DEFAULT_CLIENT.client_id,
        client_secret=Secret(DEFAULT_CLIENT.client_secret),
    )
    with pytest.raises(AuthError) as caught:
        provider.fetch()
    assert not isinstance(caught.value, AuthUnavailableError)
    _assert_names_verification(str(caught.value))

    # A subscriber logging in through it stops at once instead of backing off.
    channel = connect(
        tls_emulator.grpc_target,
        tokens=None,
        tls=TlsSettings(enabled=True, ca_file=tls_emulator.ca_cert_path),
    )
    sleeps = Sleeps()
    with pytest.raises(AuthError) as again:
        _subscribe(channel, TokenManager(provider), sleeps)
    channel.close()
    assert sleeps.delays == []
    _assert_names_verification(str(again.value))


def test_a_rest_call_to_an_untrusted_server_is_refused_not_retried(
    tls_emulator: Emulator, other_ca: Path
) -> None:
    sleeps = Sleeps()
    # The login trusts the emulator; the REST client (its own HTTPS client) does not.
    rest = RestClient(
        _static_tokens(tls_emulator),
        tls=TlsSettings(enabled=True, ca_file=other_ca),
        sleep=sleeps,
    )
    with rest, pytest.raises(RestError) as caught:
        list(rest.query("SELECT Id FROM Account"))
    assert sleeps.delays == []
    _assert_names_verification(str(caught.value))


def test_ingest_against_an_external_emulator_with_the_wrong_ca_fails_at_once(
    tls_emulator: Emulator, other_ca: Path
) -> None:
    spec = ConnectionSpec(
        emulator=EmulatorSpec(
            mode="external",
            host="localhost",
            grpc_port=tls_emulator.grpc_port,
            http_port=tls_emulator.http_port,
            tls=EmulatorTls(enabled=True, ca_file=str(other_ca)),
        )
    )
    with connect_source(spec, secrets=secret_resolver()) as source:
        sleeps = Sleeps()
        with pytest.raises(AuthError) as caught:
            _subscribe(source.channel, source.tokens, sleeps)
    assert sleeps.delays == []
    _assert_names_verification(str(caught.value))
    assert str(other_ca) in str(caught.value)
