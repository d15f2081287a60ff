"""The ``connection`` section of ``conf/pipeline.yml``: Salesforce (its auth flows and TLS)
or the emulator. Models only; :mod:`pipelines.spec.load` reads the YAML into them,
:mod:`pipelines.spec` re-exports them, and ``pipelines.spec.schema`` publishes their JSON Schema.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ingest.auth import SecretRef
from pipelines.spec.fields import Credential, meta

__all__ = [
    "API_VERSION_PATTERN",
    "AuthSpec",
    "ClientCredentialsAuth",
    "ConnectionSpec",
    "EmulatorMode",
    "EmulatorSpec",
    "EmulatorTls",
    "EmulatorWorkload",
    "JwtBearerAuth",
    "RefreshTokenAuth",
    "SalesforceSpec",
    "SalesforceTls",
    "SoapLoginAuth",
    "Source",
    "StaticTokenAuth",
    "UsernamePasswordAuth",
    "WorkloadTimestamps",
]

Source = Literal["emulator", "salesforce"]
EmulatorMode = Literal["in_process", "external"]
WorkloadTimestamps = Literal["simulated", "now"]
_HTTPS_ORIGIN = r"^https://[A-Za-z0-9.-]+(:[0-9]{1,5})?/?$"
_HTTP_ORIGIN_HINT = "an https:// origin such as 'https://mycompany.my.salesforce.com'"
_ENDPOINT_PATTERN = r"^[A-Za-z0-9.-]+:[0-9]{1,5}$"
_ORG_ID_PATTERN = r"^00D[A-Za-z0-9]{12}([A-Za-z0-9]{3})?$"
API_VERSION_PATTERN = r"^[0-9]{2,3}\.0$"


@dataclass(frozen=True, kw_only=True)
class ClientCredentialsAuth:
    """OAuth 2.0 client credentials: the recommended server-to-server flow."""

    type: Literal["client_credentials"] = field(
        default="client_credentials", metadata=meta("Auth flow.")
    )
    login_url: str = field(
        metadata=meta(
            "Your My Domain URL, e.g. https://mycompany.my.salesforce.com (login.salesforce.com "
            "and test.salesforce.com reject this flow).",
            pattern=_HTTPS_ORIGIN,
            hint=_HTTP_ORIGIN_HINT,
        )
    )
    client_id: Credential = field(
        metadata=meta("Consumer key of the connected (or external client) app.")
    )
    client_secret: SecretRef = field(
        metadata=meta("Consumer secret of the app (a secret reference).")
    )

    def _problems(self) -> list[tuple[str, str]]:
        host = self.login_url.removeprefix("https://").split(":")[0].rstrip("/").lower()
        if host in ("login.salesforce.com", "test.salesforce.com"):
            return [
                (
                    "login_url",
                    "must be your My Domain URL (https://<domain>.my.salesforce.com) for "
                    f"client_credentials; Salesforce rejects this flow on {host} "
                    f"(got {self.login_url!r})",
                )
            ]
        return []


@dataclass(frozen=True, kw_only=True)
class JwtBearerAuth:
    """OAuth 2.0 JWT bearer: an RS256 assertion signed with the app's private key."""

    type: Literal["jwt_bearer"] = field(default="jwt_bearer", metadata=meta("Auth flow."))
    login_url: str = field(
        metadata=meta(
            "Token endpoint origin: https://login.salesforce.com, https://test.salesforce.com "
            "or your My Domain URL.",
            pattern=_HTTPS_ORIGIN,
            hint=_HTTP_ORIGIN_HINT,
        )
    )
    client_id: Credential = field(metadata=meta("Consumer key of the app (the JWT issuer)."))
    username: Credential = field(
        metadata=meta("Salesforce username the job runs as (the JWT subject).")
    )
    private_key: SecretRef = field(
        metadata=meta("PEM private key whose certificate is uploaded to the app.")
    )
    audience: str | None = field(
        default=None,
        metadata=meta(
            "JWT audience; defaults to login_url (use https://test.salesforce.com for sandboxes "
            "behind a My Domain login URL).",
            pattern=_HTTPS_ORIGIN,
            hint=_HTTP_ORIGIN_HINT,
        ),
    )


@dataclass(frozen=True, kw_only=True)
class UsernamePasswordAuth:
    """OAuth 2.0 username-password flow (discouraged by Salesforce; may be blocked per org)."""

    type: Literal["username_password"] = field(
        default="username_password", metadata=meta("Auth flow.")
    )
    login_url: str = field(
        metadata=meta(
            "Token endpoint origin, e.g. https://login.salesforce.com.",
            pattern=_HTTPS_ORIGIN,
            hint=_HTTP_ORIGIN_HINT,
        )
    )
    client_id: Credential = field(metadata=meta("Consumer key of the app."))
    client_secret: SecretRef = field(metadata=meta("Consumer secret of the app."))
    username: Credential = field(metadata=meta("Salesforce username."))
    password: SecretRef = field(metadata=meta("Password of that user."))
    security_token: SecretRef | None = field(
        default=None,
        metadata=meta(
            "Security token appended to the password (not needed from trusted IP ranges)."
        ),
    )


@dataclass(frozen=True, kw_only=True)
class RefreshTokenAuth:
    """OAuth 2.0 refresh token issued earlier by a web-server or user-agent flow."""

    type: Literal["refresh_token"] = field(default="refresh_token", metadata=meta("Auth flow."))
    login_url: str = field(
        metadata=meta(
            "Token endpoint origin, e.g. https://login.salesforce.com.",
            pattern=_HTTPS_ORIGIN,
            hint=_HTTP_ORIGIN_HINT,
        )
    )
    client_id: Credential = field(metadata=meta("Consumer key of the app."))
    refresh_token: SecretRef = field(metadata=meta("The refresh token."))
    client_secret: SecretRef | None = field(
        default=None, metadata=meta("Consumer secret, when the app requires it.")
    )


@dataclass(frozen=True, kw_only=True)
class SoapLoginAuth:
    """SOAP ``login()`` (being retired by Salesforce: prefer client credentials or JWT)."""

    type: Literal["soap_login"] = field(default="soap_login", metadata=meta("Auth flow."))
    login_url: str = field(
        metadata=meta(
            "Login origin, e.g. https://login.salesforce.com.",
            pattern=_HTTPS_ORIGIN,
            hint=_HTTP_ORIGIN_HINT,
        )
    )
    username: Credential = field(metadata=meta("Salesforce username."))
    password: SecretRef = field(metadata=meta("Password of that user."))
    security_token: SecretRef | None = field(
        default=None, metadata=meta("Security token appended to the password.")
    )
    api_version: str = field(
        default="64.0",
        metadata=meta(
            "SOAP API version of the login call (login() is not available from 65.0).",
            pattern=API_VERSION_PATTERN,
            hint="a version such as '64.0'",
        ),
    )


@dataclass(frozen=True, kw_only=True)
class StaticTokenAuth:
    """An access token obtained elsewhere (short-lived; for experiments and debugging)."""

    type: Literal["static_token"] = field(default="static_token", metadata=meta("Auth flow."))
    access_token: SecretRef = field(metadata=meta("The access (session) token."))
    instance_url: str = field(
        metadata=meta(
            "Instance URL the token belongs to, e.g. https://mycompany.my.salesforce.com.",
            pattern=_HTTPS_ORIGIN,
            hint=_HTTP_ORIGIN_HINT,
        )
    )


AuthSpec = (
    ClientCredentialsAuth
    | JwtBearerAuth
    | UsernamePasswordAuth
    | RefreshTokenAuth
    | SoapLoginAuth
    | StaticTokenAuth
)


@dataclass(frozen=True, kw_only=True)
class SalesforceTls:
    """TLS towards Salesforce. Verification cannot be turned off."""

    verify: bool = field(
        default=True,
        metadata=meta("Verify the server certificate (must stay true for Salesforce)."),
    )
    ca_file: str | None = field(
        default=None,
        metadata=meta(
            "PEM bundle of extra CA certificates (e.g. a TLS-inspecting proxy), trusted by every "
            "connection sfcdc makes to the org: the Pub/Sub API (gRPC), the OAuth login, REST "
            "and Bulk API calls and the Streaming API (CometD); relative paths are resolved "
            "against the directory that contains conf/.",
            path=True,
        ),
    )

    @staticmethod
    def _schema_extra() -> dict[str, Any]:
        return {"properties": {"verify": {"const": True}}}

    def _problems(self) -> list[tuple[str, str]]:
        if self.verify:
            return []
        return [
            (
                "verify",
                "may only be false for the emulator (connection.emulator.tls.verify); "
                "Salesforce is always reached over verified TLS (got false)",
            )
        ]


@dataclass(frozen=True, kw_only=True)
class SalesforceSpec:
    """A real Salesforce org."""

    pubsub_endpoint: str = field(
        default="api.pubsub.salesforce.com:7443",
        metadata=meta(
            "Pub/Sub API endpoint as host:port. REST, Bulk API and Streaming API (CometD) calls "
            "go to the instance_url the login answers with (https://<my-domain>.my.salesforce."
            "com), not here.",
            pattern=_ENDPOINT_PATTERN,
            hint="host:port, e.g. 'api.pubsub.salesforce.com:7443'",
        ),
    )
    auth: AuthSpec = field(metadata=meta("How to obtain an access token; `type` selects the flow."))
    tenant_id: str | None = field(
        default=None,
        metadata=meta(
            "Org id (15 or 18 characters, 00D...) sent as tenantid; by default taken from the "
            "token response.",
            pattern=_ORG_ID_PATTERN,
            hint="an org id starting with 00D (15 or 18 characters)",
        ),
    )
    session_lifetime_seconds: float = field(
        default=7200.0,
        metadata=meta(
            "How long an access token is trusted before it is refreshed (Salesforce tokens carry "
            "no expiry; match the org's session timeout).",
            exclusive_minimum=0,
        ),
    )
    tls: SalesforceTls = field(default_factory=SalesforceTls, metadata=meta("TLS settings."))

    def _problems(self) -> list[tuple[str, str]]:
        port = int(self.pubsub_endpoint.rsplit(":", 1)[1])
        if 1 <= port <= 65535:
            return []
        return [("pubsub_endpoint", f"port must be between 1 and 65535 (got {port})")]


@dataclass(frozen=True, kw_only=True)
class EmulatorTls:
    """TLS towards the built-in emulator."""

    enabled: bool = field(
        default=False, metadata=meta("Serve and connect with TLS (a self-signed CA is generated).")
    )
    verify: bool = field(
        default=True,
        metadata=meta(
            "Verify the emulator's certificate. An in-process emulator is always verified "
            "against the CA it generated; an external one needs ca_file (gRPC cannot skip "
            "verification)."
        ),
    )
    ca_file: str | None = field(
        default=None,
        metadata=meta(
            "CA certificate to trust: required for an external emulator serving TLS (ca.pem in "
            "its certificate directory); an in-process emulator uses the one it generated.",
            path=True,
        ),
    )


@dataclass(frozen=True, kw_only=True)
class EmulatorWorkload:
    """What the emulator generates for a run."""

    events: int = field(
        default=10_000,
        metadata=meta(
            "Events to generate: change events and the platform events the workload mixes in, "
            "in whole transactions.",
            minimum=0,
        ),
    )
    platform_events: int = field(
        default=1_000, metadata=meta("Platform events published on top of events.", minimum=0)
    )
    events_per_second: float | None = field(
        default=None,
        metadata=meta("Generation rate; null generates as fast as possible.", exclusive_minimum=0),
    )
    timestamps: WorkloadTimestamps = field(
        default="simulated",
        metadata=meta(
            "Commit timestamps of the generated events: simulated (whole seconds from "
            "2025-01-01, the same for every run of a seed) or now (the moment each transaction "
            "is generated, to the millisecond, so lag figures are real; other values stay "
            "seeded)."
        ),
    )


@dataclass(frozen=True, kw_only=True)
class EmulatorSpec:
    """The built-in Pub/Sub API emulator (no Salesforce org needed)."""

    mode: EmulatorMode = field(
        default="in_process",
        metadata=meta(
            "in_process starts the emulator inside the sfcdc process; external connects to one "
            "already running (started by `sfcdc emulator` or a test) at host:grpc_port and logs "
            "in at its OAuth endpoint on http_port."
        ),
    )
    host: str = field(
        default="127.0.0.1",
        metadata=meta("Interface the emulator listens on (external: the host to connect to)."),
    )
    grpc_port: int = field(
        default=0,
        metadata=meta(
            "gRPC port; 0 picks a free port (in_process only: an external emulator's port is "
            "required).",
            minimum=0,
            maximum=65535,
        ),
    )
    http_port: int = field(
        default=0,
        metadata=meta(
            "OAuth endpoint port; 0 picks a free port (in_process only: an external emulator's "
            "port is required).",
            minimum=0,
            maximum=65535,
        ),
    )
    client_id: Credential = field(
        default="sfcdc-emulator",
        metadata=meta(
            "OAuth client the pipeline logs in with (client credentials flow); the default is "
            "the emulator's built-in test client."
        ),
    )
    client_secret: SecretRef | None = field(
        default=None,
        metadata=meta(
            "Secret of that client; null uses the built-in test client's secret, a public value "
            "that only the emulator accepts."
        ),
    )
    keepalive_seconds: float = field(
        default=1.0,
        metadata=meta(
            "In-process emulator: seconds of silence before an idle stream gets a keepalive "
            "(Salesforce: about 270), and how long a Streaming API long poll is held "
            "(Salesforce: 110). Short keeps the caught-up marks of idle topics fresh; `--once` "
            "does not wait for either (ingest.once_quiet_seconds).",
            exclusive_minimum=0,
        ),
    )
    seed: int = field(
        default=42,
        metadata=meta("Seed of the event generator: the same seed yields the same events."),
    )
    state_dir: str | None = field(
        default=None,
        metadata=meta(
            "Directory where the emulator keeps its event log between runs; null keeps it in "
            "memory. Relative paths are resolved against the directory that contains conf/.",
            path=True,
        ),
    )
    tls: EmulatorTls = field(default_factory=EmulatorTls, metadata=meta("TLS settings."))
    workload: EmulatorWorkload = field(
        default_factory=EmulatorWorkload, metadata=meta("Generated workload.")
    )

    def _problems(self) -> list[tuple[str, str]]:
        if self.mode != "external":
            return []
        problems = [
            (key, f"required for an external emulator: the port it listens on (got {port})")
            for key, port in (("grpc_port", self.grpc_port), ("http_port", self.http_port))
            if port == 0
        ]
        if self.tls.enabled and not self.tls.verify:
            problems.append(
                (
                    "tls.verify",
                    "must be true for an external emulator: gRPC cannot skip certificate "
                    "verification; give its CA certificate as tls.ca_file (got false)",
                )
            )
        elif self.tls.enabled and self.tls.ca_file is None:
            problems.append(
                (
                    "tls.ca_file",
                    "required for an external emulator serving TLS: its CA certificate "
                    "(ca.pem in the emulator's certificate directory)",
                )
            )
        return problems


@dataclass(frozen=True, kw_only=True)
class ConnectionSpec:
    """Where events come from."""

    source: Source = field(default="emulator", metadata=meta("Event source."))
    emulator: EmulatorSpec = field(
        default_factory=EmulatorSpec,
        metadata=meta("Emulator settings (used when source is emulator)."),
    )
    salesforce: SalesforceSpec | None = field(
        default=None, metadata=meta("Salesforce settings (required when source is salesforce).")
    )

    @staticmethod
    def _schema_extra() -> dict[str, Any]:
        return {
            "if": {"properties": {"source": {"const": "salesforce"}}, "required": ["source"]},
            "then": {"required": ["salesforce"]},
        }

    def _problems(self) -> list[tuple[str, str]]:
        if self.source == "salesforce" and self.salesforce is None:
            return [("salesforce", "required when connection.source is 'salesforce'")]
        return []
