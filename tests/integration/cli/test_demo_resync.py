"""Re-sync on the demo's configuration: the in-process emulator keeps the records of the
workload it generated in its state directory, so ``sfcdc resync``, run after ``sfcdc run
--once`` in a new emulator on the same directory, reads them and leaves no record flagged."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ingest.emulator.truthlog import TruthJournal
from pipelines.cli import main
from pipelines.commands.demo import write_conf
from pipelines.engines import TableRef
from pipelines.gold.resync import RESYNC_TABLE
from pipelines.session import engine_for
from pipelines.spec import load_conf
from tests.integration.rest.oracle import assert_gold_equals_truth

pytestmark = pytest.mark.integration


def test_resync_after_the_demo_pipeline_leaves_nothing_flagged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf_dir = write_conf(tmp_path, events=400, seed=5, engine="local")
    assert main(["-q", "run", "--once", "--conf", str(conf_dir)]) == 0
    conf = load_conf(conf_dir)
    engine = engine_for(conf.pipeline.lake)
    change_events = dataclasses.replace(
        conf, objects=tuple(o for o in conf.objects if o.kind == "change_events")
    )
    flagged_before = sum(
        sum(
            engine.read_arrow(TableRef("gold", o.tables.gold))
            .column("_cdc_needs_resync")
            .to_pylist()
        )
        for o in change_events.objects
    )
    assert flagged_before, "the demo workload should leave gap-flagged records"
    capsys.readouterr()

    # A new in-process emulator on the same state directory answers for the same records.
    assert main(["-q", "resync", "--conf", str(conf_dir)]) == 0
    out = capsys.readouterr().out
    assert "re-sync rows resolved" in out

    assert all(r["resolved_at"] is not None for r in engine.read_arrow(RESYNC_TABLE).to_pylist())
    truth = TruthJournal(tmp_path / "emulator").load()
    assert truth is not None
    print(assert_gold_equals_truth(engine, change_events, truth))
