"""``sfcdc resync`` end to end: a workload with gap events and overflows is landed, silver and
gold flag what events cannot reproduce, and the command re-reads it over the emulator's REST
API until gold equals the ground truth everywhere."""

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
from pipelines.session import engine_for
from pipelines.spec import load_conf
from tests.integration.rest.oracle import assert_gold_equals_truth, write_conf

pytestmark = [pytest.mark.integration, pytest.mark.spark]

OBJECTS = {"account": "Account", "contact": "Contact"}
MIX = WorkloadMix(
    platform_event=0.0,
    gap=4.0,
    overflow=0.8,
    wildcard=0.3,
    entity_weights={"Account": 1.0, "Contact": 1.0},
)


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    with Emulator(default_catalogue(), EmulatorConfig(keepalive_interval=0.2)) as running:
        running.rest.page_size = 50
        yield running


def test_resync_makes_gold_equal_to_the_truth(
    lake_kind: str, emulator: Emulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _resync_until_gold_equals_the_truth(lake_kind, "rest", emulator, tmp_path, capsys)


def test_bulk_resync_of_whole_objects_makes_gold_equal_to_the_truth(
    emulator: Emulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Whole objects (after an overflow) through Bulk API jobs; named records stay on REST.
    emulator.bulk.settings.max_records = 25
    sets = emulator.bulk.result_sets
    _resync_until_gold_equals_the_truth("local", "bulk", emulator, tmp_path, capsys)
    assert emulator.bulk.result_sets - sets > 1


def _resync_until_gold_equals_the_truth(
    lake_kind: str,
    api: str,
    emulator: Emulator,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    workload = Workload(emulator.catalogue, seed=41, mix=MIX)
    emulator.append(list(workload.events(900)))
    emulator.rest.attach(workload.truth)
    truth = workload.truth
    for entity in OBJECTS.values():
        expectation = truth.resync(entity)
        assert expectation.record_ids, f"the workload made no gap event of {entity}"
    assert any(truth.resync(e).full_resync for e in OBJECTS.values()), "no overflow"
    conf_dir = write_conf(tmp_path, emulator, OBJECTS, start="earliest", engine=lake_kind)
    assert main(["-q", "ingest", "--once", "--conf", str(conf_dir)]) == 0
    capsys.readouterr()

    # Silver and gold catch up inside the command: it finds the gaps and overflows first.
    assert main(["-q", "resync", "--api", api, "--conf", str(conf_dir)]) == 0
    out = capsys.readouterr().out
    assert "Account: resync read" in out and "Contact: resync read" in out
    assert "whole object" in out
    if api == "bulk":
        assert "over the Bulk API (whole object" in out, out
    conf = load_conf(conf_dir)
    engine = engine_for(conf.pipeline.lake)
    rows = engine.read_arrow(RESYNC_TABLE).to_pylist()
    assert {"gap", "overflow"} <= {r["reason"] for r in rows}
    # Every row is resolved: by a later CREATE / UNDELETE event, or else by the snapshot.
    assert all(r["resolved_at"] is not None for r in rows)
    assert any(r["resolved_by"].startswith("resync snapshot") for r in rows)
    gold = engine.read_arrow(TableRef("gold", "account")).to_pylist()
    assert {r["_cdc_last_change_type"] for r in gold} == {"SNAPSHOT"}
    print(assert_gold_equals_truth(engine, conf, truth))

    # Nothing open any more: a second run reads nothing.
    capsys.readouterr()
    version = engine.version(TableRef("gold", "account"))
    assert main(["-q", "resync", "Account", "--conf", str(conf_dir)]) == 0
    assert "nothing to re-sync" in capsys.readouterr().out
    assert engine.version(TableRef("gold", "account")) == version


def test_resync_of_an_unknown_object_names_the_configured_ones(
    emulator: Emulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf_dir = write_conf(tmp_path, emulator, OBJECTS, start="earliest")
    assert main(["-q", "resync", "Acount", "--conf", str(conf_dir)]) == 2
    err = capsys.readouterr().err
    assert "no object 'Acount'" in err and "Account, Contact" in err
