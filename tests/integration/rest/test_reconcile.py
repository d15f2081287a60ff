"""``sfcdc reconcile`` end to end: events the emulator loses before storing them and records
emptied from the Recycle Bin leave gold short of the org; reconcile measures that drift with
one query of ``Id, SystemModstamp, IsDeleted`` per object, repairs it through the re-sync path
until gold equals the ground truth cell for cell, and a second run finds nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.server import Emulator, EmulatorConfig
from ingest.emulator.workload import Workload, WorkloadMix
from pipelines.cli import main
from pipelines.engines import TableRef
from pipelines.gold.resync import RESYNC_TABLE
from pipelines.reconcile import RECONCILE_TABLE
from pipelines.session import engine_for
from pipelines.spec import load_conf
from tests.integration.rest.oracle import assert_gold_equals_truth, write_conf

pytestmark = [pytest.mark.integration]

OBJECTS = {"account": "Account", "contact": "Contact"}
MIX = WorkloadMix(
    platform_event=0.0, gap=0.0, overflow=0.0, entity_weights={"Account": 1.0, "Contact": 1.0}
)


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    with Emulator(default_catalogue(), EmulatorConfig(keepalive_interval=0.2)) as running:
        running.rest.page_size = 100
        yield running


def test_reconcile_finds_and_repairs_lost_events_and_hard_deletes(
    emulator: Emulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = Workload(emulator.catalogue, seed=38, mix=MIX)
    emulator.serve_records(workload.truth)
    emulator.append(list(workload.events(600)))
    # The last changes are never stored: nothing after them will touch their records again.
    emulator.faults.lose_events(12)
    emulator.append(list(workload.events(12)))
    lost = list(emulator.faults.lost_event_ids)
    assert len(lost) == 12
    purged = workload.empty_recycle_bin("Contact", 3) + workload.empty_recycle_bin("Account", 2)
    assert purged, "the workload deleted nothing that could be emptied from the Recycle Bin"
    conf_dir = write_conf(tmp_path, emulator, OBJECTS, start="earliest", engine="local")
    conf = load_conf(conf_dir)
    engine = engine_for(conf.pipeline.lake)
    assert main(["-q", "ingest", "--once", "--conf", str(conf_dir)]) == 0
    capsys.readouterr()

    # Measuring only: drift is found and recorded, nothing is read back.
    assert main(["-q", "reconcile", "--no-repair", "--api", "rest", "--conf", str(conf_dir)]) == 0
    out = capsys.readouterr().out
    assert "drift: 0 records" not in out, out
    measured = engine.read_arrow(RECONCILE_TABLE).to_pylist()
    assert {r["object"] for r in measured} == {"Account", "Contact"}
    assert all(r["repaired"] == 0 for r in measured)
    found = sum(r["drift_missing"] + r["drift_extra"] + r["drift_stale"] for r in measured)
    # Records in the Recycle Bin that were emptied stay deleted in gold: that is no drift.
    assert found >= 5, measured

    # Repairing, over a Bulk API job (one query of three columns per object).
    emulator.bulk.settings.max_records = 40
    sets = emulator.bulk.result_sets
    assert main(["-q", "reconcile", "--api", "bulk", "--conf", str(conf_dir)]) == 0
    out = capsys.readouterr().out
    assert emulator.bulk.result_sets - sets > 2
    print(out)
    rows = engine.read_arrow(RECONCILE_TABLE).to_pylist()
    repaired = [r for r in rows if r["api"] == "bulk"]
    assert len(repaired) == 2
    for r in repaired:
        drift = r["drift_missing"] + r["drift_extra"] + r["drift_stale"]
        assert r["repaired"] == drift, r
    assert sum(r["drift_missing"] + r["drift_extra"] + r["drift_stale"] for r in repaired) >= 5
    drift_rows = [r for r in engine.read_arrow(RESYNC_TABLE).to_pylist() if r["reason"] == "drift"]
    assert drift_rows and all(r["record_id"] is not None for r in drift_rows)
    print(assert_gold_equals_truth(engine, conf, workload.truth))
    gold = {r["Id"]: r for r in engine.read_arrow(TableRef("gold", "contact")).to_pylist()}
    assert all(gold[r]["_cdc_is_deleted"] for r in purged if r in gold)

    # sfcdc status shows each object's last reconcile; the commits table has a row per object.
    assert main(["-q", "status", "--conf", str(conf_dir)]) == 0
    status = capsys.readouterr().out
    assert status.count("reconciled at ") == 2, status
    commits = engine.read_arrow(TableRef("bronze", "sfcdc_commits")).to_pylist()
    assert sum(1 for r in commits if r["kind"] == "reconcile") == 4

    # Nothing left: a second run measures zero drift and writes nothing to the re-sync table.
    versions = engine.version(RESYNC_TABLE)
    assert main(["-q", "reconcile", "--conf", str(conf_dir)]) == 0
    assert "drift: 0 records in 2 objects" in capsys.readouterr().out
    assert engine.version(RESYNC_TABLE) == versions
