"""The OAuth/SOAP HTTP endpoint (every grant, userinfo, SOAP login) and TLS with certificate
verification on, all over real sockets."""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import ssl
from pathlib import Path
from xml.etree import ElementTree

import grpc
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from ingest.emulator.oauth import JWT_BEARER, OAuthClient
from ingest.pubsub import pb2, pb2_grpc
from tests.emulator_helpers import ORDER_TOPIC, assert_sf_error

pytestmark = pytest.mark.integration

SECRET = "s3cr3t-client-secret"
PASSWORD = "p4ssw0rd-value"
SEC_TOKEN = "SECTOKEN123"


def _rsa_identity() -> tuple[rsa.RSAPrivateKey, bytes]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "jwt-client")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .sign(key, hashes.SHA256())
    )
    return key, cert.public_bytes(serialization.Encoding.PEM)


KEY, CERT = _rsa_identity()
OTHER_KEY, _ = _rsa_identity()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def jwt(claims: dict, key: rsa.RSAPrivateKey = KEY, alg: str = "RS256") -> str:
    head = _b64(json.dumps({"alg": alg, "typ": "JWT"}).encode())
    body = _b64(json.dumps(claims).encode())
    signature = key.sign(f"{head}.{body}".encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{head}.{body}.{_b64(signature)}"


CLIENTS = (
    OAuthClient(
        client_id="app-1",
        client_secret=SECRET,
        username="svc@example.com",
        password=PASSWORD,
        security_token=SEC_TOKEN,
        jwt_cert_pem=CERT,
    ),
    OAuthClient("app-2", "other-secret", "second@example.com", "second-password"),
)


@pytest.fixture
def emulator(make_emulator):
    return make_emulator(clients=CLIENTS)


@pytest.fixture
def http(emulator):
    with httpx.Client(base_url=emulator.http_url, timeout=5) as client:
        yield client


def _token(http, **form):
    return http.post("/services/oauth2/token", data=form)


def _grpc_ok(emulator, access_token: str, instance_url: str) -> None:
    channel = emulator.channel()
    stub = pb2_grpc.PubSubStub(channel)
    md = (
        ("accesstoken", access_token),
        ("instanceurl", instance_url),
        ("tenantid", emulator.org_id),
    )
    assert stub.GetTopic(pb2.TopicRequest(topic_name=ORDER_TOPIC), metadata=md).can_publish
    channel.close()


def test_client_credentials(emulator, http, clock):
    r = _token(http, grant_type="client_credentials", client_id="app-1", client_secret=SECRET)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["access_token"].startswith(emulator.org_id[:15] + "!")
    assert body["instance_url"] == emulator.http_url
    user_id = CLIENTS[0].user_id
    assert body["id"] == f"{emulator.http_url}/id/{emulator.org_id}/{user_id}"
    assert body["token_type"] == "Bearer"
    assert body["issued_at"] == str(int(clock() * 1000))
    assert body["signature"] and "refresh_token" not in body
    _grpc_ok(emulator, body["access_token"], body["instance_url"])


def test_client_credentials_with_basic_auth_header(http):
    r = http.post(
        "/services/oauth2/token",
        data={"grant_type": "client_credentials"},
        auth=("app-2", "other-secret"),
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("form", "error"),
    [
        ({"client_id": "app-1", "client_secret": "wrong"}, "invalid_client"),
        ({"client_id": "nobody", "client_secret": SECRET}, "invalid_client_id"),
        ({"client_id": "app-1"}, "invalid_request"),
    ],
)
def test_client_credentials_errors(http, form, error):
    r = _token(http, grant_type="client_credentials", **form)
    assert r.status_code == 400
    assert r.json()["error"] == error and r.json()["error_description"]


def test_password_grant_needs_the_security_token(emulator, http):
    base = {"grant_type": "password", "client_id": "app-1", "client_secret": SECRET}
    ok = _token(http, **base, username="svc@example.com", password=PASSWORD + SEC_TOKEN)
    assert ok.status_code == 200, ok.text
    _grpc_ok(emulator, ok.json()["access_token"], ok.json()["instance_url"])
    bad = _token(http, **base, username="svc@example.com", password=PASSWORD)
    assert bad.status_code == 400
    assert bad.json() == {"error": "invalid_grant", "error_description": "authentication failure"}


def test_jwt_bearer(emulator, http, clock):
    claims = {
        "iss": "app-1",
        "sub": "svc@example.com",
        "aud": "https://login.salesforce.com",
        "exp": int(clock()) + 300,
    }
    for aud in ("https://login.salesforce.com", "https://test.salesforce.com", emulator.http_url):
        r = _token(http, grant_type=JWT_BEARER, assertion=jwt({**claims, "aud": aud}))
        assert r.status_code == 200, r.text
    _grpc_ok(emulator, r.json()["access_token"], r.json()["instance_url"])


@pytest.mark.parametrize(
    ("change", "error", "needle"),
    [
        ({"key": OTHER_KEY}, "invalid_grant", "signature"),
        ({"aud": "https://evil.example.com"}, "invalid_grant", "audience"),
        ({"exp": -10}, "invalid_grant", "expired"),
        ({"sub": "someone@else.com"}, "invalid_grant", "approved"),
        ({"iss": "nobody"}, "invalid_client_id", "client"),
        ({"iss": "app-2"}, "invalid_client", "certificate"),
        ({"alg": "HS256"}, "invalid_grant", "RS256"),
    ],
)
def test_jwt_bearer_rejections(http, clock, change, error, needle):
    claims = {
        "iss": change.get("iss", "app-1"),
        "sub": change.get("sub", "svc@example.com"),
        "aud": change.get("aud", "https://login.salesforce.com"),
        "exp": int(clock()) + change.get("exp", 300),
    }
    assertion = jwt(claims, key=change.get("key", KEY), alg=change.get("alg", "RS256"))
    r = _token(http, grant_type=JWT_BEARER, assertion=assertion)
    assert r.status_code == 400
    assert r.json()["error"] == error
    assert needle in r.json()["error_description"]


def test_jwt_garbage_assertion(http):
    r = _token(http, grant_type=JWT_BEARER, assertion="not-a-jwt")
    assert r.status_code == 400 and r.json()["error"] == "invalid_grant"


def test_refresh_token_grant(emulator, http):
    token = emulator.issue_token("app-1", refresh_token=True)
    assert token.refresh_token
    r = _token(
        http, grant_type="refresh_token", client_id="app-1", refresh_token=token.refresh_token
    )
    assert r.status_code == 200, r.text
    fresh = r.json()["access_token"]
    assert fresh != token.access_token
    _grpc_ok(emulator, fresh, r.json()["instance_url"])
    wrong_client = _token(
        http, grant_type="refresh_token", client_id="app-2", refresh_token=token.refresh_token
    )
    assert wrong_client.status_code == 400 and wrong_client.json()["error"] == "invalid_grant"
    unknown = _token(http, grant_type="refresh_token", client_id="app-1", refresh_token="5Aepx")
    assert unknown.json()["error"] == "invalid_grant"


def test_unsupported_grant_type(http):
    r = _token(http, grant_type="authorization_code", code="x")
    assert r.status_code == 400 and r.json()["error"] == "unsupported_grant_type"
    assert "authorization_code" in r.json()["error_description"]


def test_userinfo_and_identity_url(emulator, http):
    token = emulator.issue_token("app-1")
    headers = {"Authorization": f"Bearer {token.access_token}"}
    info = http.get("/services/oauth2/userinfo", headers=headers).json()
    assert info["organization_id"] == emulator.org_id
    assert info["user_id"] == CLIENTS[0].user_id
    assert info["preferred_username"] == "svc@example.com"
    identity = http.get(token.identity_url.removeprefix(emulator.http_url), headers=headers)
    assert identity.json()["organization_id"] == emulator.org_id
    bad = http.get("/services/oauth2/userinfo", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401 and bad.json()["error"] == "invalid_token"


def _soap(username: str, password: str) -> str:
    return (
        "<soapenv:Envelope xmlns:soapenv='http://schemas.xmlsoap.org/soap/envelope/' "
        "xmlns:urn='urn:partner.soap.sforce.com'><soapenv:Body><urn:login>"
        f"<urn:username><![CDATA[{username}]]></urn:username>"
        f"<urn:password><![CDATA[{password}]]></urn:password>"
        "</urn:login></soapenv:Body></soapenv:Envelope>"
    )


def test_soap_login(emulator, http):
    headers = {"content-type": "text/xml", "SOAPAction": "login"}
    r = http.post(
        "/services/Soap/u/52.0/",
        content=_soap("svc@example.com", PASSWORD + SEC_TOKEN),
        headers=headers,
    )
    assert r.status_code == 200, r.text
    ns = {"p": "urn:partner.soap.sforce.com"}
    root = ElementTree.fromstring(r.content)
    result = root.find(".//p:loginResponse/p:result", ns)
    assert result is not None
    server_url = result.findtext("p:serverUrl", namespaces=ns)
    session = result.findtext("p:sessionId", namespaces=ns)
    org = result.findtext("p:userInfo/p:organizationId", namespaces=ns)
    assert org == emulator.org_id
    assert server_url.startswith(emulator.http_url + "/services/Soap/u/52.0/")
    # The seed quick start derives instanceurl from serverUrl's scheme and host.
    instance = "/".join(server_url.split("/")[:3])
    _grpc_ok(emulator, session, instance)
    bad = http.post("/services/Soap/u/52.0", content=_soap("svc@example.com", "x"), headers=headers)
    assert bad.status_code == 500 and b"INVALID_LOGIN" in bad.content
    junk = http.post("/services/Soap/u/52.0", content=b"<not-xml", headers=headers)
    assert junk.status_code == 500 and b"well-formed" in junk.content


# The partner WSDL's GetUserInfoResult, in its element order.
PARTNER_USER_INFO = (
    "accessibilityMode",
    "chatterExternal",
    "currencySymbol",
    "orgAttachmentFileSizeLimit",
    "orgDefaultCurrencyIsoCode",
    "orgDefaultCurrencyLocale",
    "orgDisallowHtmlAttachments",
    "orgHasPersonAccounts",
    "organizationId",
    "organizationMultiCurrency",
    "organizationName",
    "profileId",
    "roleId",
    "sessionSecondsValid",
    "userDefaultCurrencyIsoCode",
    "userEmail",
    "userFullName",
    "userId",
    "userLanguage",
    "userLocale",
    "userName",
    "userTimeZone",
    "userType",
    "userUiSkin",
)


def test_soap_login_result_read_by_position_like_salesforces_python_example(emulator, http):
    # Salesforce's Python example reads the login result by child position, not by name:
    # Envelope[0] Body, [0] loginResponse, [0] result; result[3] serverUrl, [4] sessionId,
    # [6] userInfo; userInfo[8] organizationId (the partner WSDL's element order).
    r = http.post(
        "/services/Soap/u/55.0/",
        content=_soap("svc@example.com", PASSWORD + SEC_TOKEN),
        headers={"content-type": "text/xml", "SOAPAction": "Login"},
    )
    assert r.status_code == 200, r.text
    result = ElementTree.fromstring(r.content.decode("utf-8"))[0][0][0]
    server_url = result[3].text
    session = result[4].text
    user_info = result[6]
    tenant_id = user_info[8].text
    assert tenant_id == emulator.org_id
    assert [child.tag.rsplit("}", 1)[-1] for child in user_info] == list(PARTNER_USER_INFO)
    assert user_info[PARTNER_USER_INFO.index("userId")].text == CLIENTS[0].user_id
    assert user_info[PARTNER_USER_INFO.index("userName")].text == "svc@example.com"
    instance = "/".join(server_url.split("/")[:3])
    md = (("accesstoken", session), ("instanceurl", instance), ("tenantid", tenant_id))
    channel = emulator.channel()
    topic = pb2_grpc.PubSubStub(channel).GetTopic(
        pb2.TopicRequest(topic_name=ORDER_TOPIC), metadata=md
    )
    channel.close()
    assert topic.topic_name == ORDER_TOPIC


def test_expired_oauth_token_is_rejected_by_grpc(emulator, http, clock):
    r = _token(http, grant_type="client_credentials", client_id="app-1", client_secret=SECRET)
    access, instance = r.json()["access_token"], r.json()["instance_url"]
    _grpc_ok(emulator, access, instance)
    clock.advance(7201)
    channel = emulator.channel()
    md = (("accesstoken", access), ("instanceurl", instance), ("tenantid", emulator.org_id))
    with pytest.raises(grpc.RpcError) as info:
        pb2_grpc.PubSubStub(channel).GetTopic(pb2.TopicRequest(topic_name=ORDER_TOPIC), metadata=md)
    channel.close()
    assert_sf_error(info.value, grpc.StatusCode.UNAUTHENTICATED, "service.auth.error")
    assert (
        http.get(
            "/services/oauth2/userinfo", headers={"Authorization": f"Bearer {access}"}
        ).status_code
        == 401
    )


def test_secrets_never_logged_or_in_reprs(emulator, http, caplog):
    caplog.set_level(logging.DEBUG)
    ok = _token(http, grant_type="client_credentials", client_id="app-1", client_secret=SECRET)
    access = ok.json()["access_token"]
    _token(
        http,
        grant_type="password",
        client_id="app-1",
        client_secret=SECRET,
        username="svc@example.com",
        password=PASSWORD + SEC_TOKEN,
    )
    _token(http, grant_type="client_credentials", client_id="app-1", client_secret="wrong-guess")
    http.post("/services/oauth2/token?client_secret=" + SECRET, data={"grant_type": "x"})
    _grpc_ok(emulator, access, ok.json()["instance_url"])
    token = emulator.issue_token("app-1", refresh_token=True)
    ours = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("ingest"))
    text = ours + repr(CLIENTS) + repr(token) + repr(emulator.config) + repr(emulator)
    for secret in (
        SECRET,
        PASSWORD,
        SEC_TOKEN,
        access,
        token.access_token,
        token.refresh_token,
        "wrong-guess",
    ):
        assert secret not in text
    assert "client_credentials" in ours  # the log does say what happened


# -- TLS --------------------------------------------------------------------------------------


def test_tls_with_verification(make_emulator, tmp_path: Path):
    emulator = make_emulator(tls=True, cert_dir=tmp_path / "certs")
    assert emulator.http_url.startswith("https://127.0.0.1:")
    assert emulator.ca_cert_path == tmp_path / "certs" / "ca.pem"
    assert emulator.ca_cert_path.read_bytes() == emulator.ca_cert_pem
    token = emulator.issue_token()
    assert token.instance_url.startswith("https://")
    credentials = grpc.ssl_channel_credentials(root_certificates=emulator.ca_cert_pem)
    for target in (emulator.grpc_target, f"localhost:{emulator.grpc_port}"):
        with grpc.secure_channel(target, credentials) as channel:
            stub = pb2_grpc.PubSubStub(channel)
            topic = stub.GetTopic(
                pb2.TopicRequest(topic_name=ORDER_TOPIC), metadata=token.metadata()
            )
            assert topic.can_publish
    context = ssl.create_default_context(cafile=str(emulator.ca_cert_path))
    with httpx.Client(base_url=emulator.http_url, verify=context, timeout=5) as http:
        r = _token(
            http,
            grant_type="client_credentials",
            client_id="sfcdc-emulator",
            client_secret="sfcdc-emulator-secret",
        )
        assert r.status_code == 200, r.text


def test_tls_untrusted_ca_is_refused(make_emulator):
    emulator = make_emulator(tls=True)
    token = emulator.issue_token()
    public_roots = grpc.ssl_channel_credentials()
    with (
        grpc.secure_channel(emulator.grpc_target, public_roots) as channel,
        pytest.raises(grpc.RpcError) as info,
    ):
        pb2_grpc.PubSubStub(channel).GetTopic(
            pb2.TopicRequest(topic_name=ORDER_TOPIC), metadata=token.metadata(), timeout=5
        )
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    with (
        httpx.Client(base_url=emulator.http_url, timeout=5) as http,
        pytest.raises(httpx.ConnectError),
    ):
        http.get("/services/oauth2/userinfo")
    with grpc.insecure_channel(emulator.grpc_target) as plain, pytest.raises(grpc.RpcError):
        pb2_grpc.PubSubStub(plain).GetTopic(
            pb2.TopicRequest(topic_name=ORDER_TOPIC), metadata=token.metadata(), timeout=5
        )


def test_cert_dir_is_reused_across_restarts(make_emulator, tmp_path: Path):
    first = make_emulator(tls=True, cert_dir=tmp_path)
    ca = first.ca_cert_pem
    first.close()
    second = make_emulator(tls=True, cert_dir=tmp_path)
    assert second.ca_cert_pem == ca
    with grpc.secure_channel(
        second.grpc_target, grpc.ssl_channel_credentials(root_certificates=ca)
    ) as channel:
        stub = pb2_grpc.PubSubStub(channel)
        md = second.issue_token().metadata()
        assert stub.GetTopic(pb2.TopicRequest(topic_name=ORDER_TOPIC), metadata=md).can_publish
