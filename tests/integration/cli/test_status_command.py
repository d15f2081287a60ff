"""`sfcdc status` on a lake filled by `sfcdc run --once`: checkpoints and counts agree with
the tables, and every layer is caught up."""

from __future__ import annotations

import json

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pipelines import cli
from tests.integration.cli.conftest import FilledLake

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_status_json_agrees_with_the_tables(
    filled_lake: FilledLake, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["-q", "status", "--conf", str(filled_lake.conf), "--format", "json"])
    status = json.loads(capsys.readouterr().out)
    assert code == 0
    lake = filled_lake.lake
    checkpoints = DeltaTable(str(lake / "bronze" / "sfcdc_checkpoints")).to_pyarrow_table()
    topics = {t["topic"]: t for t in status["topics"]}
    assert set(topics) == {
        "/data/AccountChangeEvent",
        "/data/ContactChangeEvent",
        "/event/Order_Shipped__e",
    }
    for name, topic in topics.items():
        table = topic["bronze_table"].split(".")[1]
        rows = DeltaTable(str(lake / "bronze" / table)).to_pyarrow_table(columns=["event_id"])
        assert topic["events_landed"] == rows.num_rows > 0
        mine = checkpoints.filter(pc.equal(checkpoints["topic"], name))
        last = max(mine.to_pylist(), key=lambda r: r["batch_id"])
        assert topic["batch_id"] == last["batch_id"]
        assert topic["replay_id"] == last["replay_id"].hex()
        assert topic["kind"] == last["kind"]
        assert topic["replay_gaps"] == 0 and topic["quarantined"] == 0
    objects = {o["object"]: o for o in status["objects"]}
    for name in ("Account", "Contact"):
        obj = objects[name]
        assert obj["bronze_lag"] == 0 and obj["silver_lag"] == 0
        assert obj["gold_version"] is not None and obj["silver_applied"] == obj["silver_version"]
    assert objects["Order_Shipped__e"]["gold_table"] is None
    resync = DeltaTable(str(lake / "gold" / "sfcdc_resync")).to_pyarrow_table()
    open_rows = resync.filter(pc.is_null(resync["resolved_at"])).to_pylist()
    for name in ("Account", "Contact"):
        records = {r["record_id"] for r in open_rows if r["object"] == name and r["record_id"]}
        assert objects[name]["resync_records"] == len(records)


def test_status_text(filled_lake: FilledLake, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["-q", "status", "--conf", str(filled_lake.conf)])
    out = capsys.readouterr().out
    assert code == 0
    assert "/data/AccountChangeEvent -> bronze.account_change_event" in out
    assert "events landed; batch " in out
    assert "Account: silver.account" in out and "lag 0" in out
    assert "Order_Shipped__e: silver.order_shipped" in out and "no gold (platform event)" in out


def test_status_of_an_empty_lake(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    from pathlib import Path

    from tests.integration.cli.conftest import write_conf

    conf = write_conf(Path(str(tmp_path)))
    assert cli.main(["-q", "status", "--conf", str(conf)]) == 0
    out = capsys.readouterr().out
    assert "0 events landed; no checkpoint yet" in out
    assert "silver.account v- (bronze up to v-, lag -)" in out
