"""Every example query the demo and the docs print gives the same rows whichever engine
answers it: DataFusion (a one-shot ``sfcdc sql`` on the local engine) and Spark SQL (the
interactive prompt, ``--spark-sql``, the spark engine). A query naming a table the lake does
not have fails on both."""

from __future__ import annotations

import re

import pytest

from pipelines.commands.demo import EXAMPLES
from pipelines.commands.sql import QueryError, SqlShell, shell
from pipelines.session import engine_for
from pipelines.spec import load_conf
from tests.integration.cli.conftest import FilledLake
from tests.integration.cli.doc_queries import ROOT, comparable_rows, markdown_queries

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def example_queries() -> list[tuple[str, str]]:
    """(where, query) for every query the docs and the demo print."""
    found = [(f"demo: {e.title}", e.sql) for e in EXAMPLES]
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        found.extend((path.name, q) for q in markdown_queries(path))
    return found


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
        assert comparable_rows(got, ordered) == comparable_rows(expected, ordered), (
            f"{where}: {query}"
        )
        assert len(got.columns) == len(expected.columns)
        compared += 1
    assert compared >= 12
