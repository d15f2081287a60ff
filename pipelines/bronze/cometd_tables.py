"""The tables the Streaming API landing writes: one bronze table per channel, the describe
registry, and its rows in the shared checkpoint table.

Bronze table of a channel (``bronze.streaming_<channel>`` by default):

================  ==========  ================================================================
column            type        meaning
================  ==========  ================================================================
``replay_id``     bigint      ``data.event.replayId`` (integers increasing per channel; null
                              for a malformed message that has none)
``channel``       string      the channel it came on (null for a body that names none)
``event_type``    string      a PushTopic's ``created`` / ``updated`` / ``deleted`` /
                              ``undeleted`` (null on other channels)
``created_date``  string      ``data.event.createdDate`` as sent (PushTopic and generic)
``event_uuid``    string      a platform event's ``EventUuid``, when sent
``raw``           string      the message's JSON text, byte for byte as received
``malformed``     string      why the message is not a usable notification (null when it is):
                              silver quarantines these rows
``received_at``   timestamp   when the connect reply holding it was received
``batch_id``      bigint      landing batch of the channel
``batch_seq``     int         position in the batch: ``(batch_id, batch_seq)`` is stream order
================  ==========  ================================================================

Checkpoints are rows of the same ``bronze.sfcdc_checkpoints`` table the Pub/Sub landing
writes, under the key ``streaming:<channel>`` (see
:attr:`~pipelines.spec.cometd.CometdObjectSpec.key`), with the replay id stored as its
decimal digits (``b"1042"``), so ``CAST(replay_id AS STRING)`` reads it back.

The describe registry ``bronze.sfcdc_describes`` keeps, per channel, the object's describe
and the PushTopic query the landing found when it started (a row whenever either changed), so
silver types the fields without calling Salesforce.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from ingest.errors import ConfigError
from pipelines.bronze.tables import (
    CHECKPOINT_SCHEMA,
    CHECKPOINT_TABLE,
    SCHEMA_REGISTRY_TABLE,
    BronzeTables,
)
from pipelines.engines.arrow import arrow_schema_to_spark
from pipelines.engines.base import TableRef, WriteLayout

if TYPE_CHECKING:
    from pipelines.engines.base import LakeEngine
    from pipelines.spec.cometd import CometdObjectSpec

__all__ = [
    "COMETD_BRONZE_LAYOUT",
    "COMETD_BRONZE_SCHEMA",
    "DESCRIBES_SCHEMA",
    "DESCRIBES_TABLE",
    "CometdTables",
    "cometd_tables",
    "ensure_cometd_tables",
    "replay_bytes",
    "replay_number",
]

DESCRIBES_TABLE = "sfcdc_describes"

_TIMESTAMP = pa.timestamp("us", tz="UTC")

COMETD_BRONZE_SCHEMA = pa.schema(
    [
        pa.field("replay_id", pa.int64(), nullable=True),
        pa.field("channel", pa.string(), nullable=True),
        pa.field("event_type", pa.string(), nullable=True),
        pa.field("created_date", pa.string(), nullable=True),
        pa.field("event_uuid", pa.string(), nullable=True),
        pa.field("raw", pa.string(), nullable=False),
        pa.field("malformed", pa.string(), nullable=True),
        pa.field("received_at", _TIMESTAMP, nullable=False),
        pa.field("batch_id", pa.int64(), nullable=False),
        pa.field("batch_seq", pa.int32(), nullable=False),
    ]
)

# Raw messages are unique and only read whole; readers filter on batch ids and replay ids.
COMETD_BRONZE_LAYOUT = WriteLayout(
    distinct=("replay_id", "created_date", "event_uuid", "raw", "batch_seq"),
    unindexed=("raw", "malformed", "event_uuid", "created_date"),
)

DESCRIBES_SCHEMA = pa.schema(
    [
        # streaming:<channel>
        pa.field("stream", pa.string(), nullable=False),
        pa.field("object", pa.string(), nullable=True),
        # The describe answer (JSON), null for a generic channel.
        pa.field("describe_json", pa.string(), nullable=True),
        # The PushTopic's query as the org holds it (null on other channels).
        pa.field("query", pa.string(), nullable=True),
        # SHA-256 of describe and query: a new row is written only when it changes.
        pa.field("fingerprint", pa.string(), nullable=False),
        pa.field("fetched_at", _TIMESTAMP, nullable=False),
    ]
)


def replay_bytes(replay_id: int) -> bytes:
    """A Streaming API replay id as stored in the shared binary ``replay_id`` columns
    (checkpoints, quarantine, silver): its decimal digits."""
    return str(int(replay_id)).encode("ascii")


def replay_number(value: bytes) -> int:
    """Inverse of :func:`replay_bytes`."""
    try:
        return int(value.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError(
            f"expected a Streaming API replay id stored as decimal digits (got {value!r})"
        ) from None


@dataclass(frozen=True)
class CometdTables:
    """The tables of a Streaming API landing: one bronze table per stream key, the shared
    checkpoint table and the describe registry."""

    streams: dict[str, TableRef]
    checkpoints: TableRef
    describes: TableRef

    def bronze(self, key: str) -> TableRef:
        try:
            return self.streams[key]
        except KeyError:
            raise KeyError(
                f"{key} is not landed here (channels: {', '.join(sorted(self.streams))})"
            ) from None

    def as_bronze_tables(self) -> BronzeTables:
        """The same tables as :class:`~pipelines.bronze.tables.BronzeTables`, for the
        checkpoint store (whose rows both landings share)."""
        return BronzeTables(
            topics=self.streams,
            checkpoints=self.checkpoints,
            schemas=TableRef("bronze", SCHEMA_REGISTRY_TABLE),
        )


def cometd_tables(streams: Sequence[CometdObjectSpec]) -> CometdTables:
    """The tables of ``streams``; two channels on one bronze table is a
    :class:`~ingest.errors.ConfigError` (load_conf refuses it already)."""
    owners: dict[str, str] = {}
    problems = []
    for spec in streams:
        owner = owners.setdefault(spec.tables.bronze, spec.channel)
        if owner != spec.channel:
            problems.append(
                f"{spec.channel}: bronze table {spec.tables.bronze!r} already lands {owner}"
            )
    if problems:
        raise ConfigError("Streaming API bronze tables cannot be laid out", problems)
    return CometdTables(
        streams={spec.key: TableRef("bronze", spec.tables.bronze) for spec in streams},
        checkpoints=TableRef("bronze", CHECKPOINT_TABLE),
        describes=TableRef("bronze", DESCRIBES_TABLE),
    )


def ensure_cometd_tables(engine: LakeEngine, tables: CometdTables) -> None:
    """Create every table that is missing."""
    for table in tables.streams.values():
        engine.ensure_table(table, arrow_schema_to_spark(COMETD_BRONZE_SCHEMA))
    engine.ensure_table(tables.checkpoints, arrow_schema_to_spark(CHECKPOINT_SCHEMA))
    engine.ensure_table(tables.describes, arrow_schema_to_spark(DESCRIBES_SCHEMA))
