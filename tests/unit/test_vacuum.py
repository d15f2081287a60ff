"""VACUUM on the local engine is delta-rs' own (:func:`pipelines.engines.local_maintenance.vacuum`):
files that commits removed go once their removal is older than the retention (at once with a
retention of zero), files no version references -- the change data feed's, a crashed writer's
-- once written longer ago than the retention and an hour, so a file a writer has yet to
commit stays. Time is moved by back-dating files."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from pipelines.engines import TableRef
from pipelines.engines.arrow import arrow_schema_to_spark
from pipelines.engines.local import LocalEngine

TOMBSTONE_RETENTION = "delta.deletedFileRetentionDuration"

GOLD = TableRef("gold", "account")


def _actions(table_dir: Path, version: int) -> list[dict[str, Any]]:
    text = (table_dir / "_delta_log" / f"{version:020d}.json").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


@pytest.fixture
def merged(tmp_path: Path) -> tuple[LocalEngine, Path, dict[int, list[str]]]:
    """A gold table merged into four times (an insert, then three updates); per version, the
    change data files its commit names."""
    engine = LocalEngine(location=tmp_path / "lake")
    engine.merge(GOLD, pa.table({"Id": ["1", "2"], "Name": ["a", "b"]}), on=["Id"])
    for key, name in (("1", "c"), ("2", "d"), ("1", "e")):
        engine.merge(GOLD, pa.table({"Id": [key], "Name": [name]}), on=["Id"])
    path = engine.path(GOLD)
    latest = DeltaTable(str(path)).version()
    written = {
        v: [a["cdc"]["path"] for a in _actions(path, v) if "cdc" in a] for v in range(latest + 1)
    }
    assert all(written[v] for v in range(latest - 2, latest + 1)), written  # each update's
    return engine, path, written


def _change_data_on_disk(path: Path) -> list[str]:
    return sorted(p.relative_to(path).as_posix() for p in path.glob("_change_data/**/*.parquet"))


@pytest.mark.parametrize("hours", [1, 0.5], ids=["whole hours", "fractional hours"])
def test_change_data_older_than_the_retention_goes_and_the_newest_versions_stay_readable(
    merged: tuple[LocalEngine, Path, dict[int, list[str]]], hours: float
) -> None:
    engine, path, written = merged
    latest = max(written)
    # The change data of every commit but the last written two hours ago: a VACUUM with a
    # retention of an hour (half an hour rounds up to one) keeps only the last update's.
    for version in range(latest):
        for name in written[version]:
            _age(path / name, 7200)
    before = len(list(path.glob("**/*.parquet")))
    result = engine.maintain(GOLD, compact=False, checkpoint=False, vacuum_hours=hours)
    assert _change_data_on_disk(path) == sorted(written[latest])
    assert result.vacuumed_files == before - len(list(path.glob("**/*.parquet")))
    assert result.vacuumed_files == sum(len(written[v]) for v in range(latest))
    changes = pa.table(DeltaTable(str(path)).load_cdf(starting_version=latest))
    pairs = zip(changes["Id"].to_pylist(), changes["_change_type"].to_pylist(), strict=True)
    assert sorted(pairs) == [("1", "update_postimage"), ("1", "update_preimage")]
    assert sorted(engine.read_arrow(GOLD)["Name"].to_pylist()) == ["d", "e"]


def test_files_a_merge_replaced_go_at_once_with_no_retention(
    merged: tuple[LocalEngine, Path, dict[int, list[str]]],
) -> None:
    engine, path, _ = merged
    adds = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True))
    referenced = set(adds.column("path").to_pylist())
    result = engine.maintain(GOLD, compact=False, checkpoint=False, vacuum_hours=0)
    assert result.vacuumed_files and _data_files(path) == referenced
    assert sorted(engine.read_arrow(GOLD)["Name"].to_pylist()) == ["d", "e"]


BRONZE = TableRef("bronze", "orders")


def _append(engine: LocalEngine, n: int) -> None:
    engine.append(BRONZE, pa.table({"n": pa.array([n], pa.int64())}))


def _data_files(path: Path) -> set[str]:
    return {p.name for p in path.glob("*.parquet")}


def test_files_whose_tombstones_left_the_checkpoints_are_still_deleted(tmp_path: Path) -> None:
    engine = LocalEngine(location=tmp_path / "lake")
    engine.ensure_table(
        BRONZE,
        arrow_schema_to_spark(pa.schema([("n", pa.int64())])),
        properties={TOMBSTONE_RETENTION: "interval 1 seconds"},
    )
    for n in range(4):
        _append(engine, n)
    path = engine.path(BRONZE)
    appended = _data_files(path)
    engine.maintain(BRONZE, checkpoint=False)  # the four files leave the table
    time.sleep(1.2)
    _append(engine, 4)
    engine.maintain(BRONZE, compact=False, checkpoint=True)
    # The checkpoint no longer holds the compacted files' tombstones ...
    (checkpoint,) = (path / "_delta_log").glob("*.checkpoint.parquet")
    removes = pq.read_table(checkpoint, columns=["remove"]).column("remove")
    assert removes.null_count == len(removes)
    for name in appended:
        _age(path / name, 7200)
    # ... and VACUUM still deletes them, as files no version references.
    result = engine.maintain(BRONZE, compact=False, checkpoint=False, vacuum_hours=1 / 60)
    assert result.vacuumed_files == 4
    assert not appended & _data_files(path)
    assert sorted(engine.read_arrow(BRONZE)["n"].to_pylist()) == [0, 1, 2, 3, 4]


def test_a_file_a_writer_has_yet_to_commit_stays_and_an_old_stray_goes(
    tmp_path: Path,
) -> None:
    engine = LocalEngine(location=tmp_path / "lake")
    for n in range(2):
        _append(engine, n)
    path = engine.path(BRONZE)
    stray = path / "part-00000-left-by-a-crashed-writer-c000.snappy.parquet"
    stray.write_bytes(b"PAR1")
    _age(stray, 7200)
    in_flight = path / "part-00000-being-written-c000.snappy.parquet"
    in_flight.write_bytes(b"PAR1")
    _age(in_flight, 600)
    result = engine.maintain(BRONZE, compact=False, checkpoint=False, vacuum_hours=0)
    assert result.vacuumed_files == 1
    assert not stray.exists() and in_flight.exists()
    assert sorted(engine.read_arrow(BRONZE)["n"].to_pylist()) == [0, 1]
