"""The retention rule of :mod:`pipelines.maintenance` and the log cleanup of
:func:`pipelines.engines.deltalog.expire_log` (on log files made on disk, and on real tables
with a checkpoint that a writer left unfinished)."""

from __future__ import annotations

import math
import os
import shutil
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from pipelines.engines import TableRef
from pipelines.engines.deltalog import expire_log, log_entries
from pipelines.maintenance import (
    SAFETY_MARGIN_HOURS,
    Consumer,
    Need,
    consumers_of,
    log_floor,
    oldest_needed,
    retention_for,
    tombstone_hours,
)
from pipelines.spec import Conf, MaintenanceSpec, ObjectSpec, PipelineSpec

NOW = datetime(2026, 1, 10, 12, tzinfo=timezone.utc)
ACCOUNT = Consumer(TableRef("silver", "account"), "sfcdc.silver:Account")
CONTACT = Consumer(TableRef("silver", "contact"), "sfcdc.silver:Contact")


def test_the_oldest_version_a_consumer_still_needs() -> None:
    assert oldest_needed(10, {ACCOUNT: 7, CONTACT: 4}) == (CONTACT, 5)
    # Up to date, or never read (a first read is a snapshot): nothing old is needed.
    assert oldest_needed(10, {ACCOUNT: 10, CONTACT: None}) is None
    assert oldest_needed(10, {ACCOUNT: 10, CONTACT: 9}) == (CONTACT, 10)
    assert oldest_needed(None, {ACCOUNT: 3}) is None
    assert oldest_needed(10, {}) is None


def test_the_log_is_kept_from_where_the_next_read_of_a_consumer_starts() -> None:
    # Up to date at 10: its next read starts at 11, which maintenance itself may commit.
    assert log_floor({ACCOUNT: 10, CONTACT: 4}) == 5
    assert log_floor({ACCOUNT: 10, CONTACT: None}) == 11
    assert log_floor({ACCOUNT: None}) is None and log_floor({}) is None


def test_retention_is_the_configured_one_or_the_age_of_the_needed_commit() -> None:
    spec = MaintenanceSpec(vacuum_retention_hours=168, log_retention_hours=720)
    kept = retention_for(spec, None, now=NOW, consumers=2)
    assert (kept.vacuum_hours, kept.log_hours) == (168, 720)
    assert kept.reason == "configured (no consumer is behind)"
    assert retention_for(spec, None, now=NOW).reason == "configured (no consumers)"

    old = Need(CONTACT, 5, NOW - timedelta(hours=200))
    r = retention_for(spec, old, now=NOW, consumers=2)
    assert r.vacuum_hours == pytest.approx(200 + SAFETY_MARGIN_HOURS)
    assert r.log_hours == 720
    assert "silver.contact (sfcdc.silver:Contact) needs version 5" in r.reason

    zero = MaintenanceSpec(vacuum_retention_hours=0, log_retention_hours=0)
    recent = retention_for(zero, Need(ACCOUNT, 9, NOW - timedelta(minutes=30)), now=NOW)
    assert recent.vacuum_hours == recent.log_hours == pytest.approx(0.5 + SAFETY_MARGIN_HOURS)
    # A needed commit whose time is unknown keeps everything.
    assert math.isinf(retention_for(zero, Need(ACCOUNT, 9), now=NOW).vacuum_hours)


def test_consumers_are_silver_of_bronze_and_gold_of_silver() -> None:
    account = ObjectSpec(api_name="Account", kind="change_events", topic="/data/ChangeEvents")
    contact = ObjectSpec(api_name="Contact", kind="change_events", topic="/data/ChangeEvents")
    event = ObjectSpec(api_name="Order_Shipped__e", kind="platform_event")
    off = ObjectSpec(api_name="Lead", kind="change_events", enabled=False)
    conf = Conf(PipelineSpec(), (account, contact, event, off), Path("conf"))
    found = consumers_of(conf)
    assert found[TableRef("bronze", "change_events")] == [
        Consumer(TableRef("silver", "account"), "sfcdc.silver:Account"),
        Consumer(TableRef("silver", "contact"), "sfcdc.silver:Contact"),
    ]
    assert found[TableRef("silver", "account")] == [
        Consumer(TableRef("gold", "account"), "sfcdc.gold:Account")
    ]
    assert TableRef("silver", "order_shipped") not in found  # platform events have no gold
    assert TableRef("bronze", "lead_change_event") not in found


def _log_dir(tmp_path: Path, versions: int, checkpoints: list[int], old: int) -> Path:
    """A log of ``versions`` commits, the first ``old`` of them two days old."""
    log = tmp_path / "_delta_log"
    log.mkdir(parents=True)
    for v in range(versions):
        path = log / f"{v:020d}.json"
        path.write_text("{}\n")
        (log / f".{v:020d}.json.crc").write_text("")
        if v < old:
            stamp = (NOW - timedelta(days=2)).timestamp()
            os.utime(path, (stamp, stamp))
    (log / f".{0:020d}.json.0123abcd.tmp").write_text("")  # a writer's, in flight
    for c in checkpoints:
        (log / f"{c:020d}.checkpoint.parquet").write_bytes(b"")
    if checkpoints:
        (log / "_last_checkpoint").write_text(f'{{"version":{max(checkpoints)},"size":1}}')
    return log


def test_expired_log_entries_go_up_to_a_checkpoint_that_keeps_the_rest_readable(
    tmp_path: Path,
) -> None:
    log = _log_dir(tmp_path, 30, [10, 20], old=15)
    assert log_entries(log) == 32
    # Versions 0-14 are older than a day: the newest checkpoint at or before 15 is 10.
    cutoff = (NOW - timedelta(days=1)).timestamp()
    assert expire_log(log, older_than=cutoff) == 10
    names = sorted(p.name for p in log.iterdir() if not p.name.startswith("."))
    assert names[0] == f"{10:020d}.checkpoint.parquet" and f"{10:020d}.json" in names
    assert not (log / f".{9:020d}.json.crc").exists() and (log / "_last_checkpoint").exists()
    assert (log / f".{0:020d}.json.0123abcd.tmp").exists()

    # A reader starting at version 19 keeps checkpoint 10 and what follows it.
    assert expire_log(log, older_than=math.inf, keep_version=19) == 0
    # Everything expired: up to the newest checkpoint, which the latest versions need.
    assert expire_log(log, older_than=math.inf) == 11
    assert log_entries(log) == 11  # checkpoint 20 and versions 20-29
    # Without a checkpoint nothing can go.
    bare = _log_dir(tmp_path / "bare", 5, [], old=5)
    assert expire_log(bare, older_than=math.inf) == 0


def _age(folder: Path, seconds: float) -> None:
    stamp = time.time() - seconds
    for path in folder.iterdir():
        if path.is_file():
            os.utime(path, (stamp, stamp))


def test_a_checkpoint_a_writer_left_unfinished_is_never_the_cut(tmp_path: Path) -> None:
    """Version 10 has a complete checkpoint (the one _last_checkpoint names), version 20
    one part of two (a delta-spark writer died writing it, or is still writing it): the log
    is cut at 10, and every row stays readable. (Cut at 20, as any checkpoint file name once
    did, it lost checkpoint 10 and commits 0-19: the table could not be read.)"""
    root = tmp_path / "table"
    for i in range(21):
        write_deltalake(root, pa.table({"x": [i]}), mode="append")
        if i == 10:
            DeltaTable(root).create_checkpoint()
    log = root / "_delta_log"
    complete = next(p for p in log.iterdir() if ".checkpoint." in p.name)
    shutil.copy(complete, log / f"{20:020d}.checkpoint.0000000001.0000000002.parquet")
    hint = (log / "_last_checkpoint").read_text()
    _age(log, 7200)

    expire_log(log, older_than=math.inf)

    cut = int(complete.name.split(".")[0])
    assert complete.exists() and (log / "_last_checkpoint").read_text() == hint
    assert not (log / f"{cut - 1:020d}.json").exists()
    assert all((log / f"{v:020d}.json").exists() for v in range(cut, 21))
    assert sorted(DeltaTable(root).to_pyarrow_table().column("x").to_pylist()) == list(range(21))

    # Once the second part is there, checkpoint 20 is complete, but the cut stays at the one
    # _last_checkpoint names until it names 20.
    shutil.copy(complete, log / f"{20:020d}.checkpoint.0000000002.0000000002.parquet")
    _age(log, 7200)
    expire_log(log, older_than=math.inf)
    assert complete.exists()


def test_crashed_writers_files_and_unnamed_sidecars_go_once_old(tmp_path: Path) -> None:
    log = _log_dir(tmp_path, 12, [10], old=12)
    crashed = log / "_commit_0d3c1a.json.tmp"
    crashed.write_text("{}")
    sidecars = log / "_sidecars"
    sidecars.mkdir()
    (sidecars / "0123-orphan.parquet").write_bytes(b"")
    _age(log, 7200)
    _age(sidecars, 7200)
    fresh = log / f".{11:020d}.json.feedbeef.tmp"
    fresh.write_text("{}")  # a writer that is committing now

    expire_log(log, older_than=time.time() - 60)

    assert not crashed.exists() and not (sidecars / "0123-orphan.parquet").exists()
    assert fresh.exists()
    assert not (log / f"{9:020d}.json").exists() and (log / f"{10:020d}.json").exists()


def test_without_a_readable_last_checkpoint_nothing_goes(tmp_path: Path) -> None:
    log = _log_dir(tmp_path, 12, [10], old=12)
    (log / "_last_checkpoint").write_text('{"vers')  # being rewritten
    assert expire_log(log, older_than=math.inf) == 0
    assert log_entries(log) == 13


def test_tombstones_are_kept_for_the_configured_retention_doubled_to_cover_a_consumer() -> None:
    assert tombstone_hours(168, 168) == 168
    assert tombstone_hours(0.5, 0.2) == 0.5
    assert tombstone_hours(0.5, 0.6) == 1.0
    assert tombstone_hours(0.5, 3.1) == 4.0
    assert tombstone_hours(0, 0) == 1 / 60  # at least a minute
