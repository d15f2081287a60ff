"""Small helpers for tests that look at tables through either lake engine."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from pipelines.engines import LakeEngine, TableRef


def arrow_of(engine: LakeEngine, table: TableRef, **options: Any) -> pa.Table:
    """The table's rows as Arrow, whichever engine holds them."""
    return engine.to_arrow(engine.read(table, **options))


def rows_of(engine: LakeEngine, table: TableRef, **options: Any) -> list[dict[str, Any]]:
    """The table's rows as dicts."""
    return list(arrow_of(engine, table, **options).to_pylist())


def column_of(engine: LakeEngine, rows: Any, column: str) -> list[Any]:
    """One column of engine rows, sorted (None first)."""
    values = engine.to_arrow(rows).column(column).to_pylist()
    return sorted(values, key=lambda v: (v is not None, v))


def by_id(engine: LakeEngine, rows: Any, key: str = "Id") -> dict[Any, dict[str, Any]]:
    """Engine rows as dicts by their key."""
    return {r[key]: r for r in engine.to_arrow(rows).to_pylist()}
