"""The local engine keeps each table it opened and brings it up to date only when the log has
moved: what another writer commits, a cleaned-up log and a removed table are all seen."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pyarrow as pa

from pipelines.engines import TableRef
from pipelines.engines.deltalog import expire_log
from pipelines.engines.local import LocalEngine

TABLE = TableRef("silver", "account")


def _rows(n: int) -> pa.Table:
    return pa.table({"Id": [f"r{n}"], "n": pa.array([n], pa.int64())})


def test_commits_of_another_writer_are_seen(tmp_path: Path) -> None:
    reader = LocalEngine(location=tmp_path)
    writer = LocalEngine(location=tmp_path)
    first = writer.append(TABLE, _rows(0)).version
    assert reader.version(TABLE) == first
    for n in range(1, 4):
        writer.append(TABLE, _rows(n))
        assert reader.version(TABLE) == first + n
        assert reader.read_arrow(TABLE).num_rows == n + 1


def test_a_reader_left_behind_a_log_cleanup_catches_up(tmp_path: Path) -> None:
    reader = LocalEngine(location=tmp_path)
    writer = LocalEngine(location=tmp_path)
    first = writer.append(TABLE, _rows(0)).version
    assert reader.version(TABLE) == first
    for n in range(1, 6):
        writer.append(TABLE, _rows(n))
    writer.maintain(TABLE, compact=False, checkpoint=True)
    log = writer.path(TABLE) / "_delta_log"
    assert expire_log(log, older_than=time.time() + 60) > 0
    # The commit the reader is at, and the one after it, are gone.
    assert not (log / f"{first:020d}.json").exists()
    assert not (log / f"{first + 1:020d}.json").exists()
    assert reader.version(TABLE) == first + 5
    assert sorted(reader.read_arrow(TABLE)["n"].to_pylist()) == list(range(6))


def test_a_removed_table_is_gone_and_a_new_one_is_read_afresh(tmp_path: Path) -> None:
    reader = LocalEngine(location=tmp_path)
    writer = LocalEngine(location=tmp_path)
    writer.append(TABLE, _rows(0))
    second = writer.append(TABLE, _rows(1)).version
    assert reader.version(TABLE) == second
    shutil.rmtree(writer.path(TABLE))
    assert not reader.exists(TABLE)
    recreated = LocalEngine(location=tmp_path).append(TABLE, _rows(7)).version
    assert recreated < second
    assert reader.version(TABLE) == recreated
    assert reader.read_arrow(TABLE)["n"].to_pylist() == [7]
