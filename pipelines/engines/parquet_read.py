"""Reads of a Delta snapshot's Parquet files with pyarrow, skipping the row groups whose
statistics rule out the conditions of the read."""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipelines.engines.base import Condition

__all__ = ["data_file", "read_parquet"]


def data_file(uri: str) -> str:
    """A local path from a file URI delta-rs lists (or the text as it is)."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme == "file":
        return urllib.parse.unquote(parsed.path)
    return uri


def read_parquet(
    files: Sequence[str],
    schema: pa.Schema,
    names: Sequence[str],
    conditions: Sequence[Condition],
    filesystem: pafs.FileSystem | None = None,
) -> pa.Table:
    """Rows of ``files`` (typed as ``schema``; columns a file lacks read as null) matching
    every condition, with the columns ``names``. Row groups whose statistics exclude a
    condition are not read. ``filesystem`` (object storage) holds ``files``, paths on it."""
    needed = list(dict.fromkeys([*names, *(column for column, _op, _v in conditions)]))
    pieces = []
    for file in files:
        source: Any = data_file(file) if filesystem is None else filesystem.open_input_file(file)
        parquet = pq.ParquetFile(source)
        metadata = parquet.metadata
        groups = [
            i
            for i in range(metadata.num_row_groups)
            if _may_match(metadata.row_group(i), conditions)
        ]
        if not groups:
            continue
        have = set(parquet.schema_arrow.names)
        part = parquet.read_row_groups(groups, columns=[c for c in needed if c in have])
        columns = [
            part.column(name).cast(schema.field(name).type)
            if name in have
            else pa.nulls(part.num_rows, schema.field(name).type)
            for name in needed
        ]
        part = pa.Table.from_arrays(columns, names=needed)
        if conditions:
            part = part.filter(_mask(part, conditions))
        pieces.append(part.select(list(names)))
    if not pieces:
        return pa.schema([schema.field(n) for n in names]).empty_table()
    return pa.concat_tables(pieces).cast(pa.schema([schema.field(n) for n in names]))


def _mask(table: pa.Table, conditions: Sequence[Condition]) -> pa.ChunkedArray:
    compare = {
        "=": pc.equal,
        "!=": pc.not_equal,
        "<": pc.less,
        "<=": pc.less_equal,
        ">": pc.greater,
        ">=": pc.greater_equal,
    }
    mask = None
    for column, op, value in conditions:
        values = table.column(column)
        if op == "in":
            test = pc.is_in(values, value_set=pa.array(value, type=values.type))
        else:
            test = compare[op](values, pa.scalar(value, type=values.type))
        mask = test if mask is None else pc.and_(mask, test)
    return pc.fill_null(mask, False)


def _may_match(row_group: Any, conditions: Sequence[Condition]) -> bool:
    """False only when the row group's min/max statistics rule out a condition."""
    positions = {row_group.column(i).path_in_schema: i for i in range(row_group.num_columns)}
    for column, op, value in conditions:
        index = positions.get(column)
        if index is None:
            continue  # a column added later: its nulls never match, but be conservative
        stats = row_group.column(index).statistics
        if stats is None or not stats.has_min_max:
            continue
        low, high = stats.min, stats.max
        try:
            if op == "in":
                if not _any_between(value, low, high):
                    return False
            elif op == "=" and (value < low or value > high):
                return False
            if (op == "<" and not low < value) or (op == "<=" and not low <= value):
                return False
            if (op == ">" and not high > value) or (op == ">=" and not high >= value):
                return False
        except TypeError:
            continue  # statistics of another type (timestamps, decimals): no pruning
    return True


def _any_between(values: Sequence[Any], low: Any, high: Any) -> bool:
    """Whether some of ``values`` lies in ``[low, high]``."""
    return any(low <= v <= high for v in values)
