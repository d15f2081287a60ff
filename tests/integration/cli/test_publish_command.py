"""``sfcdc publish``: JSON lines from a file or stdin become platform events on the emulator
(over PublishStream), each line's outcome is printed, and invalid lines are reported by line
number and field before anything is published."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path

import fastavro
import pytest

from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.server import Emulator, EmulatorConfig
from pipelines.cli import main
from tests.integration.rest.oracle import write_conf

pytestmark = pytest.mark.integration

TOPIC = "/event/Order_Shipped__e"
USER = "005000000000001AAA"


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    with Emulator(default_catalogue(), EmulatorConfig(keepalive_interval=0.2)) as running:
        yield running


@pytest.fixture
def conf_dir(emulator: Emulator, tmp_path: Path) -> Path:
    return write_conf(tmp_path, emulator, {"account": "Account"}, start="earliest")


def _decoded(emulator: Emulator) -> list[dict[str, object]]:
    schema = emulator.catalogue.topic(TOPIC).current_schema
    assert schema is not None
    return [
        fastavro.schemaless_reader(io.BytesIO(e.payload), schema.parsed)  # type: ignore[misc]
        for e in emulator.log(TOPIC)
    ]


def test_a_file_of_events_is_published_line_by_line(
    emulator: Emulator, conf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = tmp_path / "orders.jsonl"
    events.write_text(
        json.dumps({"CreatedById": USER, "Order_Number__c": "O-1", "Weight_Kg__c": 2.5})
        + "\n\n"
        + json.dumps(
            {
                "CreatedById": USER,
                "Order_Number__c": "O-2",
                "Express__c": True,
                "Shipped_At__c": "2026-05-01T12:30:00Z",
                "Delivery_Date__c": "2026-05-03",
            }
        )
        + "\n"
    )
    code = main(["-q", "publish", TOPIC, str(events), "--conf", str(conf_dir)])
    out = capsys.readouterr().out
    assert code == 0, out
    log = emulator.log(TOPIC)
    assert len(log) == 2
    assert "line 1: published, replay id " in out and "line 3: published, replay id " in out
    assert "2 of 2 events published" in out
    # Each printed replay id is the one the bus gave that event.
    printed = [
        line.split("replay id ")[1].split()[0] for line in out.splitlines() if "replay id" in line
    ]
    assert sorted(printed) == sorted(base64.b64encode(e.replay_id).decode() for e in log)
    first, second = sorted(_decoded(emulator), key=lambda r: str(r["Order_Number__c"]))
    assert first["Weight_Kg__c"] == 2.5 and first["CreatedById"] == USER
    assert isinstance(first["CreatedDate"], int) and first["CreatedDate"] > 1_700_000_000_000
    assert second["Express__c"] is True
    assert second["Shipped_At__c"] == 1777638600000  # 2026-05-01T12:30:00Z
    assert second["Delivery_Date__c"] == 1777766400000  # 2026-05-03


def test_invalid_lines_name_line_and_field_and_nothing_is_published(
    emulator: Emulator,
    conf_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = [
        {"CreatedById": USER, "Order_Number__c": "O-1"},
        {"CreatedById": USER, "Weight_Kg__c": "heavy"},
        {"Order_Number__c": "O-3", "Colour__c": "red"},
        "not an object",
    ]
    text = "\n".join(json.dumps(v) for v in lines) + "\n{broken\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    assert main(["-q", "publish", TOPIC, "-", "--conf", str(conf_dir)]) == 2
    err = capsys.readouterr().err
    assert "line 2: invalid: Weight_Kg__c: expected a number (got 'heavy', a string)" in err
    assert "line 3: invalid: Colour__c: unknown field" in err
    assert "line 4: invalid: expected a JSON object (got 'not an object', a string)" in err
    assert "line 5: invalid: not JSON" in err
    assert "nothing published: 4 of 5 events are invalid" in err
    assert len(emulator.log(TOPIC)) == 0

    # --skip-invalid publishes the valid line and still reports the others.
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    args = ["-q", "publish", TOPIC, "--skip-invalid", "--created-by", USER, "--conf", str(conf_dir)]
    assert main(args) == 1
    captured = capsys.readouterr()
    assert "line 1: published" in captured.out and "line 3: published" not in captured.out
    assert "line 3: invalid: Colour__c: unknown field" in captured.err
    assert "1 of 5 events published" in captured.out and "4 invalid" in captured.out
    assert len(emulator.log(TOPIC)) == 1


def test_events_without_created_by_id_get_the_logged_in_user(
    emulator: Emulator, conf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # README's example: the fields of the event, nothing else (Salesforce requires CreatedById
    # and stores the publishing user's own Id whatever is sent).
    events = tmp_path / "events.jsonl"
    events.write_text(json.dumps({"Order_Number__c": "O-7", "Carrier__c": "DHL"}) + "\n")
    assert main(["-q", "publish", TOPIC, str(events), "--conf", str(conf_dir)]) == 0
    assert "1 of 1 events published" in capsys.readouterr().out
    (record,) = _decoded(emulator)
    assert str(record["CreatedById"]).startswith("005")
    assert record["Order_Number__c"] == "O-7"


def test_an_event_over_one_megabyte_fails_alone_with_its_line(
    emulator: Emulator, conf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = tmp_path / "big.jsonl"
    big = {"CreatedById": USER, "Carrier__c": "x" * (1024 * 1024 + 10)}
    small = {"CreatedById": USER, "Order_Number__c": "O-9"}
    events.write_text(json.dumps(small) + "\n" + json.dumps(big) + "\n")
    assert main(["-q", "publish", TOPIC, str(events), "--conf", str(conf_dir)]) == 1
    out = capsys.readouterr().out
    assert "line 1: published" in out
    assert "line 2: failed (not sent): event is 1,048," in out
    assert len(emulator.log(TOPIC)) == 1


def test_a_change_event_topic_is_refused(
    conf_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["-q", "publish", "/data/AccountChangeEvent", "--conf", str(conf_dir)]) == 2
    assert "only platform event topics" in capsys.readouterr().err
