"""Salesforce's login flows over HTTPS: each a :class:`TokenProvider` whose ``fetch`` logs in
and returns the :class:`Credentials` every Pub/Sub API call carries.

OAuth 2.0 :class:`ClientCredentials` (recommended), :class:`JwtBearer`,
:class:`UsernamePassword` and :class:`RefreshToken`; the retiring SOAP ``login()``
(:class:`SoapLogin`, which warns with :class:`DeprecatedAuthFlowWarning`); and
:class:`StaticToken` for a token obtained elsewhere. :func:`http_client` is the HTTPS client
they use, with certificate verification always on. Secret values that a flow was given are
masked in the messages of the errors it raises.

:mod:`ingest.auth` re-exports every public name here.
"""

from __future__ import annotations

import base64
import json
import ssl
import time
import warnings
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit
from xml.sax.saxutils import escape

import httpx
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from ingest.auth_secrets import _MASK, Secret
from ingest.errors import AuthError, AuthUnavailableError, ConfigError
from ingest.tls import trusted_roots, untrusted_message, verification_failure

__all__ = [
    "ClientCredentials",
    "Credentials",
    "DeprecatedAuthFlowWarning",
    "JwtBearer",
    "RefreshToken",
    "SoapLogin",
    "StaticToken",
    "TokenProvider",
    "UsernamePassword",
    "http_client",
]

_JWT_LIFETIME = 3 * 60
_LOGIN_HOSTS = frozenset({"login.salesforce.com", "test.salesforce.com"})
_SOAP_NS = {
    "soapenv": "http://schemas.xmlsoap.org/soap/envelope/",
    "p": "urn:partner.soap.sforce.com",
}


@dataclass(frozen=True, slots=True)
class Credentials:
    """What every Pub/Sub API call needs: token, instance URL and tenant (org) id.

    ``expires_at`` is an epoch time when the login response said so (Salesforce's usually do
    not); ``issued_at`` is the epoch time the token was issued. ``user_id`` is the logged-in
    user's Id when the login said it (the identity URL, SOAP's userInfo).
    """

    access_token: Secret
    instance_url: str
    tenant_id: str
    expires_at: float | None
    issued_at: float
    user_id: str | None = None

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The gRPC auth headers, lower-case as gRPC requires."""
        return (
            ("accesstoken", self.access_token.reveal()),
            ("instanceurl", self.instance_url),
            ("tenantid", self.tenant_id),
        )


@runtime_checkable
class TokenProvider(Protocol):
    """One Salesforce login flow. ``fetch`` logs in and returns fresh credentials."""

    name: str

    def fetch(self) -> Credentials:
        """Log in now. Raises :class:`~ingest.errors.AuthError` (or
        :class:`~ingest.errors.AuthUnavailableError` when the endpoint is down)."""
        ...


class DeprecatedAuthFlowWarning(FutureWarning):
    """A login flow Salesforce is retiring. A FutureWarning, so it is shown by default."""


def http_client(*, ca_file: str | Path | None = None, timeout: float = 30.0) -> httpx.Client:
    """An HTTPS client for login endpoints with certificate verification always on.

    ``ca_file`` adds trust in one extra CA (the emulator's self-signed one) instead of the
    public roots; there is deliberately no way to turn verification off. Proxy settings from
    the environment (``HTTPS_PROXY``, ``NO_PROXY``) apply, as corporate networks need them.
    """
    verify: ssl.SSLContext | bool = True
    if ca_file is not None:
        path = Path(ca_file)
        if not path.is_file():
            raise ConfigError(f"CA file {path} does not exist")
        verify = ssl.create_default_context(cafile=str(path))
    return httpx.Client(verify=verify, timeout=timeout)


def _base_url(url: str, *, what: str) -> str:
    parts = urlsplit(url.strip())
    if parts.scheme not in {"https", "http"} or not parts.netloc:
        raise ConfigError(f"{what} must be an https:// URL (got {url!r})")
    if parts.scheme == "http" and parts.hostname not in {"127.0.0.1", "localhost", "::1"}:
        raise ConfigError(f"{what} must use https (got {url!r}); plain http is only for loopback")
    return f"{parts.scheme}://{parts.netloc}"


class _Redactor:
    """Replaces secret values in text that is about to become a message."""

    def __init__(self, *secrets: Secret | None) -> None:
        self._values = [s.reveal() for s in secrets if s is not None and len(s.reveal()) >= 4]

    def __call__(self, text: str) -> str:
        for value in self._values:
            text = text.replace(value, _MASK)
        return text


class _HttpFlow:
    """Shared HTTP plumbing of the OAuth and SOAP flows."""

    name = "oauth"

    def __init__(
        self,
        login_url: str,
        *,
        http: httpx.Client | None,
        ca_file: str | Path | None,
        clock: Callable[[], float],
        what: str,
    ) -> None:
        self._login_url = _base_url(login_url, what=what)
        self._http = http if http is not None else http_client(ca_file=ca_file)
        # What certificates are checked against, for messages; unknown for an injected client.
        self._trusted = trusted_roots(ca_file) if http is None else None
        self._clock = clock
        self._redact = _Redactor()

    def _untrusted(self, url: str, exc: httpx.HTTPError) -> AuthError | None:
        """A login that failed because the server's certificate did not verify: an error
        of configuration, so an :class:`AuthError` (not retried), never ``Unavailable``."""
        reason = verification_failure(exc)
        if reason is None:
            return None
        where = urlsplit(url).netloc
        return AuthError(
            f"{self.name} login at {url}: "
            + untrusted_message(where, reason, checked_against=self._trusted)
        )

    def _post(
        self,
        url: str,
        *,
        data: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        try:
            return self._http.post(url, data=data, content=content, headers=headers)
        except httpx.HTTPError as exc:
            untrusted = self._untrusted(url, exc)
            if untrusted is not None:
                raise untrusted from exc
            raise AuthUnavailableError(
                f"{self.name} login: cannot reach {url} ({type(exc).__name__}: "
                f"{self._redact(str(exc))})"
            ) from None

    def _token_request(self, form: Mapping[str, str]) -> Mapping[str, Any]:
        url = f"{self._login_url}/services/oauth2/token"
        response = self._post(url, data=dict(form), headers={"Accept": "application/json"})
        body = _json_or_none(response)
        if response.status_code >= 500:
            raise AuthUnavailableError(
                f"{self.name} login: {url} answered HTTP {response.status_code}; retry later"
            )
        if response.status_code != 200 or not isinstance(body, Mapping):
            error = body.get("error", "") if isinstance(body, Mapping) else ""
            detail = body.get("error_description", "") if isinstance(body, Mapping) else ""
            reason = f"{error}: {detail}" if error or detail else response.text[:200]
            raise AuthError(
                f"{self.name} login rejected by {url} (HTTP {response.status_code}): "
                f"{self._redact(str(reason))}{self._hint(str(error), str(detail))}"
            )
        return body

    def _hint(self, error: str, detail: str) -> str:
        return ""

    def _credentials(self, body: Mapping[str, Any]) -> Credentials:
        token = body.get("access_token")
        instance_url = body.get("instance_url")
        if not isinstance(token, str) or not token:
            raise AuthError(f"{self.name} login: the token response has no access_token")
        if not isinstance(instance_url, str) or not instance_url:
            raise AuthError(f"{self.name} login: the token response has no instance_url")
        access = Secret(token)
        tenant = _org_from_identity_url(body.get("id")) or self._userinfo_org(access)
        issued_at = _issued_at(body.get("issued_at")) or self._clock()
        expires_in = body.get("expires_in")
        expires_at = issued_at + float(expires_in) if isinstance(expires_in, int | float) else None
        return Credentials(
            access_token=access,
            instance_url=instance_url.rstrip("/"),
            tenant_id=tenant,
            expires_at=expires_at,
            issued_at=issued_at,
            user_id=_user_from_identity_url(body.get("id")),
        )

    def _userinfo_org(self, token: Secret) -> str:
        url = f"{self._login_url}/services/oauth2/userinfo"
        try:
            response = self._http.get(url, headers={"Authorization": f"Bearer {token.reveal()}"})
        except httpx.HTTPError as exc:
            untrusted = self._untrusted(url, exc)
            if untrusted is not None:
                raise untrusted from exc
            raise AuthUnavailableError(
                f"{self.name} login: the token response has no identity URL and userinfo at "
                f"{url} is unreachable ({type(exc).__name__})"
            ) from None
        body = _json_or_none(response)
        org = body.get("organization_id") if isinstance(body, Mapping) else None
        if response.status_code != 200 or not isinstance(org, str) or not org:
            raise AuthError(
                f"{self.name} login: cannot tell the org id: the token response has no `id` "
                f"URL and userinfo at {url} answered HTTP {response.status_code} without "
                "organization_id"
            )
        return org


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _org_from_identity_url(value: object) -> str | None:
    # https://login.salesforce.com/id/<18-char org id>/<18-char user id>
    if not isinstance(value, str):
        return None
    parts = [p for p in urlsplit(value).path.split("/") if p]
    if len(parts) >= 3 and parts[-3] == "id":
        return parts[-2]
    return None


def _user_from_identity_url(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    parts = [p for p in urlsplit(value).path.split("/") if p]
    if len(parts) >= 3 and parts[-3] == "id":
        return parts[-1]
    return None


def _issued_at(value: object) -> float | None:
    # Salesforce sends epoch milliseconds as a string.
    try:
        return int(str(value)) / 1000.0 if value is not None else None
    except ValueError:
        return None


class ClientCredentials(_HttpFlow):
    """OAuth 2.0 client credentials (the recommended server-to-server flow).

    ``domain_url`` must be the org's My Domain (``https://acme.my.salesforce.com``): the
    generic login hosts answer this grant with ``invalid_grant``.
    """

    name = "client_credentials"

    def __init__(
        self,
        domain_url: str,
        *,
        client_id: str,
        client_secret: Secret,
        http: httpx.Client | None = None,
        ca_file: str | Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        host = urlsplit(domain_url.strip()).hostname or ""
        if host.lower() in _LOGIN_HOSTS:
            raise ConfigError(
                f"client credentials need the org's My Domain URL "
                f"(https://<domain>.my.salesforce.com), not {host}: Salesforce answers this "
                "grant on login.salesforce.com and test.salesforce.com with 'invalid_grant: "
                "request not supported on this domain'"
            )
        super().__init__(domain_url, http=http, ca_file=ca_file, clock=clock, what="domain_url")
        self._client_id = client_id
        self._client_secret = client_secret
        self._redact = _Redactor(client_secret)

    def fetch(self) -> Credentials:
        body = self._token_request(
            {
                "grant_type": "client_credentials",
                "client_id": self._client_id,
                "client_secret": self._client_secret.reveal(),
            }
        )
        return self._credentials(body)

    def __repr__(self) -> str:
        return f"ClientCredentials({self._login_url!r}, client_id={self._client_id!r})"


class JwtBearer(_HttpFlow):
    """OAuth 2.0 JWT bearer: an RS256 assertion signed with the app's private key.

    ``audience`` defaults to the login URL (``https://login.salesforce.com``,
    ``https://test.salesforce.com`` or a community URL).
    """

    name = "jwt_bearer"

    def __init__(
        self,
        login_url: str,
        *,
        client_id: str,
        username: str,
        private_key: Secret,
        audience: str | None = None,
        http: httpx.Client | None = None,
        ca_file: str | Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(login_url, http=http, ca_file=ca_file, clock=clock, what="login_url")
        self._client_id = client_id
        self._username = username
        self._audience = audience or self._login_url
        self._key = _load_rsa_key(private_key)
        self._redact = _Redactor(private_key)

    def assertion(self) -> str:
        """The signed JWT sent as ``assertion`` (``iss`` client id, ``sub`` user, ``exp``
        three minutes ahead)."""
        header = {"alg": "RS256", "typ": "JWT"}
        claims = {
            "iss": self._client_id,
            "sub": self._username,
            "aud": self._audience,
            "exp": int(self._clock()) + _JWT_LIFETIME,
        }
        signing_input = f"{_b64url_json(header)}.{_b64url_json(claims)}".encode("ascii")
        signature = self._key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input.decode('ascii')}.{_b64url(signature)}"

    def fetch(self) -> Credentials:
        body = self._token_request(
            {
                "grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer",
                "assertion": self.assertion(),
            }
        )
        return self._credentials(body)

    def __repr__(self) -> str:
        return f"JwtBearer({self._login_url!r}, client_id={self._client_id!r})"


def _load_rsa_key(private_key: Secret) -> rsa.RSAPrivateKey:
    try:
        key = serialization.load_pem_private_key(private_key.reveal().encode(), password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            "JWT bearer: private_key must be an unencrypted PEM RSA private key "
            f"({type(exc).__name__} while loading it)"
        ) from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ConfigError(f"JWT bearer: RS256 needs an RSA private key (got {type(key).__name__})")
    return key


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _b64url_json(value: Mapping[str, Any]) -> str:
    return _b64url(json.dumps(value, separators=(",", ":")).encode())


class UsernamePassword(_HttpFlow):
    """OAuth 2.0 username-password. Discouraged by Salesforce and often blocked org-wide;
    prefer :class:`ClientCredentials`. ``security_token`` is appended to the password."""

    name = "username_password"

    def __init__(
        self,
        login_url: str,
        *,
        client_id: str,
        client_secret: Secret,
        username: str,
        password: Secret,
        security_token: Secret | None = None,
        http: httpx.Client | None = None,
        ca_file: str | Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(login_url, http=http, ca_file=ca_file, clock=clock, what="login_url")
        self._client_id = client_id
        self._client_secret = client_secret
        self._username = username
        self._password = password
        self._security_token = security_token
        self._redact = _Redactor(client_secret, password, security_token)

    def fetch(self) -> Credentials:
        password = self._password.reveal()
        if self._security_token is not None:
            password += self._security_token.reveal()
        body = self._token_request(
            {
                "grant_type": "password",
                "client_id": self._client_id,
                "client_secret": self._client_secret.reveal(),
                "username": self._username,
                "password": password,
            }
        )
        return self._credentials(body)

    def _hint(self, error: str, detail: str) -> str:
        if error == "invalid_grant":
            return (
                " (check the password and security token; orgs can block this flow, "
                "client credentials is the supported alternative)"
            )
        return ""

    def __repr__(self) -> str:
        return f"UsernamePassword({self._login_url!r}, username={self._username!r})"


class RefreshToken(_HttpFlow):
    """OAuth 2.0 refresh token grant (for tokens issued by the web-server flow)."""

    name = "refresh_token"

    def __init__(
        self,
        login_url: str,
        *,
        client_id: str,
        refresh_token: Secret,
        client_secret: Secret | None = None,
        http: httpx.Client | None = None,
        ca_file: str | Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(login_url, http=http, ca_file=ca_file, clock=clock, what="login_url")
        self._client_id = client_id
        self._refresh_token = refresh_token
        self._client_secret = client_secret
        self._redact = _Redactor(refresh_token, client_secret)

    def fetch(self) -> Credentials:
        form = {
            "grant_type": "refresh_token",
            "client_id": self._client_id,
            "refresh_token": self._refresh_token.reveal(),
        }
        if self._client_secret is not None:
            form["client_secret"] = self._client_secret.reveal()
        return self._credentials(self._token_request(form))

    def __repr__(self) -> str:
        return f"RefreshToken({self._login_url!r}, client_id={self._client_id!r})"


class SoapLogin(_HttpFlow):
    """SOAP ``login()`` with username and password, as in Salesforce's original quick start.

    Salesforce is retiring it (not available from API v65.0, off by default in new orgs,
    gone in Summer '27): constructing one emits a :class:`DeprecatedAuthFlowWarning`.
    """

    name = "soap_login"

    def __init__(
        self,
        login_url: str,
        *,
        username: str,
        password: Secret,
        security_token: Secret | None = None,
        api_version: str = "62.0",
        http: httpx.Client | None = None,
        ca_file: str | Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        warnings.warn(
            "SOAP login() is being retired by Salesforce (unavailable from API v65.0 and "
            "disabled by default in orgs created from Winter '26); use client credentials "
            "or JWT bearer",
            DeprecatedAuthFlowWarning,
            stacklevel=2,
        )
        super().__init__(login_url, http=http, ca_file=ca_file, clock=clock, what="login_url")
        self._username = username
        self._password = password
        self._security_token = security_token
        self._api_version = api_version
        self._redact = _Redactor(password, security_token)

    def fetch(self) -> Credentials:
        password = self._password.reveal()
        if self._security_token is not None:
            password += self._security_token.reveal()
        envelope = (
            '<?xml version="1.0" encoding="utf-8"?>'
            '<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" '
            'xmlns:urn="urn:partner.soap.sforce.com"><soapenv:Body><urn:login>'
            f"<urn:username>{escape(self._username)}</urn:username>"
            f"<urn:password>{escape(password)}</urn:password>"
            "</urn:login></soapenv:Body></soapenv:Envelope>"
        )
        url = f"{self._login_url}/services/Soap/u/{self._api_version}/"
        response = self._post(
            url,
            content=envelope.encode("utf-8"),
            headers={"Content-Type": "text/xml; charset=UTF-8", "SOAPAction": "login"},
        )
        if response.status_code >= 502:
            raise AuthUnavailableError(
                f"soap login: {url} answered HTTP {response.status_code}; retry later"
            )
        try:
            root = ET.fromstring(response.content)
        except ET.ParseError:
            raise AuthError(
                f"soap login: {url} answered HTTP {response.status_code} with a body that is "
                "not XML"
            ) from None
        fault = root.find(".//soapenv:Fault", _SOAP_NS)
        if fault is not None or response.status_code != 200:
            code = fault.findtext("faultcode", default="") if fault is not None else ""
            text = fault.findtext("faultstring", default="") if fault is not None else ""
            raise AuthError(
                f"soap login rejected by {url} (HTTP {response.status_code}): "
                f"{self._redact(code)}: {self._redact(text)}"
            )
        result = root.find(".//p:result", _SOAP_NS)
        if result is None:
            raise AuthError("soap login: the response has no loginResponse result")
        session = result.findtext("p:sessionId", default="", namespaces=_SOAP_NS)
        server_url = result.findtext("p:serverUrl", default="", namespaces=_SOAP_NS)
        org = result.findtext("p:userInfo/p:organizationId", default="", namespaces=_SOAP_NS)
        user = result.findtext("p:userInfo/p:userId", default="", namespaces=_SOAP_NS)
        valid = result.findtext("p:userInfo/p:sessionSecondsValid", default="", namespaces=_SOAP_NS)
        if not session or not server_url or not org:
            raise AuthError(
                "soap login: the response lacks sessionId, serverUrl or userInfo/organizationId"
            )
        issued_at = self._clock()
        return Credentials(
            access_token=Secret(session),
            instance_url=_base_url(server_url, what="serverUrl"),
            tenant_id=org,
            expires_at=issued_at + int(valid) if valid.isdigit() else None,
            issued_at=issued_at,
            user_id=user or None,
        )

    def __repr__(self) -> str:
        return f"SoapLogin({self._login_url!r}, username={self._username!r})"


class StaticToken:
    """A token obtained elsewhere (a notebook's session, a CLI). It cannot be refreshed: when
    the server rejects it, the subscriber fails with a message saying so."""

    name = "static_token"

    def __init__(
        self,
        access_token: Secret,
        *,
        instance_url: str,
        tenant_id: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not access_token:
            raise ConfigError("static token: access_token is empty")
        self._credentials = Credentials(
            access_token=access_token,
            instance_url=_base_url(instance_url, what="instance_url"),
            tenant_id=tenant_id,
            expires_at=None,
            issued_at=clock(),
        )

    def fetch(self) -> Credentials:
        return self._credentials

    def __repr__(self) -> str:
        return f"StaticToken(instance_url={self._credentials.instance_url!r})"
