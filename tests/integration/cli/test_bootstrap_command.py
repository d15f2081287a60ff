"""``sfcdc bootstrap`` end to end: an org whose objects were changed long before the
subscription starts (at LATEST, so none of those events is ever landed) is loaded over the
emulator's REST API; the stream then continues from the recorded position and gold equals
the ground truth."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.server import Emulator, EmulatorConfig
from ingest.emulator.workload import Workload, WorkloadMix
from pipelines.bronze.checkpoint import CheckpointStore
from pipelines.bronze.tables import bronze_tables
from pipelines.cli import main
from pipelines.engines import TableRef
from pipelines.session import engine_for
from pipelines.spec import load_conf
from tests.integration.rest.oracle import assert_gold_equals_truth, write_conf

pytestmark = [pytest.mark.integration, pytest.mark.spark]

OBJECTS = {"account": "Account"}
# No gap events, overflows or wildcards: what the stream brings after the bootstrap is exact,
# and records it does not touch keep their snapshot rows.
MIX = WorkloadMix(
    platform_event=0.0,
    gap=0.0,
    overflow=0.0,
    wildcard=0.0,
    entity_weights={"Account": 1.0},
)


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    with Emulator(default_catalogue(), EmulatorConfig(keepalive_interval=0.2)) as running:
        running.rest.page_size = 40
        yield running


def test_bootstrap_then_stream_equals_the_truth(
    lake_kind: str, emulator: Emulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _bootstrap_then_stream(lake_kind, "rest", emulator, tmp_path, capsys)


def test_bulk_bootstrap_then_stream_equals_the_truth(
    emulator: Emulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The hand-off is the same whichever API reads the snapshot; one engine proves it.
    emulator.bulk.settings.max_records = 30
    sets = emulator.bulk.result_sets
    _bootstrap_then_stream("local", "bulk", emulator, tmp_path, capsys)
    assert emulator.bulk.result_sets - sets > 1, "the job's results should span several sets"
    assert emulator.bulk.jobs() == [], "a job whose records were read is deleted"


def _bootstrap_then_stream(
    lake_kind: str,
    api: str,
    emulator: Emulator,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    workload = Workload(emulator.catalogue, seed=73, mix=MIX)
    emulator.append(list(workload.events(500)))
    emulator.rest.attach(workload.truth)
    assert workload.truth.deleted("Account"), "the history should hold deleted accounts"
    conf_dir = write_conf(tmp_path, emulator, OBJECTS, start="latest", engine=lake_kind)
    conf = load_conf(conf_dir)
    engine = engine_for(conf.pipeline.lake)
    capsys.readouterr()

    for name in OBJECTS.values():
        assert main(["-q", "bootstrap", name, "--api", api, "--conf", str(conf_dir)]) == 0
        out = capsys.readouterr().out
        over = "the Bulk API" if api == "bulk" else "REST"
        assert f"{name}: bootstrap read" in out and f"records over {over}" in out
        assert "the stream continues from" in out
    store = CheckpointStore(engine, bronze_tables(conf.topics()))
    positions = {o.topic: store.latest(o.topic) for o in conf.objects}
    assert all(p is not None for p in positions.values())
    # Nothing was landed: the subscription started after every one of those events.
    assert not engine.exists(TableRef("bronze", "account_change_event")) or (
        engine.read_arrow(TableRef("bronze", "account_change_event")).num_rows == 0
    )

    # The org keeps changing; the stream continues from the recorded positions.
    emulator.append(list(workload.events(200)))
    for command in (["ingest", "--once"], ["silver"], ["gold"]):
        assert main(["-q", *command, "--conf", str(conf_dir)]) == 0
    print(assert_gold_equals_truth(engine, conf, workload.truth))
    gold = engine.read_arrow(TableRef("gold", "account")).to_pylist()
    kinds = {r["_cdc_last_change_type"] for r in gold}
    assert "SNAPSHOT" in kinds and kinds - {"SNAPSHOT"}, kinds


def test_bootstrap_of_a_platform_event_is_refused(
    emulator: Emulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf_dir = write_conf(tmp_path, emulator, OBJECTS, start="latest")
    (conf_dir / "objects" / "order.yml").write_text(
        "object: Order_Shipped__e\nkind: platform_event\n"
    )
    assert main(["-q", "bootstrap", "Order_Shipped__e", "--conf", str(conf_dir)]) == 2
    assert "platform event" in capsys.readouterr().err
