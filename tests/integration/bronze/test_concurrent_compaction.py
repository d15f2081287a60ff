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

import pyarrow as pa
import pytest

from ingest.errors import LakeError
from pipelines.engines.base import TableRef
from pipelines.engines.local import LocalEngine

pytestmark = pytest.mark.integration

TABLE = TableRef("bronze", "orders")
ROUNDS = 8  # compactions each compacting process completes
ROUNDS_WITHIN = 180.0  # seconds a compacting process may take for them, from its own start


def _compact_in_a_loop(lake: str) -> int:
    # Counted in rounds, not seconds: a spawned process can take seconds to start on a busy
    # machine, and a deadline set before it started left it one round (seen in CI).
    engine = LocalEngine(location=lake)
    rounds = 0
    give_up = time.monotonic() + ROUNDS_WITHIN
    while rounds < ROUNDS and time.monotonic() < give_up:
        try:
            engine.maintain(TABLE, compact=True, checkpoint=False)
        except LakeError as exc:
            # A listing of the log that raced a commit is refused, and so is a compaction
            # that lost the race for the next version on each of delta-rs' 15 attempts (a
            # loaded machine): scheduled maintenance tries again later. Anything else is a
            # failure.
            if not any(
                refused in str(exc)
                for refused in ("Expected contiguous commit files", "Failed to commit transaction")
            ):
                raise
            continue
        rounds += 1
    return rounds


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
    with spawn.Pool(2) as pool:
        compactors = [pool.apply_async(_compact_in_a_loop, (str(lake),)) for _ in range(2)]
        written = 10
        while not all(c.ready() for c in compactors):  # write for as long as they compact
            if writer == "append":
                engine.append(TABLE, _batch(written))
                written += 10
                time.sleep(0.02)  # a landing commits a topic every few hundred ms
            else:
                # Update the rows seen so far and add ten new ones: a MERGE rewrites files.
                seen = min(30, written)
                source = pa.concat_tables([_batch(written - seen, seen), _batch(written)])
                engine.merge(TABLE, source, on=["n"])
                written += 10
        rounds = [c.get() for c in compactors]
    assert rounds == [ROUNDS, ROUNDS], rounds  # both compacted while rows were written
    table = engine.read_arrow(TABLE)
    numbers = table.column("n").to_pylist()
    assert len(numbers) == len(set(numbers)) == written, (len(numbers), len(set(numbers)), written)
