"""`sfcdc run`: once (drain the in-process emulator, then silver and gold) and continuous
(landing in a thread, passes on an interval, a clean stop)."""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from ingest.errors import ConfigError
from pipelines import cli
from pipelines.commands.signals import stop_on_signals
from pipelines.commands.status import read_status
from pipelines.run import Pipeline
from pipelines.session import engine_for
from pipelines.spec import load_conf
from tests.integration.cli.conftest import FilledLake, write_conf

pytestmark = [pytest.mark.integration, pytest.mark.spark]

MAINTAINED = re.compile(r"maintenance: (\w+\.\w+): compacted")
ROUND = re.compile(r"maintenance: \d+ tables")


def test_run_once_lands_every_topic_then_fills_silver_and_gold(filled_lake: FilledLake) -> None:
    assert filled_lake.code == 0, filled_lake.out
    out = filled_lake.out
    assert "stopped after" in out and "drained" in out
    lake = filled_lake.lake
    for table in ("account_change_event", "contact_change_event", "order_shipped__e"):
        landed = DeltaTable(str(lake / "bronze" / table)).to_pyarrow_table(columns=["event_id"])
        assert landed.num_rows > 0
        assert f"bronze bronze.{table}: {landed.num_rows} events" in out
        # Exactly once: no event id twice.
        assert len(set(landed["event_id"].to_pylist())) == landed.num_rows
    for obj, table in (("Account", "account"), ("Contact", "contact")):
        silver = DeltaTable(str(lake / "silver" / table)).to_pyarrow_table(columns=["Id"])
        gold = DeltaTable(str(lake / "gold" / table)).to_pyarrow_table(columns=["Id"])
        assert f"silver {obj}: " in out and f"gold {obj}: " in out
        # Gold holds one row per record silver has seen (deleted ones are kept, soft delete).
        assert gold.num_rows == len(set(silver["Id"].to_pylist())) > 0
    assert "platform events have no gold table: Order_Shipped__e" in out


def test_run_continuous_stops_after_its_duration_with_a_last_pass(
    lake_kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = write_conf(tmp_path, events=200, platform_events=0, engine=lake_kind)
    # The landing child of the spark engine starts a Spark driver of its own first; the
    # duration counts from when its tables are ready.
    seconds = "3" if lake_kind == "local" else "10"
    code = cli.main(
        ["-q", "run", "--conf", str(conf), "--continuous", "--interval", "0.5", "--for", seconds]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "duration reached" in out
    assert "silver/gold passes" in out
    gold = DeltaTable(str(tmp_path / "lake" / "gold" / "account")).to_pyarrow_table(columns=["Id"])
    assert gold.num_rows > 0
    # Progress lines name each topic with its rate, lag and last replay id.
    assert "/data/AccountChangeEvent: " in out and "events/s" in out and "last replay id" in out


def test_a_continuous_run_maintains_its_tables_on_schedule_one_after_each_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pipelines.run")
    conf = write_conf(tmp_path, events=200, platform_events=0, engine="local")
    settings = ["maintenance.every_seconds=1", "maintenance.vacuum_retention_hours=0"]
    settings += ["maintenance.log_retention_hours=0"]
    args = ["-q", "run", "--conf", str(conf), "--continuous", "--interval", "0.5", "--for", "3"]
    lake = tmp_path / "lake"
    log = lake / "bronze" / "account_change_event" / "_delta_log"
    # On a loaded machine a few seconds may pass before landing has created bronze, or a
    # round may reach it while its log is one version long: run again (over the same lake)
    # until a round has maintained it and its log no longer starts at version 0.
    deadline = time.monotonic() + 120
    while True:
        caplog.clear()
        code = cli.main([*args, *(f"--set={s}" for s in settings)])
        out = capsys.readouterr().out
        assert code == 0, out
        passes = int(re.search(r"(\d+) silver/gold passes", out).group(1))  # type: ignore[union-attr]
        lines = [r.getMessage() for r in caplog.records if r.name == "pipelines.run"]
        maintained = [m.group(1) for m in map(MAINTAINED.match, lines) if m]
        rounds: list[list[str]] = []
        for line in lines:
            if ROUND.match(line):
                rounds.append([])
            elif m := MAINTAINED.match(line):
                rounds[-1].append(m.group(1))
        # A round maintains one table after each pass (not all of them after one pass), in
        # the order `sfcdc maintain` takes them: the first object's bronze table first. A
        # round that started before landing had created its tables holds only those that
        # existed then.
        assert len(maintained) <= passes, (maintained, passes)
        full = next((r for r in rounds if "bronze.account_change_event" in r), None)
        assert full is None or full[0] == "bronze.account_change_event", rounds
        # Maintenance ran: the log no longer starts at version 0 (its history with it).
        cleaned = not (log / f"{0:020d}.json").exists() and (log / "_last_checkpoint").exists()
        if full is not None and cleaned:
            break
        entries = sorted(p.name for p in log.iterdir()) if log.is_dir() else []
        assert time.monotonic() < deadline, (rounds, entries)
    bronze = DeltaTable(str(lake / "bronze" / "account_change_event"))
    # Landing went on beside it (in its child process): every event once, and silver read
    # every one of them (nothing it had yet to read was removed).
    landed = bronze.to_pyarrow_table(columns=["event_id", "batch_id", "batch_seq"])
    events = landed["event_id"].to_pylist()
    assert len(events) == len(set(events)) > 0
    silver = DeltaTable(str(lake / "silver" / "account")).to_pyarrow_table(
        columns=["_cdc_bronze_batch_id", "_cdc_bronze_batch_seq"]
    )
    read = [c.to_pylist() for c in silver.columns]
    assert set(zip(*read, strict=True)) == set(
        zip(landed["batch_id"].to_pylist(), landed["batch_seq"].to_pylist(), strict=True)
    )


def test_run_with_an_unknown_object_names_the_configured_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = write_conf(tmp_path)
    code = cli.main(["run", "--conf", str(conf), "--once", "--objects", "Acount"])
    err = capsys.readouterr().err
    assert code == 2
    assert "'Acount'" in err and "Account" in err and "Contact" in err


def test_sigterm_stops_a_continuous_run_cleanly_with_a_last_pass(
    lake_kind: str, tmp_path: Path
) -> None:
    conf = load_conf(write_conf(tmp_path, events=200, platform_events=0, engine=lake_kind))
    lines: list[str] = []

    stopped: list[bool] = []

    def report(line: str) -> None:
        # The handler is installed (the run is inside stop_on_signals); once a topic has
        # landed something (a loaded machine may report a pass before any event arrives).
        landed = re.search(r": \d+ events/s, (\d+) landed", line)
        if not stopped and landed and int(landed.group(1)) > 0:
            stopped.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
        lines.append(line)

    pipeline = Pipeline(conf, report=report)
    with stop_on_signals(pipeline.stop):
        result = pipeline.run_continuous(interval=0.2)
    assert result.stopped == "received SIGTERM"
    assert len(result.passes) >= 2  # the pass that reported, then the last one
    assert any(line.startswith("silver/gold pass: ") for line in lines)
    # Everything the landing committed reached silver and gold.
    status = read_status(engine_for(conf.pipeline.lake), conf)
    for obj in status.objects:
        assert obj.bronze_lag == 0 and obj.silver_lag in (0, None), obj
    assert sum(t.events_landed for t in status.topics) == result.landing.events > 0


def test_a_failing_pass_stops_the_landing_and_is_raised(lake_kind: str, tmp_path: Path) -> None:
    conf_dir = write_conf(tmp_path, events=100, platform_events=0, engine=lake_kind)
    (conf_dir / "objects" / "account.yml").write_text(
        "object: Account\nkind: change_events\ngold:\n  sequence_by: [No_Such_Column__c]\n"
    )
    pipeline = Pipeline(load_conf(conf_dir))
    with pytest.raises(ConfigError, match="No_Such_Column__c"):
        pipeline.run_continuous(interval=0.2)
    # The landing thread was stopped and joined before the error surfaced.
    assert not [t for t in threading.enumerate() if t.name == "sfcdc-landing"]
