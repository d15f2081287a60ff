"""sfcdc's bookkeeping tables exist, empty, from the first run of the layer that owns them
(:mod:`pipelines.bookkeeping`), on both engines; so every query README, docs/querying.md, the
dashboard and the alerts show runs on a lake that has never had a gap event, and ``sfcdc demo``
works for a workload of any size.

Before: ``gold.sfcdc_resync`` appeared with the first gap event, so ``sfcdc demo --events 1``
(and 100, and 500) ended with TABLE_OR_VIEW_NOT_FOUND, as did README's re-sync query on any lake
without a gap."""

from __future__ import annotations

import contextlib
import io
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pipelines import cli
from pipelines.bookkeeping import BookkeepingTable
from pipelines.bronze.bookkeeping import BOOKKEEPING as BRONZE
from pipelines.commands.demo import EXAMPLES
from pipelines.commands.sql import shell
from pipelines.engines import LakeEngine, TableRef
from pipelines.gold.resync import RESYNC_TABLE
from pipelines.gold.tables import BOOKKEEPING as GOLD
from pipelines.session import engine_for
from pipelines.silver.tables import BOOKKEEPING as SILVER
from pipelines.spec import load_conf
from tests.integration.cli.doc_queries import ROOT, bundle_queries, markdown_queries, named_tables

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

LAYERS: dict[str, tuple[BookkeepingTable, ...]] = {"bronze": BRONZE, "silver": SILVER, "gold": GOLD}
DECLARED = {str(t.table) for tables in LAYERS.values() for t in tables}
_ROWS = re.compile(r"^\((\d+) rows?\)$", re.M)


def _tables(layer: str) -> set[TableRef]:
    return {t.table for t in LAYERS[layer]}


def test_every_bookkeeping_table_the_documents_name_is_declared() -> None:
    documents = [
        ROOT / "README.md",
        ROOT / "conf" / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "notebooks").glob("*.py")),
    ]
    named = {
        (path.relative_to(ROOT).as_posix(), name.lower())
        for path in documents
        for name in re.findall(r"\b(?:bronze|silver|gold)\.sfcdc_\w+", path.read_text())
    }
    named |= {
        (where, name)
        for where, sql in bundle_queries()
        for name in named_tables(sql)
        if name.split(".", 1)[1].startswith("sfcdc_")
    }
    assert {"gold.sfcdc_resync", "silver.sfcdc_quarantine", "bronze.sfcdc_commits"} <= {
        name for _, name in named
    }
    undeclared = sorted(f"{where}: {name}" for where, name in named if name not in DECLARED)
    assert not undeclared, (
        "tables the documents name that no layer creates on its first run; add each to the "
        "BOOKKEEPING of the layer that writes it (see pipelines/bookkeeping.py):\n"
        + "\n".join(undeclared)
    )


# ---------------------------------------------------------- every layer, both engines


def _conf(root: Path, engine: str, objects: dict[str, str]) -> Path:
    conf = root / "conf"
    (conf / "objects").mkdir(parents=True)
    (conf / "pipeline.yml").write_text(
        textwrap.dedent(
            f"""\
            connection:
              emulator:
                state_dir: ./emulator
                keepalive_seconds: 0.3
                workload: {{events: 0, platform_events: 0}}
            lake: {{engine: {engine}, location: ./lake}}
            defaults:
              batching: {{max_age_seconds: 0.2}}
            """
        )
    )
    for name, text in objects.items():
        (conf / "objects" / f"{name}.yml").write_text(text)
    return conf


def _present(engine: LakeEngine) -> set[TableRef]:
    return {t.table for tables in LAYERS.values() for t in tables if engine.exists(t.table)}


def _counts(
    conf: Path, tables: set[TableRef], capsys: pytest.CaptureFixture[str]
) -> dict[str, int]:
    """Rows of each of ``tables``, by one one-shot ``sfcdc sql`` (a query on any of them must
    not fail)."""
    query = " UNION ALL ".join(
        f"SELECT '{table}' AS name, count(*) AS n FROM {table}" for table in sorted(tables, key=str)
    )
    capsys.readouterr()
    code = cli.main(["sql", "--conf", str(conf), "--format", "csv", query])
    out, err = capsys.readouterr()
    assert code == 0, err
    return {name: int(n) for name, n in (line.split(",") for line in out.splitlines()[1:])}


def test_silver_and_gold_create_their_bookkeeping_tables_on_their_first_run(
    lake_kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    objects = {
        "account": "object: Account\nkind: change_events\n",
        "order_shipped": "object: Order_Shipped__e\nkind: platform_event\n",
    }
    conf = _conf(tmp_path, lake_kind, objects)
    engine = engine_for(load_conf(conf).pipeline.lake)
    assert _present(engine) == set()

    assert cli.main(["-q", "silver", "--conf", str(conf)]) == 0
    assert _present(engine) == _tables("silver")
    versions = {t: engine.version(t) for t in _tables("silver")}
    # A second run finds them and commits nothing.
    assert cli.main(["-q", "silver", "--conf", str(conf)]) == 0
    assert {t: engine.version(t) for t in _tables("silver")} == versions

    assert cli.main(["-q", "gold", "--conf", str(conf)]) == 0
    assert _present(engine) == _tables("silver") | _tables("gold")
    # (The first landing's, on both engines: tests/integration/bronze/test_landing.py.)

    # Empty, and a query on each finds no rows rather than no table.
    counts = _counts(conf, _present(engine), capsys)
    assert counts == {str(t): 0 for t in _present(engine)}


def test_the_streaming_api_runs_create_their_layers_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pushtopic = (
        "kind: streaming_api\nchannel: /topic/InvoiceUpdates\npushtopic:\n"
        "  manage: create_or_update\n  query: SELECT Id, Name, Status__c FROM Invoice__c\n"
    )
    conf = _conf(tmp_path, "local", {"invoice_updates": pushtopic})
    engine = engine_for(load_conf(conf).pipeline.lake)
    assert cli.main(["-q", "streaming", "ingest", "--conf", str(conf), "--once"]) == 0
    assert _present(engine) == _tables("bronze")
    assert cli.main(["-q", "streaming", "silver", "--conf", str(conf)]) == 0
    assert cli.main(["-q", "streaming", "gold", "--conf", str(conf)]) == 0
    assert _present(engine) == _tables("bronze") | _tables("silver") | _tables("gold")
    assert _counts(conf, {RESYNC_TABLE}, capsys) == {str(RESYNC_TABLE): 0}


# ------------------------------------------------ the demo, and every documented query


@dataclass(frozen=True)
class Demo:
    events: int
    conf: Path
    code: int
    out: str


@pytest.fixture(scope="module", params=[1, 100], ids=lambda n: f"events={n}")
def demo(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Demo:
    events = int(request.param)
    directory = tmp_path_factory.mktemp(f"demo-{events}")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["demo", "--events", str(events), "--dir", str(directory)])
    return Demo(events, directory / "conf", code, out.getvalue())


def _gap_free(demo: Demo) -> None:
    """The lake has had no gap or overflow event (what these tests are about)."""
    engine = engine_for(load_conf(demo.conf).pipeline.lake)
    assert engine.read_arrow(RESYNC_TABLE).num_rows == 0
    for table in engine.tables():
        schema = engine.schema(table)
        if table.layer == "silver" and schema and "_cdc_change_type" in schema.fieldNames():
            kinds = engine.read_arrow(table, columns=["_cdc_change_type"]).column(0)
            assert not any(k.startswith("GAP_") for k in kinds.to_pylist() if k), table


def test_the_demo_adapts_to_what_the_workload_made(demo: Demo) -> None:
    assert demo.code == 0, demo.out
    assert "sfcdc demo: pipeline ran once" in demo.out
    assert "quarantined rows: 0; open re-sync rows: 0" in demo.out
    _gap_free(demo)
    present = {str(t).lower() for t in engine_for(load_conf(demo.conf).pipeline.lake).tables()}
    shown = 0
    for example in EXAMPLES:
        missing = [t for t in example.tables if t.lower() not in present]
        if missing:
            # An object the workload made no events for has no table: said, not a traceback.
            assert f"-- {example.title}\n(not run: no {' or '.join(missing)};" in demo.out
        else:
            assert f"-- {example.title}\n{example.sql}\n" in demo.out, demo.out
            shown += 1
    assert len(_ROWS.findall(demo.out)) == shown
    # The re-sync example names a bookkeeping table only: it always runs, and finds nothing.
    resync = next(e for e in EXAMPLES if "sfcdc_resync" in e.sql)
    assert f"{resync.sql}\nobject" in demo.out and "(0 rows)" in demo.out
    if demo.events == 1:
        assert shown < len(EXAMPLES)
    else:
        assert "-- Top accounts by annual revenue (gold: current state)\nSELECT" in demo.out
    # Where it stands: every object current, those without events too (nothing to apply).
    status = io.StringIO()
    with contextlib.redirect_stdout(status):
        assert cli.main(["status", "--conf", str(demo.conf), "--check"]) == 0
    objects = re.findall(r"^  (OK|WARN|FAIL) +(\S+): (.*)$", status.getvalue(), re.M)
    assert len(objects) == 6 and all(state == "OK" for state, _, _ in objects), status.getvalue()
    # What it suggests exploring exists.
    suggested = re.search(
        r'Explore further: +sfcdc sql --conf \S+ "SELECT \* FROM (\S+)"',
        demo.out,
    )
    assert suggested is not None, demo.out
    assert cli.main(["-q", "sql", "--conf", str(demo.conf), f"SELECT * FROM {suggested[1]}"]) == 0


def test_every_documented_query_runs_on_a_lake_without_gap_events(
    demo: Demo, capsys: pytest.CaptureFixture[str]
) -> None:
    _gap_free(demo)
    engine = engine_for(load_conf(demo.conf).pipeline.lake)
    present = {str(t).lower() for t in engine.tables()}
    queries = [
        (path, sql)
        for path in ("README.md", "docs/querying.md")
        for sql in markdown_queries(ROOT / path)
    ]
    assert len(queries) >= 9
    ran = 0
    for where, sql in queries:
        capsys.readouterr()
        code = cli.main(["sql", "--conf", str(demo.conf), sql])
        out, err = capsys.readouterr()
        missing = named_tables(sql) - present
        # Only an object the workload made no events for may lack its table.
        assert not {m for m in missing if m.split(".", 1)[1].startswith("sfcdc_")}, (where, sql)
        if missing:
            assert code == 1 and "not found" in err, f"{where}: {sql}\n{out}{err}"
            continue
        assert code == 0, f"{where}: {sql}\n{err}"
        assert _ROWS.search(out), f"{where}: {sql}\n{out}"
        ran += 1
    if demo.events >= 100:
        assert ran == len(queries)


@pytest.mark.spark
@pytest.mark.parametrize("demo", [1], indirect=True, ids=["events=1"])
def test_the_dashboards_and_alerts_run_on_a_lake_without_gap_events(
    demo: Demo, few_partitions: SparkSession
) -> None:
    # On Databricks they run on Databricks SQL: Spark SQL is the judge here.
    _gap_free(demo)
    sql = shell(load_conf(demo.conf))
    queries = bundle_queries()
    assert len(queries) >= 6
    for where, query in queries:
        result = sql.query(query)  # a QueryError fails the test with its reason
        assert result.columns, where
