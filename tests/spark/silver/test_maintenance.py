"""Maintenance with 0 h retention on real Delta tables, on both engines: old files and log
entries go, the bronze versions silver has not read yet stay, and silver reads them; and
``sfcdc maintain`` on a local lake."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable

from pipelines import cli
from pipelines.engines import LakeEngine, TableRef, Txn
from pipelines.engines.base import TOMBSTONE_PROPERTY
from pipelines.engines.deltalog import log_entries
from pipelines.engines.local import LocalEngine
from pipelines.maintenance import describe, maintain_tables
from pipelines.silver.job import run_silver
from pipelines.spec import Conf, MaintenanceSpec, PipelineSpec
from tests.conftest import EngineFactory
from tests.spark.silver.lake import ACCOUNT, ACCOUNT_SILVER, land, register, silver, table_dir
from tests.unit.silver.support import ACCOUNT_V1, bronze_batch, change_event

BRONZE = TableRef("bronze", ACCOUNT.tables.bronze)
ZERO = MaintenanceSpec(vacuum_retention_hours=0, log_retention_hours=0)


def _events(batches: range) -> list[list[tuple[str, bytes]]]:
    return [
        [(ACCOUNT_V1.schema_id, change_event(ACCOUNT_V1, "CREATE", [f"001{i:03d}"]))]
        for i in batches
    ]


def _land(engine: LakeEngine, batches: range) -> None:
    for i, events in zip(batches, _events(batches), strict=True):
        land(engine, ACCOUNT, events, batch_id=i)


def _land_elsewhere(engine: LakeEngine, batch: int) -> None:
    """A second writer of the table (its own transaction), which last saw the log long ago."""
    (events,) = _events(range(batch, batch + 1))
    rows = bronze_batch(events, batch_id=batch, topic=ACCOUNT.topic)
    engine.append(BRONZE, rows, txn=Txn("tests.other-writer", batch))


def _age_log(log_dir: Path, before: int, days: int) -> None:
    """Make the log entries of versions before ``before`` ``days`` old, as their files'
    modification times say (both libraries judge an entry's age by it). Delta Spark keeps
    every entry of the day its log retention ends in, and never less than the tombstones
    (7 days), so only entries that old can go there."""
    then = time.time() - days * 86_400
    for entry in log_dir.iterdir():
        if entry.is_file() and entry.name[:20].isdigit() and int(entry.name[:20]) < before:
            os.utime(entry, (then, then))


def _data_files(directory: Path) -> int:
    return sum(1 for p in directory.rglob("*.parquet") if "_delta_log" not in p.parts)


@pytest.fixture
def delta_checkpoints(engine_name: str, request: pytest.FixtureRequest) -> Iterator[None]:
    """Over Spark Connect nothing can write a log checkpoint on demand (no SQL statement
    does), so the log is cleaned up only when Delta checkpoints by itself: there, tables
    created during the test checkpoint every second commit."""
    if engine_name != "spark_connect":
        yield
        return
    session = request.getfixturevalue("spark_connect")
    key = "spark.databricks.delta.properties.defaults.checkpointInterval"
    session.conf.set(key, "2")
    try:
        yield
    finally:
        session.conf.unset(key)


@pytest.mark.usefixtures("delta_checkpoints")
def test_maintain_removes_old_files_and_log_entries_but_not_what_silver_has_yet_to_read(
    engine: LakeEngine, make_engine: EngineFactory, lake: Path
) -> None:
    conf = Conf(PipelineSpec(maintenance=ZERO), (ACCOUNT,), Path("conf"))
    bronze_dir = table_dir(lake, BRONZE)
    other = make_engine(lake)
    register(engine, ACCOUNT_V1)
    _land(engine, range(2))
    _land_elsewhere(other, 2)
    run_silver(engine, conf)

    # Silver has read everything: no old file is needed, so 0 h it is. Its next read starts
    # at the compaction this run commits, so no log entry can go yet.
    files = _data_files(bronze_dir)
    # Bronze alone (every table of the lake is the maintain command's test, on the local engine:
    # each Spark VACUUM costs seconds).
    (first,) = maintain_tables(engine, conf, tables=[BRONZE])
    assert first.retention.need is None
    assert (first.retention.vacuum_hours, first.retention.log_hours) == (0, 0)
    assert first.result is not None and first.result.files_removed == files == 3
    assert first.result.vacuumed_files == files and _data_files(bronze_dir) == 1
    assert first.result.log_entries_removed == 0

    _land(engine, range(3, 5))
    run_silver(engine, conf)
    assert first.result.checkpoint_version is not None
    _age_log(bronze_dir / "_delta_log", before=first.result.checkpoint_version, days=30)
    entries = log_entries(bronze_dir / "_delta_log")
    (second,) = maintain_tables(engine, conf, tables=[BRONZE])
    assert second.result is not None and second.result.vacuumed_files == 3
    # The old entries went: during the cleanup, or already when the maintenance's own commits
    # ran the library's post-commit cleanup (then not counted as the cleanup's).
    assert second.result.log_entries_removed is not None
    assert log_entries(bronze_dir / "_delta_log") < entries
    assert not (bronze_dir / "_delta_log" / f"{0:020d}.json").exists()

    # Three more batches, one by the writer whose last commit's log entry is gone; silver
    # has not read them: their files and log entries must survive.
    _land(engine, range(5, 7))
    _land_elsewhere(other, 7)
    processed = engine.txn_version(ACCOUNT_SILVER, "sfcdc.silver:Account")
    assert processed is not None
    (third,) = maintain_tables(engine, conf, tables=[BRONZE])
    need = third.retention.need
    assert need is not None and need.version == processed + 1
    assert third.retention.vacuum_hours > 0 and third.retention.log_hours > 0
    assert f"silver.account (sfcdc.silver:Account) needs version {processed + 1}" in describe(third)
    assert third.result is not None and third.result.vacuumed_files == 0
    assert third.result.log_entries_removed == 0

    result = run_silver(engine, conf)
    (account,) = result.objects
    assert (account.after_version, account.events) == (processed, 3)
    assert [r["Id"] for r in silver(engine, ACCOUNT)] == [f"001{i:03d}" for i in range(8)]


def test_local_checkpoints_keep_tombstones_for_the_configured_retention_only(
    engine: LakeEngine, lake: Path
) -> None:
    spec = MaintenanceSpec(vacuum_retention_hours=0.5, log_retention_hours=1)
    conf = Conf(PipelineSpec(maintenance=spec), (ACCOUNT,), Path("conf"))
    register(engine, ACCOUNT_V1)
    _land(engine, range(2))
    maintain_tables(engine, conf, tables=[BRONZE])
    configuration = DeltaTable(str(table_dir(lake, BRONZE))).metadata().configuration
    if not isinstance(engine, LocalEngine):
        # Delta Spark refuses reads of versions older than the property: Delta's default stays.
        assert TOMBSTONE_PROPERTY not in configuration
        return
    assert configuration[TOMBSTONE_PROPERTY] == "interval 1800 seconds"
    # Set once: a later round commits nothing for it.
    version = engine.version(BRONZE)
    assert version is not None
    _land(engine, range(2, 3))
    maintain_tables(engine, conf, tables=[BRONZE])
    later = [e for e in engine.history(BRONZE, limit=10) if e.version > version]
    assert later and not [e for e in later if "PROPERTIES" in e.operation.upper()], later


def test_the_maintain_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lake = tmp_path / "lake"
    conf = tmp_path / "conf"
    (conf / "objects").mkdir(parents=True)
    (conf / "pipeline.yml").write_text(
        f"lake:\n  engine: local\n  location: {lake}\n"
        "maintenance:\n  vacuum_retention_hours: 0\n  log_retention_hours: 0\n"
    )
    (conf / "objects" / "account.yml").write_text("object: Account\nkind: change_events\n")
    engine = LocalEngine(location=lake)
    register(engine, ACCOUNT_V1)
    _land(engine, range(2))
    bronze_dir = table_dir(lake, BRONZE)

    assert cli.main(["-q", "maintain", "--conf", str(conf), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "bronze.account_change_event: dry run, would use retention 0 h (files), 0 h (log)" in out
    assert _data_files(bronze_dir) == 2

    assert cli.main(["-q", "maintain", "--conf", str(conf), "--objects", "Account"]) == 0
    lines = capsys.readouterr().out.splitlines()
    (line,) = [x for x in lines if x.startswith("bronze.account_change_event:")]
    assert line.startswith(
        "bronze.account_change_event: compacted 2 files into 1, vacuumed 2 files, removed "
    )
    assert line.endswith("retention 0 h (files), 0 h (log): configured (no consumer is behind)")
    assert "removed 0 log entries" not in line
    assert any(x.startswith("bronze.sfcdc_schemas: compacted") for x in lines)
    assert _data_files(bronze_dir) == 1

    assert cli.main(["-q", "maintain", "--conf", str(conf), "--objects", "Nope"]) == 2
    assert "--objects: no object 'Nope'" in capsys.readouterr().err


class _LandingMeanwhile(LocalEngine):
    """A local engine beside which the landing commits to bronze: right after each lookup of
    bronze's latest version (as bronze's landing does several times a second)."""

    def __init__(self, location: Path) -> None:
        super().__init__(location=location)
        self.batches = iter(range(100, 200))
        self.landing = False

    def version(self, table: TableRef) -> int | None:
        latest = super().version(table)
        if table == BRONZE and self.landing:
            self.landing = False  # the landing's own appends look the version up too
            _land(self, range(next(self.batches), next(self.batches)))
            self.landing = True
        return latest


def test_the_commit_a_consumer_needs_is_found_while_the_landing_commits(lake: Path) -> None:
    conf = Conf(PipelineSpec(maintenance=ZERO), (ACCOUNT,), Path("conf"))
    engine = _LandingMeanwhile(lake)
    register(engine, ACCOUNT_V1)
    _land(engine, range(2))
    run_silver(engine, conf)
    _land(engine, range(2, 4))
    processed = engine.txn_version(ACCOUNT_SILVER, "sfcdc.silver:Account")
    assert processed is not None
    engine.landing = True
    (item,) = maintain_tables(engine, conf, tables=[BRONZE])
    # The needed version's commit time is read although newer commits keep arriving: the
    # retention is its age plus the margin, not "keep everything".
    need = item.retention.need
    assert need is not None and need.version == processed + 1
    assert need.committed_at is not None, describe(item)
    assert item.retention.vacuum_hours < 1 and item.result is not None
    assert item.result.vacuumed_files is not None
