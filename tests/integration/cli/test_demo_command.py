"""`sfcdc demo`: a fresh lake from the in-process emulator over TLS with an OAuth login, one
pipeline run, and a summary whose figures agree with the tables. On the local engine the demo
starts no Spark session: its queries are answered as a one-shot `sfcdc sql` answers them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from deltalake import DeltaTable

from pipelines import cli

pytestmark = pytest.mark.integration


def test_demo_prints_the_summary_and_example_queries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "demo"
    (directory / "lake").mkdir(parents=True)
    (directory / "lake" / "stale").write_text("replaced by a fresh lake")
    (directory / "mine.txt").write_text("left alone")
    code = cli.main(["demo", "--events", "600", "--seed", "3", "--dir", str(directory)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert (directory / "mine.txt").read_text() == "left alone"
    assert not (directory / "lake" / "stale").exists()
    # TLS was on: the emulator generated its CA and the pipeline verified against it.
    assert (directory / "emulator" / "tls").is_dir()
    lake = directory / "lake"
    for topic, table in (
        ("/data/AccountChangeEvent", "account_change_event"),
        ("/data/OpportunityChangeEvent", "opportunity_change_event"),
        ("/data/Invoice__ChangeEvent", "invoice__change_event"),
        ("/event/Order_Shipped__e", "order_shipped__e"),
    ):
        n = DeltaTable(str(lake / "bronze" / table)).to_pyarrow_table(columns=["event_id"]).num_rows
        assert re.search(rf"{re.escape(topic)}\s+{n} events -> bronze.{table}", out), out
    gold = DeltaTable(str(lake / "gold" / "account")).to_pyarrow_table(columns=["_cdc_is_deleted"])
    deleted = sum(gold["_cdc_is_deleted"].to_pylist())
    assert re.search(rf"Account\s+{gold.num_rows} records -> gold.account \({deleted} deleted", out)
    assert "quarantined rows: 0; open re-sync rows: " in out
    changes = re.search(r"changes in silver: (.*); (\d+) with long-text diffs", out)
    assert changes is not None, out
    for kind in ("CREATE", "UPDATE", "DELETE", "GAP_"):
        assert kind in changes.group(1)
    for title in (
        "Top accounts by annual revenue",
        "Open opportunities by stage",
        "Records needing re-sync",
        "Change history of the most changed account",
    ):
        assert f"-- {title}" in out
    assert out.count(" rows)") + out.count(" row)") >= 4
    # one re-sync row per gap event: records and events are counted apart
    assert re.search(r"object\s+\|\s+reason\s+\|\s+records\s+\|\s+events", out), out
    assert "CREATE" in out and "UPDATE" in out
    assert f"sfcdc sql --conf {directory / 'conf'}" in out or "sfcdc sql --conf" in out
