"""Assertions shared by the gold tests: projections of engine rows compared row by row."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from pipelines.engines import LakeEngine, Rows


def assert_rows(
    engine: LakeEngine,
    actual: Rows | pa.Table,
    columns: Sequence[str],
    expected: Iterable[Sequence[Any]],
) -> None:
    """``actual`` (rows of ``engine``, or Arrow) projected on ``columns`` holds exactly
    ``expected`` (any row order). A struct value is expected as the tuple of its children's
    values, or as a dict of them."""
    projected = engine.to_arrow(actual).select(list(columns))
    types = [projected.schema.field(c).type for c in columns]
    got = [
        tuple(_plain(row[c], t) for c, t in zip(columns, types, strict=True))
        for row in projected.to_pylist()
    ]
    wanted = [tuple(_plain(v, t) for v, t in zip(row, types, strict=True)) for row in expected]
    assert sorted(got, key=repr) == sorted(wanted, key=repr)


def _plain(value: Any, type_: pa.DataType) -> Any:
    """A value as comparable plain Python: structs as tuples in field order, instants in
    UTC."""
    if value is None:
        return None
    if pa.types.is_struct(type_):
        fields = [type_.field(i) for i in range(type_.num_fields)]
        if isinstance(value, Mapping):
            return tuple(_plain(value.get(f.name), f.type) for f in fields)
        return tuple(_plain(v, f.type) for v, f in zip(value, fields, strict=True))
    if pa.types.is_list(type_) or pa.types.is_large_list(type_):
        return [_plain(v, type_.value_type) for v in value]
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(timezone.utc)
    return value
