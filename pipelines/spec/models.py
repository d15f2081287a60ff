"""The models of ``conf/pipeline.yml`` (:class:`PipelineSpec`) and of an object file
(:class:`ObjectSpec`), a subscription (:class:`TopicSpec`), and the rules for topic and table
names; the loaded ``conf/`` directory (:class:`~pipelines.spec.conf.Conf`) is in
:mod:`pipelines.spec.conf`. The per-object sections
(replay, batching, silver, gold, health) are in :mod:`pipelines.spec.sections`, the
``connection`` section in :mod:`pipelines.spec.connection`. Models only:
:mod:`pipelines.spec.load` reads the YAML into them, :mod:`pipelines.spec` re-exports them,
and ``pipelines.spec.schema`` publishes their JSON Schema.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ingest.auth import SecretRef
from pipelines.spec.connection import API_VERSION_PATTERN, ConnectionSpec
from pipelines.spec.fields import meta
from pipelines.spec.sections import (
    BatchingSpec,
    DefaultsSpec,
    FormulasSpec,
    GoldSpec,
    HealthSpec,
    PollSpec,
    ReplaySpec,
    SilverSpec,
)

__all__ = [
    "IDENTIFIER_PATTERN",
    "POLLED_PREFIX",
    "TOPIC_FORMATS",
    "TOPIC_PATTERN",
    "CometdApiSpec",
    "EngineName",
    "IngestSpec",
    "LakeSpec",
    "Layer",
    "MaintenanceSpec",
    "ObjectKind",
    "ObjectSpec",
    "OpsSpec",
    "PipelineSpec",
    "PrometheusSpec",
    "ReconcileSpec",
    "RetrySpec",
    "SchemasSpec",
    "StorageSpec",
    "TablesSpec",
    "TopicInfo",
    "TopicKind",
    "TopicSpec",
    "default_tables",
    "default_topic",
    "is_identifier",
    "parse_topic",
    "snake_case",
]

Layer = Literal["bronze", "silver", "gold"]
EngineName = Literal["auto", "local", "spark"]
ObjectKind = Literal["change_events", "platform_event", "polled"]
_LAYERS: tuple[Layer, ...] = ("bronze", "silver", "gold")
TopicKind = Literal[
    "change_events", "change_event_channel", "platform_event", "platform_event_channel"
]

# Table, schema and catalog names are interpolated into SQL by the lake engines; anything that
# would need quoting (or could smuggle SQL in) is refused at load time. The patterns below also
# go into the JSON Schema (ECMA-262 regular expressions), so they keep `^...$`; Python checks
# them with `fullmatch`, because its `$` also matches before a trailing newline.
IDENTIFIER_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
_IDENTIFIER_RE = re.compile(IDENTIFIER_PATTERN)
_IDENTIFIER_MAX = 255
_IDENTIFIER_HINT = "a SQL identifier: letters, digits and '_', not starting with a digit"

_OBJECT_PATTERN = r"^[A-Za-z][A-Za-z0-9_]*$"
_OBJECT_HINT = "a Salesforce API name such as 'Account', 'Invoice__c' or 'Order_Shipped__e'"
_TABLE_PREFIX_PATTERN = r"^[A-Za-z0-9_]*$"
_DEVELOPER_NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_]*$"

TOPIC_FORMATS: tuple[str, ...] = (
    "/event/<Name>__e",
    "/event/<Name>",
    "/event/<Name>__chn",
    "/data/ChangeEvents",
    "/data/<Object>ChangeEvent",
    "/data/<Object>__ChangeEvent",
    "/data/<Name>__chn",
)
_NAME = r"[A-Za-z][A-Za-z0-9_]*"
_TOPIC_RULES: tuple[tuple[re.Pattern[str], TopicKind, Callable[[str], str | None]], ...] = (
    (re.compile(r"^/data/ChangeEvents$"), "change_event_channel", lambda _m: None),
    (re.compile(rf"^/data/{_NAME}__chn$"), "change_event_channel", lambda _m: None),
    (re.compile(rf"^/data/({_NAME})__ChangeEvent$"), "change_events", lambda m: f"{m}__c"),
    (re.compile(r"^/data/([A-Za-z][A-Za-z0-9]*)ChangeEvent$"), "change_events", lambda m: m),
    (re.compile(rf"^/event/{_NAME}__chn$"), "platform_event_channel", lambda _m: None),
    (re.compile(rf"^/event/({_NAME}__e)$"), "platform_event", lambda m: m),
    (re.compile(r"^/event/([A-Za-z][A-Za-z0-9]*)$"), "platform_event", lambda m: m),
)
# One pattern for all formats, for the JSON Schema and the first check of a `topic` key.
TOPIC_PATTERN = "^(" + "|".join(rule.pattern[1:-1] for rule, _kind, _entity in _TOPIC_RULES) + ")$"
_TOPIC_HINT = f"a Pub/Sub topic name, one of {', '.join(TOPIC_FORMATS)}"


# The topic key of a polled object (it has no topic): what its bookkeeping goes by.
POLLED_PREFIX = "polled:"

# Default of fields whose value is derived from others when the YAML leaves them out.
_DERIVED: Any = None


def _identmeta(doc: str, **more: Any) -> dict[str, Any]:
    return meta(
        doc, pattern=IDENTIFIER_PATTERN, hint=_IDENTIFIER_HINT, max_length=_IDENTIFIER_MAX, **more
    )


# ------------------------------------------------------------------------------------ lake


@dataclass(frozen=True, kw_only=True)
class SchemasSpec:
    """Schema (database) name of each layer."""

    bronze: str = field(default="bronze", metadata=_identmeta("Schema of the bronze tables."))
    silver: str = field(default="silver", metadata=_identmeta("Schema of the silver tables."))
    gold: str = field(default="gold", metadata=_identmeta("Schema of the gold tables."))

    def for_layer(self, layer: Layer) -> str:
        name: str = getattr(self, layer)
        return name


@dataclass(frozen=True, kw_only=True)
class StorageSpec:
    """How the local engine reaches a lake.location on object storage (s3://, abfss://, az://,
    gs://): what delta-rs is given to connect. Credentials are secret references; left out,
    delta-rs looks for them where the provider's SDKs do (environment, instance identity)."""

    endpoint: str | None = field(
        default=None,
        metadata=meta(
            "URL of the storage service when it is not the provider's own: an S3-compatible "
            "server, or the blob endpoint of Azurite or an Azure account "
            "(http://127.0.0.1:10000/devstoreaccount1).",
            pattern=r"^https?://\S+$",
            hint="an http:// or https:// URL",
        ),
    )
    region: str | None = field(default=None, metadata=meta("S3: the bucket's region."))
    allow_http: bool = field(
        default=False,
        metadata=meta("Allow a plain-HTTP endpoint (a storage server on this machine)."),
    )
    access_key_id: SecretRef | None = field(default=None, metadata=meta("S3: the access key id."))
    secret_access_key: SecretRef | None = field(
        default=None, metadata=meta("S3: the secret access key.")
    )
    session_token: SecretRef | None = field(
        default=None, metadata=meta("S3: the session token of temporary credentials.")
    )
    account_name: str | None = field(
        default=None, metadata=meta("Azure: the storage account's name.")
    )
    account_key: SecretRef | None = field(
        default=None, metadata=meta("Azure: a key of the storage account.")
    )
    sas_token: SecretRef | None = field(
        default=None, metadata=meta("Azure: a shared access signature instead of a key.")
    )
    service_account_key: SecretRef | None = field(
        default=None, metadata=meta("GCS: the service account's JSON key.")
    )


@dataclass(frozen=True, kw_only=True)
class LakeSpec:
    """Where and how Delta tables are written."""

    engine: EngineName = field(
        default="auto",
        metadata=meta(
            "Lake engine: spark (delta-spark: Databricks, any Spark with the Delta jars), local "
            "(delta-rs, no JVM), or auto (spark on Databricks or in a Spark session with Delta, "
            "else local)."
        ),
    )
    location: str = field(
        default="./lake",
        metadata=meta(
            "Root directory of the tables (<location>/<layer>/<table>): the local engine's, and "
            "the spark engine's when no catalog is set; relative paths are resolved against the "
            "directory that contains conf/. The local engine also takes object storage "
            "(s3://bucket/lake, abfss://container@account.dfs.core.windows.net/lake, "
            "az://container/lake, gs://bucket/lake; see lake.storage), the spark engine any "
            "location Spark reads (dbfs:/..., /Volumes/...).",
            path=True,
        ),
    )
    direct_writes: bool = field(
        default=True,
        metadata=meta(
            "Let the local engine commit appends and its MERGE itself (a constant cost per "
            "commit, however long the log): only on a local file system where a probe shows "
            "that hard links and put-if-absent work, else (FUSE mounts, object storage) and on "
            "any link error through delta-rs; false: every commit through delta-rs."
        ),
    )
    storage: StorageSpec = field(
        default_factory=StorageSpec,
        metadata=meta("Object storage settings for the local engine (s3://, az://, gs://)."),
    )
    catalog: str | None = field(
        default=None,
        metadata=_identmeta(
            "Catalog of the spark engine's tables (Unity Catalog on Databricks): they are the "
            "catalog's tables catalog.schema.table; null keeps them under lake.location."
        ),
    )
    schemas: SchemasSpec = field(
        default_factory=SchemasSpec, metadata=meta("Schema names per layer.")
    )
    table_prefix: str = field(
        default="",
        metadata=meta(
            "Prefix added to every table name (e.g. 'sfcdc_').",
            pattern=_TABLE_PREFIX_PATTERN,
            hint="letters, digits and '_'",
            max_length=64,
        ),
    )

    def table_name(self, name: str) -> str:
        """The physical table name of a logical one (the prefix applied)."""
        return f"{self.table_prefix}{name}"


# ------------------------------------------------------------------- ingest and operations


@dataclass(frozen=True, kw_only=True)
class RetrySpec:
    """Reconnecting after transient failures (exponential backoff)."""

    max_attempts: int = field(
        default=10,
        metadata=meta("Consecutive failed attempts before the subscription gives up.", minimum=1),
    )
    initial_backoff_seconds: float = field(
        default=1.0, metadata=meta("Wait before the first retry.", exclusive_minimum=0)
    )
    max_backoff_seconds: float = field(
        default=60.0, metadata=meta("Longest wait between retries.", exclusive_minimum=0)
    )
    multiplier: float = field(
        default=2.0, metadata=meta("Growth factor of the wait per failed attempt.", minimum=1)
    )
    first_contact_seconds: float = field(
        default=10.0,
        metadata=meta(
            "A subscription that has never reached its server (a name that does not resolve, a "
            "refused connection, a login endpoint that is down) stops within this long, naming "
            "the address and the cause; once the server has answered, outages are retried as "
            "max_attempts allows.",
            minimum=0,
        ),
    )

    def _problems(self) -> list[tuple[str, str]]:
        if self.max_backoff_seconds >= self.initial_backoff_seconds:
            return []
        return [
            (
                "max_backoff_seconds",
                f"must be at least initial_backoff_seconds ({self.initial_backoff_seconds:g}) "
                f"(got {self.max_backoff_seconds:g})",
            )
        ]


@dataclass(frozen=True, kw_only=True)
class IngestSpec:
    """Subscription behaviour shared by all topics."""

    num_requested: int = field(
        default=100,
        metadata=meta(
            "Flow control: events requested per FetchRequest (Salesforce caps it at 100).",
            minimum=1,
            maximum=100,
        ),
    )
    retry: RetrySpec = field(default_factory=RetrySpec, metadata=meta("Retry policy."))
    progress_interval_seconds: float = field(
        default=30.0,
        metadata=meta("How often a running subscription logs its progress.", exclusive_minimum=0),
    )
    maintain_every_commits: int = field(
        default=100,
        metadata=meta(
            "Compact a bronze table and checkpoint its Delta log after this many commits to it "
            "(0: never), so reads stay fast on long runs (on the local engine this runs beside "
            "landing's commits, which do not wait for it); silver tables likewise at every "
            "version that is a multiple of it.",
            minimum=0,
        ),
    )
    lease_seconds: float = field(
        default=60.0,
        metadata=meta(
            "How long a landing's lease on its topics lasts without renewal (renewed every "
            "third of it). A second landing of a leased topic into the same lake is refused at "
            "start; a lease left by a killed process is taken over once it expires.",
            exclusive_minimum=0,
        ),
    )
    once_quiet_seconds: float = field(
        default=3.0,
        metadata=meta(
            "`--once` runs: a Pub/Sub topic whose server owes events (requested, not yet "
            "sent) yet sends nothing for this long, or a Streaming API long poll held this long "
            "(the connect asks the server for no longer), has delivered everything it held; the "
            "landing then stops without waiting for Salesforce's keepalive (about 270 s) or "
            "long-poll timeout (110 s). Raise it if an org is slow to start delivering.",
            exclusive_minimum=0,
            maximum=110,
        ),
    )


@dataclass(frozen=True, kw_only=True)
class PrometheusSpec:
    """The Prometheus endpoint of `sfcdc run --continuous` and `sfcdc ingest`."""

    port: int | None = field(
        default=None,
        metadata=meta(
            "Port serving /metrics while the command runs (`--metrics-port` overrides it); "
            "null serves none.",
            minimum=1,
            maximum=65535,
        ),
    )
    host: str = field(
        default="127.0.0.1",
        metadata=meta("Interface it listens on (0.0.0.0: every interface)."),
    )


@dataclass(frozen=True, kw_only=True)
class OpsSpec:
    """What sfcdc records about its own work: the commits table and the metrics endpoint."""

    commits_table: bool = field(
        default=True,
        metadata=meta(
            "Record every landing, silver and gold commit (and every failure) as a row of the "
            "bronze schema's sfcdc_commits table, which `sfcdc status` and the dashboard read "
            "(the table exists either way, empty when this is off)."
        ),
    )
    flush_seconds: float = field(
        default=10.0,
        metadata=meta(
            "Longest time commit rows wait in memory before they are written (one commit per "
            "flush; one-shot commands write theirs when they end).",
            exclusive_minimum=0,
        ),
    )
    rate_window_seconds: float = field(
        default=300.0,
        metadata=meta("`sfcdc status`: the events/s figure covers this many seconds.", minimum=1),
    )
    prometheus: PrometheusSpec = field(
        default_factory=PrometheusSpec, metadata=meta("Prometheus metrics endpoint.")
    )


@dataclass(frozen=True, kw_only=True)
class MaintenanceSpec:
    """`sfcdc maintain`, and continuous runs on a schedule: compaction, log checkpoints, log
    cleanup and VACUUM of every table, never removing what a consumer has yet to read."""

    vacuum_retention_hours: float = field(
        default=168.0,
        metadata=meta(
            "VACUUM deletes data files no longer in a table for at least this long. Longer when "
            "a consumer (silver of bronze, gold of silver) still needs an older version: the "
            "retention used is then the age of that version's commit. Time travel to versions "
            "older than the retention no longer works.",
            minimum=0,
        ),
    )
    log_retention_hours: float = field(
        default=720.0,
        metadata=meta(
            "Delta log entries (commit JSON and checkpoints) older than this, and older than "
            "the newest log checkpoint, are deleted; longer when a consumer still needs an "
            "older version, as for vacuum_retention_hours. History and time travel before the "
            "oldest kept entry are gone.",
            minimum=0,
        ),
    )
    every_seconds: float = field(
        default=3600.0,
        metadata=meta(
            "Continuous runs (`sfcdc run --continuous`) maintain every table this often, one "
            "table after each silver and gold pass (0: never; `sfcdc maintain` runs it on "
            "demand).",
            minimum=0,
        ),
    )
    compact: bool = field(
        default=True,
        metadata=meta("Compact small data files (OPTIMIZE) before vacuuming."),
    )


@dataclass(frozen=True, kw_only=True)
class ReconcileSpec:
    """`sfcdc reconcile`, and continuous runs on a schedule: compare gold with Salesforce
    (one query of Id, SystemModstamp and IsDeleted per object) and repair the drift."""

    every_hours: float = field(
        default=0.0,
        metadata=meta(
            "Continuous runs (`sfcdc run --continuous`) reconcile every change event object "
            "this often, counted from the last reconcile the lake recorded (0: never; "
            "`sfcdc reconcile` and the bundle's sfcdc_reconcile job run it on demand).",
            minimum=0,
        ),
    )
    api: Literal["rest", "bulk", "auto"] = field(
        default="auto",
        metadata=meta(
            "How each object is read: REST queryAll, a Bulk API 2.0 queryAll job, or auto "
            "(count first, Bulk from 50,000 records on)."
        ),
    )
    lookback_seconds: float = field(
        default=300.0,
        metadata=meta(
            "Records Salesforce saved this recently are in flight (their event may not be in "
            "gold yet): counted, not judged. Covers landing latency and clock skew.",
            minimum=0,
        ),
    )
    repair: bool = field(
        default=True,
        metadata=meta(
            "Re-read drifting records through the re-sync path; false only measures and "
            "records the drift."
        ),
    )


@dataclass(frozen=True, kw_only=True)
class CometdApiSpec:
    """The Streaming API (CometD) source, for object files of ``kind: streaming_api``."""

    api_version: str = field(
        default="62.0",
        metadata=meta(
            "API version of the CometD endpoint (/cometd/<version>, 37.0 or later for durable "
            "replay) and of the REST calls that manage PushTopics and read describes.",
            pattern=API_VERSION_PATTERN,
            hint="a version such as '62.0'",
        ),
    )

    def _problems(self) -> list[tuple[str, str]]:
        if float(self.api_version) >= 37.0:
            return []
        return [
            (
                "api_version",
                "must be 37.0 or later: older versions have no replay, so a restart could lose "
                f"notifications (got {self.api_version!r})",
            )
        ]


@dataclass(frozen=True, kw_only=True)
class PipelineSpec:
    """``conf/pipeline.yml``: one per deployment."""

    connection: ConnectionSpec = field(
        default_factory=ConnectionSpec, metadata=meta("Event source and credentials.")
    )
    lake: LakeSpec = field(default_factory=LakeSpec, metadata=meta("Delta tables."))
    defaults: DefaultsSpec = field(
        default_factory=DefaultsSpec, metadata=meta("Per-object defaults.")
    )
    ingest: IngestSpec = field(default_factory=IngestSpec, metadata=meta("Subscription settings."))
    ops: OpsSpec = field(
        default_factory=OpsSpec, metadata=meta("Commit records, status window and metrics.")
    )
    streaming_api: CometdApiSpec = field(
        default_factory=CometdApiSpec,
        metadata=meta("The Streaming API source (object files of kind streaming_api)."),
    )
    maintenance: MaintenanceSpec = field(
        default_factory=MaintenanceSpec,
        metadata=meta("Compaction, log cleanup and VACUUM (`sfcdc maintain`)."),
    )
    reconcile: ReconcileSpec = field(
        default_factory=ReconcileSpec,
        metadata=meta("Drift against Salesforce, measured and repaired (`sfcdc reconcile`)."),
    )


# --------------------------------------------------------------------------------- objects


@dataclass(frozen=True, kw_only=True)
class TablesSpec:
    """Table names of one object; each defaults to a name derived from the topic or object."""

    bronze: str = field(
        default=_DERIVED,
        metadata=_identmeta(
            "Bronze table (one per topic, shared by every object on that topic).",
            derived="snake_case of the topic's last segment: account_change_event, change_events",
        ),
    )
    silver: str = field(
        default=_DERIVED,
        metadata=_identmeta(
            "Silver table of the object.",
            derived="snake_case of the object without __c/__e: account, invoice, order_shipped",
        ),
    )
    gold: str = field(
        default=_DERIVED,
        metadata=_identmeta(
            "Gold table of the object.",
            derived="snake_case of the object without __c/__e: account, invoice, order_shipped",
        ),
    )

    def for_layer(self, layer: Layer) -> str:
        name: str = getattr(self, layer)
        return name


@dataclass(frozen=True, kw_only=True)
class ObjectSpec:
    """``conf/objects/<name>.yml``: one Salesforce object or platform event.

    Built without ``topic`` or ``tables`` it derives them (see :func:`default_topic` and
    :func:`default_tables`); :func:`load_conf` also applies the pipeline's ``defaults``.
    """

    api_name: str = field(
        metadata=meta(
            "API name of the object or platform event: Account, Invoice__c, Order_Shipped__e.",
            key="object",
            pattern=_OBJECT_PATTERN,
            hint=_OBJECT_HINT,
            max_length=_IDENTIFIER_MAX,
        )
    )
    kind: ObjectKind = field(
        metadata=meta(
            "change_events for Change Data Capture of an object, platform_event for an event, "
            "polled for an object without change events (read by incremental queries on "
            "SystemModstamp, see `poll`)."
        )
    )
    topic: str = field(
        default=_DERIVED,
        metadata=meta(
            "Pub/Sub topic (or channel shared with other objects, such as /data/ChangeEvents). "
            "A polled object has none.",
            pattern=TOPIC_PATTERN,
            hint=_TOPIC_HINT,
            derived="/data/AccountChangeEvent, /data/Invoice__ChangeEvent, /event/Order_Shipped__e",
        ),
    )
    enabled: bool = field(
        default=True, metadata=meta("Ingest this object; false keeps the file but skips it.")
    )
    replay: ReplaySpec = field(
        default_factory=ReplaySpec,
        metadata=meta("Overrides of defaults.replay.", inherits="defaults.replay"),
    )
    batching: BatchingSpec = field(
        default_factory=BatchingSpec,
        metadata=meta("Overrides of defaults.batching.", inherits="defaults.batching"),
    )
    silver: SilverSpec = field(
        default_factory=SilverSpec,
        metadata=meta("Overrides of defaults.silver.", inherits="defaults.silver"),
    )
    gold: GoldSpec = field(
        default_factory=GoldSpec,
        metadata=meta("Overrides of defaults.gold.", inherits="defaults.gold"),
    )
    health: HealthSpec = field(
        default_factory=HealthSpec,
        metadata=meta("Overrides of defaults.health.", inherits="defaults.health"),
    )
    tables: TablesSpec = field(default_factory=TablesSpec, metadata=meta("Table names."))
    poll: PollSpec = field(
        default_factory=PollSpec,
        metadata=meta("How a polled object is read (kind polled only)."),
    )
    formulas: FormulasSpec = field(
        default_factory=FormulasSpec,
        metadata=meta("The scheduled refresh of formula fields (change_events and polled)."),
    )
    num_requested: int | None = field(
        default=None,
        metadata=meta(
            "Flow control of this object's topic: events requested per FetchRequest (1-100); "
            "lower it for objects whose events are large. null takes ingest.num_requested.",
            minimum=1,
            maximum=100,
        ),
    )
    managed_subscription: str | None = field(
        default=None,
        metadata=meta(
            "Developer name of a ManagedEventSubscription on this topic (ManagedSubscribe, "
            "beta): the server keeps the replay position as well, and sfcdc commits it there "
            "only after the Delta checkpoint. null subscribes with Subscribe and replay.start.",
            pattern=_DEVELOPER_NAME_PATTERN,
            hint="a developer name: letters, digits and '_', starting with a letter",
            max_length=80,
        ),
    )

    def __post_init__(self) -> None:
        # Derivation lives here so that code building an ObjectSpec directly (tests, notebooks)
        # gets the same names as a YAML file that leaves them out.
        topic = self.topic if self.topic is not None else default_topic(self.api_name, self.kind)
        derived = default_tables(self.api_name, topic)
        tables = TablesSpec(
            bronze=self.tables.bronze if self.tables.bronze is not None else derived.bronze,
            silver=self.tables.silver if self.tables.silver is not None else derived.silver,
            gold=self.tables.gold if self.tables.gold is not None else derived.gold,
        )
        object.__setattr__(self, "topic", topic)
        object.__setattr__(self, "tables", tables)


@dataclass(frozen=True)
class TopicInfo:
    """What a topic name says: its kind and, for single-entity topics, the entity."""

    name: str
    kind: TopicKind
    entity: str | None


@dataclass(frozen=True)
class TopicSpec:
    """One subscription: a topic, the bronze table it lands in and the objects it carries;
    ``managed_subscription`` names the ManagedEventSubscription it streams from, if any;
    ``num_requested`` overrides ``ingest.num_requested`` (``None``: it applies)."""

    topic: str
    kind: TopicKind
    bronze_table: str
    replay: ReplaySpec
    batching: BatchingSpec
    objects: tuple[ObjectSpec, ...]
    managed_subscription: str | None = None
    num_requested: int | None = None


# ------------------------------------------------------------------------ names and topics


def is_identifier(name: object) -> bool:
    """True for names the lake engines may put in SQL unquoted (and at most 255 chars)."""
    return (
        isinstance(name, str)
        and len(name) <= _IDENTIFIER_MAX
        and _IDENTIFIER_RE.fullmatch(name) is not None
    )


def snake_case(name: str) -> str:
    """``AccountChangeEvent`` -> ``account_change_event``; underscores are kept as they are."""
    text = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)
    text = re.sub(r"(?<=[A-Z])(?=[A-Z][a-z])", "_", text)
    return text.lower()


def parse_topic(topic: str) -> TopicInfo:
    """Classify a Pub/Sub topic name; ``ValueError`` lists the valid formats otherwise.

    Names are case-sensitive, as on Salesforce.
    """
    if isinstance(topic, str):
        for pattern, kind, entity in _TOPIC_RULES:
            match = pattern.fullmatch(topic)
            if match:
                return TopicInfo(topic, kind, entity(match.group(1)) if match.groups() else None)
    raise ValueError(f"must be {_TOPIC_HINT} (got {topic!r})")


def default_topic(api_name: str, kind: ObjectKind) -> str:
    """The topic Salesforce uses for an object's change events or for a platform event; a
    polled object has no topic and gets the key ``polled:<Object>`` in its place (the name its
    bookkeeping goes by, never subscribed to)."""
    if kind == "polled":
        return f"{POLLED_PREFIX}{api_name}"
    if kind == "platform_event":
        return f"/event/{api_name}"
    if api_name.endswith("__c"):
        return f"/data/{api_name.removesuffix('__c')}__ChangeEvent"
    return f"/data/{api_name}ChangeEvent"


def _object_table(api_name: str) -> str:
    for suffix in ("__c", "__e"):
        if api_name.endswith(suffix):
            api_name = api_name.removesuffix(suffix)
            break
    return snake_case(api_name)


def default_tables(api_name: str, topic: str) -> TablesSpec:
    """Derived table names: bronze from the topic (one table per topic; a polled object's
    ``<object>_polled``), silver and gold from the object (``Invoice__c`` -> ``invoice``)."""
    if topic.startswith(POLLED_PREFIX):
        name = _object_table(api_name)
        return TablesSpec(bronze=f"{name}_polled", silver=name, gold=name)
    return TablesSpec(
        bronze=snake_case(topic.rsplit("/", 1)[-1]),
        silver=_object_table(api_name),
        gold=_object_table(api_name),
    )
