"""The emulator facade: one object that runs the gRPC Pub/Sub API server and the OAuth/SOAP
HTTP(S) server over a shared event bus, token store, managed subscriptions and faults.

::

    with Emulator(catalogue, EmulatorConfig(tls=True)) as emu:
        token = emu.issue_token()
        stub = pb2_grpc.PubSubStub(emu.channel())
        stub.GetTopic(pb2.TopicRequest(topic_name="/data/AccountChangeEvent"),
                      metadata=token.metadata())
"""

from __future__ import annotations

import logging
import ssl
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import TracebackType

import grpc

from ingest.emulator.bulk import BulkQueryApi
from ingest.emulator.cometd.bayeux import CometdSettings
from ingest.emulator.cometd.server import CometdApi
from ingest.emulator.eventlog import EventBus, LoggedEvent
from ingest.emulator.faults import Faults, FaultSettings
from ingest.emulator.managed import (
    ManagedSubscriptionConfig,
    ManagedSubscriptions,
    salesforce_id_18,
)
from ingest.emulator.oauth import OAuthClient, OAuthServer, Token, TokenStore
from ingest.emulator.rest import RestApi
from ingest.emulator.service import PubSubService
from ingest.emulator.service_settings import ResponseEncoding, ServiceSettings
from ingest.emulator.tls import CA_CERT, SERVER_CERT, SERVER_KEY, TlsMaterial, ensure_tls
from ingest.emulator.topics import Catalogue, EmittedEvent
from ingest.emulator.truth import GroundTruth
from ingest.emulator.truthlog import TruthJournal
from ingest.errors import ConfigError

__all__ = [
    "DEFAULT_CLIENT",
    "DEFAULT_ORG_ID",
    "Emulator",
    "EmulatorConfig",
]

logger = logging.getLogger(__name__)

DEFAULT_ORG_ID = salesforce_id_18("00DEm0000SfCdcE")
DEFAULT_CLIENT = OAuthClient(
    client_id="sfcdc-emulator",
    client_secret="sfcdc-emulator-secret",
    username="integration@sfcdc.emulator",
    password="sfcdc-emulator-password",
)
_MAX_GRPC_MESSAGE = 4 * 1024 * 1024


@dataclass(frozen=True)
class EmulatorConfig:
    """Everything about an emulator that is fixed while it runs.

    Ports 0 pick free ports. ``instance_url`` defaults to the emulator's own HTTP(S) URL (the
    value clients must send as ``instanceurl``). ``cert_dir`` holds ``ca.pem``,
    ``server.pem`` and ``server-key.pem``; they are generated there when missing, and in a
    temporary directory when ``cert_dir`` is ``None``. ``state_dir`` journals the event log,
    managed-subscription commits, tokens and the records served by :meth:`Emulator.serve_records`
    so a new emulator on the same directory serves the same events under the same replay ids
    and answers REST and Bulk API queries for the same records.

    ``seed`` drives the gaps between replay ids. ``response_encoding="message"`` builds every
    Subscribe response as a protobuf message (slower; a cross-check and benchmark baseline).
    """

    host: str = "127.0.0.1"
    grpc_port: int = 0
    http_port: int = 0
    tls: bool = False
    cert_dir: Path | None = None
    org_id: str = DEFAULT_ORG_ID
    instance_url: str = ""
    retention: timedelta = timedelta(hours=72)
    keepalive_interval: float = 270.0
    idle_timeout: float = 60.0
    no_commit_timeout: float = 1800.0
    token_ttl: float = 7200.0
    state_dir: Path | None = None
    clients: tuple[OAuthClient, ...] = (DEFAULT_CLIENT,)
    managed_subscriptions: tuple[ManagedSubscriptionConfig, ...] = ()
    max_pending: int = 100
    max_response_bytes: int = 3 * 1024 * 1024
    max_event_bytes: int = 1024 * 1024
    faults: FaultSettings = field(default_factory=FaultSettings)
    seed: int = 0
    response_encoding: ResponseEncoding = "prebuilt"
    max_workers: int = 64
    streaming: CometdSettings = field(default_factory=CometdSettings)

    def __post_init__(self) -> None:
        problems: list[str] = []
        org = self.org_id
        if not (isinstance(org, str) and len(org) in (15, 18) and org.startswith("00D")):
            problems.append(f"org_id: expected a 15- or 18-character id starting 00D, got {org!r}")
        else:
            try:
                object.__setattr__(self, "org_id", salesforce_id_18(org))
            except ValueError as exc:
                problems.append(f"org_id: {exc}")
        for name in ("grpc_port", "http_port"):
            port = getattr(self, name)
            if not isinstance(port, int) or not 0 <= port <= 65535:
                problems.append(f"{name}: expected 0..65535, got {port!r}")
        for name in (
            "keepalive_interval",
            "idle_timeout",
            "no_commit_timeout",
            "token_ttl",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                problems.append(f"{name}: expected positive seconds, got {value!r}")
        if not isinstance(self.retention, timedelta) or self.retention <= timedelta(0):
            problems.append(f"retention: expected a positive timedelta, got {self.retention!r}")
        if not 1 <= self.max_pending <= 100_000:
            problems.append(f"max_pending: expected 1..100000, got {self.max_pending!r}")
        if self.max_event_bytes < 1 or self.max_event_bytes > self.max_response_bytes:
            problems.append(
                f"max_event_bytes: expected 1..max_response_bytes ({self.max_response_bytes}), "
                f"got {self.max_event_bytes!r}"
            )
        if self.max_response_bytes > _MAX_GRPC_MESSAGE:
            problems.append(
                f"max_response_bytes: expected at most {_MAX_GRPC_MESSAGE} (gRPC's default "
                f"message limit), got {self.max_response_bytes!r}"
            )
        if not self.clients:
            problems.append("clients: expected at least one OAuthClient")
        ids = [c.client_id for c in self.clients]
        if len(set(ids)) != len(ids):
            problems.append(f"clients: client_id values must be unique, got {ids}")
        names = [m.developer_name for m in self.managed_subscriptions]
        if len(set(names)) != len(names):
            problems.append(f"managed_subscriptions: developer names must be unique, got {names}")
        if self.response_encoding not in ("prebuilt", "message"):
            problems.append(
                f"response_encoding: expected 'prebuilt' or 'message', got "
                f"{self.response_encoding!r}"
            )
        if self.max_workers < 4:
            problems.append(f"max_workers: expected at least 4, got {self.max_workers!r}")
        if not isinstance(self.streaming, CometdSettings):
            problems.append(f"streaming: expected CometdSettings, got {self.streaming!r}")
        else:
            problems.extend(self.streaming.problems())
        if problems:
            raise ConfigError("invalid EmulatorConfig", problems)


def _display_host(host: str) -> str:
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


class Emulator:
    """A running Salesforce Pub/Sub API emulator for one org.

    ``clock`` (epoch seconds) drives retention, event times and token expiry, so tests can move
    time forward instead of waiting. ``faults`` defaults to one built from ``config.faults``.
    """

    def __init__(
        self,
        catalogue: Catalogue,
        config: EmulatorConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
        faults: Faults | None = None,
    ) -> None:
        self.config = config or EmulatorConfig()
        self.catalogue = catalogue
        self.faults = faults if faults is not None else Faults(self.config.faults)
        # The REST query endpoint; it answers once a workload's ground truth is attached.
        self.rest = RestApi(self.catalogue)
        self._clock = clock
        problems = [
            f"managed_subscriptions: {m.developer_name} names unknown topic {m.topic!r}"
            for m in self.config.managed_subscriptions
            if m.topic not in catalogue
        ]
        if problems:
            raise ConfigError("invalid EmulatorConfig for this catalogue", problems)
        self.managed = ManagedSubscriptions(
            self.config.managed_subscriptions, state_dir=self.config.state_dir
        )
        self._tokens = TokenStore(
            org_id=self.config.org_id,
            clock=clock,
            ttl=self.config.token_ttl,
            faults=self.faults,
            state_dir=self.config.state_dir,
        )
        self._bus = self._new_bus()
        # The Streaming API (CometD) on the HTTP(S) port, over the same bus and tokens.
        self.streaming = CometdApi(
            catalogue,
            tokens=self._tokens,
            faults=self.faults,
            settings=self.config.streaming,
            clock=clock,
            bus=lambda: self._bus,
            secure_cookies=self.config.tls,
        )
        # Bulk API 2.0 query jobs over the records the REST query endpoint answers from.
        self.bulk = BulkQueryApi(
            self.rest,
            tokens=self._tokens,
            object_fields=self.streaming.object_fields,
            clock=clock,
        )
        # The records REST and Bulk API queries read, kept beside the event log.
        state = self.config.state_dir
        self._truth_journal = TruthJournal(state) if state is not None else None
        self._journaled: GroundTruth | None = None
        if self._truth_journal is not None and self._truth_journal.exists():
            restored = self._truth_journal.load()
            if restored is not None:
                restored.use_formulas(self.catalogue.formulas)
                self.rest.attach(restored)
                self._journaled = restored
        self._grpc: grpc.Server | None = None
        self._oauth: OAuthServer | None = None
        self._service: PubSubService | None = None
        self._tls: TlsMaterial | None = None
        self._tls_dir: Path | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._grpc_port = self.config.grpc_port
        self._http_port = self.config.http_port
        self.http_url = ""
        self.instance_url = ""

    def _new_bus(self) -> EventBus:
        return EventBus(
            self.catalogue,
            clock=self._clock,
            retention=self.config.retention.total_seconds(),
            seed=self.config.seed,
            state_dir=self.config.state_dir,
        )

    def __repr__(self) -> str:
        state = f"grpc={self.grpc_target} http={self.http_url}" if self.running else "stopped"
        return f"Emulator(org={self.config.org_id}, {state})"

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._grpc is not None

    def start(self) -> Emulator:
        """Bind both servers and start serving. Returns ``self``."""
        if self.running:
            raise RuntimeError("the emulator is already running")
        config = self.config
        ssl_context = None
        if config.tls:
            self._tls_dir = config.cert_dir
            if self._tls_dir is None:
                if self._tmp is None:
                    self._tmp = tempfile.TemporaryDirectory(prefix="sfcdc-emulator-tls-")
                self._tls_dir = Path(self._tmp.name)
            self._tls = ensure_tls(self._tls_dir)
            ssl_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ssl_context.minimum_version = ssl.TLSVersion.TLSv1_2
            ssl_context.load_cert_chain(self._tls_dir / SERVER_CERT, self._tls_dir / SERVER_KEY)

        self._oauth = OAuthServer(
            self._tokens,
            config.clients,
            host=config.host,
            port=self._http_port,
            clock=self._clock,
            ssl_context=ssl_context,
            faults=self.faults,
            rest=self.rest,
            routes=(self.bulk, *self.streaming.routes),
        )
        self._http_port = self._oauth.port
        scheme = "https" if config.tls else "http"
        self.http_url = f"{scheme}://{_display_host(config.host)}:{self._http_port}"
        self.instance_url = config.instance_url.rstrip("/") or self.http_url
        self._tokens.bind(instance_url=self.instance_url, login_url=self.http_url)

        self._service = PubSubService(
            catalogue=self.catalogue,
            bus=self._bus,
            tokens=self._tokens,
            managed=self.managed,
            faults=self.faults,
            settings=ServiceSettings(
                org_id=config.org_id,
                instance_url=self.instance_url,
                keepalive_interval=config.keepalive_interval,
                idle_timeout=config.idle_timeout,
                no_commit_timeout=config.no_commit_timeout,
                max_pending=config.max_pending,
                max_response_bytes=config.max_response_bytes,
                max_event_bytes=config.max_event_bytes,
                response_encoding=config.response_encoding,
            ),
            clock=self._clock,
        )
        server = grpc.server(
            ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix="sfcdc-pubsub"),
            options=[
                ("grpc.max_receive_message_length", _MAX_GRPC_MESSAGE),
                ("grpc.max_send_message_length", _MAX_GRPC_MESSAGE),
                # Two emulators must never share a port silently.
                ("grpc.so_reuseport", 0),
                # Clients keep idle streams alive with HTTP/2 pings (sfcdc's every 60 s, while
                # a stream waits up to 270 s for a keepalive). gRPC servers accept a ping
                # without data only every 5 minutes by default and answer the third with
                # GOAWAY too_many_pings, which ended every quiet stream after 3 minutes.
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
            ],
        )
        self._service.register(server)
        address = f"{config.host}:{self._grpc_port}"
        if self._tls is not None:
            credentials = grpc.ssl_server_credentials(
                [(self._tls.server_key_pem, self._tls.server_cert_pem)]
            )
            port = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
        if port == 0:
            self._oauth.stop()
            self._oauth = None
            raise RuntimeError(f"could not bind the gRPC server to {address}")
        self._grpc_port = port
        server.start()
        self.streaming.bind(self._bus)
        self._oauth.start()
        self._grpc = server
        self.faults.attach(self._purge)
        logger.info(
            "emulator for org %s serving gRPC on %s and %s (tls=%s)",
            config.org_id,
            self.grpc_target,
            self.http_url,
            config.tls,
        )
        return self

    def stop(self, grace: float = 1.0) -> None:
        """End every stream with UNAVAILABLE and stop both servers. Idempotent."""
        if self._service is not None:
            self._service.shutdown()
        self.streaming.close()
        if self._grpc is not None:
            self._grpc.stop(grace).wait()
            self._grpc = None
        if self._oauth is not None:
            self._oauth.stop()
            self._oauth = None
        self._service = None
        self.faults.attach(None)
        self._bus.close()

    def restart(self) -> Emulator:
        """Stop and start again on the same ports. With ``state_dir`` the log is reloaded from
        disk, as a new process would; without it the in-memory log carries over."""
        self.stop()
        if self.config.state_dir is not None:
            self._bus = self._new_bus()
            self.managed = ManagedSubscriptions(
                self.config.managed_subscriptions, state_dir=self.config.state_dir
            )
        return self.start()

    def close(self) -> None:
        """Stop and remove generated certificates (when they were put in a temporary dir)."""
        self.stop()
        if self._truth_journal is not None:
            self._truth_journal.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- addresses and credentials -----------------------------------------------------------

    @property
    def peak_requested(self) -> int:
        """The most events a client had requested and not yet received on one Subscribe or
        ManagedSubscribe stream since the server (re)started, counted before Salesforce's cap
        of 100 outstanding applies."""
        service = self._service
        return service.peak_requested if service is not None else 0

    @property
    def grpc_port(self) -> int:
        return self._grpc_port

    @property
    def http_port(self) -> int:
        return self._http_port

    @property
    def grpc_target(self) -> str:
        """``host:port`` to dial (``127.0.0.1:<port>`` by default)."""
        return f"{_display_host(self.config.host)}:{self._grpc_port}"

    @property
    def ca_cert_pem(self) -> bytes | None:
        """The CA that signed the server certificate (``None`` without TLS)."""
        return self._tls.ca_cert_pem if self._tls is not None else None

    @property
    def ca_cert_path(self) -> Path | None:
        return self._tls_dir / CA_CERT if self._tls is not None and self._tls_dir else None

    @property
    def org_id(self) -> str:
        return self.config.org_id

    def channel(self) -> grpc.Channel:
        """A new gRPC channel to this emulator (verifying its certificate in TLS mode)."""
        if self.ca_cert_pem is not None:
            credentials = grpc.ssl_channel_credentials(root_certificates=self.ca_cert_pem)
            return grpc.secure_channel(self.grpc_target, credentials)
        return grpc.insecure_channel(self.grpc_target)

    def issue_token(self, client_id: str | None = None, *, refresh_token: bool = False) -> Token:
        """A valid access token for a configured client (the first when ``client_id`` is
        ``None``), as the OAuth endpoint would issue it. ``refresh_token=True`` also issues a
        refresh token, as the web-server flow does."""
        if not self.running:
            raise RuntimeError("issue_token needs a running emulator: call start() first")
        clients = {c.client_id: c for c in self.config.clients}
        client = self.config.clients[0] if client_id is None else clients.get(client_id)
        if client is None:
            raise KeyError(f"no OAuth client {client_id!r}; configured: {sorted(clients)}")
        return self._tokens.issue(
            client_id=client.client_id,
            user_id=client.user_id,
            username=client.username,
            with_refresh_token=refresh_token,
        )

    # -- the org's records -------------------------------------------------------------------

    def serve_records(self, truth: GroundTruth) -> None:
        """Answer REST queries and Bulk API query jobs from ``truth`` (the records of the
        workload whose events are appended here), and with ``state_dir`` keep it on disk as
        events are appended, so a restarted emulator answers for the same records."""
        self.rest.attach(truth)
        self._journaled = truth
        if self._truth_journal is not None:
            self._truth_journal.start(truth)

    @property
    def records(self) -> GroundTruth | None:
        """The records REST and Bulk API queries are answered from (``None``: none)."""
        return self.rest.truth

    # -- the bus -----------------------------------------------------------------------------

    def append(self, events: Iterable[EmittedEvent]) -> list[bytes]:
        """Put events on the bus (as Salesforce would after a record change or a publish);
        returns their replay ids in order. Subscribers of their topics (and of the channels
        carrying them) receive them. Events a standing :meth:`Faults.lose_events` claims, and
        events of an entity whose Change Data Capture is off
        (:meth:`~ingest.emulator.topics.Catalogue.disable_change_events`), are not stored and
        have no replay id."""
        batch = list(events)
        problems = []
        for i, ev in enumerate(batch):
            if ev.topic not in self.catalogue:
                problems.append(f"event {i}: unknown topic {ev.topic!r}")
            elif self.catalogue.topic(ev.topic).kind == "change_event_channel":
                problems.append(
                    f"event {i}: {ev.topic} is a channel; append to the object's own topic"
                )
            if len(ev.payload) > self.config.max_event_bytes:
                problems.append(
                    f"event {i}: payload of {len(ev.payload)} bytes exceeds max_event_bytes "
                    f"({self.config.max_event_bytes}); Salesforce sends a GAP event instead"
                )
        if problems:
            raise ValueError("cannot append: " + "; ".join(problems))
        journaled = self._journaled
        if (
            self._truth_journal is not None
            and journaled is not None
            and self.rest.truth is journaled
        ):
            # Before the events: Salesforce commits a record before it publishes the change.
            self._truth_journal.record(journaled)
        # An entity whose Change Data Capture is off publishes nothing: its change is in the
        # truth (and served by REST and Bulk), with no event.
        kept = [
            e
            for e in batch
            if self.catalogue.publishes(e.topic) and not self.faults.claim_loss(e.topic, e.event_id)
        ]
        return [e.replay_id for e in self._bus.append(kept)] if kept else []

    def log(self, topic: str) -> Sequence[LoggedEvent]:
        """What the bus retains for ``topic`` (replay id, event id, schema id, payload, time)."""
        return self._bus.log(topic)

    @property
    def bus(self) -> EventBus:
        return self._bus

    def _purge(self, before: float | None, through: int | None) -> int:
        return self._bus.purge(before=before, through=through)
