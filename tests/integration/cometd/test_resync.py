"""``sfcdc resync`` of a Streaming API channel: a PushTopic's replay gap becomes a whole-object
re-sync row of ``streaming:/topic/Accts``, which ``sfcdc resync`` (every object and channel) or
``sfcdc resync streaming:/topic/Accts`` re-reads over the emulator's REST API into the
channel's gold table, until it equals the org's records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ingest.emulator.server import Emulator
from ingest.emulator.workload import Workload, WorkloadMix
from pipelines.cli import main
from pipelines.engines import LakeEngine, TableRef
from pipelines.engines.local import LocalEngine
from pipelines.gold.resync import RESYNC_TABLE
from tests.integration.cometd.lake import ACCOUNT_QUERY, ACCTS, write_conf

pytestmark = [pytest.mark.streaming_api, pytest.mark.integration]

KEY = "streaming:/topic/Accts"
MIX = WorkloadMix(
    platform_event=0.0,
    gap=0.0,
    overflow=0.0,
    wildcard=0.0,
    lead_conversion=0.0,
    entity_weights={"Account": 1.0},
)


def _open_rows(engine: LakeEngine) -> list[dict[str, Any]]:
    rows = engine.read_arrow(RESYNC_TABLE, where=[("object", "=", KEY)]).to_pylist()
    return [r for r in rows if r["resolved_at"] is None]


def _assert_gold_equals_the_org(engine: LakeEngine, workload: Workload) -> None:
    gold = {r["Id"]: r for r in engine.read_arrow(TableRef("gold", "accts")).to_pylist()}
    records = workload.truth.records("Account")
    live = workload.truth.live("Account")
    assert {i for i, r in gold.items() if not r["_cdc_is_deleted"]} == set(live)
    for record_id in live:
        want = records[record_id]
        got = gold[record_id]
        assert (got["Industry"], got["NumberOfEmployees"]) == (
            want.get("Industry"),
            want.get("NumberOfEmployees"),
        ), record_id


@pytest.mark.parametrize("named", [False, True])
def test_resync_rereads_a_pushtopic_after_a_replay_gap(
    named: bool, tmp_path: Path, tls_emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    emu = tls_emulator
    workload = Workload(emu.catalogue, seed=11, mix=MIX)
    emu.rest.attach(workload.truth)
    emu.streaming.create_push_topic("Accts", ACCOUNT_QUERY)
    emu.append(list(workload.events(40)))
    accts = ACCTS + "replay: {start: earliest, on_corrupted: earliest}\n"
    conf = str(write_conf(tmp_path, emu, {"accts": accts}))
    assert main(["-q", "streaming", "run", "--conf", conf, "--once"]) == 0

    # More changes; the channel's messages are purged before the next landing, so its stored
    # replay id is rejected: a replay gap, and gold cannot know what it missed.
    emu.append(list(workload.events(40)))
    emu.streaming.purge("/topic/Accts", through=emu.streaming.hub.tip("/topic/Accts"))
    assert main(["-q", "streaming", "run", "--conf", conf, "--once"]) == 0
    engine = LocalEngine(location=tmp_path / "lake")
    (gap,) = _open_rows(engine)
    assert (gap["reason"], gap["record_id"]) == ("replay_gap", None)
    capsys.readouterr()

    argv = ["-q", "resync", *([KEY] if named else []), "--api", "rest", "--conf", conf]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"{KEY}: resync read" in out and "whole object" in out, out
    assert "1 re-sync rows resolved" in out, out
    assert _open_rows(engine) == []
    _assert_gold_equals_the_org(engine, workload)

    assert main(["-q", "resync", "--conf", conf]) == 0
    assert "nothing to re-sync" in capsys.readouterr().out


def test_resync_names_an_unknown_channel(
    tmp_path: Path, tls_emulator: Emulator, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = str(write_conf(tmp_path, tls_emulator, {"accts": ACCTS}))
    assert main(["-q", "resync", "streaming:/topic/Nope", "--conf", conf]) != 0
    err = capsys.readouterr().err
    assert "no Streaming API channel 'streaming:/topic/Nope'" in err, err
    assert "streaming:/topic/Accts" in err and "--objects" not in err, err
