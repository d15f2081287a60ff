"""sfcdc's bookkeeping tables exist, empty, from the first run of the layer that owns them
(:mod:`pipelines.bookkeeping`), on both engines.

Before: ``gold.sfcdc_resync`` appeared with the first gap event, so README's re-sync query
failed with TABLE_OR_VIEW_NOT_FOUND on any lake without a gap."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from pipelines import cli
from pipelines.bookkeeping import BookkeepingTable
from pipelines.bronze.bookkeeping import BOOKKEEPING as BRONZE
from pipelines.engines import LakeEngine, TableRef
from pipelines.gold.resync import RESYNC_TABLE
from pipelines.gold.tables import BOOKKEEPING as GOLD
from pipelines.session import engine_for
from pipelines.silver.tables import BOOKKEEPING as SILVER
from pipelines.spec import load_conf
from tests.integration.cli.doc_queries import ROOT, bundle_queries, named_tables

pytestmark = pytest.mark.integration

LAYERS: dict[str, tuple[BookkeepingTable, ...]] = {"bronze": BRONZE, "silver": SILVER, "gold": GOLD}
DECLARED = {str(t.table) for tables in LAYERS.values() for t in tables}


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
