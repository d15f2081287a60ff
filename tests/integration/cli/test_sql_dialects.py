"""Every example query the demo and the docs print gives the same rows whichever engine
answers it: DataFusion (a one-shot ``sfcdc sql`` on the local engine) and Spark SQL (the
interactive prompt, ``--spark-sql``, the spark engine). A query naming a table the lake does
not have fails on both."""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from pipelines.commands.demo import EXAMPLES
from pipelines.commands.sql import QueryError, Result, SqlShell, shell
from pipelines.session import engine_for
from pipelines.spec import load_conf
from tests.integration.cli.conftest import FilledLake

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[3]


def example_queries() -> list[tuple[str, str]]:
    """(where, query) for every query the docs and the demo print."""
    found = [(f"demo: {e.title}", e.sql) for e in EXAMPLES]
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        for block in re.findall(r"```sql\n(.*?)```", text, re.DOTALL):
            found.extend((path.name, q.strip()) for q in block.split(";") if q.strip())
        # `sfcdc sql "SELECT ..."` commands (not placeholders such as "<query>").
        commands = re.findall(r'sfcdc sql[^"\n]* "(SELECT [^"]+)"', text, re.IGNORECASE)
        found.extend((path.name, q) for q in commands)
    return found


def _value(value: Any) -> Any:
    if hasattr(value, "asDict"):  # a Spark Row (struct)
        value = value.asDict()
    if isinstance(value, dict):
        return tuple(sorted((k, _value(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_value(v) for v in value)
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(timezone.utc).replace(tzinfo=None)
    if isinstance(value, float):
        return float(f"{value:.9g}") if math.isfinite(value) else value
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def _rows(result: Result, ordered: bool) -> list[Any]:
    rows = [tuple(_value(v) for v in row) for row in result.rows]
    return rows if ordered else sorted(rows, key=repr)


def test_examples_are_found() -> None:
    where = {w.split(":")[0] for w, _ in example_queries()}
    assert {"demo", "README.md", "querying.md", "operations.md", "gold.md"} <= where


@pytest.mark.parametrize("filled_lake", ["local"], indirect=True)
def test_every_example_query_gives_the_same_rows_on_both_engines(
    filled_lake: FilledLake,
) -> None:
    conf = load_conf(filled_lake.conf)
    engine = engine_for(conf.pipeline.lake)
    datafusion = SqlShell(engine, arrow=True)
    spark_sql = shell(conf)
    # The shared Spark session may still know tables of another test's lake by the same names:
    # a query naming a table this lake lacks must fail on DataFusion, whatever Spark says.
    lake = {f"{t.layer}.{t.name}".lower() for t in engine.tables()}
    compared = 0
    for where, query in example_queries():
        named = {m.lower() for m in re.findall(r"\b(?:bronze|silver|gold)\.\w+", query, re.I)}
        if named - lake:
            with pytest.raises(QueryError, match="not found"):
                datafusion.query(query)
            continue
        try:
            expected = spark_sql.query(query)
        except QueryError as exc:
            assert "TABLE_OR_VIEW_NOT_FOUND" in str(exc), f"{where}: {query}\n{exc}"
            with pytest.raises(QueryError, match="not found"):
                datafusion.query(query)
            continue
        got = datafusion.query(query)
        ordered = re.search(r"\bORDER\s+BY\b", query, re.IGNORECASE) is not None
        assert _rows(got, ordered) == _rows(expected, ordered), f"{where}: {query}"
        assert len(got.columns) == len(expected.columns)
        compared += 1
    assert compared >= 12
