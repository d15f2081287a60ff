"""Silver's pure batch functions around decoding: taking decoded rows apart into silver rows
and quarantine rows, quarantining bronze rows no object decodes, and the small filters and
counts the job runs over bronze rows.

Each is a :data:`~pipelines.engines.base.BatchFunction` (a picklable callable from Arrow
batches to Arrow batches) that reads no table and writes nothing; the engine runs it where its
rows are (:meth:`~pipelines.engines.base.LakeEngine.map_batches`). Their output schemas are
fixed here (:data:`QUARANTINE_SCHEMA`, :data:`COUNTS_SCHEMA`) or by the caller.

A quarantine row keeps the bronze coordinates (table, batch id, batch position), the replay
id, event id and schema id, the entity whose decoder refused it (or none), the reason (a
``reason_kind`` of :data:`~pipelines.silver.decode.ErrorKind` and a sentence), the raw
payload and the time of the run that quarantined it: enough to find, understand and replay it.
``resolved_at`` is set when ``sfcdc silver --retry-quarantine`` decoded the row into silver.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.engines.base import CountsOf, RowsWhere

__all__ = [
    "COUNTS_SCHEMA",
    "ERROR_COLUMNS",
    "FAILURES_SCHEMA",
    "QUARANTINE_KEYS",
    "QUARANTINE_SCHEMA",
    "AfterBatch",
    "Failures",
    "QuarantinePart",
    "SchemaCounts",
    "SilverPart",
    "Undecodable",
    "WithoutKeys",
]

QUARANTINE_SCHEMA = T.StructType(
    [
        T.StructField("bronze_table", T.StringType()),
        T.StructField("topic", T.StringType()),
        T.StructField("bronze_batch_id", T.LongType()),
        T.StructField("bronze_batch_seq", T.IntegerType()),
        T.StructField("replay_id", T.BinaryType()),
        T.StructField("event_id", T.StringType()),
        T.StructField("schema_id", T.StringType()),
        T.StructField("entity", T.StringType()),
        T.StructField("reason_kind", T.StringType()),
        T.StructField("reason", T.StringType()),
        T.StructField("payload", T.BinaryType()),
        T.StructField("quarantined_at", T.TimestampType()),
        # Set by `sfcdc silver --retry-quarantine` once the row decoded into silver.
        T.StructField("resolved_at", T.TimestampType()),
    ]
)
# The bronze coordinates of a quarantined row: how reruns recognise rows already quarantined.
QUARANTINE_KEYS = ("bronze_table", "bronze_batch_id", "bronze_batch_seq")
# The columns after the silver columns of a decoded row (null on the rows that decoded).
ERROR_COLUMNS = ("_cdc_error", "_cdc_error_kind", "_cdc_payload")
# What :class:`Failures` yields.
FAILURES_SCHEMA = T.StructType([T.StructField("_cdc_error", T.StringType())])
# Bronze rows per schema id in a batch (SchemaCounts).
COUNTS_SCHEMA = T.StructType(
    [
        T.StructField("schema_id", T.StringType()),
        T.StructField("rows", T.LongType()),
        T.StructField("max_batch_id", T.LongType()),
    ]
)

_QUARANTINE = spark_schema_to_arrow(QUARANTINE_SCHEMA)
_COUNTS = spark_schema_to_arrow(COUNTS_SCHEMA)
_AT = pa.timestamp("us", tz="UTC")


def _quarantine_batch(columns: Mapping[str, pa.Array], n: int) -> pa.RecordBatch:
    arrays = []
    for f in _QUARANTINE:
        array = columns.get(f.name)
        arrays.append(pa.nulls(n, f.type) if array is None else array.cast(f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=_QUARANTINE)


def _constant(value: object, n: int, t: pa.DataType) -> pa.Array:
    return pa.repeat(pa.scalar(value, t), n)


class SilverPart:
    """Decoded and shaped rows (silver columns, then :data:`ERROR_COLUMNS`) -> the rows that
    decoded, with the silver columns ``names``."""

    keeps = RowsWhere("_cdc_error", null=True)

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        self.selects = tuple(self.names)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            errors = batch.column("_cdc_error")
            rows = (
                batch if errors.null_count == batch.num_rows else batch.filter(pc.is_null(errors))
            )
            if rows.num_rows:
                yield rows.select(self.names)


class Failures:
    """Decoded and shaped rows -> the error (:data:`FAILURES_SCHEMA`) of each row that did
    not decode: what tells a job whether it has quarantine rows to build."""

    keeps = RowsWhere("_cdc_error", null=False)
    selects = ("_cdc_error",)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            errors = batch.column("_cdc_error")
            if errors.null_count < batch.num_rows:
                yield batch.filter(pc.is_valid(errors)).select(list(self.selects))


class QuarantinePart:
    """Decoded and shaped rows -> :data:`QUARANTINE_SCHEMA` rows of those that could not be
    decoded. ``bronze_table`` and ``topic`` say where they came from, ``entity`` whose decoder
    refused them, ``at`` when the run started (one value per run keeps it deterministic)."""

    keeps = RowsWhere("_cdc_error", null=False)
    reads = (
        "_cdc_bronze_batch_id",
        "_cdc_bronze_batch_seq",
        "_cdc_replay_id",
        "_cdc_event_id",
        "_cdc_schema_id",
        "_cdc_error_kind",
        "_cdc_error",
        "_cdc_payload",
    )

    def __init__(self, *, bronze_table: str, topic: str, at: datetime, entity: str) -> None:
        self.bronze_table = bronze_table
        self.topic = topic
        self.at = at
        self.entity = entity

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            errors = batch.column("_cdc_error")
            if errors.null_count == batch.num_rows:
                continue
            bad = batch.filter(pc.is_valid(errors))
            n = bad.num_rows
            yield _quarantine_batch(
                {
                    "bronze_table": _constant(self.bronze_table, n, pa.string()),
                    "topic": _constant(self.topic, n, pa.string()),
                    "bronze_batch_id": bad.column("_cdc_bronze_batch_id"),
                    "bronze_batch_seq": bad.column("_cdc_bronze_batch_seq"),
                    "replay_id": bad.column("_cdc_replay_id"),
                    "event_id": bad.column("_cdc_event_id"),
                    "schema_id": bad.column("_cdc_schema_id"),
                    "entity": _constant(self.entity, n, pa.string()),
                    "reason_kind": bad.column("_cdc_error_kind"),
                    "reason": bad.column("_cdc_error"),
                    "payload": bad.column("_cdc_payload"),
                    "quarantined_at": _constant(self.at, n, _AT),
                },
                n,
            )


class Undecodable:
    """Bronze rows (``batch_id, batch_seq, event_id, replay_id, schema_id, payload``) that no
    object decodes -> :data:`QUARANTINE_SCHEMA` rows.

    ``decodable``: schema ids some object decodes or that are rightly skipped (other
    objects' events on a channel). ``reasons``: ``(reason_kind, reason)`` of schema ids known
    to be unusable (a registry entry that does not parse, another object's schema on a
    single-object topic). Any other schema id is missing from the registry (``registry``
    names it in the reason).
    """

    def __init__(
        self,
        *,
        decodable: Collection[str],
        reasons: Mapping[str, tuple[str, str]],
        registry: str,
        bronze_table: str,
        topic: str,
        at: datetime,
    ) -> None:
        self.known = sorted(set(decodable) - set(reasons))
        self.reasons = dict(reasons)
        self.registry = registry
        self.bronze_table = bronze_table
        self.topic = topic
        self.at = at

    def _reason(self, sid: str | None) -> tuple[str, str]:
        if sid in self.reasons:
            return self.reasons[sid]
        if not sid:
            return "unknown_schema", "the bronze row has no schema id"
        return (
            "unknown_schema",
            f"unknown schema id '{sid}': not in {self.registry} (landing registers every "
            "schema before the events that use it)",
        )

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        known = pa.array(self.known, pa.string())
        for batch in batches:
            sids = batch.column("schema_id")
            keep = pc.invert(pc.fill_null(pc.is_in(sids, value_set=known), False))
            bad = batch.filter(keep)
            n = bad.num_rows
            if not n:
                continue
            pairs = [self._reason(sid) for sid in bad.column("schema_id").to_pylist()]
            yield _quarantine_batch(
                {
                    "bronze_table": _constant(self.bronze_table, n, pa.string()),
                    "topic": _constant(self.topic, n, pa.string()),
                    "bronze_batch_id": bad.column("batch_id"),
                    "bronze_batch_seq": bad.column("batch_seq"),
                    "replay_id": bad.column("replay_id"),
                    "event_id": bad.column("event_id"),
                    "schema_id": bad.column("schema_id"),
                    "reason_kind": pa.array([k for k, _ in pairs], pa.string()),
                    "reason": pa.array([r for _, r in pairs], pa.string()),
                    "payload": bad.column("payload"),
                    "quarantined_at": _constant(self.at, n, _AT),
                },
                n,
            )


class WithoutKeys:
    """Quarantine rows whose bronze coordinates (:data:`QUARANTINE_KEYS`) are not in
    ``seen``: what an earlier run that stopped elsewhere in the range did not quarantine."""

    def __init__(self, seen: Collection[tuple[str, int, int]]) -> None:
        self.seen = set(seen)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            keys = zip(*(batch.column(k).to_pylist() for k in QUARANTINE_KEYS), strict=True)
            mask = pa.array([k not in self.seen for k in keys], pa.bool_())
            rows = batch.filter(mask)
            if rows.num_rows:
                yield rows


class AfterBatch:
    """Bronze rows of batches after ``last`` (the last one silver processed)."""

    def __init__(self, last: int) -> None:
        self.last = last

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            rows = batch.filter(
                pc.fill_null(pc.greater(batch.column("batch_id"), self.last), False)
            )
            if rows.num_rows:
                yield rows


class SchemaCounts:
    """Bronze rows -> rows and highest batch id per schema id (:data:`COUNTS_SCHEMA`), per
    batch; the job sums them."""

    counts = CountsOf("schema_id", "batch_id")

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            table = pa.Table.from_batches([batch]).select(["schema_id", "batch_id"])
            grouped = table.group_by("schema_id").aggregate(
                [([], "count_all"), ("batch_id", "max")]
            )
            yield pa.RecordBatch.from_arrays(
                [
                    grouped.column("schema_id").combine_chunks().cast(pa.string()),
                    grouped.column("count_all").combine_chunks().cast(pa.int64()),
                    grouped.column("batch_id_max").combine_chunks().cast(pa.int64()),
                ],
                schema=_COUNTS,
            )
