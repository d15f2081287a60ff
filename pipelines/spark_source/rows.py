"""What a read returns: the raw bronze columns, or silver's decoded columns.

``raw`` rows are bronze's: replay id (bytes, never a number), event id, schema id, Avro
payload, topic and receive time. ``silver`` rows are what silver's step makes of them
(:class:`~pipelines.silver.decode.SilverRows`, the same function the silver job runs): each
event decoded with its own writer schema, one row per record id, bitmaps expanded, dates and
times converted, undecodable events kept with ``_cdc_error`` set: a corrupt payload, or a
schema id GetSchema refuses (``schema_unavailable``, with the server's answer; asked again in
each micro-batch that has such events, so events after the refusal ends decode).

A query's columns are fixed when it starts, from the topic's current schema. An event written
with a newer schema whose fields are not among them raises :class:`SchemaChangedError`: the
query stops, and started again it reads the new columns (a Delta sink takes them with
``mergeSchema``). Older versions' fields that the current schema dropped are not columns.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import types as T

from ingest.client import SchemaCache
from ingest.errors import PermanentError
from ingest.schema import EventSchema, parse_event_schema
from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.silver.columns import SilverLayout, build_layout
from pipelines.silver.decode import DecodePlan, ErrorKind, SilverRows
from pipelines.silver.shape import shaped_schema, shaped_struct
from pipelines.spark_source.errors import SchemaChangedError
from pipelines.spark_source.feed import Events
from pipelines.spark_source.offsets import GapMark

__all__ = [
    "RAW_GAPS_SCHEMA",
    "RAW_SCHEMA",
    "SilverDecoding",
    "gap_detail",
    "raw_batch",
    "silver_decoding",
]

RAW_SCHEMA = T.StructType(
    [
        T.StructField("replay_id", T.BinaryType(), False),
        T.StructField("event_id", T.StringType(), False),
        T.StructField("schema_id", T.StringType(), False),
        T.StructField("payload", T.BinaryType(), False),
        T.StructField("topic", T.StringType(), False),
        T.StructField("received_at", T.TimestampType(), False),
    ]
)
_RAW_ARROW = spark_schema_to_arrow(RAW_SCHEMA)

# replayGaps=rows: a replay gap is a row of its own, with its topic, the time it was met and
# its explanation in ``replay_gap``; its event columns are null (events have no replay_gap).
RAW_GAPS_SCHEMA = T.StructType(
    [
        T.StructField(f.name, f.dataType, f.name not in ("topic", "received_at"))
        for f in RAW_SCHEMA.fields
    ]
    + [T.StructField("replay_gap", T.StringType(), True)]
)
_RAW_GAPS_ARROW = spark_schema_to_arrow(RAW_GAPS_SCHEMA)


def raw_batch(topic: str, events: Events, *, gap_rows: bool = False) -> pa.RecordBatch:
    """``events`` of ``topic`` as one batch of :data:`RAW_SCHEMA`; with ``gap_rows``, of
    :data:`RAW_GAPS_SCHEMA`, each replay gap a row placed before the event it preceded."""
    n = len(events)
    received = pa.array([int(t * 1_000_000) for t in events.received_at], pa.int64())
    columns = [
        pa.array(events.replay_ids, pa.binary()),
        pa.array(events.event_ids, pa.string()),
        pa.array(events.schema_ids, pa.string()),
        pa.array(events.payloads, pa.binary()),
        pa.array([topic] * n, pa.string()),
        received.cast(pa.timestamp("us", tz="UTC")),
    ]
    if not gap_rows:
        return pa.RecordBatch.from_arrays(columns, schema=_RAW_ARROW)
    columns.append(pa.nulls(n, pa.string()))
    gaps = events.gaps
    if not gaps:
        return pa.RecordBatch.from_arrays(columns, schema=_RAW_GAPS_ARROW)
    # A gap's row carries the receive time of the event it preceded (of the batch's last
    # event when none followed it; of this read when the batch has no event).
    met = [events.received_at[min(g.at, n - 1)] if n else time.time() for g in gaps]
    stamps = pa.array([int(t * 1_000_000) for t in met], pa.int64())
    gap_part = [
        *(pa.nulls(len(gaps), c.type) for c in columns[:4]),
        pa.array([topic] * len(gaps), pa.string()),
        stamps.cast(pa.timestamp("us", tz="UTC")),
        pa.array([gap_detail(topic, g) for g in gaps], pa.string()),
    ]
    table = pa.Table.from_arrays(
        [pa.concat_arrays([a, b]) for a, b in zip(columns, gap_part, strict=True)],
        schema=_RAW_GAPS_ARROW,
    )
    # Each gap before the event it preceded (``at`` events of the batch came before it).
    order = sorted(range(n + len(gaps)), key=lambda i: (i, 1) if i < n else (gaps[i - n].at, 0))
    return table.take(pa.array(order, pa.int64())).combine_chunks().to_batches()[0]


@dataclass(frozen=True)
class SilverDecoding:
    """How one object's events become silver rows: its entity and the writer schemas (id ->
    JSON) the columns were built from, which travel to every process that reads."""

    entity: str
    schemas: Mapping[str, str]

    def _layout_schemas(self) -> list[EventSchema]:
        return [parse_event_schema(text, expected_id=sid) for sid, text in self.schemas.items()]

    def struct(self) -> T.StructType:
        """The rows' Spark schema: the silver table's columns, then the error columns."""
        return shaped_struct(build_layout(self.entity, self._layout_schemas()))

    def batches(self, topic: str, events: Events, cache: SchemaCache) -> Iterator[pa.RecordBatch]:
        """``events`` of ``topic`` decoded, each with its own writer schema (fetched once per
        id), then one ``replay_gap`` row per replay gap met among them."""
        layout = build_layout(self.entity, self._layout_schemas())
        if len(events):
            yield from self._decoded(events, cache, layout)
        if events.gaps:
            yield _gap_rows(layout, topic, events.gaps, self.entity)

    def _decoded(
        self, events: Events, cache: SchemaCache, layout: SilverLayout
    ) -> Iterator[pa.RecordBatch]:
        columns = {f.name for f in layout.fields}
        writer: dict[str, str] = dict(self.schemas)
        failures: dict[str, tuple[ErrorKind, str]] = {}
        for schema_id in sorted(set(events.schema_ids) - set(writer)):
            try:
                schema = cache.schema(schema_id)
            except PermanentError as exc:
                # The server will not serve it (NOT_FOUND, no permission): its events become
                # error rows with the server's answer, and the query goes on.
                failures[schema_id] = ("schema_unavailable", f"GetSchema {schema_id}: {exc}")
                continue
            if schema.entity_name != self.entity:
                failures[schema_id] = (
                    "wrong_entity",
                    f"schema {schema_id} is a {schema.entity_name} schema, but this query "
                    f"reads {self.entity} events",
                )
                continue
            new = [
                f.name
                for f in schema.fields
                if f.name not in columns and f.name != "ChangeEventHeader"
            ]
            if new:
                raise SchemaChangedError(
                    f"{self.entity}: events are now written with schema {schema_id}, which "
                    f"adds fields {new} that this query's columns do not hold (they were "
                    f"fixed at its start from schema(s) {sorted(self.schemas)}). Start the "
                    "query again to read them (a Delta sink needs "
                    ".option('mergeSchema', 'true') to add the columns); nothing after the "
                    "last committed micro-batch is lost."
                )
            writer[schema_id] = schema.json
        n = len(events)
        bronze = pa.RecordBatch.from_arrays(
            [
                pa.array([0] * n, pa.int64()),
                pa.array(range(n), pa.int32()),
                pa.array(events.event_ids, pa.string()),
                pa.array(events.replay_ids, pa.binary()),
                pa.array(events.schema_ids, pa.string()),
                pa.array(events.payloads, pa.binary()),
            ],
            names=["batch_id", "batch_seq", "event_id", "replay_id", "schema_id", "payload"],
        )
        plan = DecodePlan(layout, writer, "GetSchema", failures=failures)
        yield from SilverRows(plan)(iter([bronze]))


def gap_detail(topic: str, gap: GapMark) -> str:
    """What a replay gap means, in words."""
    return (
        f"replay gap on {topic}: the stored position {gap.requested} was rejected "
        f"({gap.reason}) and the subscription resumed at {gap.resumed}; events in between may "
        "be missing (latest) or repeated (earliest)"
    )


def _gap_rows(layout: SilverLayout, topic: str, gaps: list[GapMark], entity: str) -> pa.RecordBatch:
    """One row per gap: only the error columns, the entity and its place in the batch (the
    number of the first event after it) are set."""
    schema = shaped_schema(layout)
    n = len(gaps)
    values: dict[str, pa.Array] = {
        "_cdc_entity": pa.array([entity] * n, pa.string()),
        "_cdc_bronze_batch_id": pa.array([0] * n, schema.field("_cdc_bronze_batch_id").type),
        "_cdc_bronze_batch_seq": pa.array(
            [g.at for g in gaps], schema.field("_cdc_bronze_batch_seq").type
        ),
        "_cdc_error_kind": pa.array(["replay_gap"] * n, pa.string()),
        "_cdc_error": pa.array([gap_detail(topic, g) for g in gaps], pa.string()),
    }
    return pa.RecordBatch.from_arrays(
        [values.get(f.name, pa.nulls(n, f.type)) for f in schema], schema=schema
    )


def silver_decoding(cache: SchemaCache, topic: str) -> SilverDecoding:
    """The decoding of ``topic``'s events, with columns from its current schema."""
    info = cache.topic_info(topic, refresh=True)
    if not info.schema_id:
        raise ValueError(
            f"{topic} carries several objects (it has no schema of its own); decode=silver "
            "reads one object's topic, such as /data/AccountChangeEvent"
        )
    schema = cache.schema(info.schema_id)
    return SilverDecoding(schema.entity_name, {schema.schema_id: schema.json})
