"""Decoding bronze payloads: the pure batch functions silver's step runs wherever the engine
puts them (this process, or Spark executors with ``mapInArrow``).

:class:`SilverRows` is the step's function: bronze rows (``batch_id, batch_seq, event_id,
replay_id, schema_id, payload``) of one object's schemas in, the object's silver rows and
error columns out. Inside, :func:`decode_batches` yields :func:`decoded_schema` rows: per
bronze row, the bronze coordinates, the CDC header and the object's fields as
:meth:`~pipelines.silver.columns.SilverLayout.raw_columns` (dates and times still epoch
milliseconds: :mod:`pipelines.silver.shape` converts them). A row that cannot be decoded
carries ``_cdc_error`` (the reason), ``_cdc_error_kind`` and its payload instead, for the
quarantine: a corrupt or truncated payload, a bitmap that points past the schema, a header
naming another object, a schema that does not parse.

Each object's function keeps only the bronze rows whose schema id is one of that object's
schemas, so on a channel carrying several objects every row is still decoded once.

What travels with the function (:class:`DecodePlan`) is small and picklable: the object's
layout and the registry's schema JSON of its versions. In each Python process the schemas are
parsed and their decoders generated once per schema id (a module-level
:class:`~ingest.decoding.DecoderCache`, reused by every task of that worker). Each Arrow
batch is decoded a field at a time over all its rows by
:class:`~pipelines.silver.columnar.ColumnarDecoder`, straight into Arrow arrays; a row that
does not decode is reported on its own, with the reason the row decoder
(:meth:`~ingest.decoding.EventDecoder.decode_batch`) gives, and so is a row whose bitmap
does not expand or whose header names another object. Only a schema the row decoder itself
leaves to fastavro (a logical type, a recursive type) is decoded row by row, by fastavro.
"""

from __future__ import annotations

import gc
import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from ingest.decoding import DecodedBatch, DecoderCache, EventDecoder, expander_for
from ingest.errors import DecodeError
from ingest.schema import EventSchema, FieldInfo
from pipelines.engines.arrow import spark_schema_to_arrow, spark_type_to_arrow
from pipelines.silver.columnar import (
    Column,
    ColumnarDecoder,
    Decoded,
    UnionColumn,
    expanded_bitmaps,
    to_pylist,
)
from pipelines.silver.columns import FieldLayout, LeafKind, SilverLayout, leaf_kind
from pipelines.silver.shape import shape_batch, shaped_schema

__all__ = [
    "BRONZE_COLUMNS",
    "DECODED_HEADER",
    "DECODE_BATCH_BYTES",
    "DECODE_BATCH_ROWS",
    "DecodePlan",
    "ErrorKind",
    "SilverRows",
    "decode_batches",
    "decode_function",
    "decoded_schema",
]

ErrorKind = Literal[
    "unknown_schema",
    "schema_unavailable",
    "invalid_schema",
    "corrupt_payload",
    "bad_bitmap",
    "wrong_entity",
    "replay_gap",
]

# Rows of the batches :class:`SilverRows` decodes: smaller batches that arrive one after the
# other (Spark hands a Python worker batches of spark.sql.execution.arrow.maxRecordsPerBatch
# rows, 10,000 by default) are joined up to this many rows, or this many bytes, first.
# Decoding and shaping cost a little per batch and per column, whatever its rows, so fewer,
# longer batches go faster; the bounds keep what a worker holds at once small.
DECODE_BATCH_ROWS = 50_000
DECODE_BATCH_BYTES = 64 << 20

# The bronze columns the decoder reads, in this order.
BRONZE_COLUMNS = ("batch_id", "batch_seq", "event_id", "replay_id", "schema_id", "payload")

_STRINGS = T.ArrayType(T.StringType())
# Columns of every decoded row, whatever its object.
DECODED_HEADER: tuple[tuple[str, T.DataType], ...] = (
    ("_cdc_bronze_batch_id", T.LongType()),
    ("_cdc_bronze_batch_seq", T.IntegerType()),
    ("_cdc_event_id", T.StringType()),
    ("_cdc_replay_id", T.BinaryType()),
    ("_cdc_schema_id", T.StringType()),
    ("_cdc_entity", T.StringType()),
    ("_cdc_error", T.StringType()),
    ("_cdc_error_kind", T.StringType()),
    ("_cdc_payload", T.BinaryType()),
    ("_cdc_record_ids", _STRINGS),
    ("_cdc_change_type", T.StringType()),
    ("_cdc_change_origin", T.StringType()),
    ("_cdc_transaction_key", T.StringType()),
    ("_cdc_sequence_number", T.IntegerType()),
    ("_cdc_commit_timestamp", T.LongType()),
    ("_cdc_commit_number", T.LongType()),
    ("_cdc_commit_user", T.StringType()),
    ("_cdc_changed_fields", _STRINGS),
    ("_cdc_nulled_fields", _STRINGS),
    ("_cdc_diff_fields", _STRINGS),
)
_PASS_THROUGH = 5  # the first columns come straight from bronze
# ChangeEventHeader fields -> decoded columns (recordIds and the bitmaps are handled apart).
_HEADER_SCALARS = (
    ("changeType", "_cdc_change_type"),
    ("changeOrigin", "_cdc_change_origin"),
    ("transactionKey", "_cdc_transaction_key"),
    ("sequenceNumber", "_cdc_sequence_number"),
    ("commitTimestamp", "_cdc_commit_timestamp"),
    ("commitNumber", "_cdc_commit_number"),
    ("commitUser", "_cdc_commit_user"),
)


@dataclass(frozen=True)
class DecodePlan:
    """Everything a Spark task needs to decode one object's bronze rows.

    ``layout``: the object's silver columns. ``schemas``: schema id -> JSON of every
    registry schema of the object (the job feeds the decoder only rows with one of these
    ids). ``registry``: the registry table's name, for messages. ``failures``: schema ids
    whose rows cannot be decoded, with the error kind and reason their rows carry (a schema
    the server refused to serve, say); :class:`SilverRows` keeps those rows, as errors.
    """

    layout: SilverLayout
    schemas: Mapping[str, str]
    registry: str = "the schema registry"
    failures: Mapping[str, tuple[ErrorKind, str]] = field(default_factory=dict)


def decoded_schema(plan: DecodePlan) -> T.StructType:
    """The schema of the rows :func:`decode_function` yields: bronze coordinates, error
    columns, the CDC header and the object's :meth:`~SilverLayout.raw_columns`."""
    columns = (*DECODED_HEADER, *plan.layout.raw_columns())
    return T.StructType([T.StructField(n, t) for n, t in columns])


# Arrow schemas per layout, by identity: a layout's hash walks all its fields.
_SCHEMAS: dict[tuple[str, int], tuple[SilverLayout, pa.Schema]] = {}


def _per_layout(kind: str, layout: SilverLayout, make: Callable[[], pa.Schema]) -> pa.Schema:
    key = (kind, id(layout))
    held = _SCHEMAS.get(key)
    if held is None or held[0] is not layout:
        if len(_SCHEMAS) >= _MAX_BUILDERS:
            _SCHEMAS.clear()
        held = _SCHEMAS[key] = (layout, make())
    return held[1]


def _decoded_arrow(layout: SilverLayout) -> pa.Schema:
    """:func:`decoded_schema` in Arrow types (it depends on the layout only)."""

    def make() -> pa.Schema:
        columns = (*DECODED_HEADER, *layout.raw_columns())
        return spark_schema_to_arrow(T.StructType([T.StructField(n, t) for n, t in columns]))

    return _per_layout("decoded", layout, make)


def _shaped_schema(layout: SilverLayout) -> pa.Schema:
    return _per_layout("shaped", layout, partial(shaped_schema, layout))


def decode_function(
    plan: DecodePlan,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The batch function decoding bronze rows according to ``plan``."""
    return partial(decode_batches, plan)


class SilverRows:
    """The batch function of an object's silver step: bronze rows -> the object's silver
    rows followed by the error columns (:func:`~pipelines.silver.shape.shaped_schema`).

    Rows written with a schema that is not one of ``plan``'s are left out (they are another
    object's) unless ``plan.failures`` names it (they become error rows); the rest are
    decoded (:func:`decode_batches`) and shaped (:func:`~pipelines.silver.shape.shape_batch`):
    one row per record id, dates converted, compounds as the object asks.
    """

    def __init__(self, plan: DecodePlan) -> None:
        self.plan = plan

    def _mine(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ids = pa.array(sorted({*self.plan.schemas, *self.plan.failures}), pa.string())
        for batch in batches:
            keep = pc.fill_null(pc.is_in(batch.column("schema_id"), value_set=ids), False)
            rows = batch if keep.false_count == 0 else batch.filter(keep)
            if rows.num_rows:
                yield rows

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        target = _shaped_schema(self.plan.layout)
        joined = _joined(self._mine(batches), DECODE_BATCH_ROWS, DECODE_BATCH_BYTES)
        for decoded in decode_batches(self.plan, joined):
            yield shape_batch(self.plan.layout, decoded, target)


def _joined(batches: Iterator[pa.RecordBatch], rows: int, size: int) -> Iterator[pa.RecordBatch]:
    """``batches`` joined, in order, until a joined batch holds ``rows`` rows or ``size``
    bytes: the same rows, in fewer batches."""
    held: list[pa.RecordBatch] = []
    count = nbytes = 0
    for batch in batches:
        held.append(batch)
        count += batch.num_rows
        nbytes += batch.nbytes
        if count >= rows or nbytes >= size:
            yield _one_batch(held)
            held, count, nbytes = [], 0, 0
    if held:
        yield _one_batch(held)


def _one_batch(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    # Through a table: pyarrow.concat_batches is newer than the pyarrow sfcdc supports (15),
    # which Spark's Python workers on a Databricks runtime may have.
    joined = pa.Table.from_batches(batches).combine_chunks().to_batches()
    return joined[0] if len(joined) == 1 else batches[0].slice(0, 0)


# ----------------------------------------------------------------------- in the worker

_SCHEMA_JSON: dict[str, str] = {}
_SCHEMA_LOCK = threading.Lock()


def _registry_json(schema_id: str) -> str | None:
    return _SCHEMA_JSON.get(schema_id)


# One per Python worker process, shared by its tasks: a schema is parsed and its decoder
# generated once per worker, however many tasks and runs use it. Schema ids are fingerprints
# of the schema, so a cached id can never come to mean another schema.
_DECODERS = DecoderCache(_registry_json)
_BUILDERS: dict[tuple[str, SilverLayout], _Builder] = {}
_MAX_BUILDERS = 256


def decode_batches(plan: DecodePlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Decode bronze Arrow batches into batches of :func:`decoded_schema` (see the module
    docstring). Used through :func:`decode_function`."""
    with _SCHEMA_LOCK:
        _SCHEMA_JSON.update(plan.schemas)
    out_schema = _decoded_arrow(plan.layout)
    for batch in batches:
        # Decoding creates millions of small acyclic objects (strings, floats); the cyclic
        # collector would walk all of them again and again and find nothing.
        enabled = gc.isenabled()
        gc.disable()
        try:
            yield from _decode_batch(plan, out_schema, batch)
        finally:
            if enabled:
                gc.enable()


def _decode_batch(
    plan: DecodePlan, out_schema: pa.Schema, batch: pa.RecordBatch
) -> Iterator[pa.RecordBatch]:
    if batch.num_rows == 0:
        return
    missing = [c for c in BRONZE_COLUMNS if c not in batch.schema.names]
    if missing:
        raise DecodeError(
            f"the decoder reads bronze columns {', '.join(BRONZE_COLUMNS)}; the input lacks "
            f"{', '.join(missing)} (got {', '.join(batch.schema.names)})"
        )
    bronze = pa.RecordBatch.from_arrays(
        [batch.column(c) for c in BRONZE_COLUMNS], names=list(BRONZE_COLUMNS)
    )
    ids = bronze.column(4)
    unique = pc.unique(ids).to_pylist()
    if len(unique) == 1:
        groups: list[tuple[Any, pa.RecordBatch]] = [(unique[0], bronze)]
    else:
        groups = []
        for sid in unique:
            mask = pc.is_null(ids) if sid is None else pc.equal(ids, sid)
            groups.append((sid, bronze.filter(mask)))
    for sid, rows in groups:
        yield from _decode_group(plan, out_schema, sid, rows)


class _Out:
    """Columns of an output batch, filled by name; the rest become nulls."""

    def __init__(self, schema: pa.Schema, bronze: pa.RecordBatch) -> None:
        self.schema = schema
        self.n = bronze.num_rows
        self.columns: dict[str, pa.Array] = {}
        for i, (name, _) in enumerate(DECODED_HEADER[:_PASS_THROUGH]):
            column, target = bronze.column(i), schema.field(name).type
            self.columns[name] = column if column.type == target else column.cast(target)

    def batch(self) -> pa.RecordBatch:
        arrays = []
        for f in self.schema:
            array = self.columns.get(f.name)
            arrays.append(pa.nulls(self.n, f.type) if array is None else array)
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def _failed(
    schema: pa.Schema,
    bronze: pa.RecordBatch,
    kinds: ErrorKind | Sequence[ErrorKind],
    reasons: str | Sequence[str],
    entity: str | None = None,
) -> pa.RecordBatch:
    out = _Out(schema, bronze)
    n = bronze.num_rows
    text = [reasons] * n if isinstance(reasons, str) else list(reasons)
    kind_text = [kinds] * n if isinstance(kinds, str) else list(kinds)
    out.columns["_cdc_error"] = pa.array(text, pa.string())
    out.columns["_cdc_error_kind"] = pa.array(kind_text, pa.string())
    out.columns["_cdc_payload"] = bronze.column(5)
    if entity is not None:
        out.columns["_cdc_entity"] = pa.array([entity] * n, pa.string())
    return out.batch()


def _decode_group(
    plan: DecodePlan, schema: pa.Schema, sid: Any, bronze: pa.RecordBatch
) -> Iterator[pa.RecordBatch]:
    layout = plan.layout
    if not sid:
        yield _failed(schema, bronze, "unknown_schema", "the bronze row has no schema id")
        return
    failure = plan.failures.get(sid)
    if failure is not None:
        yield _failed(schema, bronze, failure[0], failure[1], layout.entity)
        return
    if sid not in plan.schemas:
        yield _failed(
            schema,
            bronze,
            "unknown_schema",
            f"schema id {sid!r} is not a {layout.entity} schema in {plan.registry}",
        )
        return
    try:
        event_schema, decoder = _DECODERS.get(sid)
    except DecodeError as exc:
        yield _failed(schema, bronze, "invalid_schema", str(exc), layout.entity)
        return
    yield from _builder(sid, layout, event_schema, decoder).build(schema, bronze)


def _builder(
    sid: str, layout: SilverLayout, schema: EventSchema, decoder: EventDecoder
) -> _Builder:
    key = (sid, layout)
    builder = _BUILDERS.get(key)
    if builder is None:
        if len(_BUILDERS) >= _MAX_BUILDERS:
            _BUILDERS.clear()
        builder = _BUILDERS[key] = _Builder(layout, schema, decoder)
    return builder


def _text(kind: LeafKind) -> Callable[[Any], str]:
    """A value of ``kind`` as text, for a column another schema version made STRING."""
    if kind == "boolean":
        return lambda v: "true" if v else "false"
    if kind == "date":
        return _iso_date
    if kind == "timestamp":
        return _iso_timestamp
    if kind == "time":
        return _time_of_day
    if kind == "string":
        return str
    if kind == "binary":
        return lambda v: bytes(v).hex()
    return lambda v: v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)


def _iso_date(ms: int) -> str:
    import datetime as dt

    return (dt.date(1970, 1, 1) + dt.timedelta(days=ms // 86_400_000)).isoformat()


def _iso_timestamp(ms: int) -> str:
    import datetime as dt

    moment = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(milliseconds=ms)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _time_of_day(ms: int) -> str:
    seconds, milli = divmod(ms, 1000)
    minutes, sec = divmod(seconds, 60)
    hours, minute = divmod(minutes, 60)
    return f"{hours:02d}:{minute:02d}:{sec:02d}.{milli:03d}"


def _source_kind(info: FieldInfo) -> LeafKind | None:
    """The leaf kind a schema version writes for a field (None for a record)."""
    return None if info.children else leaf_kind(info)


def _arrow(t: T.DataType) -> pa.DataType:
    return spark_type_to_arrow(t)


_Column = Callable[[list[Any], int], pa.Array]
# How BitmapExpander's messages begin (decode_batch reports errors as text).
_BITMAP_ERRORS = ("bitmap ", "a bitmap ")


class _Builder:
    """Turns one schema version's decoded columns into one object's struct column.

    Built once per (schema id, layout) in a worker: for each column of the layout, a
    function from the version's decoded values (or nothing, when the version lacks the
    field) to an Arrow array of the column's type.
    """

    def __init__(self, layout: SilverLayout, schema: EventSchema, decoder: EventDecoder) -> None:
        self.layout = layout
        self.schema = schema
        self.decoder = decoder
        self.entity = layout.entity
        self.names = [name for name, _ in layout.raw_columns()]
        by_name = {f.name: f for f in schema.fields}
        self.columns: list[tuple[str | None, _Column]] = []
        raw = dict(layout.raw_columns())
        for f in layout.fields:
            self.columns.extend(self._plan(f, by_name.get(f.name), raw))
        # The schemas the row decoder leaves to fastavro are read as fastavro reads them.
        self.columnar = ColumnarDecoder.for_schema(schema) if decoder.specialised else None
        self.expander = expander_for(schema)

    @staticmethod
    def _plan(
        f: FieldLayout, info: FieldInfo | None, raw: Mapping[str, T.DataType]
    ) -> list[tuple[str | None, _Column]]:
        if f.shape == "switchable":
            value_type = _arrow(raw[f.name])
            record_type = _arrow(raw[f.person_column])
            if info is None:
                return [(None, _nulls(value_type)), (None, _nulls(record_type))]
            if info.kind == "switchable_name":
                return [
                    (info.name, _branch_value(value_type, f.kind)),
                    (info.name, _branch_record(record_type, f, info)),
                ]
            if info.children:  # an older version with only the record
                return [(None, _nulls(value_type)), (info.name, _records(record_type, f, info))]
            value = _leaf(value_type, f.kind, leaf_kind(info))
            return [(info.name, value), (None, _nulls(record_type))]
        arrow_type = _arrow(raw[f.name])
        if info is None:
            return [(None, _nulls(arrow_type))]
        if f.shape == "struct":
            if not info.children:
                return [(info.name, _nulls(arrow_type))]
            return [(info.name, _records(arrow_type, f, info))]
        source = _source_kind(info)
        if source is None or info.kind == "switchable_name":
            return [(info.name, _leaf(arrow_type, f.kind, "json"))]
        return [(info.name, _leaf(arrow_type, f.kind, source))]

    def build(self, schema: pa.Schema, bronze: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        if self.columnar is None:
            yield from self._rows(schema, bronze)
            return
        decoded = self.columnar.decode(bronze.column(5))
        entity = self.entity
        kinds: dict[int, tuple[ErrorKind, str]] = {
            i: ("corrupt_payload", reason) for i, reason in decoded.errors.items()
        }
        rows = decoded.rows
        header = decoded.header
        out_columns: dict[str, pa.Array] = {}
        if self.schema.is_change_event and len(rows):
            refused: dict[int, tuple[ErrorKind, str]] = {}
            bitmaps = {}
            for field_name, target in _BITMAP_COLUMNS:
                column = header.get(field_name)
                if column is None:
                    bitmaps[target] = pa.array([[]] * len(rows), pa.list_(pa.string()))
                    continue
                bitmaps[target], errors = expanded_bitmaps(column, self.expander.expand)
                for k, reason in errors.items():
                    refused.setdefault(k, ("bad_bitmap", reason))
            names = header["entityName"]
            wrong = pc.fill_null(pc.not_equal(names, pa.scalar(entity, names.type)), True)
            if wrong.true_count:
                for k in np.flatnonzero(np.asarray(wrong)).tolist():
                    refused.setdefault(
                        k,
                        (
                            "wrong_entity",
                            f"schema {self.schema.schema_id} is a {entity} schema but the "
                            f"event's ChangeEventHeader.entityName is {names[k].as_py()!r}",
                        ),
                    )
            if refused:
                for k, error in refused.items():
                    kinds[int(rows[k])] = error
                keep = np.setdiff1d(np.arange(len(rows)), np.fromiter(refused, np.int64))
                index = pa.array(keep, pa.int64())
                rows = rows[keep]
                header = {name: column.take(index) for name, column in header.items()}
                bitmaps = {name: column.take(index) for name, column in bitmaps.items()}
                decoded = Decoded(
                    {name: _take(column, keep) for name, column in decoded.columns.items()},
                    header,
                    rows,
                    decoded.errors,
                )
            out_columns.update(bitmaps)
        if len(rows):
            good = bronze if len(rows) == bronze.num_rows else bronze.take(pa.array(rows))
            yield self._good(schema, good, decoded, out_columns)
        if kinds:
            order = sorted(kinds)
            failed = bronze.take(pa.array(order, pa.int64()))
            yield _failed(
                schema, failed, [kinds[i][0] for i in order], [kinds[i][1] for i in order], entity
            )

    def _rows(self, schema: pa.Schema, bronze: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        """A schema the row decoder itself leaves to fastavro (a logical type, a recursive
        type, an array of zero-width items): decoded row by row, as fastavro reads it."""
        payloads = bronze.column(5).to_pylist()
        decoded = self.decoder.decode_batch(payloads)
        out_rows = decoded.row_index
        entity = self.entity
        kinds: list[tuple[int, ErrorKind, str]] = [
            (i, "bad_bitmap" if reason.startswith(_BITMAP_ERRORS) else "corrupt_payload", reason)
            for i, reason in decoded.errors
        ]
        if self.schema.is_change_event and len(decoded):
            names = decoded.header["entityName"]
            wrong = [k for k, name in enumerate(names) if name != entity]
            if wrong:
                for k in wrong:
                    kinds.append(
                        (
                            out_rows[k],
                            "wrong_entity",
                            f"schema {self.schema.schema_id} is a {entity} schema but the "
                            f"event's ChangeEventHeader.entityName is {names[k]!r}",
                        )
                    )
                decoded = _drop(decoded, set(wrong))
                out_rows = decoded.row_index
        if out_rows:
            yield self._good_rows(schema, bronze, decoded, out_rows)
        if kinds:
            kinds.sort()
            failed = bronze.take(pa.array([i for i, _, _ in kinds], pa.int64()))
            yield _failed(
                schema, failed, [k for _, k, _ in kinds], [r for _, _, r in kinds], entity
            )

    def _good_rows(
        self,
        schema: pa.Schema,
        bronze: pa.RecordBatch,
        decoded: DecodedBatch,
        rows: list[int],
    ) -> pa.RecordBatch:
        n = len(rows)
        if n != bronze.num_rows:
            bronze = bronze.take(pa.array(rows, pa.int64()))
        out = _Out(schema, bronze)
        out.columns["_cdc_entity"] = pa.array([self.entity] * n, pa.string())
        header = decoded.header
        if header:
            out.columns["_cdc_record_ids"] = pa.array(header["recordIds"], _arrow(_STRINGS))
            for field_name, target in _HEADER_SCALARS:
                out.columns[target] = pa.array(header[field_name], schema.field(target).type)
            out.columns["_cdc_changed_fields"] = _name_lists(decoded.changed)
            out.columns["_cdc_nulled_fields"] = _name_lists(decoded.nulled)
            out.columns["_cdc_diff_fields"] = _name_lists(decoded.diffed)
        values = decoded.columns
        for column, (source, build) in zip(self.names, self.columns, strict=True):
            out.columns[column] = build(values[source] if source is not None else [], n)
        return out.batch()

    def _good(
        self,
        schema: pa.Schema,
        bronze: pa.RecordBatch,
        decoded: Decoded,
        bitmaps: dict[str, pa.Array],
    ) -> pa.RecordBatch:
        n = bronze.num_rows
        out = _Out(schema, bronze)
        out.columns["_cdc_entity"] = pa.array([self.entity] * n, pa.string())
        header = decoded.header
        if self.schema.is_change_event:
            if "recordIds" in header:
                out.columns["_cdc_record_ids"] = _cast_or_convert(
                    header["recordIds"], _arrow(_STRINGS)
                )
            for field_name, target in _HEADER_SCALARS:
                if field_name in header:
                    out.columns[target] = _cast_or_convert(
                        header[field_name], schema.field(target).type
                    )
            out.columns.update(bitmaps)
        values = decoded.columns
        for column, (source, build) in zip(self.names, self.columns, strict=True):
            out.columns[column] = _from_arrow(build, values[source] if source else None, n)
        return out.batch()


def _drop(decoded: DecodedBatch, bad: set[int]) -> DecodedBatch:
    keep = [k for k in range(len(decoded)) if k not in bad]

    def pick(column: list[Any]) -> list[Any]:
        return [column[k] for k in keep]

    return DecodedBatch(
        schema_id=decoded.schema_id,
        header={name: pick(col) for name, col in decoded.header.items()},
        columns={name: pick(col) for name, col in decoded.columns.items()},
        changed=pick(decoded.changed),
        nulled=pick(decoded.nulled),
        diffed=pick(decoded.diffed),
        row_index=pick(decoded.row_index),
        errors=decoded.errors,
    )


_BITMAP_COLUMNS = (
    ("changedFields", "_cdc_changed_fields"),
    ("nulledFields", "_cdc_nulled_fields"),
    ("diffFields", "_cdc_diff_fields"),
)


def _take(value: Column, keep: np.ndarray) -> Column:
    if isinstance(value, UnionColumn):
        return value.take(keep)
    return value.take(pa.array(keep, pa.int64()))


def _cast_or_convert(value: pa.Array, arrow_type: pa.DataType) -> pa.Array:
    """A header column in the output's type: cast, or through its values where a cast
    does not do what ``pa.array(values, arrow_type)`` does."""
    if value.type == arrow_type:
        return value
    try:
        return value.cast(arrow_type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return pa.array(to_pylist(value), arrow_type)


def _from_arrow(build: _Column, value: Column | None, n: int) -> pa.Array:
    """What ``build`` makes of a decoded column, from its Arrow form: the common cases
    straight from the arrays, anything else through the same values as the row decoder's."""
    fast = getattr(build, "arrow", None)
    if fast is not None:
        result = fast(value, n)
        if result is not None:
            return result
    return build([] if value is None else to_pylist(value), n)


def _name_lists(values: list[tuple[str, ...]]) -> pa.Array:
    """Expanded bitmaps as list<string>. A stream repeats a handful of distinct bitmaps, so
    each distinct one is converted once and the column gathered from them."""
    index: dict[tuple[str, ...], int] = {}
    positions = [index.setdefault(v, len(index)) for v in values]
    distinct = pa.array(list(index), pa.list_(pa.string()))
    return distinct.take(pa.array(positions, pa.int32()))


class _Build:
    """A column builder: ``build(values, n)`` from the row decoder's values, and ``arrow``
    (value, n) from the columnar decoder's array, or None where that needs the values."""

    def __init__(
        self,
        build: Callable[[list[Any], int], pa.Array],
        arrow: Callable[[Column | None, int], pa.Array | None],
    ) -> None:
        self.build = build
        self.arrow = arrow

    def __call__(self, values: list[Any], n: int) -> pa.Array:
        return self.build(values, n)


def _no_arrow(_value: Column | None, _n: int) -> None:
    return None


def _cast(value: Column | None, arrow_type: pa.DataType) -> pa.Array | None:
    """``value`` as ``pa.array(value.to_pylist(), arrow_type)`` makes it, where a cast gives
    the same: same type, int widened to long, a number to double."""
    if not isinstance(value, pa.Array):
        return None
    if value.type == arrow_type:
        return value
    if pa.types.is_integer(value.type) and (
        pa.types.is_int64(arrow_type) or pa.types.is_float64(arrow_type)
    ):
        # Python's int -> float rounds to nearest, as this cast does (safe=False: no check
        # that the value is exact).
        return value.cast(arrow_type, safe=False)
    if pa.types.is_float32(value.type) and pa.types.is_float64(arrow_type):
        return value.cast(arrow_type)
    return None


def _nulls(arrow_type: pa.DataType) -> _Column:
    return _Build(
        lambda _values, n: pa.nulls(n, arrow_type), lambda _value, n: pa.nulls(n, arrow_type)
    )


def _leaf(arrow_type: pa.DataType, target: LeafKind, source: LeafKind) -> _Column:
    if target == "double" and source in ("int", "long"):
        # An integer widened to a double rounds to the nearest one, as Arrow's cast does on
        # the columnar path (pa.array refuses an integer beyond 2**53 it cannot hold exactly).
        return _Build(
            lambda values, _n: pa.array(values, pa.int64()).cast(arrow_type, safe=False),
            lambda value, _n: _cast(value, arrow_type),
        )
    if source != "json" and (
        target == source
        or (target not in ("string", "json") and source not in ("string", "boolean", "binary"))
    ):
        # Same kind, or a lossless widening Arrow does on its own (int -> long; a date's
        # epoch ms as a timestamp's). A "json" value (a record, or a list) is always
        # written as text, even into a column of that kind.
        return _Build(
            lambda values, _n: pa.array(values, arrow_type),
            lambda value, _n: _cast(value, arrow_type),
        )
    text = _text(source)
    return _Build(
        lambda values, _n: pa.array([None if v is None else text(v) for v in values], arrow_type),
        _no_arrow,
    )


def _branch_value(arrow_type: pa.DataType, target: LeafKind) -> _Column:
    text = _text("json")

    def build(values: list[Any], _n: int) -> pa.Array:
        if target == "string":
            return pa.array([v if v.__class__ is str else None for v in values], arrow_type)
        return pa.array(
            [None if v is None or v.__class__ is dict else text(v) for v in values], arrow_type
        )

    def arrow(value: Column | None, _n: int) -> pa.Array | None:
        if target != "string" or not isinstance(value, UnionColumn):
            return None
        strings = [v for v, t in zip(value.values, value.types, strict=True) if t == "string"]
        return _cast(strings[0], arrow_type) if len(strings) == 1 else None

    return _Build(build, arrow)


def _converting_children(f: FieldLayout, info: FieldInfo) -> dict[str, Callable[[Any], Any]]:
    """Children whose values this version writes in another kind than the column's (as
    text, or an integer as a double), and children whose values are written as JSON text (a
    record, or a list)."""
    out: dict[str, Callable[[Any], Any]] = {}
    for c in info.children:
        target = f.child(c.name).kind
        source: LeafKind = "json" if c.children else leaf_kind(c)
        if source == "json" or (target in ("string", "json") and source != "string"):
            out[c.name] = _text(source)
        elif target == "double" and source in ("int", "long"):
            out[c.name] = float  # rounds to the nearest double, as the columnar path's cast
    return out


def _struct(value: Column | None, arrow_type: pa.DataType) -> pa.Array | None:
    """A decoded record column as ``pa.array(records, arrow_type)`` makes it from the
    records: children in the column's order and types, missing ones null."""
    if not isinstance(value, pa.StructArray):
        return None
    have = {f.name: i for i, f in enumerate(value.type)}
    if len(have) != value.type.num_fields:
        return None
    n = len(value)
    children = []
    for f in arrow_type:
        i = have.pop(f.name, None)
        if i is None:
            children.append(pa.nulls(n, f.type))
            continue
        # field() (not flatten()) keeps the child's own values under null records: they
        # are null there too, as the decoder leaves them.
        child = _cast(value.field(i), f.type)
        if child is None:
            return None
        children.append(child)
    if have:  # a child the column does not have
        return None
    mask = value.is_null() if value.null_count else None
    return pa.StructArray.from_arrays(children, fields=list(arrow_type), mask=mask)


def _records(arrow_type: pa.DataType, f: FieldLayout, info: FieldInfo) -> _Column:
    convert = _converting_children(f, info)
    if not convert:
        # A dict per value, missing children become nulls: pyarrow does it in C++.
        return _Build(
            lambda values, _n: pa.array(values, arrow_type),
            lambda value, _n: _struct(value, arrow_type),
        )

    def build(values: list[Any], _n: int) -> pa.Array:
        fixed = [
            None
            if v is None
            else {k: (convert[k](x) if k in convert and x is not None else x) for k, x in v.items()}
            for v in values
        ]
        return pa.array(fixed, arrow_type)

    if all(c is float for c in convert.values()):
        # Integers widened to doubles: the decoded record column's cast does the same.
        return _Build(build, lambda value, _n: _struct(value, arrow_type))
    return _Build(build, _no_arrow)


def _branch_record(arrow_type: pa.DataType, f: FieldLayout, info: FieldInfo) -> _Column:
    records = _records(arrow_type, f, info)

    def build(values: list[Any], n: int) -> pa.Array:
        return records([v if v.__class__ is dict else None for v in values], n)

    def arrow(value: Column | None, n: int) -> pa.Array | None:
        if not isinstance(value, UnionColumn) or not isinstance(records, _Build):
            return None
        kinds = [
            (v, t)
            for v, t in zip(value.values, value.types, strict=True)
            if isinstance(t, dict) and t.get("type") in ("record", "error")
        ]
        if len(kinds) != 1:
            return None
        return records.arrow(kinds[0][0], n)

    return _Build(build, arrow)
