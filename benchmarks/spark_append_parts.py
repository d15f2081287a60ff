"""The spark engine's one-commit append of parts (``SparkEngine(one_commit_appends=True)``,
Delta's ``OptimisticTransaction`` over the py4j gateway) against a DataFrameWriter commit per
part (the default, and the only way over Spark Connect), in one classic session.

The workload is what a landing commits to the checkpoint table: one row per topic, each under
its topic's transaction, ``--topics`` topics per round, ``--rounds`` rounds; the two ways
alternate round by round on tables of their own, so the machine's load falls on both alike.
After the rounds each table is checked to record every topic's last transaction. Run from the
repository root::

    PYTHONPATH=. python benchmarks/spark_append_parts.py [--topics 6] [--rounds 12]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ingest.replay import ReplayId
from pipelines.bronze.checkpoint import CheckpointRow, CheckpointStore
from pipelines.bronze.tables import bronze_tables, checkpoint_app_id, ensure_tables
from pipelines.engines import SparkEngine
from pipelines.spec.models import TopicSpec
from pipelines.spec.sections import BatchingSpec, ReplaySpec


def _store(spark: object, root: Path, topics: list[str], one_commit: bool) -> CheckpointStore:
    engine = SparkEngine(spark, location=root, one_commit_appends=one_commit)  # type: ignore[arg-type]
    specs = [
        TopicSpec(t, "change_events", f"t{i}", ReplaySpec(), BatchingSpec(), ())
        for i, t in enumerate(topics)
    ]
    tables = bronze_tables(specs)
    ensure_tables(engine, tables)
    return CheckpointStore(engine, tables)


def _round(store: CheckpointStore, topics: list[str], batch: int) -> float:
    rows = [
        CheckpointRow(t, batch, "events", ReplayId(batch.to_bytes(8, "big") + b"\0\0"), 10)
        for t in topics
    ]
    started = time.perf_counter()
    store.write_all(rows)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=6, help="parts (topics) per commit")
    parser.add_argument("--rounds", type=int, default=12, help="measured rounds of each way")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: temp)")
    args = parser.parse_args()
    root = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pipelines.session import local_session

    scratch = Path(args.dir or tempfile.mkdtemp(prefix="sfcdc-bench-parts-"))
    spark = local_session("sfcdc-bench-parts", delta=True, workdir=scratch)
    topics = [f"/data/Object{i}ChangeEvent" for i in range(args.topics)]
    times: dict[str, list[float]] = {"per part": [], "one commit": []}
    try:
        stores = {
            "per part": _store(spark, scratch / "per-part", topics, one_commit=False),
            "one commit": _store(spark, scratch / "one-commit", topics, one_commit=True),
        }
        for batch in range(1, args.rounds + 3):
            for name, store in stores.items():
                took = _round(store, topics, batch)
                if batch > 2:  # two warm-up rounds
                    times[name].append(took)
        last = args.rounds + 2
        for name, store in stores.items():
            engine = store._engine
            table = store._tables.checkpoints
            recorded = {engine.txn_version(table, checkpoint_app_id(t)) for t in topics}
            assert recorded == {last}, (name, recorded)
            commits = engine.version(table)
            print(f"{name}: {commits} commits in the checkpoint table", file=sys.stderr)
    finally:
        spark.stop()
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)

    per_part = statistics.median(times["per part"])
    one = statistics.median(times["one commit"])
    print(
        f"checkpoint rows of {args.topics} topics per round, {args.rounds} rounds each, one "
        f"classic session; cores={os.cpu_count()} (shared: single runs are noisy)"
    )
    for name, values in times.items():
        print(
            f"  {name:<10}  median {statistics.median(values) * 1000:7.0f} ms/round  "
            f"(min {min(values) * 1000:.0f}, max {max(values) * 1000:.0f})"
        )
    print(f"  one commit / per part: {one / per_part:.2f}x the time ({per_part / one:.1f}x faster)")


if __name__ == "__main__":
    main()
