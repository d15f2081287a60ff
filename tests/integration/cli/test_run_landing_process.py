"""`sfcdc run --continuous` with the landing in a child process (`sfcdc ingest`): progress
read from the child's reports, a clean stop with SIGTERM, and a child that dies failing the
run with its exit code."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from deltalake import DeltaTable

from ingest.errors import SfcdcError
from pipelines.commands.signals import stop_on_signals
from pipelines.commands.status import read_status
from pipelines.run import LandingProcess, Pipeline
from pipelines.session import engine_for
from pipelines.spec import load_conf
from tests.integration.cli.conftest import write_conf

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_sigterm_stops_the_landing_process_then_a_last_pass_folds_everything(
    lake_kind: str, tmp_path: Path
) -> None:
    conf_dir = write_conf(tmp_path, events=200, platform_events=20, engine=lake_kind)
    conf = load_conf(conf_dir)
    lines: list[str] = []
    pids: list[int | None] = []

    def report(line: str) -> None:
        # Once the child reports a topic with events landed (with the spark engine it
        # starts a Spark driver first; on a loaded machine its first reports can show none
        # landed yet), the run is stopped.
        if not pids and line.startswith("/data/") and ", 0 landed" not in line:
            pids.append(pipeline.landing_pid)
            os.kill(os.getpid(), signal.SIGTERM)
        lines.append(line)

    pipeline = Pipeline(
        conf, report=report, landing_process=LandingProcess(conf_dir, progress_seconds=0.2)
    )
    with stop_on_signals(pipeline.stop):
        result = pipeline.run_continuous(interval=0.2)
    assert result.stopped == "received SIGTERM"
    # The landing ran in another process, which has exited.
    assert pids and pids[0] is not None and pids[0] != os.getpid()
    assert pipeline.landing_pid is None
    # Progress lines come from the child's reports: rate, lag and last replay id per topic.
    topic_lines = [line for line in lines if line.startswith("/data/AccountChangeEvent: ")]
    assert topic_lines and "events/s" in topic_lines[0] and "last replay id" in topic_lines[0]
    assert any(line.startswith("silver/gold pass: ") for line in lines)
    # The child's last report is the run's landing result, and the last pass folded it all.
    bronze = tmp_path / "lake" / "bronze"
    landed = sum(
        DeltaTable(str(bronze / t)).to_pyarrow_table(columns=["event_id"]).num_rows
        for t in ("account_change_event", "contact_change_event", "order_shipped__e")
    )
    assert result.landing.events == landed > 0
    status = read_status(engine_for(conf.pipeline.lake), conf)
    for obj in status.objects:
        assert obj.bronze_lag == 0 and obj.silver_lag in (0, None), obj


def test_a_landing_process_that_fails_names_its_exit_code_and_stops_the_passes(
    spark: object, tmp_path: Path
) -> None:
    conf_dir = write_conf(tmp_path, events=50, platform_events=0)
    # The child is told to use a lake engine that does not exist: it exits with code 2.
    child = LandingProcess(conf_dir, (("lake.engine", "nonsense"),))
    pipeline = Pipeline(load_conf(conf_dir), landing_process=child)
    with pytest.raises(SfcdcError, match=r"exited with code 2") as caught:
        pipeline.run_continuous(interval=0.2)
    message = str(caught.value)
    assert "landing process" in message and "lake.engine" in message
    assert "silver and gold passes stopped" in message


def test_a_killed_landing_process_fails_the_run(spark: object, tmp_path: Path) -> None:
    conf_dir = write_conf(tmp_path, events=100, platform_events=0)
    passes: list[str] = []

    def report(line: str) -> None:
        pid = pipeline.landing_pid
        if not passes and pid is not None:
            os.kill(pid, signal.SIGKILL)
        passes.append(line)

    pipeline = Pipeline(
        load_conf(conf_dir),
        report=report,
        landing_process=LandingProcess(conf_dir, progress_seconds=0.2),
    )
    with pytest.raises(SfcdcError, match="killed by signal SIGKILL"):
        pipeline.run_continuous(interval=0.2)
