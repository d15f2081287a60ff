"""The emulator's login side: OAuth 2.0 token endpoint, userinfo, and SOAP ``login()``.

Endpoints (plain HTTP, or HTTPS when the emulator runs with TLS):

``POST /services/oauth2/token``
    ``client_credentials``, ``urn:ietf:params:oauth:grant-type:jwt-bearer`` (RS256, verified
    against the client's certificate), ``password`` (security token appended to the password)
    and ``refresh_token``. Errors are HTTP 400 with ``error`` / ``error_description`` as
    Salesforce sends them (``invalid_client_id``, ``invalid_client``, ``invalid_grant``,
    ``unsupported_grant_type``, ``invalid_request``).
``GET /services/oauth2/userinfo`` and ``GET /id/<orgId>/<userId>``
    The identity of a bearer token.
``POST /services/Soap/u/<version>``
    The partner API ``login()`` call, answering ``serverUrl``, ``sessionId`` and ``userInfo``.
``GET /services/data/vXX.X/query`` and ``/queryAll`` (with a bearer token)
    SOQL queries answered from the ground truth (:mod:`ingest.emulator.rest`).

Access tokens start with the 15-character org id and ``!``, like Salesforce's. The store keeps
only SHA-256 digests of tokens, so neither memory dumps of the store nor its state file hold a
usable secret; secrets never reach a log line or a ``repr``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import logging
import secrets
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit
from xml.etree import ElementTree
from xml.sax.saxutils import escape

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from ingest.emulator.faults import Faults
from ingest.emulator.managed import salesforce_id_18
from ingest.emulator.rest import RestApi
from ingest.emulator.routes import HttpAnswer, HttpRequest, Route

__all__ = [
    "JWT_BEARER",
    "SALESFORCE_AUDIENCES",
    "GrantInfo",
    "OAuthClient",
    "OAuthServer",
    "Token",
    "TokenStore",
]

logger = logging.getLogger(__name__)

JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
SALESFORCE_AUDIENCES = ("https://login.salesforce.com", "https://test.salesforce.com")
_TOKENS_FILE = "tokens.json"
_SOAP_ENV = "http://schemas.xmlsoap.org/soap/envelope/"
_PARTNER = "urn:partner.soap.sforce.com"


@dataclass(frozen=True)
class OAuthClient:
    """A connected app and the user it acts as.

    ``jwt_cert_pem`` is the X.509 certificate uploaded for the JWT bearer flow (PEM); without
    it the client cannot use that flow. ``user_id`` is derived from the username when blank.
    """

    client_id: str
    client_secret: str = field(repr=False)
    username: str
    password: str = field(repr=False)
    security_token: str = field(default="", repr=False)
    jwt_cert_pem: bytes | None = field(default=None, repr=False)
    user_id: str = ""

    def __post_init__(self) -> None:
        problems = [
            f"{name} must be a non-empty str (got {type(getattr(self, name)).__name__})"
            for name in ("client_id", "client_secret", "username", "password")
            if not isinstance(getattr(self, name), str) or not getattr(self, name)
        ]
        if problems:
            raise ValueError("invalid OAuthClient: " + "; ".join(problems))
        if not self.user_id:
            digest = hashlib.sha256(self.username.encode("utf-8")).hexdigest()
            object.__setattr__(
                self, "user_id", salesforce_id_18("005" + digest[:12].upper().replace("0", "A"))
            )


@dataclass(frozen=True)
class Token:
    """A valid access token with everything a Pub/Sub client needs to call the emulator."""

    access_token: str = field(repr=False)
    instance_url: str
    org_id: str
    user_id: str
    username: str
    client_id: str
    issued_at: float
    expires_at: float
    identity_url: str
    refresh_token: str | None = field(default=None, repr=False)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The gRPC call metadata: ``accesstoken``, ``instanceurl`` and ``tenantid``."""
        return (
            ("accesstoken", self.access_token),
            ("instanceurl", self.instance_url),
            ("tenantid", self.org_id),
        )


@dataclass(frozen=True)
class GrantInfo:
    """What the store remembers about one issued access token (never the token itself)."""

    client_id: str
    user_id: str
    username: str
    org_id: str
    issued_at: float
    expires_at: float
    generation: int


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


class TokenStore:
    """Issues and checks access and refresh tokens for one org. Thread-safe.

    Expiry follows the injected ``clock``; :meth:`Faults.expire_tokens` invalidates everything
    issued before it. With ``state_dir`` the digests survive an emulator restart.
    """

    def __init__(
        self,
        *,
        org_id: str,
        clock: Callable[[], float],
        ttl: float,
        faults: Faults,
        state_dir: Path | None = None,
    ) -> None:
        self.org_id = org_id
        self._clock = clock
        self._ttl = ttl
        self._faults = faults
        self._lock = threading.Lock()
        self._grants: dict[str, GrantInfo] = {}
        self._refresh: dict[str, tuple[str, str, str]] = {}  # digest -> client, user id, name
        self._state_dir = state_dir
        self.instance_url = ""
        self.login_url = ""
        if state_dir is not None:
            self._load(state_dir / _TOKENS_FILE)

    def bind(self, *, instance_url: str, login_url: str) -> None:
        """Set the URLs tokens are issued for (known once the HTTP server has a port)."""
        self.instance_url = instance_url
        self.login_url = login_url

    def issue(
        self,
        *,
        client_id: str,
        user_id: str,
        username: str,
        with_refresh_token: bool = False,
    ) -> Token:
        """A new access token (and optionally a refresh token) for ``username``."""
        now = self._clock()
        access = f"{self.org_id[:15]}!AQ{secrets.token_urlsafe(64)}"
        refresh = f"5Aep861{secrets.token_urlsafe(48)}" if with_refresh_token else None
        grant = GrantInfo(
            client_id=client_id,
            user_id=user_id,
            username=username,
            org_id=self.org_id,
            issued_at=now,
            expires_at=now + self._ttl,
            generation=self._faults.token_generation,
        )
        with self._lock:
            self._grants[_digest(access)] = grant
            if refresh is not None:
                self._refresh[_digest(refresh)] = (client_id, user_id, username)
            self._save()
        return Token(
            access_token=access,
            instance_url=self.instance_url,
            org_id=self.org_id,
            user_id=user_id,
            username=username,
            client_id=client_id,
            issued_at=now,
            expires_at=grant.expires_at,
            identity_url=f"{self.login_url}/id/{self.org_id}/{user_id}",
            refresh_token=refresh,
        )

    def check(self, access_token: str) -> GrantInfo | None:
        """The grant behind a token, or ``None`` when it is unknown, expired or revoked."""
        with self._lock:
            grant = self._grants.get(_digest(access_token))
        if grant is None:
            return None
        if grant.generation != self._faults.token_generation:
            return None
        if self._clock() >= grant.expires_at:
            return None
        return grant

    def refresh_grant(self, refresh_token: str) -> tuple[str, str, str] | None:
        """``(client_id, user_id, username)`` of a refresh token, or ``None``."""
        with self._lock:
            return self._refresh.get(_digest(refresh_token))

    def _load(self, path: Path) -> None:
        if not path.exists():
            return
        saved = json.loads(path.read_text())
        for key, g in saved.get("access", {}).items():
            self._grants[key] = GrantInfo(**g)
        for key, r in saved.get("refresh", {}).items():
            self._refresh[key] = (r[0], r[1], r[2])

    def _save(self) -> None:
        if self._state_dir is None:
            return
        now = self._clock()
        self._state_dir.mkdir(parents=True, exist_ok=True)
        live = {k: g.__dict__ for k, g in self._grants.items() if g.expires_at > now}
        path = self._state_dir / _TOKENS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"access": live, "refresh": self._refresh}))
        tmp.replace(path)


# -- JWT ---------------------------------------------------------------------------------------


class _GrantError(Exception):
    def __init__(self, error: str, description: str) -> None:
        super().__init__(description)
        self.error = error
        self.description = description


def _b64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _verify_jwt(
    assertion: str,
    clients: Mapping[str, OAuthClient],
    *,
    audiences: Iterable[str],
    now: float,
) -> OAuthClient:
    parts = assertion.split(".")
    if len(parts) != 3:
        raise _GrantError(
            "invalid_grant", f"invalid assertion: expected 3 dot-separated parts, got {len(parts)}"
        )
    try:
        header = json.loads(_b64url(parts[0]))
        claims = json.loads(_b64url(parts[1]))
        signature = _b64url(parts[2])
    except (ValueError, UnicodeDecodeError) as exc:
        raise _GrantError("invalid_grant", "invalid assertion: not base64url JSON") from exc
    if not isinstance(header, dict) or header.get("alg") != "RS256":
        alg = header.get("alg") if isinstance(header, dict) else None
        raise _GrantError("invalid_grant", f"invalid assertion: alg must be RS256 (got {alg!r})")
    if not isinstance(claims, dict):
        raise _GrantError("invalid_grant", "invalid assertion: claims must be a JSON object")
    client = clients.get(str(claims.get("iss", "")))
    if client is None:
        raise _GrantError("invalid_client_id", "client identifier invalid (iss)")
    if client.jwt_cert_pem is None:
        raise _GrantError(
            "invalid_client", f"client {client.client_id} has no certificate for the JWT flow"
        )
    public_key = x509.load_pem_x509_certificate(client.jwt_cert_pem).public_key()
    if not isinstance(public_key, rsa.RSAPublicKey):
        raise _GrantError("invalid_client", "the client's certificate does not hold an RSA key")
    try:
        public_key.verify(
            signature,
            f"{parts[0]}.{parts[1]}".encode("ascii"),
            padding.PKCS1v15(),
            hashes.SHA256(),
        )
    except InvalidSignature:
        raise _GrantError(
            "invalid_grant",
            "invalid assertion: the signature does not verify against the client's certificate",
        ) from None
    aud = claims.get("aud")
    aud_values = aud if isinstance(aud, list) else [aud]
    allowed = {a.rstrip("/") for a in audiences}
    if not any(isinstance(a, str) and a.rstrip("/") in allowed for a in aud_values):
        raise _GrantError(
            "invalid_grant", f"audience invalid: expected one of {sorted(allowed)}, got {aud!r}"
        )
    exp = claims.get("exp")
    if not isinstance(exp, (int, float)) or isinstance(exp, bool):
        raise _GrantError("invalid_grant", f"invalid assertion: exp must be a number (got {exp!r})")
    if exp <= now:
        raise _GrantError("invalid_grant", "expired assertion: exp is in the past")
    if claims.get("sub") != client.username:
        raise _GrantError("invalid_grant", "user hasn't approved this consumer (sub)")
    return client


# -- HTTP server ------------------------------------------------------------------------------


class OAuthServer:
    """The emulator's HTTP(S) login server. Starts a thread; :meth:`stop` ends it."""

    def __init__(
        self,
        tokens: TokenStore,
        clients: Iterable[OAuthClient],
        *,
        host: str,
        port: int,
        clock: Callable[[], float],
        ssl_context: ssl.SSLContext | None = None,
        faults: Faults,
        rest: RestApi | None = None,
        routes: Iterable[Route] = (),
    ) -> None:
        self._tokens = tokens
        self.rest = rest
        self.routes = tuple(routes)
        self._clients = {c.client_id: c for c in clients}
        self._clock = clock
        self._faults = faults
        handler = _make_handler(self)
        self._httpd = ThreadingHTTPServer((host, port), handler)
        self._httpd.daemon_threads = True
        if ssl_context is not None:
            self._httpd.socket = ssl_context.wrap_socket(
                self._httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="sfcdc-emulator-oauth",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- grants ------------------------------------------------------------------------------

    def _client(self, client_id: str, client_secret: str | None) -> OAuthClient:
        client = self._clients.get(client_id)
        if client is None:
            raise _GrantError("invalid_client_id", "client identifier invalid")
        if client_secret is not None and not hmac.compare_digest(
            client.client_secret.encode("utf-8"), client_secret.encode("utf-8")
        ):
            raise _GrantError("invalid_client", "invalid client credentials")
        return client

    def token(self, form: Mapping[str, str]) -> dict[str, Any]:
        grant_type = form.get("grant_type", "")
        if grant_type == "client_credentials":
            client = self._client(_required(form, "client_id"), _required(form, "client_secret"))
            return self._response(client.client_id, client, client, with_refresh=False)
        if grant_type == "password":
            client = self._client(_required(form, "client_id"), _required(form, "client_secret"))
            username = _required(form, "username")
            password = _required(form, "password")
            user = self._user(username, password)
            if user is None:
                raise _GrantError("invalid_grant", "authentication failure")
            return self._response(client.client_id, client, user, with_refresh=False)
        if grant_type == JWT_BEARER:
            audiences = (*SALESFORCE_AUDIENCES, self._tokens.login_url)
            client = _verify_jwt(
                _required(form, "assertion"),
                self._clients,
                audiences=audiences,
                now=self._clock(),
            )
            return self._response(client.client_id, client, client, with_refresh=False)
        if grant_type == "refresh_token":
            client = self._client(_required(form, "client_id"), form.get("client_secret"))
            grant = self._tokens.refresh_grant(_required(form, "refresh_token"))
            if grant is None or grant[0] != client.client_id:
                raise _GrantError("invalid_grant", "expired access/refresh token")
            token = self._tokens.issue(client_id=grant[0], user_id=grant[1], username=grant[2])
            return self._token_json(token, client)
        if not grant_type:
            raise _GrantError("unsupported_grant_type", "grant type not supported (none given)")
        raise _GrantError(
            "unsupported_grant_type",
            f"grant type not supported: expected client_credentials, password, refresh_token "
            f"or {JWT_BEARER} (got {grant_type!r})",
        )

    def _user(self, username: str, password: str) -> OAuthClient | None:
        for c in self._clients.values():
            if c.username == username and hmac.compare_digest(
                (c.password + c.security_token).encode("utf-8"), password.encode("utf-8")
            ):
                return c
        return None

    def _response(
        self, client_id: str, client: OAuthClient, user: OAuthClient, *, with_refresh: bool
    ) -> dict[str, Any]:
        token = self._tokens.issue(
            client_id=client_id,
            user_id=user.user_id,
            username=user.username,
            with_refresh_token=with_refresh,
        )
        return self._token_json(token, client)

    def _token_json(self, token: Token, client: OAuthClient) -> dict[str, Any]:
        issued_at = str(int(token.issued_at * 1000))
        signature = base64.b64encode(
            hmac.new(
                client.client_secret.encode("utf-8"),
                (token.identity_url + issued_at).encode("utf-8"),
                hashlib.sha256,
            ).digest()
        ).decode("ascii")
        body: dict[str, Any] = {
            "access_token": token.access_token,
            "instance_url": token.instance_url,
            "id": token.identity_url,
            "token_type": "Bearer",
            "issued_at": issued_at,
            "signature": signature,
            "scope": "api",
        }
        if token.refresh_token:
            body["refresh_token"] = token.refresh_token
        return body

    def identity(self, authorization: str) -> dict[str, Any] | None:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            return None
        grant = self._tokens.check(value.strip())
        if grant is None:
            return None
        return {
            "sub": f"{self._tokens.login_url}/id/{grant.org_id}/{grant.user_id}",
            "user_id": grant.user_id,
            "organization_id": grant.org_id,
            "preferred_username": grant.username,
            "email": grant.username,
            "active": True,
            "urls": {"custom_domain": self._tokens.instance_url},
        }

    def soap_login(self, body: bytes, version: str) -> tuple[int, str]:
        try:
            root = ElementTree.fromstring(body)
        except ElementTree.ParseError as exc:
            return 500, _soap_fault("soapenv:Client", f"request is not well-formed XML: {exc}")
        login = next((el for el in root.iter() if _local(el.tag) == "login"), None)
        if login is None:
            return 500, _soap_fault(
                "soapenv:Client", "expected a partner API login() call in the SOAP body"
            )
        values = {_local(child.tag): (child.text or "") for child in login}
        user = self._user(values.get("username", ""), values.get("password", ""))
        if user is None:
            return 500, _soap_fault(
                "sf:INVALID_LOGIN",
                "INVALID_LOGIN: Invalid username, password, security token; or user locked out.",
            )
        token = self._tokens.issue(client_id="", user_id=user.user_id, username=user.username)
        org = self._tokens.org_id
        base = self._tokens.instance_url
        ttl = int(token.expires_at - token.issued_at)
        result = (
            f"<metadataServerUrl>{escape(base)}/services/Soap/m/{version}/{org[:15]}"
            f"</metadataServerUrl>"
            "<passwordExpired>false</passwordExpired><sandbox>false</sandbox>"
            f"<serverUrl>{escape(base)}/services/Soap/u/{version}/{org[:15]}</serverUrl>"
            f"<sessionId>{escape(token.access_token)}</sessionId>"
            f"<userId>{user.user_id}</userId>"
            f"<userInfo>{_user_info(org, user, ttl)}</userInfo>"
        )
        return 200, (
            f'<?xml version="1.0" encoding="UTF-8"?>'
            f'<soapenv:Envelope xmlns:soapenv="{_SOAP_ENV}" xmlns="{_PARTNER}" '
            f'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">'
            f"<soapenv:Body><loginResponse><result>{result}</result></loginResponse>"
            f"</soapenv:Body></soapenv:Envelope>"
        )


_NIL = None


def _user_info(org: str, user: OAuthClient, ttl: int) -> str:
    """``userInfo`` with every element of the partner WSDL's GetUserInfoResult, in its order:
    clients read it by position (Salesforce's Python example takes organizationId as child 8).
    """
    digest = hashlib.sha256(user.username.encode("utf-8")).hexdigest()
    values: tuple[tuple[str, str | None], ...] = (
        ("accessibilityMode", "false"),
        ("chatterExternal", "false"),
        ("currencySymbol", "$"),
        ("orgAttachmentFileSizeLimit", "5242880"),
        ("orgDefaultCurrencyIsoCode", "USD"),
        ("orgDefaultCurrencyLocale", "en_US"),
        ("orgDisallowHtmlAttachments", "false"),
        ("orgHasPersonAccounts", "true"),
        ("organizationId", org),
        ("organizationMultiCurrency", "false"),
        ("organizationName", "sfcdc emulator"),
        ("profileId", salesforce_id_18("00e" + digest[12:24].upper().replace("0", "A"))),
        ("roleId", _NIL),
        ("sessionSecondsValid", str(ttl)),
        ("userDefaultCurrencyIsoCode", _NIL),
        ("userEmail", user.username),
        ("userFullName", user.username.split("@", 1)[0]),
        ("userId", user.user_id),
        ("userLanguage", "en_US"),
        ("userLocale", "en_US"),
        ("userName", user.username),
        ("userTimeZone", "America/Los_Angeles"),
        ("userType", "Standard"),
        ("userUiSkin", "Theme3"),
    )
    return "".join(
        f'<{name} xsi:nil="true"/>' if value is None else f"<{name}>{escape(value)}</{name}>"
        for name, value in values
    )


def _required(form: Mapping[str, str], name: str) -> str:
    value = form.get(name, "")
    if not value:
        raise _GrantError("invalid_request", f"missing required parameter {name}")
    return value


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _soap_fault(code: str, message: str) -> str:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>'
        f'<soapenv:Envelope xmlns:soapenv="{_SOAP_ENV}" '
        f'xmlns:sf="urn:fault.partner.soap.sforce.com">'
        f"<soapenv:Body><soapenv:Fault><faultcode>{escape(code)}</faultcode>"
        f"<faultstring>{escape(message)}</faultstring></soapenv:Fault>"
        f"</soapenv:Body></soapenv:Envelope>"
    )


def _make_handler(server: OAuthServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "sfcdc-emulator"
        timeout = 30

        def log_message(self, format: str, *args: Any) -> None:
            # Only the path is logged: query strings and bodies may carry credentials.
            logger.debug("%s %s", self.command, urlsplit(self.path).path)

        def _send(self, status: int, body: str, content_type: str) -> None:
            if server._faults.latency:
                time.sleep(server._faults.latency)
            data = body.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-cache,must-revalidate,max-age=0,no-store")
            self.end_headers()
            self.wfile.write(data)

        def _json(self, status: int, payload: Mapping[str, Any]) -> None:
            self._send(status, json.dumps(payload), "application/json;charset=UTF-8")

        _read_body: bytes | None = None

        def _body(self) -> bytes:
            if self._read_body is not None:
                body, self._read_body = self._read_body, None
                return body
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length > 0 else b""

        def _routed(self, method: str) -> bytes | None:
            """Offer the request to the extra routes; the body read (or ``None``) when none
            answered it, so the built-in endpoints can still use it."""
            self._read_body = None
            parts = urlsplit(self.path)
            body = self._body() if method in ("POST", "PATCH", "PUT") else b""
            request = HttpRequest(
                method,
                parts.path,
                {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()},
                {k.lower(): v for k, v in self.headers.items()},
                body,
            )
            for route in server.routes:
                answer = route.answer(request)
                if answer is not None:
                    self._answer(answer)
                    return None
            return body

        def _answer(self, answer: HttpAnswer) -> None:
            if answer.drop:
                # A lost long poll: the connection closes and no answer is ever sent.
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
            if server._faults.latency:
                time.sleep(server._faults.latency)
            data = answer.body.encode("utf-8")
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-cache,must-revalidate,max-age=0,no-store")
            for name, value in answer.headers:
                self.send_header(name, value)
            self.end_headers()
            if data:
                self.wfile.write(data)

        def do_PATCH(self) -> None:
            if self._routed("PATCH") is not None:
                path = urlsplit(self.path).path
                self._json(404, {"error": "not_found", "error_description": f"no {path}"})

        def do_DELETE(self) -> None:
            if self._routed("DELETE") is not None:
                path = urlsplit(self.path).path
                self._json(404, {"error": "not_found", "error_description": f"no {path}"})

        def do_POST(self) -> None:
            body = self._routed("POST")
            if body is None:
                return
            self._read_body = body
            path = urlsplit(self.path).path.rstrip("/")
            if path == "/services/oauth2/token":
                self._token()
            elif path.startswith("/services/Soap/u/"):
                version = path.removeprefix("/services/Soap/u/").split("/", 1)[0]
                status, xml = server.soap_login(self._body(), version or "60.0")
                self._send(status, xml, "text/xml;charset=UTF-8")
            elif path == "/services/oauth2/userinfo":
                self._identity()
            else:
                self._json(404, {"error": "not_found", "error_description": f"no {path}"})

        def do_GET(self) -> None:
            if self._routed("GET") is None:
                return
            path = urlsplit(self.path).path.rstrip("/")
            if path == "/services/oauth2/userinfo" or path.startswith("/id/"):
                self._identity()
            elif path.startswith("/services/data/") and server.rest is not None:
                self._rest(path)
            else:
                self._json(404, {"error": "not_found", "error_description": f"no {path}"})

        def _rest(self, path: str) -> None:
            assert server.rest is not None
            scheme, _, token = self.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or server._tokens.check(token.strip()) is None:
                self._json_list(
                    HTTPStatus.UNAUTHORIZED,
                    [{"message": "Session expired or invalid", "errorCode": "INVALID_SESSION_ID"}],
                )
                return
            query = urlsplit(self.path).query
            params = {k: v[0] for k, v in parse_qs(query, keep_blank_values=True).items()}
            answer = server.rest.get(path, params, dict(self.headers.items()))
            self._json_list(answer.status, answer.body)

        def _json_list(self, status: int, payload: Any) -> None:
            self._send(status, json.dumps(payload), "application/json;charset=UTF-8")

        def _identity(self) -> None:
            identity = server.identity(self.headers.get("Authorization", ""))
            if identity is None:
                self._json(
                    HTTPStatus.UNAUTHORIZED,
                    {
                        "error": "invalid_token",
                        "error_description": "Bad_OAuth_Token: expected a valid "
                        "'Authorization: Bearer <access token>' header",
                    },
                )
            else:
                self._json(200, identity)

        def _token(self) -> None:
            raw = self._body().decode("utf-8", errors="replace")
            query = urlsplit(self.path).query
            form = {k: v[0] for k, v in parse_qs(query, keep_blank_values=True).items()}
            form.update({k: v[0] for k, v in parse_qs(raw, keep_blank_values=True).items()})
            basic = self.headers.get("Authorization", "")
            if basic.lower().startswith("basic ") and "client_id" not in form:
                try:
                    pair = base64.b64decode(basic[6:].strip()).decode("utf-8")
                except ValueError:
                    pair = ""
                client_id, _, client_secret = pair.partition(":")
                form.setdefault("client_id", client_id)
                form.setdefault("client_secret", client_secret)
            try:
                body = server.token(form)
            except _GrantError as exc:
                logger.info(
                    "token request refused: grant_type=%s client_id=%s error=%s",
                    form.get("grant_type", ""),
                    form.get("client_id", ""),
                    exc.error,
                )
                self._json(400, {"error": exc.error, "error_description": exc.description})
                return
            logger.info(
                "token issued: grant_type=%s client_id=%s",
                form.get("grant_type"),
                form.get("client_id", ""),
            )
            self._json(200, body)

    return Handler
