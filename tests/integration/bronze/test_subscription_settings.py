"""Per-object subscription settings from YAML reach the wire: a new subscription starts right
after the configured replay id (base64, as Salesforce shows it) with the object's
``num_requested``, while another topic keeps the pipeline's."""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.server import Emulator, EmulatorConfig
from ingest.emulator.workload import Workload, WorkloadMix
from pipelines.cli import main
from pipelines.engines import TableRef
from pipelines.session import engine_for
from pipelines.spec import load_conf
from tests.integration.rest.oracle import write_conf

pytestmark = pytest.mark.integration

MIX = WorkloadMix(
    platform_event=0.0,
    gap=0.0,
    overflow=0.0,
    wildcard=0.0,
    entity_weights={"Account": 1.0, "Contact": 1.0},
)


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    with Emulator(default_catalogue(), EmulatorConfig(keepalive_interval=0.2)) as running:
        yield running


def test_replay_id_and_num_requested_per_object(
    emulator: Emulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    workload = Workload(emulator.catalogue, seed=8, mix=MIX)
    emulator.append(list(workload.events(120)))
    accounts = emulator.log("/data/AccountChangeEvent")
    assert len(accounts) > 10
    start_after = accounts[len(accounts) // 2]
    conf_dir = write_conf(
        tmp_path, emulator, {"account": "Account", "contact": "Contact"}, start="earliest"
    )
    with (conf_dir / "objects" / "account.yml").open("a") as handle:
        replay_id = base64.b64encode(start_after.replay_id).decode("ascii")
        handle.write(f"num_requested: 7\nreplay: {{replay_id: '{replay_id}'}}\n")

    with caplog.at_level(logging.INFO, logger="ingest.emulator.service"):
        assert main(["-q", "ingest", "--once", "--conf", str(conf_dir)]) == 0
    subscribes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("subscribe")]
    assert any(
        "topic=/data/AccountChangeEvent preset=CUSTOM num_requested=7" in m for m in subscribes
    ), subscribes
    assert any(
        "topic=/data/ContactChangeEvent preset=EARLIEST num_requested=100" in m for m in subscribes
    ), subscribes

    engine = engine_for(load_conf(conf_dir).pipeline.lake)
    landed = engine.read_arrow(TableRef("bronze", "account_change_event"))
    expected = [e.replay_id for e in accounts if e.position > start_after.position]
    assert sorted(landed.column("replay_id").to_pylist()) == sorted(expected)
    contacts = engine.read_arrow(TableRef("bronze", "contact_change_event"))
    assert contacts.num_rows == len(emulator.log("/data/ContactChangeEvent"))
