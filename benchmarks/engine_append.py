"""Arrow append throughput of the local lake engine into a bronze-shaped Delta table.

Each batch is what bronze landing commits: raw Avro payload bytes plus the event's identity,
appended with an application transaction (idempotency) and commit metadata. The baseline,
measured in the same run on the same batches, is a bare ``deltalake.write_deltalake`` append:
the difference is the engine's own cost (txn check, schema fitting, metadata). No Spark
session is started: the bronze path does not need one.

    python benchmarks/engine_append.py [--batches 8] [--rows 25000] [--payload-bytes 600]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from deltalake import write_deltalake

from pipelines.engines import TableRef, Txn
from pipelines.engines.local import LocalEngine

TOPIC = "/data/AccountChangeEvent"


def bronze_batch(first: int, rows: int, payload_bytes: int, rng: np.random.Generator) -> pa.Table:
    # Random payloads do not compress, like encrypted or high-entropy Avro: a worst case.
    raw = rng.integers(0, 256, size=rows * payload_bytes, dtype=np.uint8).tobytes()
    offsets = pa.array(np.arange(0, (rows + 1) * payload_bytes, payload_bytes, dtype=np.int32))
    payload = pa.BinaryArray.from_buffers(
        pa.binary(), rows, [None, offsets.buffers()[1], pa.py_buffer(raw)]
    )
    counters = np.arange(first, first + rows, dtype=np.uint64)
    replay = b"".join(int(c).to_bytes(8, "big") + b"\x00\x00" for c in counters)
    replay_offsets = pa.array(np.arange(0, (rows + 1) * 10, 10, dtype=np.int32))
    replay_ids = pa.BinaryArray.from_buffers(
        pa.binary(), rows, [None, replay_offsets.buffers()[1], pa.py_buffer(replay)]
    )
    now = int(time.time() * 1_000_000)
    return pa.table(
        {
            "topic": pa.array([TOPIC] * rows, pa.string()),
            "schema_id": pa.array(["a01VpgrsZNJdn-7KStJcxQ"] * rows, pa.string()),
            "event_id": pa.array(
                [f"00000000-0000-4000-8000-{i:012d}" for i in range(first, first + rows)]
            ),
            "replay_id": replay_ids,
            "payload": payload,
            "received_at": pa.array(
                np.full(rows, now, dtype=np.int64), pa.timestamp("us", tz="UTC")
            ),
            "ingest_batch": pa.array(np.full(rows, first // max(rows, 1), dtype=np.int64)),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--rows", type=int, default=25_000, help="events per batch")
    parser.add_argument("--payload-bytes", type=int, default=600)
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: temp)")
    args = parser.parse_args()

    rng = np.random.default_rng(7)
    batches = [
        bronze_batch(i * args.rows, args.rows, args.payload_bytes, rng) for i in range(args.batches)
    ]
    events = args.batches * args.rows
    megabytes = sum(b.nbytes for b in batches) / 1e6
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="sfcdc-bench-"))
    try:
        # Warm up (imports, allocator, page cache) so neither measurement pays for it.
        write_deltalake(str(scratch / "warmup"), batches[0], mode="append")
        baseline_path = scratch / "baseline"
        started = time.perf_counter()
        for batch in batches:
            write_deltalake(str(baseline_path), batch, mode="append")
        baseline = time.perf_counter() - started

        engine = LocalEngine(location=scratch / "lake")
        table = TableRef("bronze", "account_change_event")
        started = time.perf_counter()
        for i, batch in enumerate(batches):
            result = engine.append(
                table, batch, txn=Txn(f"bronze:{TOPIC}", i), metadata={"batch": str(i)}
            )
            assert not result.skipped and result.rows == args.rows
        measured = time.perf_counter() - started
        # A replayed batch is skipped by its txn without writing anything.
        started = time.perf_counter()
        assert engine.append(
            table, batches[-1], txn=Txn(f"bronze:{TOPIC}", args.batches - 1)
        ).skipped
        skip = time.perf_counter() - started
    finally:
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)

    print(
        f"{events:,} events in {args.batches} batches, {megabytes:.0f} MB of Arrow data, "
        f"cores={os.cpu_count()}"
    )
    print(f"{'':28}{'events/s':>12}{'MB/s':>10}{'s':>8}")
    for label, seconds in (
        ("baseline write_deltalake", baseline),
        ("LocalEngine.append + txn", measured),
    ):
        print(f"{label:28}{events / seconds:>12,.0f}{megabytes / seconds:>10.1f}{seconds:>8.2f}")
    print(
        f"engine / baseline time: {measured / baseline:.2f}x; "
        f"skipped replay of a batch: {skip * 1000:.1f} ms"
    )


if __name__ == "__main__":
    main()
