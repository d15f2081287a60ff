"""Every login flow against the emulator's OAuth / SOAP endpoint over HTTPS with certificate
verification, TLS gRPC against the emulator's CA, and secrets kept out of logs and messages."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterator

import grpc
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from ingest.auth import (
    ClientCredentials,
    DeprecatedAuthFlowWarning,
    JwtBearer,
    RefreshToken,
    Secret,
    SoapLogin,
    StaticToken,
    TokenManager,
    TokenProvider,
    UsernamePassword,
)
from ingest.client.channel import TlsSettings, connect
from ingest.client.schemas import SchemaCache
from ingest.client.stream import EventBatch
from ingest.client.subscriber import Subscription
from ingest.emulator.oauth import OAuthClient
from ingest.emulator.server import Emulator
from ingest.errors import AuthError, AuthRejectedError, ConfigError, PermanentError
from ingest.replay import Earliest
from tests.integration.client.conftest import TOPIC, fill

pytestmark = pytest.mark.integration

# Distinctive values so a leak anywhere is easy to find.
CLIENT_SECRET = "cs-ZEBRA-4242-secret"
PASSWORD = "pw-OKAPI-7777-secret"
SECURITY_TOKEN = "st-NARWHAL-9090"
USERNAME = "jobs@sfcdc.example"


def _key_and_cert() -> tuple[str, bytes]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sfcdc-jwt")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    return pem, cert.public_bytes(serialization.Encoding.PEM)


KEY_PEM, CERT_PEM = _key_and_cert()


@pytest.fixture
def tls_emulator(make_emulator: Callable[..., Emulator]) -> Emulator:
    client = OAuthClient(
        client_id="sfcdc-jobs",
        client_secret=CLIENT_SECRET,
        username=USERNAME,
        password=PASSWORD,
        security_token=SECURITY_TOKEN,
        jwt_cert_pem=CERT_PEM,
    )
    return make_emulator(tls=True, clients=(client,))


def _providers(emu: Emulator) -> dict[str, Callable[[], TokenProvider]]:
    ca = emu.ca_cert_path
    url = emu.http_url

    def refresh() -> TokenProvider:
        issued = emu.issue_token("sfcdc-jobs", refresh_token=True)
        assert issued.refresh_token
        return RefreshToken(
            url, client_id="sfcdc-jobs", refresh_token=Secret(issued.refresh_token), ca_file=ca
        )

    def soap() -> TokenProvider:
        with pytest.warns(DeprecatedAuthFlowWarning, match="retired"):
            return SoapLogin(
                url,
                username=USERNAME,
                password=Secret(PASSWORD),
                security_token=Secret(SECURITY_TOKEN),
                ca_file=ca,
            )

    return {
        "client_credentials": lambda: ClientCredentials(
            url, client_id="sfcdc-jobs", client_secret=Secret(CLIENT_SECRET), ca_file=ca
        ),
        "jwt_bearer": lambda: JwtBearer(
            url, client_id="sfcdc-jobs", username=USERNAME, private_key=Secret(KEY_PEM), ca_file=ca
        ),
        "username_password": lambda: UsernamePassword(
            url,
            client_id="sfcdc-jobs",
            client_secret=Secret(CLIENT_SECRET),
            username=USERNAME,
            password=Secret(PASSWORD),
            security_token=Secret(SECURITY_TOKEN),
            ca_file=ca,
        ),
        "refresh_token": refresh,
        "soap_login": soap,
        "static_token": lambda: StaticToken(
            Secret(emu.issue_token("sfcdc-jobs").access_token),
            instance_url=emu.instance_url,
            tenant_id=emu.org_id,
        ),
    }


FLOWS = [
    "client_credentials",
    "jwt_bearer",
    "username_password",
    "refresh_token",
    "soap_login",
    "static_token",
]


@pytest.fixture
def secure_channel(tls_emulator: Emulator) -> Iterator[Callable[[TokenManager], grpc.Channel]]:
    opened: list[grpc.Channel] = []

    def make(tokens: TokenManager) -> grpc.Channel:
        ch = connect(
            tls_emulator.grpc_target,
            tokens=tokens,
            tls=TlsSettings(ca_file=tls_emulator.ca_cert_path),
        )
        opened.append(ch)
        return ch

    yield make
    for ch in opened:
        ch.close()


@pytest.mark.parametrize("flow", FLOWS)
def test_every_flow_logs_in_and_subscribes_over_verified_tls(
    tls_emulator: Emulator, secure_channel: Callable[[TokenManager], grpc.Channel], flow: str
) -> None:
    provider = _providers(tls_emulator)[flow]()
    tokens = TokenManager(provider)
    credentials = tokens.current()
    assert credentials.tenant_id == tls_emulator.org_id
    assert credentials.instance_url == tls_emulator.instance_url
    assert credentials.access_token.reveal().startswith(tls_emulator.org_id[:15])
    fill(tls_emulator, 3)
    channel = secure_channel(tokens)
    assert SchemaCache(channel).topic_info(TOPIC).can_publish
    got = 0
    with Subscription(channel, TOPIC, start=Earliest(), tokens=tokens) as sub:
        for item in sub:
            if isinstance(item, EventBatch):
                got += len(item.events)
            if got >= 3:
                break
    assert got == 3


def test_tls_verification_is_on(tls_emulator: Emulator) -> None:
    # Without the emulator's CA the self-signed certificate is not trusted, neither for
    # HTTPS logins nor for gRPC.
    provider = ClientCredentials(
        tls_emulator.http_url, client_id="sfcdc-jobs", client_secret=Secret(CLIENT_SECRET)
    )
    with pytest.raises(AuthError, match=r"certificate at .* is not trusted"):
        provider.fetch()
    tokens = TokenManager(
        StaticToken(
            Secret(tls_emulator.issue_token().access_token),
            instance_url=tls_emulator.instance_url,
            tenant_id=tls_emulator.org_id,
        )
    )
    channel = connect(tls_emulator.grpc_target, tokens=tokens, tls=TlsSettings())
    with pytest.raises(PermanentError, match="CERTIFICATE_VERIFY_FAILED"):
        SchemaCache(channel).topic_info(TOPIC)
    channel.close()


def test_a_static_token_that_expired_fails_with_a_clear_message(
    tls_emulator: Emulator, secure_channel: Callable[[TokenManager], grpc.Channel]
) -> None:
    tokens = TokenManager(_providers(tls_emulator)["static_token"]())
    tls_emulator.faults.expire_tokens()
    channel = secure_channel(tokens)
    sub = Subscription(channel, TOPIC, tokens=tokens, sleep=lambda s: None)
    with pytest.raises(AuthRejectedError, match="static token cannot be refreshed"), sub:
        for _ in sub:
            pass


@pytest.mark.parametrize(
    ("flow", "expected"),
    [
        ("client_credentials", "invalid_client"),
        ("username_password", "invalid_grant"),
        ("soap_login", "INVALID_LOGIN"),
    ],
)
def test_rejected_logins_say_why_without_the_secret(
    tls_emulator: Emulator, flow: str, expected: str
) -> None:
    ca, url = tls_emulator.ca_cert_path, tls_emulator.http_url
    wrong = Secret("wrong-ZEBRA-4242-secret")
    provider: TokenProvider
    if flow == "client_credentials":
        provider = ClientCredentials(url, client_id="sfcdc-jobs", client_secret=wrong, ca_file=ca)
    elif flow == "username_password":
        provider = UsernamePassword(
            url,
            client_id="sfcdc-jobs",
            client_secret=Secret(CLIENT_SECRET),
            username=USERNAME,
            password=wrong,
            ca_file=ca,
        )
    else:
        with pytest.warns(DeprecatedAuthFlowWarning):
            provider = SoapLogin(url, username=USERNAME, password=wrong, ca_file=ca)
    with pytest.raises(AuthError) as info:
        provider.fetch()
    assert expected in str(info.value)
    assert "wrong-ZEBRA" not in str(info.value)


def test_secrets_never_appear_in_logs_messages_or_reprs(
    tls_emulator: Emulator,
    secure_channel: Callable[[TokenManager], grpc.Channel],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    providers = _providers(tls_emulator)
    seen: list[str] = []
    tokens_seen: list[str] = []
    for flow in FLOWS:
        provider = providers[flow]()
        manager = TokenManager(provider, logger=logging.getLogger("sfcdc.test.tokens"))
        credentials = manager.current()
        tokens_seen.append(credentials.access_token.reveal())
        seen += [repr(provider), repr(manager), repr(credentials), str(credentials)]
        manager.invalidate(credentials)
        manager.current()
    # failures: a wrong password and an expired token on a live subscription
    with pytest.raises(AuthError) as info:
        UsernamePassword(
            tls_emulator.http_url,
            client_id="sfcdc-jobs",
            client_secret=Secret(CLIENT_SECRET),
            username=USERNAME,
            password=Secret(PASSWORD + "x"),
            ca_file=tls_emulator.ca_cert_path,
        ).fetch()
    seen.append(str(info.value))
    tokens = TokenManager(providers["static_token"]())
    tokens_seen.append(tokens.current().access_token.reveal())
    tls_emulator.faults.expire_tokens()
    sub = Subscription(secure_channel(tokens), TOPIC, tokens=tokens, sleep=lambda s: None)
    with pytest.raises(AuthRejectedError) as rejected, sub:
        for _ in sub:
            pass
    seen.append(str(rejected.value))
    seen.append(repr(sub))
    seen += [r.getMessage() for r in caplog.records]
    seen += [str(r.args) for r in caplog.records]
    text = "\n".join(seen)
    assert len(caplog.records) > 10
    for secret in (CLIENT_SECRET, PASSWORD, SECURITY_TOKEN, KEY_PEM[40:80], *tokens_seen):
        assert secret not in text


def test_client_credentials_refuses_the_generic_login_hosts() -> None:
    for host in ("https://login.salesforce.com", "https://test.salesforce.com/"):
        with pytest.raises(ConfigError, match="My Domain"):
            ClientCredentials(host, client_id="x", client_secret=Secret("y"))


def test_userinfo_supplies_the_org_when_the_token_response_has_no_identity_url() -> None:
    # A fake transport (not a mock of our code): a token endpoint without `id`, and userinfo.
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/services/oauth2/token":
            return httpx.Response(
                200,
                json={
                    "access_token": "00Dxx!tok",
                    "instance_url": "https://acme.my.salesforce.com",
                    "issued_at": "1700000000000",
                },
            )
        assert request.headers["Authorization"] == "Bearer 00Dxx!tok"
        return httpx.Response(200, json={"organization_id": "00D000000000042AAA"})

    provider = ClientCredentials(
        "https://acme.my.salesforce.com",
        client_id="x",
        client_secret=Secret("y"),
        http=httpx.Client(transport=httpx.MockTransport(handler)),
    )
    credentials = provider.fetch()
    assert credentials.tenant_id == "00D000000000042AAA"
    assert credentials.issued_at == 1_700_000_000.0
