"""The declarative configuration: ``conf/pipeline.yml`` and ``conf/objects/<name>.yml``.

This is the only module that parses YAML. :func:`load_conf` reads a ``conf/`` directory into
frozen, typed models (one dataclass per section), applies ``defaults`` to every object and
derives what an object file leaves out (its topic and table names). Every problem in every
file is reported at once, in one :class:`~ingest.errors.ConfigError` whose ``problems`` each
name the file and the key path::

    conf/objects/account.yml: replay.start: must be one of 'earliest', 'latest' (got 'yesterday')

Secrets are never values in YAML: a secret key holds a reference, ``{env: NAME}`` or
``{secret: {scope: ..., key: ...}}`` (a Databricks secret scope). References are checked for
form here and resolved at connect time by the resolver the caller injects, so a missing
environment variable is not a load-time error.

The models double as the source of the published JSON Schema (``pipelines.spec_schema``): the
``doc`` and constraints in each field's metadata feed both the validation below and the schema.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml

from ingest.auth import EnvRef, ScopeRef, SecretRef
from ingest.errors import ConfigError
from ingest.replay import After, Earliest, Latest, ReplayId, StartPosition
from pipelines.spec_connection import (
    API_VERSION_PATTERN,
    AuthSpec,
    ClientCredentialsAuth,
    ConnectionSpec,
    EmulatorMode,
    EmulatorSpec,
    EmulatorTls,
    EmulatorWorkload,
    JwtBearerAuth,
    RefreshTokenAuth,
    SalesforceSpec,
    SalesforceTls,
    SoapLoginAuth,
    Source,
    StaticTokenAuth,
    UsernamePasswordAuth,
    WorkloadTimestamps,
)
from pipelines.spec_fields import (
    INVALID,
    ByteSize,
    Credential,
    Problems,
    join,
    meta,
    parse_byte_size,
    parse_model,
    resolve_paths,
)

if TYPE_CHECKING:
    from pipelines.spec_streaming import StreamingObjectSpec

__all__ = [
    "DEFAULT_SEQUENCE_BY",
    "IDENTIFIER_PATTERN",
    "TOPIC_FORMATS",
    "TOPIC_PATTERN",
    "AuthSpec",
    "BatchingSpec",
    "ByteSize",
    "ClientCredentialsAuth",
    "CompoundFields",
    "Conf",
    "ConnectionSpec",
    "Credential",
    "DefaultsSpec",
    "DeleteMode",
    "EmulatorMode",
    "EmulatorSpec",
    "EmulatorTls",
    "EmulatorWorkload",
    "EngineName",
    "EnvRef",
    "GoldSpec",
    "HealthSpec",
    "IngestSpec",
    "JwtBearerAuth",
    "LakeSpec",
    "Layer",
    "MaintenanceSpec",
    "ObjectKind",
    "ObjectSpec",
    "OnCorrupted",
    "OpsSpec",
    "PipelineSpec",
    "PrometheusSpec",
    "RefreshTokenAuth",
    "ReplaySpec",
    "ReplayStart",
    "RetrySpec",
    "SalesforceSpec",
    "SalesforceTls",
    "Scd2Spec",
    "SchemasSpec",
    "ScopeRef",
    "SecretRef",
    "SilverSpec",
    "SoapLoginAuth",
    "Source",
    "StaticTokenAuth",
    "StreamingApiSpec",
    "TablesSpec",
    "TopicInfo",
    "TopicKind",
    "TopicSpec",
    "UsernamePasswordAuth",
    "WorkloadTimestamps",
    "default_tables",
    "default_topic",
    "is_identifier",
    "load_conf",
    "load_object",
    "load_pipeline",
    "parse_byte_size",
    "parse_override",
    "parse_topic",
    "pipeline_from_overrides",
    "snake_case",
]

Layer = Literal["bronze", "silver", "gold"]
EngineName = Literal["auto", "local", "spark"]
ReplayStart = Literal["earliest", "latest"]
_HEX_RE = re.compile(r"[0-9A-Fa-f]+")
OnCorrupted = Literal["fail", "earliest", "latest"]
ObjectKind = Literal["change_events", "platform_event"]
CompoundFields = Literal["struct", "flattened"]
DeleteMode = Literal["soft", "hard"]
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
            "directory that contains conf/.",
            path=True,
        ),
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


# -------------------------------------------------------------------- defaults and ingest


@dataclass(frozen=True, kw_only=True)
class ReplaySpec:
    """Where a subscription starts when it has no checkpoint, and what a bad replay id does."""

    start: ReplayStart = field(
        default="earliest",
        metadata=meta(
            "Start of a new subscription: earliest (oldest retained event, 72 h on Salesforce) "
            "or latest (only new events). Ignored once a checkpoint exists."
        ),
    )
    on_corrupted: OnCorrupted = field(
        default="fail",
        metadata=meta(
            "When Salesforce rejects the stored replay id (expired or invalid): fail (stop and "
            "say so), or restart from earliest / latest (latest loses events)."
        ),
    )
    replay_id: str | None = field(
        default=None,
        metadata=meta(
            "Start a new subscription right after this replay id instead of at start (a "
            "replay id an earlier consumer stored): base64 as Salesforce's APIs show it, or "
            "hex; 'hex:' or 'base64:' in front says which when the text could be either (bare "
            "text of hex digits reads as hex). Ignored once a checkpoint exists.",
            max_length=200,
        ),
    )

    def start_position(self) -> StartPosition:
        """Where a subscription without a checkpoint starts."""
        if self.replay_id is not None:
            return After(parse_replay_id(self.replay_id))
        return Earliest() if self.start == "earliest" else Latest()

    def _problems(self) -> list[tuple[str, str]]:
        if self.replay_id is None:
            return []
        try:
            parse_replay_id(self.replay_id)
        except ValueError as exc:
            return [("replay_id", str(exc))]
        return []


@dataclass(frozen=True, kw_only=True)
class BatchingSpec:
    """When a batch of received events is written to bronze (whichever limit comes first)."""

    max_events: int = field(default=50_000, metadata=meta("Events per bronze commit.", minimum=1))
    max_bytes: Annotated[int, ByteSize] = field(
        default=16 * 1024**2,
        metadata=meta(
            "Payload bytes per bronze commit: a byte count or a size such as '16MiB'. Landing "
            "holds about two batches while it writes (the open one and the one committing), and "
            "larger batches buy no throughput past a few MiB.",
            minimum=1024,
            maximum=1024**3,
        ),
    )
    max_age_seconds: float = field(
        default=5.0,
        metadata=meta(
            "Longest time an event waits in memory before its batch is written.",
            exclusive_minimum=0,
        ),
    )


@dataclass(frozen=True, kw_only=True)
class SilverSpec:
    """How an object's silver table is shaped."""

    compound_fields: CompoundFields = field(
        default="struct",
        metadata=meta(
            "Compound fields (Address, Location, PersonName): struct keeps one STRUCT column "
            "per field (BillingAddress.City), flattened makes one column per child "
            "(BillingAddress_City)."
        ),
    )
    max_rows_per_commit: int = field(
        default=1_000_000,
        metadata=meta(
            "Bronze rows decoded per silver commit: a larger backlog is processed in several "
            "commits, each recording the bronze version it reached (objects sharing a topic "
            "use the smallest of their values).",
            minimum=1000,
        ),
    )
    max_bytes_per_commit: Annotated[int, ByteSize] = field(
        default=512 * 1024**2,
        metadata=meta(
            "Bronze payload bytes decoded per silver commit, as landing recorded them: the "
            "bound that keeps wide objects' commits in memory (a byte count or a size such as "
            "'512MiB'; objects sharing a topic use the smallest).",
            minimum=1024**2,
        ),
    )


_COLUMN_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# The order of Salesforce's own replication guidance: commit time, then commit number, then
# the transaction and the change's place in it. Stream order is always added as the last
# tie-break.
DEFAULT_SEQUENCE_BY: tuple[str, ...] = (
    "_cdc_commit_timestamp",
    "_cdc_commit_number",
    "_cdc_transaction_key",
    "_cdc_sequence_number",
    "_cdc_bronze_batch_id",
    "_cdc_bronze_batch_seq",
)


@dataclass(frozen=True, kw_only=True)
class Scd2Spec:
    """SCD2 history of an object's gold table: one row per version of each record."""

    enabled: bool = field(
        default=False,
        metadata=meta("Keep a history table `<gold table>_history` with one row per version."),
    )
    track: tuple[str, ...] | Literal["all"] = field(
        default="all",
        metadata=meta(
            "Columns whose change starts a new version: a list of gold column names, or `all` "
            "(every body column).",
            pattern=_COLUMN_PATTERN,
        ),
    )


@dataclass(frozen=True, kw_only=True)
class GoldSpec:
    """How an object's gold table is folded and merged."""

    deletes: DeleteMode = field(
        default="soft",
        metadata=meta(
            "soft keeps a deleted record's row, with `_cdc_is_deleted` true and its values; "
            "hard removes the row and remembers the delete in `<gold table>_tombstones`."
        ),
    )
    sequence_by: tuple[str, ...] = field(
        default=DEFAULT_SEQUENCE_BY,
        metadata=meta(
            "Silver columns that order a record's changes; the bronze batch id and position "
            "are always added as the final tie-break. Changing it needs a rebuilt gold table.",
            pattern=_COLUMN_PATTERN,
        ),
    )
    scd2: Scd2Spec = field(default_factory=Scd2Spec, metadata=meta("SCD2 history table."))
    max_rows_per_commit: int = field(
        default=1_000_000,
        metadata=meta(
            "Silver rows folded per gold commit: a larger backlog is folded in several "
            "commits, each recording the silver version it reached, so a run's memory follows "
            "this value and not the backlog. A silver version is never split (a larger one is "
            "folded alone), so any value is safe; a small one only costs more commits.",
            minimum=1,
        ),
    )
    deletion_vectors: bool = field(
        default=False,
        metadata=meta(
            "Let a MERGE mark the gold (and SCD2 history) rows it replaces or removes as deleted "
            "(Delta deletion vectors) instead of rewriting the files that hold them, so a small "
            "batch into a large table writes little more than its own rows. The spark engine "
            "applies it (it upgrades the table's protocol to reader 3 / writer 7, which "
            "readers such as delta-rs cannot read); the local engine's writer cannot, and "
            "rewrites the files a MERGE touches."
        ),
    )


@dataclass(frozen=True, kw_only=True)
class HealthSpec:
    """When `sfcdc status` calls an object WARN or FAIL (`sfcdc status --check` fails on FAIL).

    Lag is how far behind Salesforce the object's last table is: now minus the newest commit
    timestamp it has applied, or minus the last moment the stream showed nothing pending."""

    lag_warn_seconds: float = field(
        default=1800.0,
        metadata=meta("WARN when the object is this many seconds behind.", exclusive_minimum=0),
    )
    lag_fail_seconds: float = field(
        default=7200.0,
        metadata=meta(
            "FAIL when the object is this many seconds behind (at least lag_warn_seconds).",
            exclusive_minimum=0,
        ),
    )
    quarantine_warn_rows: int = field(
        default=1,
        metadata=meta(
            "WARN when the object's topic has this many quarantined rows (0: never).", minimum=0
        ),
    )
    resync_warn_records: int = field(
        default=1,
        metadata=meta(
            "WARN when this many records (or any whole-object re-sync) wait for `sfcdc resync` "
            "(0: never).",
            minimum=0,
        ),
    )

    def _problems(self) -> list[tuple[str, str]]:
        if self.lag_fail_seconds >= self.lag_warn_seconds:
            return []
        return [
            (
                "lag_fail_seconds",
                f"must be at least lag_warn_seconds ({self.lag_warn_seconds:g}) "
                f"(got {self.lag_fail_seconds:g})",
            )
        ]


@dataclass(frozen=True, kw_only=True)
class DefaultsSpec:
    """Settings applied to every object unless its own file overrides them."""

    replay: ReplaySpec = field(
        default_factory=ReplaySpec, metadata=meta("Replay start and recovery.")
    )
    batching: BatchingSpec = field(default_factory=BatchingSpec, metadata=meta("Bronze batching."))
    silver: SilverSpec = field(default_factory=SilverSpec, metadata=meta("Silver table shape."))
    gold: GoldSpec = field(default_factory=GoldSpec, metadata=meta("Gold fold and MERGE."))
    health: HealthSpec = field(
        default_factory=HealthSpec, metadata=meta("Lag and health thresholds of `sfcdc status`.")
    )


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
            "bronze schema's sfcdc_commits table, which `sfcdc status` and the dashboard read."
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
class StreamingApiSpec:
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
    streaming_api: StreamingApiSpec = field(
        default_factory=StreamingApiSpec,
        metadata=meta("The Streaming API source (object files of kind streaming_api)."),
    )
    maintenance: MaintenanceSpec = field(
        default_factory=MaintenanceSpec,
        metadata=meta("Compaction, log cleanup and VACUUM (`sfcdc maintain`)."),
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
            "change_events for Change Data Capture of an object, platform_event for an event."
        )
    )
    topic: str = field(
        default=_DERIVED,
        metadata=meta(
            "Pub/Sub topic (or channel shared with other objects, such as /data/ChangeEvents).",
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


@dataclass(frozen=True)
class Conf:
    """A loaded ``conf/`` directory: the pipeline and its objects, defaults applied."""

    pipeline: PipelineSpec
    objects: tuple[ObjectSpec, ...]
    conf_dir: Path
    object_files: Mapping[str, Path] = field(default_factory=dict)
    # Object files of kind streaming_api: Streaming API channels (pipelines.spec_streaming).
    streams: tuple[StreamingObjectSpec, ...] = ()

    def object(self, api_name: str) -> ObjectSpec:
        """The object called ``api_name`` (case-sensitive, as in Salesforce)."""
        for obj in self.objects:
            if obj.api_name == api_name:
                return obj
        known = ", ".join(o.api_name for o in self.objects)
        raise KeyError(f"no object {api_name!r} in {self.conf_dir} (configured: {known})")

    def enabled_objects(self) -> tuple[ObjectSpec, ...]:
        return tuple(o for o in self.objects if o.enabled)

    def enabled_streams(self) -> tuple[StreamingObjectSpec, ...]:
        """The Streaming API channels to land (object files of kind streaming_api)."""
        return tuple(s for s in self.streams if s.enabled)

    def objects_by_topic(
        self, *, include_disabled: bool = False
    ) -> Mapping[str, tuple[ObjectSpec, ...]]:
        """Objects grouped by topic, topics in name order. Objects sharing a topic share its
        subscription and its bronze table."""
        groups: dict[str, list[ObjectSpec]] = {}
        for obj in self.objects:
            if obj.enabled or include_disabled:
                groups.setdefault(obj.topic, []).append(obj)
        return {topic: tuple(groups[topic]) for topic in sorted(groups)}

    def topics(self, *, include_disabled: bool = False) -> tuple[TopicSpec, ...]:
        """One :class:`TopicSpec` per subscription (load_conf guarantees the objects of a
        topic agree on bronze table, replay and batching)."""
        specs = []
        for topic, objs in self.objects_by_topic(include_disabled=include_disabled).items():
            first = objs[0]
            specs.append(
                TopicSpec(
                    topic=topic,
                    kind=parse_topic(topic).kind,
                    bronze_table=first.tables.bronze,
                    replay=first.replay,
                    batching=first.batching,
                    objects=objs,
                    managed_subscription=first.managed_subscription,
                    num_requested=first.num_requested,
                )
            )
        return tuple(specs)


# ------------------------------------------------------------------------ names and topics


def parse_replay_id(text: str) -> ReplayId:
    """A replay id written in YAML: ``hex:<digits>``, ``base64:<text>``, or bare text (hex
    when it is an even number of hex digits, base64 otherwise)."""
    value = text.strip()
    form, sep, rest = value.partition(":")
    if sep and form.lower() in ("hex", "base64"):
        value = rest.strip()
    else:
        form = "hex" if _HEX_RE.fullmatch(value) and len(value) % 2 == 0 else "base64"
    try:
        if form.lower() == "hex":
            return ReplayId.from_hex(value)
        return ReplayId.from_base64(value)
    except ValueError as exc:  # binascii.Error is a ValueError
        raise ValueError(
            f"must be a replay id in base64 (as Salesforce shows it, e.g. 'AAAAAAAABnc=') or "
            f"hex (e.g. '0000000000000677'), not empty (got {text!r})"
        ) from exc


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
    """The topic Salesforce uses for an object's change events or for a platform event."""
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
    """Derived table names: bronze from the topic (one table per topic), silver and gold from
    the object (``Invoice__c`` -> ``invoice``)."""
    return TablesSpec(
        bronze=snake_case(topic.rsplit("/", 1)[-1]),
        silver=_object_table(api_name),
        gold=_object_table(api_name),
    )


# ---------------------------------------------------------------------------- YAML reading


class _AliasRefused(yaml.MarkedYAMLError):
    """An alias (``*name``) in a configuration file or a ``--set`` value."""


# Aliases are refused outright rather than counted: nine lines of nested aliases ("billion
# laughs") expand to 9**9 values, and every later walk of the data (duplicate keys, validation,
# messages) would pay for each. The files do not need them: what objects share goes under
# `defaults` in pipeline.yml.
_ALIAS_FIX = (
    "aliases are not supported in configuration files (they can expand a small file into "
    "billions of values); write the value out, or put what objects share under defaults in "
    "pipeline.yml"
)


class _Loader(yaml.SafeLoader):
    """Safe loader that refuses aliases while composing (before anything is expanded);
    duplicate keys are found on the node tree before construction."""

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise _AliasRefused(
                problem=f"YAML alias *{event.anchor}", problem_mark=event.start_mark
            )
        return super().compose_node(parent, index)


def _duplicate_keys(node: yaml.Node, path: str, found: list[tuple[str, str]]) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, str] = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = key_node.value
                mark = key_node.start_mark
                where = f"line {mark.line + 1}, column {mark.column + 1}"
                sub = join(path, str(key))
                if key in seen:
                    found.append(
                        (
                            sub,
                            f"duplicate key (first at {seen[key]}, again at {where}); "
                            "YAML would silently keep the last one",
                        )
                    )
                else:
                    seen[key] = where
                _duplicate_keys(value_node, sub, found)
            else:
                _duplicate_keys(value_node, path, found)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _duplicate_keys(item, f"{path}[{i}]", found)


_EMPTY = object()


def _read_yaml(path: Path, ctx: Problems) -> Any:
    """The document in ``path``; problems (syntax, duplicates) go to ``ctx``. Returns
    ``_EMPTY`` for a file without content and ``INVALID`` when it cannot be used."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        ctx.add("", f"cannot be read ({exc.strerror or exc})")
        return INVALID
    except UnicodeDecodeError as exc:
        ctx.add("", f"is not UTF-8 text ({exc.reason} at byte {exc.start})")
        return INVALID
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return _EMPTY
        duplicates: list[tuple[str, str]] = []
        _duplicate_keys(node, "", duplicates)
        for key_path, message in duplicates:
            ctx.add(key_path, message)
        data = loader.construct_document(node)
    except _AliasRefused as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        ctx.add("", f"{where}{exc.problem}: {_ALIAS_FIX}")
        return INVALID
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        what = " ".join(p for p in (exc.context, exc.problem) if p)
        ctx.add("", f"{where}invalid YAML: {what}")
        return INVALID
    except yaml.YAMLError as exc:
        ctx.add("", f"invalid YAML: {exc}")
        return INVALID
    finally:
        loader.dispose()
    return data


# ------------------------------------------------------------------- cross-field checks


def _check_object(obj: ObjectSpec, lake: LakeSpec, ctx: Problems) -> None:
    name, kind = obj.api_name, obj.kind
    if kind == "platform_event" and name.endswith("__c"):
        ctx.add(
            "kind", f"{name} is a custom object (__c); its kind is change_events (got {kind!r})"
        )
    if kind == "change_events" and name.endswith("__e"):
        ctx.add(
            "kind", f"{name} is a platform event (__e); its kind is platform_event (got {kind!r})"
        )
    try:
        info = parse_topic(obj.topic)
    except ValueError as exc:
        ctx.add("topic", str(exc))
        return
    expects = ("change_events", "change_event_channel")
    if kind == "platform_event":
        expects = ("platform_event", "platform_event_channel")
    if info.kind not in expects:
        ctx.add(
            "topic",
            f"a {kind} object needs a "
            + ("/data/... topic" if kind == "change_events" else "/event/... topic")
            + f" (got {obj.topic!r}, a {info.kind.replace('_', ' ')} topic)",
        )
    elif info.entity is not None and info.entity != name:
        ctx.add(
            "topic",
            f"{obj.topic!r} carries {info.entity}, not {name}; use "
            f"{default_topic(name, kind)!r} or a channel shared by several objects",
        )
    for layer in _LAYERS:
        physical = lake.table_name(obj.tables.for_layer(layer))
        if len(physical) > _IDENTIFIER_MAX:
            ctx.add(
                f"tables.{layer}",
                f"with lake.table_prefix the name must be at most {_IDENTIFIER_MAX} characters "
                f"(got {len(physical)})",
            )


def _check_objects(objs: list[tuple[ObjectSpec, Problems]], lake: LakeSpec) -> None:
    by_name: dict[str, Problems] = {}
    for obj, ctx in objs:
        if obj.api_name in by_name:
            ctx.add(
                "object", f"{obj.api_name} is already configured in {by_name[obj.api_name].file}"
            )
        else:
            by_name[obj.api_name] = ctx

    # One subscription and one bronze table per topic: the objects on it must agree.
    first_on_topic: dict[str, tuple[ObjectSpec, Problems]] = {}
    for obj, ctx in objs:
        if obj.topic not in first_on_topic:
            first_on_topic[obj.topic] = (obj, ctx)
            continue
        other, other_ctx = first_on_topic[obj.topic]
        for key in ("tables.bronze", "replay", "batching", "managed_subscription", "num_requested"):
            mine = obj.tables.bronze if key == "tables.bronze" else getattr(obj, key)
            theirs = other.tables.bronze if key == "tables.bronze" else getattr(other, key)
            if mine != theirs:
                ctx.add(
                    key,
                    f"objects sharing topic {obj.topic} share one subscription and bronze table, "
                    f"so {key} must equal that of {other.api_name} ({other_ctx.file})",
                )

    # A managed subscription belongs to one topic: two topics cannot take turns on it.
    managed_by: dict[str, tuple[str, str]] = {}
    for obj, ctx in objs:
        name = obj.managed_subscription
        if name is None:
            continue
        topic, file = managed_by.setdefault(name, (obj.topic, ctx.file))
        if topic != obj.topic:
            ctx.add(
                "managed_subscription",
                f"{name} already serves topic {topic} ({file}); a managed subscription "
                f"follows one topic, so {obj.topic} needs its own",
            )

    # Physical names: (schema, table) must be unique, across layers when schemas coincide.
    owners: dict[tuple[str, str], tuple[str, str, str]] = {}
    for obj, ctx in objs:
        for layer in _LAYERS:
            schema = lake.schemas.for_layer(layer)
            table = lake.table_name(obj.tables.for_layer(layer))
            owner = f"topic {obj.topic}" if layer == "bronze" else obj.api_name
            previous = owners.setdefault((schema, table), (layer, owner, ctx.file))
            if previous == (layer, owner, ctx.file) or previous[:2] == ("bronze", owner):
                continue
            if previous[0] == layer == "bronze":
                message = (
                    f"table {schema}.{table} already lands {previous[1]} ({previous[2]}); "
                    "each topic needs its own bronze table"
                )
            else:
                message = (
                    f"table {schema}.{table} is already the {previous[0]} table of "
                    f"{previous[1]} ({previous[2]}); give one of them another name"
                )
            ctx.add(f"tables.{layer}", message)


# ------------------------------------------------------------------------------- loading


def _display(path: Path, conf_dir: Path) -> str:
    try:
        return str(Path(conf_dir.name) / path.relative_to(conf_dir))
    except ValueError:
        return str(path)


def parse_override(text: str) -> tuple[str, Any]:
    """``lake.catalog=main`` as ``("lake.catalog", "main")``: a ``pipeline.yml`` key path and a
    value read as YAML (``50`` is a number, ``null`` is null, ``'{env: NAME}'`` a mapping).

    Jobs pass what differs between deployments (catalog, schemas, engine, source) this way,
    so ``conf/`` stays the same in every environment."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not sep or not key or not all(_OVERRIDE_KEY_RE.fullmatch(p) for p in parts):
        shown = key if sep else text
        raise ConfigError(
            f"--set expects KEY=VALUE with a dotted pipeline.yml key such as "
            f"lake.catalog=main (got {shown!r}{'' if sep else ' without ='})"
        )
    loader = _Loader(raw)
    try:
        value = loader.get_single_data() if raw.strip() else ""
    except _AliasRefused:
        raise ConfigError(f"--set {key}: YAML aliases are not supported in values") from None
    except yaml.YAMLError:
        # The value is not echoed: it may be meant for a secret key.
        raise ConfigError(f"--set {key}: the value is not valid YAML") from None
    finally:
        loader.dispose()
    return key, value


_OVERRIDE_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _apply_overrides(data: Any, overrides: Sequence[tuple[str, Any]], ctx: Problems) -> Any:
    if not overrides:
        return data
    if not isinstance(data, dict):
        # The file itself is not a mapping; parse_model reports that.
        return data
    merged = copy.deepcopy(data)
    for key, value in overrides:
        node = merged
        parts = key.split(".")
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(parts[: depth + 1])
                ctx.add(key, f"--set cannot set a key inside {where}, which is not a mapping")
                break
            node = child
        else:
            node[parts[-1]] = value
    return merged


def _load_pipeline(
    path: Path, ctx: Problems, overrides: Sequence[tuple[str, Any]] = ()
) -> PipelineSpec | None:
    data = _read_yaml(path, ctx)
    if data is INVALID:
        return None
    data = _apply_overrides({} if data is _EMPTY else data, overrides, ctx)
    spec = parse_model(PipelineSpec, data, "", ctx)
    if spec is INVALID:
        return None
    return spec  # type: ignore[no-any-return]


def _load_object(
    path: Path, defaults: DefaultsSpec, lake: LakeSpec, ctx: Problems
) -> ObjectSpec | StreamingObjectSpec | None:
    data = _read_yaml(path, ctx)
    if data is INVALID:
        return None
    if data is _EMPTY:
        ctx.add("", "is empty; an object file needs at least 'object' and 'kind'")
        return None
    if isinstance(data, dict) and data.get("kind") == "streaming_api":
        return _load_stream(data, defaults, ctx)
    # Sections the file leaves out, and keys a section leaves out, come from the defaults.
    inherited = {
        "replay": defaults.replay,
        "batching": defaults.batching,
        "silver": defaults.silver,
        "gold": defaults.gold,
        "health": defaults.health,
    }
    spec = parse_model(ObjectSpec, data, "", ctx, inherited)
    if spec is INVALID:
        return None
    _check_object(spec, lake, ctx)
    return spec  # type: ignore[no-any-return]


def _load_stream(data: Any, defaults: DefaultsSpec, ctx: Problems) -> StreamingObjectSpec | None:
    from pipelines.spec_streaming import StreamingGoldSpec, StreamingObjectSpec

    inherited = {
        "replay": defaults.replay,
        "batching": defaults.batching,
        "silver": defaults.silver,
        # The order of a channel's changes is the channel's own (see StreamingGoldSpec).
        "gold": StreamingGoldSpec(
            deletes=defaults.gold.deletes,
            scd2=defaults.gold.scd2,
            max_rows_per_commit=defaults.gold.max_rows_per_commit,
        ),
    }
    spec = parse_model(StreamingObjectSpec, data, "", ctx, inherited)
    return None if spec is INVALID else spec


def load_pipeline(path: Path) -> PipelineSpec:
    """Read one ``pipeline.yml`` (relative paths resolved against its directory's parent)."""
    ctx = Problems(str(path))
    spec = _load_pipeline(path, ctx)
    if ctx.problems or spec is None:
        raise ConfigError(f"{path} is invalid", ctx.problems)
    resolved: PipelineSpec = resolve_paths(spec, path.resolve().parent.parent)
    return resolved


def pipeline_from_overrides(
    overrides: Sequence[tuple[str, Any]], *, base: Path, shown: str
) -> PipelineSpec:
    """A ``pipeline.yml`` made only of ``overrides`` (key path, value) pairs, as
    :func:`parse_override` reads them, over the defaults; relative paths are resolved against
    ``base``. ``shown`` names where the keys came from in messages. For callers that receive
    the settings as flat key/value options instead of a file (the Spark data source)."""
    ctx = Problems(shown)
    data = _apply_overrides({}, overrides, ctx)
    spec = parse_model(PipelineSpec, data, "", ctx)
    if ctx.problems or spec is INVALID:
        raise ConfigError(f"{shown} are invalid", ctx.problems)
    resolved: PipelineSpec = resolve_paths(spec, base)
    return resolved


def load_object(
    path: Path, *, defaults: DefaultsSpec | None = None, lake: LakeSpec | None = None
) -> ObjectSpec:
    """Read one object file, applying ``defaults`` (the built-in ones when omitted)."""
    ctx = Problems(str(path))
    spec = _load_object(path, defaults or DefaultsSpec(), lake or LakeSpec(), ctx)
    if ctx.problems or spec is None:
        raise ConfigError(f"{path} is invalid", ctx.problems)
    if not isinstance(spec, ObjectSpec):
        raise ConfigError(
            f"{path} is a Streaming API object file (kind: streaming_api); load it with the "
            "rest of its conf/ directory (load_conf), which keeps it in Conf.streams"
        )
    return spec


def _object_files(objects_dir: Path) -> list[Path]:
    files = [p for p in objects_dir.iterdir() if p.suffix in (".yml", ".yaml") and p.is_file()]
    return sorted(p for p in files if not p.name.startswith((".", "_")))


def load_conf(conf_dir: Path, *, overrides: Sequence[tuple[str, Any]] = ()) -> Conf:
    """Load ``conf_dir/pipeline.yml`` and every ``conf_dir/objects/*.yml``.

    Defaults are applied and derived names filled in; relative paths (lake location, CA
    files, emulator state) are resolved against ``conf_dir``'s parent. ``overrides`` (key
    path, value) pairs from :func:`parse_override` replace keys of ``pipeline.yml`` before it
    is validated, so they are checked like the file's own keys. Raises one
    :class:`ConfigError` listing every problem in every file.
    """
    conf_dir = Path(conf_dir)
    problems: list[str] = []
    pipeline_path = conf_dir / "pipeline.yml"
    if not conf_dir.is_dir():
        raise ConfigError(f"configuration directory {conf_dir} does not exist")
    if not pipeline_path.is_file():
        raise ConfigError(
            f"{pipeline_path} is missing: every deployment needs a pipeline.yml "
            "(connection, lake, defaults, ingest)"
        )
    shown = _display(pipeline_path, conf_dir)
    if overrides:
        shown += f" (with --set {', '.join(key for key, _ in overrides)})"
    pipe_ctx = Problems(shown)
    pipeline = _load_pipeline(pipeline_path, pipe_ctx, overrides)
    if pipeline is not None:
        pipeline = resolve_paths(pipeline, conf_dir.resolve().parent)
    problems.extend(pipe_ctx.problems)
    defaults = pipeline.defaults if pipeline else DefaultsSpec()
    lake = pipeline.lake if pipeline else LakeSpec()

    objects_dir = conf_dir / "objects"
    files = _object_files(objects_dir) if objects_dir.is_dir() else []
    if not files:
        problems.append(
            f"{_display(objects_dir, conf_dir)}: no object files (*.yml); add one per "
            "Salesforce object or platform event"
        )
    loaded: list[tuple[ObjectSpec, Problems]] = []
    streams: list[tuple[StreamingObjectSpec, Problems]] = []
    contexts: list[Problems] = []
    object_files: dict[str, Path] = {}
    for path in files:
        ctx = Problems(_display(path, conf_dir))
        contexts.append(ctx)
        obj = _load_object(path, defaults, lake, ctx)
        if isinstance(obj, ObjectSpec):
            loaded.append((obj, ctx))
            object_files.setdefault(obj.api_name, path)
        elif obj is not None:
            streams.append((obj, ctx))
            object_files.setdefault(obj.key, path)
    _check_objects(loaded, lake)
    if streams:
        from pipelines.spec_streaming import check_streams

        check_streams(streams, loaded, lake)
    for ctx in contexts:
        problems.extend(ctx.problems)
    if problems or pipeline is None:
        count = len(problems)
        raise ConfigError(
            f"{conf_dir}: {count} configuration problem{'s' if count != 1 else ''}", problems
        )
    objects = tuple(sorted((obj for obj, _ in loaded), key=lambda o: o.api_name))
    channels = tuple(sorted((spec for spec, _ in streams), key=lambda s: s.channel))
    return Conf(
        pipeline=pipeline,
        objects=objects,
        conf_dir=conf_dir,
        object_files=object_files,
        streams=channels,
    )
