"""Commit cost of bronze landing over a long run: does the 3,000th commit cost what the first did?

Landing commits small batches often (5 commits/s per topic at ``max_age_seconds: 0.2``). This
script commits ``--commits`` one-row-group batches to a bronze table with the local engine's
append (which writes its own log entry: :mod:`pipelines.engines.deltalog`), with the
maintenance landing runs (compaction and a log checkpoint every ``--maintain-every`` commits),
and prints the mean milliseconds per commit over each stretch of the run, and how many data
files and log entries the table directory holds at the end.

Baseline, in the same run: the same commits made by delta-rs itself (``write_deltalake`` with
the app transaction), which lists the whole ``_delta_log`` directory on each commit, so its
cost grows with the commits a table has had.

    python benchmarks/long_run_commits.py [--commits 3000] [--rows 40]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from deltalake import CommitProperties, Transaction, write_deltalake  # noqa: E402

from pipelines.bronze.tables import BRONZE_LAYOUT, BRONZE_SCHEMA  # noqa: E402
from pipelines.engines import TableRef, Txn  # noqa: E402
from pipelines.engines.arrow import arrow_schema_to_spark  # noqa: E402
from pipelines.engines.local import LocalEngine  # noqa: E402

TOPIC = "/data/AccountChangeEvent"


def _batch(batch_id: int, rows: int) -> pa.Table:
    return pa.table(
        {
            "replay_id": pa.array(
                [(batch_id * rows + i).to_bytes(8, "big") + b"\0\0" for i in range(rows)],
                pa.binary(),
            ),
            "event_id": pa.array([f"{batch_id}-{i}" for i in range(rows)], pa.string()),
            "schema_id": pa.array(["schema-1"] * rows, pa.string()),
            "payload": pa.array([os.urandom(1000) for _ in range(rows)], pa.binary()),
            "topic": pa.array([TOPIC] * rows, pa.string()),
            "received_at": pa.array(
                [1_700_000_000_000_000 + batch_id] * rows, pa.timestamp("us", tz="UTC")
            ),
            "batch_id": pa.array([batch_id] * rows, pa.int64()),
            "batch_seq": pa.array(range(rows), pa.int32()),
        },
        schema=BRONZE_SCHEMA,
    )


def run(
    root: Path, *, engine_commits: bool, commits: int, rows: int, every: int, stretch: int
) -> tuple[list[float], int, int]:
    """Mean ms per commit by stretch, then data files and log entries left on disk."""
    engine = LocalEngine(location=root)
    table = TableRef("bronze", "account")
    engine.ensure_table(table, arrow_schema_to_spark(BRONZE_SCHEMA))
    batches = [_batch(i, rows) for i in range(1, 51)]
    app = f"sfcdc.bronze:{TOPIC}"
    means = []
    spent = 0.0
    for batch_id in range(1, commits + 1):
        data = batches[batch_id % len(batches)]
        started = time.perf_counter()
        if engine_commits:
            engine.append(
                table, data, txn=Txn(app, batch_id), evolve_schema=False, layout=BRONZE_LAYOUT
            )
        else:
            write_deltalake(
                str(engine.path(table)),
                data,
                mode="append",
                commit_properties=CommitProperties(app_transactions=[Transaction(app, batch_id)]),
            )
        spent += time.perf_counter() - started
        if batch_id % every == 0:
            engine.maintain(table)  # outside the timing: landing runs it on another thread
        if batch_id % stretch == 0:
            means.append(spent / stretch * 1000)
            spent = 0.0
    directory = engine.path(table)
    files = len(list(directory.glob("*.parquet")))
    entries = len(list((directory / "_delta_log").glob("*.json")))
    return means, files, entries


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=3000)
    parser.add_argument("--rows", type=int, default=40, help="events per commit (40)")
    parser.add_argument("--maintain-every", type=int, default=100)
    parser.add_argument("--stretch", type=int, default=500, help="commits per printed mean")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sfcdc-long-run-") as tmp:
        figures = {
            label: run(
                Path(tmp) / label,
                engine_commits=plain,
                commits=args.commits,
                rows=args.rows,
                every=args.maintain_every,
                stretch=args.stretch,
            )
            for label, plain in (("sfcdc's log entries", True), ("delta-rs commits", False))
        }
    print(
        f"bronze commits of {args.rows} events (1 KB each), maintenance every "
        f"{args.maintain_every} commits, mean ms per commit (write + commit) by stretch of the "
        f"run, load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    stretches = [
        f"{i * args.stretch + 1}-{(i + 1) * args.stretch}"
        for i in range(args.commits // args.stretch)
    ]
    print(f"{'commits':<22}" + "".join(f"{s:>12}" for s in stretches) + "  files  log entries")
    for label, (means, files, entries) in figures.items():
        print(
            f"{label:<22}" + "".join(f"{m:>12.1f}" for m in means) + f"  {files:>5}  {entries:>11}"
        )
    first, last = figures["sfcdc's log entries"][0][0], figures["sfcdc's log entries"][0][-1]
    print(f"sfcdc's log entries: last stretch / first = {last / first:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
