"""Silver's row shaping on decoded Arrow batches, where they were decoded.

:func:`shape_batch` turns one batch of :func:`~pipelines.silver.decode.decoded_schema` rows
into silver rows: record ids fanned out (change events: one row per record id, with
``_cdc_record_count`` and ``_cdc_is_wildcard``; an event without ids, such as a
GAP_OVERFLOW, stays one row with a null ``Id``), epoch milliseconds turned into DATE /
TIMESTAMP / time text (dates floor to their UTC day; times are computed from the number, so
no time zone can shift them), compounds flattened when the object asks for it, the silver
columns in table order, then the error columns.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.silver.columns import ID_COLUMN, LeafKind, SilverLayout

__all__ = ["ERROR_TYPES", "shape_batch", "shaped_schema", "shaped_struct"]

# The error columns after the silver columns (see quarantine.ERROR_COLUMNS).
ERROR_TYPES: tuple[tuple[str, T.DataType], ...] = (
    ("_cdc_error", T.StringType()),
    ("_cdc_error_kind", T.StringType()),
    ("_cdc_payload", T.BinaryType()),
)
_RECORD_IDS = "_cdc_record_ids"
_COMMIT_TIMESTAMP = "_cdc_commit_timestamp"
_MS_PER_DAY = 86_400_000
_TIMESTAMP = pa.timestamp("us", tz="UTC")
# Below 2**53 milliseconds, float division floors to the integer quotient.
_EXACT = 2**53


def shaped_struct(layout: SilverLayout) -> T.StructType:
    """What :func:`shape_batch` returns, as a Spark schema: the silver table's columns, then
    the error columns."""
    fields = [*layout.silver_schema().fields, *(T.StructField(n, t) for n, t in ERROR_TYPES)]
    return T.StructType(fields)


def shaped_schema(layout: SilverLayout) -> pa.Schema:
    """:func:`shaped_struct` in the Arrow types Delta stores."""
    return spark_schema_to_arrow(shaped_struct(layout))


def shape_batch(layout: SilverLayout, batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """Decoded rows -> silver rows followed by the error columns, in ``target``
    (:func:`shaped_schema` of ``layout``). A row that could not be decoded keeps its error
    columns and, like a GAP_OVERFLOW event, becomes one row with a null ``Id``."""
    columns: dict[str, pa.Array] = dict(zip(batch.schema.names, batch.columns, strict=True))
    if layout.change_events:
        columns = _fan_out(columns)
    _convert_epochs(columns, layout)
    if layout.compounds == "flattened":
        _flatten(columns, layout)
    missing = [f.name for f in target if f.name not in columns]
    if missing:
        raise ValueError(
            f"{layout.entity}: silver columns {missing} are missing from the decoded rows "
            f"(got {list(columns)})"
        )
    arrays = []
    for f in target:
        array = columns[f.name]
        arrays.append(array if array.type == f.type else array.cast(f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=target)


def _fan_out(columns: dict[str, pa.Array]) -> dict[str, pa.Array]:
    """One row per record id; a row without ids (null or empty list) stays as one row with a
    null ``Id`` (Spark's ``explode_outer``)."""
    ids = columns.pop(_RECORD_IDS)
    lengths = pc.fill_null(pc.list_value_length(ids), 0).cast(pa.int32())
    values = pc.list_flatten(ids)
    parents = pc.list_parent_indices(ids).cast(pa.int64())
    empty = pc.indices_nonzero(pc.equal(lengths, 0)).cast(pa.int64())
    if len(empty):
        # Rows without ids slot in among the others, in row order (a stable sort).
        parents = pa.concat_arrays([parents, empty])
        values = pa.concat_arrays([values, pa.nulls(len(empty), values.type)])
        order = pc.sort_indices(parents)
        parents = parents.take(order)
        values = values.take(order)
    out: dict[str, pa.Array] = {ID_COLUMN: values}
    out["_cdc_is_wildcard"] = pc.fill_null(pc.ends_with(values, "*"), False)
    if len(values) == len(lengths):  # one id per row: nothing to repeat
        out["_cdc_record_count"] = lengths
        out.update(columns)
        return out
    out["_cdc_record_count"] = lengths.take(parents)
    for name, array in columns.items():
        out[name] = array.take(parents)
    return out


def _timestamp(array: pa.Array) -> pa.Array:
    return pc.multiply_checked(array.cast(pa.int64()), 1000).cast(_TIMESTAMP)


def _date(array: pa.Array) -> pa.Array:
    # As Spark computes it: a double division floored, so dates before 1970 stay on their day.
    days = pc.floor(pc.divide(array.cast(pa.float64()), float(_MS_PER_DAY)))
    return days.cast(pa.int32()).cast(pa.date32())


def _java_rem(x: int, y: int) -> int:
    # Spark's % takes the sign of the dividend, unlike Python's.
    r = abs(x) % y
    return r if x >= 0 else -r


def _time_text(ms: int) -> str:
    hours = math.floor(ms / 3_600_000)
    minutes = _java_rem(math.floor(ms / 60_000), 60)
    seconds = _java_rem(math.floor(ms / 1_000), 60)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}.{_java_rem(ms, 1000):03d}"


def _time(array: pa.Array) -> pa.Array:
    ms = array.cast(pa.int64())
    bounds = pc.min_max(ms).as_py()
    if bounds["min"] is None:
        return pa.nulls(len(ms), pa.string())
    if bounds["min"] < 0 or bounds["max"] >= _EXACT:
        # Outside a day's range, where Spark's signs and float division show: row by row.
        return pa.array([None if v is None else _time_text(v) for v in ms.to_pylist()], pa.string())
    v = pc.fill_null(ms, 0).to_numpy()
    text = pc.binary_join_element_wise(
        _digits(v // 3_600_000, 2),
        _digits(v // 60_000 % 60, 2),
        _digits(v // 1_000 % 60, 2),
        ":",
    )
    text = pc.binary_join_element_wise(text, _digits(v % 1_000, 3), ".")
    return text if not ms.null_count else pc.if_else(ms.is_valid(), text, None)


def _digits(values: np.ndarray, width: int) -> pa.Array:
    return pc.utf8_lpad(pa.array(values).cast(pa.string()), width, "0")


_CONVERT: dict[str, Callable[[pa.Array], pa.Array]] = {
    "date": _date,
    "timestamp": _timestamp,
    "time": _time,
}


def _convert(array: pa.Array, kind: LeafKind) -> pa.Array:
    return _CONVERT[kind](array)


def _convert_epochs(columns: dict[str, pa.Array], layout: SilverLayout) -> None:
    if _COMMIT_TIMESTAMP in columns:
        columns[_COMMIT_TIMESTAMP] = _timestamp(columns[_COMMIT_TIMESTAMP])
    for name, kind in layout.epoch_columns().items():
        if name in columns:
            columns[name] = _convert(columns[name], kind)
    nested: dict[str, dict[str, LeafKind]] = {}
    for (struct, child), kind in layout.nested_epoch_columns().items():
        nested.setdefault(struct, {})[child] = kind
    for name, kinds in nested.items():
        if name not in columns:
            continue
        array = columns[name]
        assert isinstance(array, pa.StructArray)
        children = []
        fields = []
        for i, member in enumerate(array.type):
            child = pc.struct_field(array, [i])
            if member.name in kinds:
                child = _convert(child, kinds[member.name])
            children.append(child)
            fields.append(pa.field(member.name, child.type, nullable=True))
        columns[name] = pa.StructArray.from_arrays(children, fields=fields, mask=array.is_null())


def _flatten(columns: dict[str, pa.Array], layout: SilverLayout) -> None:
    """Compound structs -> one ``<Field>_<Child>`` column per child (null where the
    compound is null)."""
    for f in layout.fields:
        if f.shape == "leaf":
            continue
        struct = f.name if f.shape == "struct" else f.person_column
        array = columns.pop(struct, None)
        if array is None:
            continue
        for child in f.child_names():
            index = array.type.get_field_index(child)
            columns[f"{f.name}_{child}"] = pc.struct_field(array, [index])
