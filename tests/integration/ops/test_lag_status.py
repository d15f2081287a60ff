"""Lag measured in time: `sfcdc run --once` from the in-process emulator records, per commit
and layer, the newest Salesforce commit time applied, which must equal the newest commit time
the emulator generated for that topic; `sfcdc status` turns the records into seconds behind,
events/s and an OK/WARN/FAIL per object."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.workload import Workload
from pipelines import cli
from pipelines.connect import _GENERATE_CHUNK
from tests.integration.cli.conftest import write_conf

pytestmark = pytest.mark.integration

EVENTS, PLATFORM_EVENTS = 60, 10
TOPICS = {
    "Account": "/data/AccountChangeEvent",
    "Contact": "/data/ContactChangeEvent",
    "Order_Shipped__e": "/event/Order_Shipped__e",
}


def _known_newest() -> dict[str, datetime]:
    """The newest commit time per topic of the seeded workload the emulator generated (the
    same generator, seed and chunking as `pipelines.connect`)."""
    generator = Workload(default_catalogue(), seed=7)
    remaining = EVENTS
    while remaining > 0:
        remaining -= len(list(generator.events(min(remaining, _GENERATE_CHUNK))))
    generator.platform_events(PLATFORM_EVENTS)
    newest: dict[str, int] = {}
    for change in generator.log:
        newest[change.topic] = max(newest.get(change.topic, 0), change.commit_timestamp)
    return {t: datetime.fromtimestamp(ms / 1000, tz=timezone.utc) for t, ms in newest.items()}


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ops-lag")
    conf = write_conf(root, events=EVENTS, platform_events=PLATFORM_EVENTS)
    assert cli.main(["-q", "run", "--conf", str(conf), "--once"]) == 0
    return root


def test_every_layer_records_the_newest_commit_time_the_emulator_generated(lake: Path) -> None:
    known = _known_newest()
    commits = DeltaTable(str(lake / "lake" / "bronze" / "sfcdc_commits")).to_pyarrow_table()
    rows = commits.filter(pc.equal(commits["kind"], "commit")).to_pylist()
    layers = {"bronze", "silver", "gold"}
    assert {r["layer"] for r in rows} == layers
    for obj, topic in TOPICS.items():
        expected = known[topic]
        for layer in ("silver", "gold") if obj != "Order_Shipped__e" else ("silver",):
            mine = [r for r in rows if r["layer"] == layer and r["object"] == obj]
            assert mine, (layer, obj)
            assert max(r["newest_commit_at"] for r in mine) == expected, (layer, obj)
            assert sum(r["events"] for r in mine) > 0
        landed = [r for r in rows if r["layer"] == "bronze" and r["topic"] == topic]
        assert max(r["newest_commit_at"] for r in landed) == expected, topic
        # Each landing commit's own lag: from the commit time to visibility.
        for r in landed:
            assert r["lag_seconds"] == pytest.approx(
                (r["visible_at"] - r["newest_commit_at"]).total_seconds()
            )
            assert r["version"] is not None and r["payload_bytes"] > 0
    # A drained topic is caught up: its last keepalive position was committed.
    caught_up = commits.filter(pc.equal(commits["kind"], "caught_up")).to_pylist()
    assert {r["topic"] for r in caught_up} == set(TOPICS.values())


def test_status_json_gives_lag_rate_and_verdict(
    lake: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["-q", "status", "--conf", str(lake / "conf"), "--json", "--check"])
    status = json.loads(capsys.readouterr().out)
    assert code == 0
    assert status["commits_table"] is True and status["state"] == "OK"
    objects = {o["object"]: o for o in status["objects"]}
    for obj in TOPICS:
        o = objects[obj]
        assert o["state"] == "OK", o["reasons"]
        # Caught up moments ago (the keepalive that ended the drain), not a year behind.
        assert 0 <= o["behind_seconds"] < 120
        assert [h["layer"] for h in o["layers"]] == (
            ["bronze", "silver"] if obj == "Order_Shipped__e" else ["bronze", "silver", "gold"]
        )
        assert o["events_per_second"] > 0
        assert o["quarantined"] == 0 and o["last_error"] is None


def test_status_text_says_behind_by_seconds(lake: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["-q", "status", "--conf", str(lake / "conf")]) == 0
    out = capsys.readouterr().out
    assert "health at " in out
    for obj in TOPICS:
        line = next(x for x in out.splitlines() if x.strip().startswith(f"OK   {obj}:"))
        assert "behind by " in line and " s (bronze " in line and "events/s" in line
