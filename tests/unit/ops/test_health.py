"""Lag in seconds and OK/WARN/FAIL from commit records, against the YAML thresholds: the
commits table's rows summed up by the same batch function the engines run, then judged."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from pipelines.commands.status_model import Progress, object_status
from pipelines.engines import TableRef
from pipelines.ops.health import judge, layer_lags, layer_rate
from pipelines.ops.summary import CommitSummary, Summary, TableSummary
from pipelines.ops.table import CommitRecord, records_to_arrow
from pipelines.spec import HealthSpec

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
TOPIC, OBJ = "/data/AccountChangeEvent", "Account"
CHAIN = [
    ("bronze", "bronze.account_change_event"),
    ("silver", "silver.account"),
    ("gold", "gold.account"),
]
HEALTH = HealthSpec(lag_warn_seconds=60, lag_fail_seconds=600)


def _at(seconds_ago: float) -> datetime:
    return NOW - timedelta(seconds=seconds_ago)


def _commit(layer: str, table: str, *, newest_ago: float, visible_ago: float, events: int = 10):
    return CommitRecord(
        layer=layer,
        kind="commit",
        visible_at=_at(visible_ago),
        topic=TOPIC,
        object=None if layer == "bronze" else OBJ,
        table=table,
        events=events,
        newest_commit_at=_at(newest_ago),
    )


def _summary(records: list[CommitRecord], *, window: float = 300) -> Summary:
    rows = records_to_arrow(records)
    batches = list(CommitSummary(NOW - timedelta(seconds=window))(iter(rows.to_batches())))
    found = [r for batch in batches for r in batch.to_pylist()]
    return Summary(
        tuple(
            TableSummary(
                layer=r["layer"],
                kind=r["kind"],
                topic=r["topic"],
                object=r["object"],
                table=r["table_name"],
                newest_commit_at=r["newest_commit_at"],
                visible_at=r["visible_at"],
                events_recent=r["events_recent"],
                rows_recent=r["rows_recent"],
                count=r["count"],
                message=r["message"],
            )
            for r in found
        )
    )


def _verdict(records: list[CommitRecord], caught_up=(True, False, False), **counts: int):
    summary = _summary(records)
    lags = layer_lags(summary, now=NOW, tables=CHAIN, caught_up=list(caught_up))
    args = {"quarantined": 0, "resync_records": 0, "resync_whole": 0, **counts}
    verdict, error = judge(summary, lags, HEALTH, topic=TOPIC, obj=OBJ, **args)
    return lags, verdict, error


def test_lag_is_now_minus_the_newest_commit_time_each_layer_applied() -> None:
    records = [
        _commit("bronze", CHAIN[0][1], newest_ago=5, visible_ago=4),
        _commit("silver", CHAIN[1][1], newest_ago=20, visible_ago=3),
        _commit("gold", CHAIN[2][1], newest_ago=30, visible_ago=2),
        _commit("gold", CHAIN[2][1], newest_ago=45, visible_ago=200),
    ]
    lags, verdict, error = _verdict(records)
    assert [lag.behind_seconds for lag in lags] == [5, 20, 30]
    assert verdict.state == "OK" and error is None
    # Events per second over the window: the gold commits' 20 events over 300 s.
    assert layer_rate(_summary(records), "gold", CHAIN[2][1], 300) == pytest.approx(20 / 300)


def test_a_layer_that_processed_everything_below_it_is_as_fresh_as_that_layer() -> None:
    records = [
        _commit("bronze", CHAIN[0][1], newest_ago=5, visible_ago=4),
        CommitRecord(
            layer="bronze", kind="caught_up", visible_at=_at(1), topic=TOPIC, table=CHAIN[0][1]
        ),
        _commit("silver", CHAIN[1][1], newest_ago=900, visible_ago=3),
        _commit("gold", CHAIN[2][1], newest_ago=900, visible_ago=2),
    ]
    lags, verdict, _ = _verdict(records, caught_up=(True, True, True))
    assert [lag.behind_seconds for lag in lags] == [1, 1, 1]
    assert verdict.state == "OK"


@pytest.mark.parametrize(
    ("gold_ago", "state"), [(59, "OK"), (60, "WARN"), (599, "WARN"), (600, "FAIL")]
)
def test_thresholds_of_the_yaml_decide_warn_and_fail(gold_ago: float, state: str) -> None:
    records = [
        _commit("bronze", CHAIN[0][1], newest_ago=1, visible_ago=1),
        _commit("silver", CHAIN[1][1], newest_ago=1, visible_ago=1),
        _commit("gold", CHAIN[2][1], newest_ago=gold_ago, visible_ago=1),
    ]
    _, verdict, _ = _verdict(records)
    assert verdict.state == state
    if state != "OK":
        assert f"{gold_ago:.0f} s behind" in verdict.reasons[0]


def test_quarantine_and_resync_warn_and_an_unrecovered_error_fails() -> None:
    base = [
        _commit("bronze", CHAIN[0][1], newest_ago=1, visible_ago=1),
        _commit("silver", CHAIN[1][1], newest_ago=1, visible_ago=1),
        _commit("gold", CHAIN[2][1], newest_ago=1, visible_ago=30),
    ]
    _, verdict, _ = _verdict(base, quarantined=3, resync_records=2)
    assert verdict.state == "WARN"
    assert verdict.reasons == ("3 quarantined rows", "re-sync pending (2 records)")

    failed = CommitRecord(
        layer="gold", kind="error", visible_at=_at(10), message="LakeError: disk full"
    )
    _, verdict, error = _verdict([*base, failed])
    assert verdict.state == "FAIL"
    assert error is not None and error.message == "LakeError: disk full" and not error.recovered
    assert error.at == _at(10)

    # A gold commit after the failure: recovered, the error is still reported as the last one.
    later = _commit("gold", CHAIN[2][1], newest_ago=1, visible_ago=5)
    _, verdict, error = _verdict([*base, failed, later])
    assert verdict.state == "OK" and error is not None and error.recovered


def test_nothing_recorded_is_a_warning_not_a_guess() -> None:
    lags, verdict, _ = _verdict([])
    assert all(lag.behind_seconds is None for lag in lags)
    assert verdict.state == "WARN" and "nothing recorded" in verdict.reasons[0]


def test_an_object_without_events_yet_is_as_current_as_its_quiet_topic() -> None:
    # A keepalive showed the topic caught up 2 s ago; bronze (version 0) holds no event, so
    # silver made no table, and gold has nothing to apply: not "lag unknown".
    caught_up = CommitRecord(
        layer="bronze", kind="caught_up", visible_at=_at(2), topic=TOPIC, table=CHAIN[0][1]
    )
    progress = Progress(
        bronze=TableRef("bronze", "account_change_event"),
        bronze_version=0,
        silver=TableRef("silver", "account"),
        silver_version=None,
        processed=None,
        gold=TableRef("gold", "account"),
    )
    status = object_status(
        _summary([caught_up]),
        progress,
        name=OBJ,
        topic=TOPIC,
        now=NOW,
        window=300,
        spec=HEALTH,
        open_resync=[],
        quarantined=0,
    )
    assert [h.behind_seconds for h in status.layers] == [2, 2, 2]
    assert status.state == "OK", status.reasons
