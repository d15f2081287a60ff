"""The tables bronze landing writes: one per topic, the checkpoints and the schema registry.

Bronze table (one per topic; objects sharing a topic such as ``/data/ChangeEvents`` share it):

==============  ==========  =========================================================
column          type        meaning
==============  ==========  =========================================================
``replay_id``   binary      the event's replay id, opaque bytes exactly as received
``event_id``    string      the event's id (a UUID)
``schema_id``   string      id of the Avro schema the payload was written with
``payload``     binary      the Avro payload, untouched (nothing is decoded in bronze)
``topic``       string      the topic it was received on
``received_at`` timestamp   when the client received the server response holding it
``batch_id``    bigint      landing batch of the topic: increasing, with gaps where a batch
                            only moved the checkpoint (keepalive, replay gap)
``batch_seq``   int         position in the batch: ``(batch_id, batch_seq)`` is stream order
==============  ==========  =========================================================

Checkpoint table ``sfcdc_checkpoints``: one row per landing commit of any topic (see
:mod:`pipelines.bronze.checkpoint`), and schema registry ``sfcdc_schemas``: schema id to
schema JSON, written before the first events that use the id, so silver never calls
Salesforce. ``sfcdc_schema_failures``: schema ids GetSchema refused (the events landed all the
same; silver quarantines them with the server's error until ``sfcdc silver
--retry-quarantine`` fetches the schema). ``sfcdc_topic_failures``: topics whose subscription
failed for good (the other topics went on), which ``sfcdc status`` shows as FAIL until the topic
lands again. All live in the bronze schema next to the topic tables, as does
``sfcdc_commits``, the record of every layer's commits (:mod:`pipelines.ops.table`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import pyarrow as pa

from ingest.errors import ConfigError
from pipelines.engines.arrow import arrow_schema_to_spark
from pipelines.engines.base import TableRef, WriteLayout
from pipelines.ops.table import COMMITS_TABLE
from pipelines.spec.models import TopicSpec

if TYPE_CHECKING:
    from pipelines.engines.base import LakeEngine

__all__ = [
    "BRONZE_LAYOUT",
    "BRONZE_SCHEMA",
    "CHECKPOINT_SCHEMA",
    "CHECKPOINT_TABLE",
    "COMMITS_TABLE",
    "LEASE_TABLE",
    "RESERVED_TABLES",
    "SCHEMA_FAILURES_SCHEMA",
    "SCHEMA_FAILURES_TABLE",
    "SCHEMA_REGISTRY_SCHEMA",
    "SCHEMA_REGISTRY_TABLE",
    "TOPIC_FAILURES_SCHEMA",
    "TOPIC_FAILURES_TABLE",
    "BronzeTables",
    "CheckpointKind",
    "bronze_app_id",
    "bronze_tables",
    "checkpoint_app_id",
    "ensure_tables",
]

CHECKPOINT_TABLE = "sfcdc_checkpoints"
SCHEMA_REGISTRY_TABLE = "sfcdc_schemas"
SCHEMA_FAILURES_TABLE = "sfcdc_schema_failures"
TOPIC_FAILURES_TABLE = "sfcdc_topic_failures"
LEASE_TABLE = "sfcdc_leases"
RESERVED_TABLES = frozenset(
    {
        CHECKPOINT_TABLE,
        SCHEMA_REGISTRY_TABLE,
        SCHEMA_FAILURES_TABLE,
        TOPIC_FAILURES_TABLE,
        LEASE_TABLE,
        COMMITS_TABLE,
    }
)

CheckpointKind = Literal["events", "keepalive", "replay_gap"]

_TIMESTAMP = pa.timestamp("us", tz="UTC")

BRONZE_SCHEMA = pa.schema(
    [
        pa.field("replay_id", pa.binary(), nullable=False),
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("schema_id", pa.string(), nullable=False),
        pa.field("payload", pa.binary(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("received_at", _TIMESTAMP, nullable=False),
        pa.field("batch_id", pa.int64(), nullable=False),
        pa.field("batch_seq", pa.int32(), nullable=False),
    ]
)

# Ids and payloads are unique per event, so dictionaries would be built only to be dropped;
# readers filter on batch ids, positions and receive times only; Avro payloads of change
# events compress poorly, and compressing them costs more CPU per event than writing them as
# they are. Only the schema id and topic (a handful of values per batch) are dictionary-encoded
# and compressed. A batch is one row group: the local engine's writer encodes straight from the
# batch's columns, one column at a time (see pipelines.engines.deltalog).
BRONZE_LAYOUT = WriteLayout(
    distinct=("replay_id", "event_id", "payload", "received_at", "batch_id", "batch_seq"),
    unindexed=("replay_id", "event_id", "payload", "schema_id", "topic"),
    uncompressed=("replay_id", "event_id", "payload", "received_at", "batch_id", "batch_seq"),
)

CHECKPOINT_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("batch_id", pa.int64(), nullable=False),
        # events | keepalive | replay_gap
        pa.field("kind", pa.string(), nullable=False),
        # The position to resume after: the batch's last event, or a keepalive's
        # latest_replay_id. Null for a replay gap, which resumes at gap_resumed instead.
        pa.field("replay_id", pa.binary(), nullable=True),
        pa.field("event_count", pa.int64(), nullable=False),
        pa.field("payload_bytes", pa.int64(), nullable=False),
        # The bronze table version holding the batch (null without events or when unknown).
        pa.field("bronze_version", pa.int64(), nullable=True),
        pa.field("committed_at", _TIMESTAMP, nullable=False),
        # A replay gap: the stored position the server rejected ("after:<hex>"), the position
        # the corrupted-replay policy resumed at ("earliest" | "latest").
        pa.field("gap_requested", pa.string(), nullable=True),
        pa.field("gap_resumed", pa.string(), nullable=True),
        # Why: the gap's reason, or how a checkpoint was recovered after a crash.
        pa.field("detail", pa.string(), nullable=True),
        # ManagedSubscribe only: the last batch whose replay id the server had acknowledged
        # committing when this row was written (server commits follow the Delta commits).
        pa.field("server_acked_batch_id", pa.int64(), nullable=True),
    ]
)

SCHEMA_REGISTRY_SCHEMA = pa.schema(
    [
        pa.field("schema_id", pa.string(), nullable=False),
        pa.field("schema_json", pa.string(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("first_seen_at", _TIMESTAMP, nullable=False),
    ]
)

# A GetSchema call that failed for good: the schema id, the topic whose events use it, and the
# server's answer (gRPC status, Salesforce error-code trailer, description).
SCHEMA_FAILURES_SCHEMA = pa.schema(
    [
        pa.field("schema_id", pa.string(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("error_code", pa.string(), nullable=True),
        pa.field("error", pa.string(), nullable=False),
        pa.field("failed_at", _TIMESTAMP, nullable=False),
    ]
)

# A topic whose subscription failed for good: the objects it carries and the server's answer.
TOPIC_FAILURES_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("objects", pa.string(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("error_code", pa.string(), nullable=True),
        pa.field("error", pa.string(), nullable=False),
        pa.field("failed_at", _TIMESTAMP, nullable=False),
    ]
)

_SCHEMA_FAILURES = TableRef("bronze", SCHEMA_FAILURES_TABLE)
_TOPIC_FAILURES = TableRef("bronze", TOPIC_FAILURES_TABLE)


def bronze_app_id(topic: str) -> str:
    """The Delta application-transaction id of a topic's bronze appends."""
    return f"sfcdc.bronze:{topic}"


def checkpoint_app_id(topic: str) -> str:
    """The Delta application-transaction id of a topic's checkpoint rows."""
    return f"sfcdc.checkpoint:{topic}"


@dataclass(frozen=True)
class BronzeTables:
    """The tables of one landing: a bronze table per topic, the checkpoints, the registry."""

    topics: Mapping[str, TableRef]
    checkpoints: TableRef
    schemas: TableRef
    schema_failures: TableRef = _SCHEMA_FAILURES
    topic_failures: TableRef = _TOPIC_FAILURES

    def bronze(self, topic: str) -> TableRef:
        """The bronze table of ``topic``."""
        try:
            return self.topics[topic]
        except KeyError:
            raise KeyError(
                f"topic {topic} is not landed here (topics: {', '.join(sorted(self.topics))})"
            ) from None


def bronze_tables(topics: Sequence[TopicSpec]) -> BronzeTables:
    """The tables for ``topics``; a topic whose bronze table takes a reserved name, or two
    topics sharing one table, is a :class:`~ingest.errors.ConfigError`."""
    problems = []
    owners: dict[str, str] = {}
    for spec in topics:
        if spec.bronze_table in RESERVED_TABLES:
            problems.append(
                f"{spec.topic}: bronze table {spec.bronze_table!r} is reserved for sfcdc's own "
                f"bookkeeping ({', '.join(sorted(RESERVED_TABLES))}); set tables.bronze to "
                "another name"
            )
        owner = owners.setdefault(spec.bronze_table, spec.topic)
        if owner != spec.topic:
            problems.append(
                f"{spec.topic}: bronze table {spec.bronze_table!r} already lands {owner}; each "
                "topic needs its own"
            )
    if problems:
        raise ConfigError("bronze tables cannot be laid out", problems)
    return BronzeTables(
        topics={spec.topic: TableRef("bronze", spec.bronze_table) for spec in topics},
        checkpoints=TableRef("bronze", CHECKPOINT_TABLE),
        schemas=TableRef("bronze", SCHEMA_REGISTRY_TABLE),
    )


def ensure_tables(engine: LakeEngine, tables: BronzeTables) -> None:
    """Create every table that is missing (an existing one gains the columns it lacks)."""
    for table in tables.topics.values():
        engine.ensure_table(table, arrow_schema_to_spark(BRONZE_SCHEMA))
    engine.ensure_table(tables.checkpoints, arrow_schema_to_spark(CHECKPOINT_SCHEMA))
    engine.ensure_table(tables.schemas, arrow_schema_to_spark(SCHEMA_REGISTRY_SCHEMA))
