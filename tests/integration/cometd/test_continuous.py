"""`sfcdc run --continuous` lands the Streaming API channels beside the Pub/Sub topics, in
the landing thread or in the landing child process (``sfcdc ingest --with-streams``): a
PushTopic's notifications reach bronze, silver and gold while the run goes on, and the
channel's commits are recorded in the commits table. A conf/ of channels alone runs too,
continuously and with ``--once``."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from ingest.emulator.server import Emulator
from pipelines import cli
from pipelines.engines import TableRef
from pipelines.engines.local import LocalEngine
from pipelines.ops.table import OPS_TABLE
from pipelines.run import LandingProcess, Pipeline
from pipelines.spec import load_conf
from tests.integration.cometd.lake import ACCOUNT_QUERY, ACCTS, account, write_conf

pytestmark = [pytest.mark.streaming_api, pytest.mark.integration]

CDC = "object: Account\nkind: change_events\n"
IDS = [f"0010000000000{n:02d}AAA" for n in range(1, 6)]


def _gold_ids(engine: LocalEngine, name: str) -> set[str]:
    table = TableRef("gold", name)
    if not engine.exists(table):
        return set()
    return set(engine.read_arrow(table, columns=["Id"]).column("Id").to_pylist())


@pytest.mark.parametrize("landing", ["thread", "process"])
def test_a_continuous_run_lands_a_pushtopic_beside_the_cdc_topic(
    landing: str, tmp_path: Path, tls_emulator: Emulator
) -> None:
    emu = tls_emulator
    conf_dir = write_conf(tmp_path, emu, {"accts": ACCTS, "account": CDC})
    conf = load_conf(conf_dir)
    engine = LocalEngine(location=tmp_path / "lake")
    child = LandingProcess(conf_dir, progress_seconds=0.2, streams=True)
    pipeline = Pipeline(conf, landing_process=child if landing == "process" else None)
    outcome: list[object] = []
    runner = threading.Thread(
        target=lambda: outcome.append(pipeline.run_continuous(interval=0.3)), daemon=True
    )
    runner.start()
    try:
        # The PushTopic exists once the channels' landing has set it up; changes made after
        # that notify it (and the CDC topic gets them too).
        deadline = time.monotonic() + 120
        while not emu.streaming.push_topics.records():
            assert time.monotonic() < deadline, "the channels' landing never made its PushTopic"
            time.sleep(0.1)
        for n, record_id in enumerate(IDS):
            account(emu, "CREATE", record_id, {"Name": f"Acme {n}", "Industry": "Energy"})
        # Both gold tables fill while the run goes on.
        while _gold_ids(engine, "accts") != set(IDS) or _gold_ids(engine, "account") != set(IDS):
            assert time.monotonic() < deadline, "gold did not fill while the run went on"
            assert runner.is_alive(), outcome
            time.sleep(0.2)
    finally:
        pipeline.stop("test done")
        runner.join(60)
    assert not runner.is_alive()
    assert outcome and outcome[0].stopped == "test done"  # type: ignore[attr-defined]
    bronze = engine.read_arrow(TableRef("bronze", "streaming_accts"), columns=["replay_id"])
    assert sorted(bronze.column("replay_id").to_pylist()) == list(range(1, len(IDS) + 1))
    commits = engine.read_arrow(OPS_TABLE).to_pylist()
    landed = sum(
        r["events"]
        for r in commits
        if r["layer"] == "bronze"
        and r["kind"] == "commit"
        and r["topic"] == "streaming:/topic/Accts"
    )
    assert landed == len(IDS)


@pytest.mark.parametrize("landing", ["thread", "process"])
def test_a_continuous_run_of_channels_only(
    landing: str, tmp_path: Path, tls_emulator: Emulator
) -> None:
    emu = tls_emulator
    conf_dir = write_conf(tmp_path, emu, {"accts": ACCTS})
    engine = LocalEngine(location=tmp_path / "lake")
    child = LandingProcess(conf_dir, progress_seconds=0.2, streams=True)
    pipeline = Pipeline(
        load_conf(conf_dir), landing_process=child if landing == "process" else None
    )
    outcome: list[object] = []
    runner = threading.Thread(
        target=lambda: outcome.append(pipeline.run_continuous(interval=0.3)), daemon=True
    )
    runner.start()
    try:
        deadline = time.monotonic() + 120
        while not emu.streaming.push_topics.records():
            assert time.monotonic() < deadline, "the channels' landing never made its PushTopic"
            assert runner.is_alive(), outcome
            time.sleep(0.1)
        for n, record_id in enumerate(IDS):
            account(emu, "CREATE", record_id, {"Name": f"Acme {n}"})
        while _gold_ids(engine, "accts") != set(IDS):
            assert time.monotonic() < deadline, "gold did not fill while the run went on"
            assert runner.is_alive(), outcome
            time.sleep(0.2)
    finally:
        pipeline.stop("test done")
        runner.join(60)
    assert not runner.is_alive()
    assert outcome and outcome[0].stopped == "test done"  # type: ignore[attr-defined]


def test_run_once_of_channels_only(
    tmp_path: Path, tls_emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    emu = tls_emulator
    emu.streaming.create_push_topic("Accts", ACCOUNT_QUERY)
    for n, record_id in enumerate(IDS):
        account(emu, "CREATE", record_id, {"Name": f"Acme {n}"})
    conf_dir = write_conf(tmp_path, emu, {"accts": ACCTS})
    assert cli.main(["-q", "run", "--conf", str(conf_dir), "--once"]) == 0
    out = capsys.readouterr().out
    assert "bronze bronze.streaming_accts: 5 events" in out, out
    assert "gold streaming:/topic/Accts: 5 changes of 5 records" in out, out
    engine = LocalEngine(location=tmp_path / "lake")
    assert _gold_ids(engine, "accts") == set(IDS)
