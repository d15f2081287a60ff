"""An outage longer than the event retention: the position sfcdc stored is no longer on the bus,
and with ``replay.on_expired: rebootstrap`` ``sfcdc run`` resumes the stream at the newest event,
reads every record again (the bootstrap hand-off: the stream position is taken before the
snapshot) and gold ends equal to the org, then follows the stream as before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.server import Emulator, EmulatorConfig
from ingest.emulator.workload import Workload, WorkloadMix
from pipelines.bronze import CHECKPOINT_TABLE
from pipelines.cli import main
from pipelines.engines import TableRef
from pipelines.gold.resync import RESYNC_TABLE
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
        yield running


def rebootstrap_conf(
    root: Path, emulator: Emulator, engine: str, *, objects: dict[str, str] = OBJECTS
) -> Path:
    """``write_conf`` with ``replay.on_expired: rebootstrap``."""
    conf_dir = write_conf(root, emulator, objects, start="earliest", engine=engine)
    pipeline = conf_dir / "pipeline.yml"
    text = pipeline.read_text()
    assert "on_corrupted: fail}" in text
    pipeline.write_text(
        text.replace("on_corrupted: fail}", "on_corrupted: fail, on_expired: rebootstrap}")
    )
    return conf_dir


def test_an_expired_position_is_rebootstrapped(
    emulator: Emulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = Workload(emulator.catalogue, seed=36, mix=MIX)
    emulator.serve_records(workload.truth)
    emulator.append(list(workload.events(300)))
    conf_dir = rebootstrap_conf(tmp_path, emulator, "local")
    conf = load_conf(conf_dir)
    engine = engine_for(conf.pipeline.lake)
    assert main(["-q", "run", "--once", "--conf", str(conf_dir)]) == 0
    print(assert_gold_equals_truth(engine, conf, workload.truth))

    # The outage: changes the landing never sees, then the retention drops every event so far
    # (the stored positions with them), then changes committed while nobody listened.
    missed = emulator.append(list(workload.events(200)))
    assert emulator.faults.purge(through=missed[-1]) >= 500
    emulator.append(list(workload.events(100)))
    assert main(["-q", "run", "--once", "--conf", str(conf_dir)]) == 0
    capsys.readouterr()
    gaps = [
        r
        for r in engine.read_arrow(TableRef("bronze", CHECKPOINT_TABLE)).to_pylist()
        if r["kind"] == "replay_gap"
    ]
    assert len(gaps) == 2 and {g["gap_resumed"] for g in gaps} == {"latest"}, gaps
    rows = [r for r in engine.read_arrow(RESYNC_TABLE).to_pylist() if r["reason"] == "replay_gap"]
    assert {r["object"] for r in rows} == {"Account", "Contact"}
    assert all(r["resolved_at"] is not None for r in rows), rows
    print(assert_gold_equals_truth(engine, conf, workload.truth))

    # The stream goes on from the position taken before the snapshot.
    emulator.append(list(workload.events(150)))
    assert main(["-q", "run", "--once", "--conf", str(conf_dir)]) == 0
    print(assert_gold_equals_truth(engine, conf, workload.truth))
