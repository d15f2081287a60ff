"""Compactions and MERGEs of one local Delta table from several processes at once keep every
row exactly once.

delta-rs lets two commits that remove the same file with ``dataChange: false`` through, so
without the local engine's rewrite lock two overlapping compactions each add a copy of the
same rows (seen in a soak: a continuous run's scheduled maintenance compacting a bronze table
while the landing compacted it too). Here two other processes compact the table in a loop
while this one appends or merges into it; the table must end with each row once. (The spark
engine relies on Delta Spark's own conflict detection, which refuses such commits.)
"""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ingest.errors import LakeError
from pipelines.engines.base import TableRef
from pipelines.engines.local import LocalEngine

pytestmark = pytest.mark.integration

TABLE = TableRef("bronze", "orders")
# Commits the writer makes while the compactions run: counted, not timed, so that a busy
# machine makes the test slower, not different (a time limit let appends pile up into
# thousands of commits that every compaction then had to read).
WRITES = {"append": 150, "merge": 40}


def _compact_until(lake: str, started: Any, stop: Any) -> tuple[int, int]:
    """Say so on ``started``, then compact the table until ``stop`` is set; returns
    (compactions, refusals)."""
    engine = LocalEngine(location=lake)
    started.put(True)
    rounds = refused = 0
    while not stop.is_set():
        try:
            engine.maintain(TABLE, compact=True, checkpoint=False)
        except LakeError as exc:
            # A listing of the log that raced a commit is refused, and so is a compaction
            # that lost the race for the next version on each of delta-rs' 15 attempts (a
            # loaded machine): scheduled maintenance tries again later. Anything else is a
            # failure.
            if not any(
                reason in str(exc)
                for reason in ("Expected contiguous commit files", "Failed to commit transaction")
            ):
                raise
            refused += 1
            continue
        rounds += 1
    return rounds, refused


def _batch(first: int, rows: int = 10) -> pa.Table:
    ids = list(range(first, first + rows))
    return pa.table(
        {"n": pa.array(ids, pa.int64()), "value": pa.array([f"v{i}" for i in ids], pa.string())}
    )


@pytest.mark.parametrize("writer", ["append", "merge"])
def test_concurrent_compactions_keep_each_row_once(tmp_path: Path, writer: str) -> None:
    lake = tmp_path / "lake"
    engine = LocalEngine(location=lake)
    engine.append(TABLE, _batch(0))
    spawn = multiprocessing.get_context("spawn")  # delta-rs' runtime does not survive fork
    with spawn.Manager() as manager, spawn.Pool(2) as pool:
        started, stop = manager.Queue(), manager.Event()
        compactors = [
            pool.apply_async(_compact_until, (str(lake), started, stop)) for _ in range(2)
        ]
        for _ in compactors:
            started.get(timeout=300)  # spawned processes start slowly on a busy machine
        written = 10
        for _ in range(WRITES[writer]):
            if writer == "append":
                engine.append(TABLE, _batch(written))
                time.sleep(0.02)  # a landing commits a topic every few hundred ms
            else:
                # Update the rows seen so far and add ten new ones: a MERGE rewrites files.
                seen = min(30, written)
                source = pa.concat_tables([_batch(written - seen, seen), _batch(written)])
                engine.merge(TABLE, source, on=["n"])
            written += 10
        stop.set()
        results = [c.get(timeout=600) for c in compactors]
    assert min(rounds for rounds, _ in results) >= 1, results  # both compacted meanwhile
    table = engine.read_arrow(TABLE)
    numbers = table.column("n").to_pylist()
    assert len(numbers) == len(set(numbers)) == written, (len(numbers), len(set(numbers)), written)
