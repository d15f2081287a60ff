"""Pure output logic of the run, sql, status, validate and demo commands (no JVM)."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path

import pytest

from pipelines import run as run_module
from pipelines.bronze import LandingResult, TopicResult
from pipelines.commands.demo import write_conf
from pipelines.commands.run import summary
from pipelines.commands.sql import Result, format_rows
from pipelines.commands.status import format_status
from pipelines.commands.status_model import LayerHealth, ObjectStatus, Status, TopicStatus
from pipelines.commands.validate import describe
from pipelines.run import PassLog, PassResult, progress_lines
from pipelines.spec import load_conf

ROOT = Path(__file__).resolve().parents[3]


def _topic(events: int, received: int, last: str | None = "00ff") -> TopicResult:
    return TopicResult(
        topic="/data/AccountChangeEvent",
        table="bronze.account_change_event",
        received=received,
        events=events,
        payload_bytes=0,
        commits=1,
        keepalive_commits=0,
        replay_gaps=0,
        redelivered_skipped=0,
        last_replay_id=last,
    )


def test_progress_lines_give_rate_lag_and_last_replay_id() -> None:
    before = LandingResult((_topic(100, 100),), 1.0, "running")
    now = LandingResult((_topic(600, 650, "0a0b"),), 3.0, "running")
    lines = progress_lines(now, before, 2.0, None)
    assert lines == [
        "/data/AccountChangeEvent: 250 events/s, 600 landed, lag 50 events, last replay id 0a0b"
    ]
    first = progress_lines(LandingResult((_topic(0, 0, None),), 1.0, "running"), None, 1.0, None)
    assert first == [
        "/data/AccountChangeEvent: 0 events/s, 0 landed, lag 0 events, last replay id none"
    ]


def test_a_failed_topic_shows_as_fail_with_its_error_in_progress_lines() -> None:
    failed = dataclasses.replace(_topic(0, 0, None), error="NOT_FOUND topic.not.found")
    lines = progress_lines(LandingResult((failed,), 1.0, "running"), None, 1.0, None)
    assert lines == ["/data/AccountChangeEvent: FAIL, 0 landed: NOT_FOUND topic.not.found"]


def test_text_table_aligns_numbers_right_and_shows_nulls_bytes_and_times() -> None:
    result = Result(
        ("name", "amount", "replay", "at"),
        (
            ("Acme", Decimal("12.50"), b"\x00\xff", datetime(2025, 1, 1, tzinfo=timezone.utc)),
            (None, Decimal("7"), None, None),
        ),
        truncated=False,
    )
    text = format_rows(result).splitlines()
    assert text[0].split(" | ")[0].strip() == "name"
    assert text[2] == "Acme |  12.50 | 00ff   | 2025-01-01T00:00:00+00:00"
    assert text[3] == "NULL |      7 | NULL   | NULL"
    assert text[-1] == "(2 rows)"


def test_truncated_results_say_so_and_cells_are_single_line() -> None:
    rows = tuple((f"line one\nline {i}" + "x" * 100,) for i in range(3))
    text = format_rows(Result(("t",), rows, truncated=True))
    assert "\\n" in text and "…" in text
    assert text.endswith("(3 rows, first 3 shown)")


def test_csv_and_json() -> None:
    result = Result(("a", "b"), ((1, [b"\x01", "x"]), (None, {"k": 2})), truncated=False)
    assert format_rows(result, "csv").splitlines() == [
        "a,b",
        '1,"[""01"", ""x""]"',
        ',"{""k"": 2}"',
    ]
    assert json.loads(format_rows(result, "json")) == [
        {"a": 1, "b": ["01", "x"]},
        {"a": None, "b": {"k": 2}},
    ]


def test_validate_describes_every_object_of_the_shipped_conf() -> None:
    lines = describe(load_conf(ROOT / "conf"))
    assert lines[0].endswith("valid; 5 of 5 objects enabled")
    assert any("Invoice__c" in line and "bronze.invoice__change_event" in line for line in lines)


def test_validate_counts_streaming_api_channels(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    (conf / "objects").mkdir(parents=True)
    (conf / "pipeline.yml").write_text("")
    (conf / "objects" / "alerts.yml").write_text("kind: streaming_api\nchannel: /u/Alerts\n")
    lines = describe(load_conf(conf))
    assert lines[0].endswith("valid; 1 of 1 objects enabled (0 Pub/Sub, 1 Streaming API)")


def test_the_demo_conf_is_valid_with_tls_on(tmp_path: Path) -> None:
    conf = load_conf(write_conf(tmp_path, events=123, seed=9))
    emulator = conf.pipeline.connection.emulator
    assert emulator.tls.enabled and emulator.mode == "in_process"
    assert emulator.workload.events == 123 and emulator.seed == 9
    assert {o.api_name for o in conf.objects} == {
        "Account",
        "Contact",
        "Invoice__c",
        "Opportunity",
        "Order_Shipped__e",
    }


def test_status_text() -> None:
    status = Status(
        "/lake",
        (
            TopicStatus(
                "/data/AccountChangeEvent",
                "bronze.account_change_event",
                4,
                3,
                "0a",
                "2025-01-01T00:00:00.000+00:00",
                "keepalive",
                10,
                1,
                2,
            ),
        ),
        (
            ObjectStatus(
                "Account",
                "/data/AccountChangeEvent",
                "silver.account",
                2,
                3,
                1,
                "gold.account",
                5,
                1,
                1,
                4,
                1,
                quarantined=2,
                state="FAIL",
                reasons=("gold failed at 2026-03-01T11:59:00+00:00 and has not committed since",),
                behind_seconds=42.0,
                events_per_second=3.5,
                layers=(
                    LayerHealth("bronze", "bronze.account_change_event", 1.0, None, None, 4.0),
                    LayerHealth("silver", "silver.account", 2.0, None, None, 3.5),
                    LayerHealth("gold", "gold.account", 42.0, None, None, 3.5),
                ),
                last_error="LakeError: disk full",
                last_error_at="2026-03-01T11:59:00.000+00:00",
            ),
        ),
        now="2026-03-01T12:00:00.000+00:00",
        commits_table=True,
    )
    lines = format_status(status)
    assert lines[1:5] == [
        "health at 2026-03-01T12:00:00.000+00:00: FAIL",
        "  FAIL Account: behind by 42 s (bronze 1 s, silver 2 s, gold 42 s); 3.5 events/s; "
        "2 quarantined, 4 re-sync records + 1 whole-object",
        "       last error at 2026-03-01T11:59:00.000+00:00: LakeError: disk full",
        "       gold failed at 2026-03-01T11:59:00+00:00 and has not committed since",
    ]
    del lines[1:5]
    assert lines[2] == (
        "  /data/AccountChangeEvent -> bronze.account_change_event v4: 10 events landed; batch 3 "
        "(keepalive) at 2025-01-01T00:00:00.000+00:00, replay id 0a; 1 REPLAY GAP, 2 quarantined"
    )
    assert lines[4] == (
        "  Account: silver.account v2 (bronze up to v3, lag 1); gold.account v5 (silver up to "
        "v1, lag 1); re-sync pending: 4 records, 1 whole-object"
    )


def _pass(rows: int, merged: int) -> PassResult:
    from pipelines.engines import MergeMetrics, TableRef
    from pipelines.gold import job as gold
    from pipelines.silver import job as silver

    bronze, table = TableRef("bronze", "account_change_event"), TableRef("silver", "account")
    decoded = silver.ObjectResult("Account", table, bronze, 0, 1, events=rows, rows=rows)
    topic = silver.TopicResult("/data/AccountChangeEvent", bronze, 0, 1, rows, 1, (decoded,))
    merge = MergeMetrics(TableRef("gold", "account"), merged, 0, 0, rows, 2, False, 0.1)
    folded = gold.ObjectResult(
        "Account", merge.table, table, 0, 1, rows, rows, rows, 0, merge, 0, 0, 0, 0, False, 0.1
    )
    return PassResult(silver.SilverResult((topic,)), gold.GoldResult((folded,)), 0.5)


def test_a_long_run_keeps_its_latest_passes_and_totals_over_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(run_module, "KEPT_PASSES", 3)
    log = PassLog()
    for n in range(1, 11):
        log.append(_pass(rows=n, merged=2 * n))
    landing = LandingResult((), 60.0, "stopped")
    result = log.result(landing, 60.0, "stopped")

    assert [p.silver_rows for p in result.passes] == [8, 9, 10]
    assert (result.pass_count, result.silver_rows, result.quarantined) == (10, 55, 10)
    assert result.merged() == {"Account": 110}
    assert summary(result)[1:] == [
        "  10 silver/gold passes: 55 silver rows, 10 quarantined",
        "  gold Account: 110 rows inserted, updated or deleted",
    ]
