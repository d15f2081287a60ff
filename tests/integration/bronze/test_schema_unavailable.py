"""An event whose schema id the server refuses (GetSchema answers INVALID_ARGUMENT
schema.meta.permission, or NOT_FOUND) still lands in bronze, exactly once, and the topic goes
on; silver quarantines it as ``schema_unavailable`` with the server's message; once GetSchema
serves the schema, ``sfcdc silver --retry-quarantine`` decodes those rows into silver once."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest

from ingest.emulator.server import Emulator
from pipelines.cli import main
from pipelines.commands.ingest import land
from pipelines.engines import LocalEngine, TableRef
from pipelines.session import engine_for
from pipelines.silver.job import QUARANTINE_TABLE, run_silver
from pipelines.spec import load_conf
from tests.integration.bronze.conftest import (
    ACCOUNT,
    ACCOUNT_OBJECT,
    ORDER_OBJECT,
    ORDERS,
    expected,
    landed,
    write_conf,
)
from tests.integration.client.conftest import fill

pytestmark = pytest.mark.integration

SILVER_ACCOUNT = TableRef("silver", "account")
SILVER_ORDERS = TableRef("silver", "order_shipped")


@pytest.mark.parametrize("refusal", ["schema.meta.permission", "schema.not.found"])
def test_a_refused_schema_lands_quarantines_and_is_retried_once(
    emulator: Emulator,
    tmp_path: Path,
    lake_kind: str,
    refusal: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    conf_dir = write_conf(
        tmp_path,
        emulator,
        engine=lake_kind,
        objects={"account": ACCOUNT_OBJECT, "order": ORDER_OBJECT},
    )
    refused = emulator.catalogue.topic(ACCOUNT).current_schema
    assert refused is not None
    emulator.faults.refuse_schema(refused.schema_id, refusal)
    fill(emulator, 30, ACCOUNT)
    fill(emulator, 10, ORDERS)

    result = land(load_conf(conf_dir), once=True)
    assert result.failed == ()
    assert landed(conf_dir, ACCOUNT) == expected(emulator, ACCOUNT)
    assert landed(conf_dir, ORDERS) == expected(emulator, ORDERS)
    reader = LocalEngine(location=tmp_path / "lake")
    failures = reader.read_arrow(TableRef("bronze", "sfcdc_schema_failures")).to_pylist()
    assert [f["schema_id"] for f in failures] == [refused.schema_id]
    assert failures[0]["error_code"].endswith(refusal)

    # The topic goes on: a later run lands the newer events too.
    fill(emulator, 5, ACCOUNT, start=30)
    land(load_conf(conf_dir), once=True)
    assert landed(conf_dir, ACCOUNT) == expected(emulator, ACCOUNT)

    conf = load_conf(conf_dir)
    engine = engine_for(conf.pipeline.lake)
    run_silver(engine, conf)
    assert reader.read_arrow(SILVER_ORDERS).num_rows == 10
    quarantine = reader.read_arrow(QUARANTINE_TABLE)
    assert quarantine.num_rows == 35
    assert set(quarantine.column("reason_kind").to_pylist()) == {"schema_unavailable"}
    assert set(quarantine.column("schema_id").to_pylist()) == {refused.schema_id}
    reason = quarantine.column("reason")[0].as_py()
    assert refusal in reason and "--retry-quarantine" in reason
    assert not reader.exists(SILVER_ACCOUNT) or reader.read_arrow(SILVER_ACCOUNT).num_rows == 0

    # Still refused: the retry says so and changes nothing.
    assert main(["-q", "silver", "--conf", str(conf_dir), "--retry-quarantine"]) == 1
    assert "still refused" in capsys.readouterr().out
    assert not reader.exists(SILVER_ACCOUNT) or reader.read_arrow(SILVER_ACCOUNT).num_rows == 0

    # GetSchema serves it again: the quarantined rows are decoded into silver, once.
    emulator.faults.refuse_schema(refused.schema_id, None)
    assert main(["-q", "silver", "--conf", str(conf_dir), "--retry-quarantine"]) == 0
    out = capsys.readouterr().out
    assert "35 quarantined rows decoded into silver (0 still open)" in out
    silver = reader.read_arrow(SILVER_ACCOUNT)
    assert silver.num_rows == 35
    assert sorted(set(silver.column("_cdc_replay_id").to_pylist())) == sorted(
        rid for rid, _ in expected(emulator, ACCOUNT)
    )
    quarantine = reader.read_arrow(QUARANTINE_TABLE)
    assert quarantine.num_rows == 35
    assert pc.sum(pc.is_valid(quarantine.column("resolved_at"))).as_py() == 35

    # Again: nothing is decoded twice, and silver's own run adds nothing either.
    assert main(["-q", "silver", "--conf", str(conf_dir), "--retry-quarantine"]) == 0
    assert reader.read_arrow(SILVER_ACCOUNT).num_rows == 35
    assert reader.read_arrow(TableRef("bronze", "sfcdc_schemas")).num_rows >= 2
