"""Commit cost and storage of bronze landing over a long run: does the 3,000th commit cost what
the first did, and do files on disk and log entries stay bounded?

Landing commits small batches often (5 commits/s per topic at ``max_age_seconds: 0.2``). This
script commits ``--commits`` one-row-group batches to a bronze table with the local engine's
append (which writes its own log entry: :mod:`pipelines.engines.deltalog`), and every
``--maintain-every`` commits runs maintenance, and prints the mean milliseconds per commit over
each stretch of the run, and the data files and log entries (commit JSON and checkpoint files)
the table directory holds at the end of each stretch. Three runs:

- ``sfcdc + maintain``: the maintenance of ``sfcdc maintain`` (:mod:`pipelines.maintenance`):
  compaction, VACUUM and log cleanup with a retention of 0 h for both, the consumer guard
  still applied -- a simulated silver that keeps up (it has read every version before each
  maintenance run), so no old file is pinned, and the log is kept from where its next read
  starts. Target: files and log entries bounded (by two maintenance intervals), not growing
  with the commits.
- ``sfcdc, compact only`` (baseline): what landing itself runs, compaction and a log
  checkpoint, with no VACUUM and the default 30-day log retention.
- ``delta-rs commits``: the same commits made by delta-rs itself (``write_deltalake`` with
  the app transaction), which lists the whole ``_delta_log`` directory on each commit, so its
  cost grows with the commits a table has had (with landing's maintenance).

    python benchmarks/long_run_commits.py [--commits 3000] [--rows 40] [--maintain-every 100]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from deltalake import CommitProperties, Transaction, write_deltalake  # noqa: E402

from pipelines.bronze.tables import BRONZE_LAYOUT, BRONZE_SCHEMA  # noqa: E402
from pipelines.engines import TableRef, Txn  # noqa: E402
from pipelines.engines.arrow import arrow_schema_to_spark  # noqa: E402
from pipelines.engines.deltalog import log_entries  # noqa: E402
from pipelines.engines.local import LocalEngine  # noqa: E402
from pipelines.maintenance import (  # noqa: E402
    Consumer,
    Need,
    log_floor,
    oldest_needed,
    retention_for,
)
from pipelines.spec.models import MaintenanceSpec  # noqa: E402

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


@dataclass
class Figures:
    """Per stretch of the run: mean ms per commit, data files and log entries at its end."""

    means: list[float] = field(default_factory=list)
    files: list[int] = field(default_factory=list)
    entries: list[int] = field(default_factory=list)


def _data_files(directory: Path) -> int:
    return sum(1 for p in directory.rglob("*.parquet") if "_delta_log" not in p.parts)


def _safe_maintain(engine: LocalEngine, table: TableRef, read_up_to: int | None) -> None:
    """Maintenance as ``sfcdc maintain`` runs it with 0 h retention: the retention is what the
    consumer (a silver that has read up to ``read_up_to``) still needs."""
    spec = MaintenanceSpec(vacuum_retention_hours=0, log_retention_hours=0)
    silver = Consumer(TableRef("silver", "account"), "sfcdc.silver:Account")
    oldest = oldest_needed(engine.version(table), {silver: read_up_to})
    need = None
    if oldest is not None:
        consumer, version = oldest
        (entry,) = [e for e in engine.history(table, limit=50) if e.version == version]
        need = Need(consumer, version, entry.timestamp)
    retention = retention_for(
        spec,
        need,
        now=datetime.now(timezone.utc),
        consumers=1,
        log_from=log_floor({silver: read_up_to}),
    )
    engine.maintain(
        table,
        vacuum_hours=retention.vacuum_hours,
        log_hours=retention.log_hours,
        log_from_version=retention.log_from,
    )


def run(root: Path, *, mode: str, commits: int, rows: int, every: int, stretch: int) -> Figures:
    """Commit ``commits`` batches in ``mode`` (engine, engine+maintain, delta-rs)."""
    engine = LocalEngine(location=root)
    table = TableRef("bronze", "account")
    engine.ensure_table(table, arrow_schema_to_spark(BRONZE_SCHEMA))
    batches = [_batch(i, rows) for i in range(1, 51)]
    app = f"sfcdc.bronze:{TOPIC}"
    figures = Figures()
    spent = 0.0
    directory = engine.path(table)
    for batch_id in range(1, commits + 1):
        data = batches[batch_id % len(batches)]
        started = time.perf_counter()
        if mode == "delta-rs":
            write_deltalake(
                str(engine.path(table)),
                data,
                mode="append",
                commit_properties=CommitProperties(app_transactions=[Transaction(app, batch_id)]),
            )
        else:
            engine.append(
                table, data, txn=Txn(app, batch_id), evolve_schema=False, layout=BRONZE_LAYOUT
            )
        spent += time.perf_counter() - started
        # Maintenance is outside the timing: landing and `sfcdc run` run it on another thread
        # or between passes.
        if batch_id % every == 0:
            if mode == "maintain":
                _safe_maintain(engine, table, read_up_to=engine.version(table))
            else:
                engine.maintain(table)
        if batch_id % stretch == 0:
            figures.means.append(spent / stretch * 1000)
            figures.files.append(_data_files(directory))
            figures.entries.append(log_entries(directory / "_delta_log"))
            spent = 0.0
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=3000)
    parser.add_argument("--rows", type=int, default=40, help="events per commit (40)")
    parser.add_argument("--maintain-every", type=int, default=100)
    parser.add_argument("--stretch", type=int, default=500, help="commits per printed figure")
    args = parser.parse_args()
    # VACUUM with 0 h warns on every run; the figures are the point here.
    logging.getLogger("pipelines.engines.local").setLevel(logging.ERROR)
    runs = (
        ("sfcdc + maintain", "maintain"),
        ("sfcdc, compact only", "engine"),
        ("delta-rs commits", "delta-rs"),
    )
    with tempfile.TemporaryDirectory(prefix="sfcdc-long-run-") as tmp:
        figures = {
            label: run(
                Path(tmp) / mode,
                mode=mode,
                commits=args.commits,
                rows=args.rows,
                every=args.maintain_every,
                stretch=args.stretch,
            )
            for label, mode in runs
        }
    print(
        f"bronze commits of {args.rows} events (1 KB each), maintenance every "
        f"{args.maintain_every} commits, by stretch of the run; load "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    stretches = [f"{(i + 1) * args.stretch}" for i in range(args.commits // args.stretch)]
    for title, attribute, form in (
        ("mean ms per commit (write + commit), commits up to", "means", ".1f"),
        ("data files on disk after commit", "files", "d"),
        ("log entries (json + checkpoints) after commit", "entries", "d"),
    ):
        print(f"{title}")
        print(f"  {'':<22}" + "".join(f"{s:>8}" for s in stretches))
        for label, fig in figures.items():
            print(f"  {label:<22}" + "".join(f"{v:>8{form}}" for v in getattr(fig, attribute)))
    safe = figures["sfcdc + maintain"]
    first, last = safe.means[0], safe.means[-1]
    print(f"sfcdc + maintain: last stretch / first = {last / first:.2f} (ms per commit)")
    # Bounded: never more than two maintenance intervals' commits (the log is kept from where
    # the consumer's next read starts, so it is cut one run late), however many commits the
    # run makes.
    bound = 2 * args.maintain_every + 10
    bounded = max(safe.files) <= bound and max(safe.entries) <= bound
    print(
        f"target: data files and log entries bounded by two maintenance intervals "
        f"(<= {bound}) at every point of the run: {'met' if bounded else 'MISSED'}; at most "
        f"{max(safe.files)} files and {max(safe.entries)} log entries; baseline at the end "
        f"{figures['sfcdc, compact only'].files[-1]} files and "
        f"{figures['sfcdc, compact only'].entries[-1]} log entries"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
