"""Gold on each lake engine: folding throughput, and MERGE next to a plain rewrite.

A gold table of Account (the emulator's real AccountChangeEvent schema: text, numbers,
dates, datetimes, three Address structs, a Location, the person name union) holds
``--records`` rows. A batch of ``--changes`` silver changes arrives: updates of existing
records (one to three fields each, a tenth of the records changed several times in the batch,
some long text nulled), creates of new records, deletes. For each engine the run measures

- the fold: reading the touched gold rows, folding the changes in order, collecting the
  post-images as Arrow (silver rows per second) -- the gold job's own ``fold_rows``;
- the MERGE of those post-images into the gold table (``engine.merge`` on ``Id`` with the
  order-key guard), next to the baseline measured in the same run on the same engine:
  rewriting the whole table (``engine.overwrite`` of all its rows, already in memory).
  Target: MERGE <= 1.5x rewrite on the local engine. Beside it, the floor of any writer of
  those rows: pyarrow encoding them into one Parquet file, with no Delta commit (the local
  engine's own MERGE writes with pyarrow; its overwrite goes through delta-rs, about three
  times slower than that floor).

Then the same with a small batch (``--small-changes``, 10,000 by default) into a table of the
same size, which must not cost a rewrite of the table. The targets of the local engine are
printed with the figures: fold >= 50,000 silver rows/s; fold + MERGE <= 1.2x the rewrite for
the batch of ``--changes``, <= 0.2x for the small batch.

Both engines' figures are printed side by side, the spark engine's twice: as it writes by
default and with ``gold.deletion_vectors`` on (``spark+dv``: a MERGE marks the rows it replaces
instead of rewriting their files); peak RSS of this process (and the JVM) at the
end. Run from the repository root::

    PYTHONPATH=. python benchmarks/gold_merge.py [--records 1000000] [--changes 100000]
        [--engine both|local|spark]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ingest.emulator.catalogue import schema_versions
from pipelines.engines import LakeEngine, SparkEngine, TableRef, Txn
from pipelines.engines.arrow import arrow_schema_to_spark, spark_schema_to_arrow
from pipelines.engines.local import LocalEngine
from pipelines.gold.columns import CONTROL_COLUMNS, body_fields, gold_schema
from pipelines.gold.folding import GoldPart
from pipelines.gold.job import fold_rows
from pipelines.gold.object_run import merge_conditions
from pipelines.gold.order_keys import encode_order_key
from pipelines.gold.plan import fold_plan
from pipelines.silver.columns import SilverLayout, build_layout

GOLD = TableRef("gold", "account")
SILVER = TableRef("silver", "account")
START = datetime(2025, 1, 1, tzinfo=timezone.utc)
NOW = datetime(2025, 6, 1, tzinfo=timezone.utc)


def record_id(n: int) -> str:
    return f"001{n:015d}"


def _values(kind: str, n: int, rng: np.random.Generator, nulls: float) -> pa.Array:
    mask = rng.random(n) < nulls
    if kind == "string":
        words = np.array(["Acme", "Globex", "Initech", "Umbrella", "Hooli", "Stark", "Wayne"])
        picked = words[rng.integers(0, len(words), n)]
        return pa.array(np.char.add(picked, rng.integers(0, 10_000, n).astype(str)), mask=mask)
    if kind in ("int", "long"):
        return pa.array(
            rng.integers(0, 100_000, n), pa.int32() if kind == "int" else pa.int64(), mask=mask
        )
    if kind == "double":
        return pa.array(np.round(rng.random(n) * 1e6, 2), mask=mask)
    if kind == "boolean":
        return pa.array(rng.random(n) < 0.5, mask=mask)
    if kind == "timestamp":
        micros = (START.timestamp() + rng.integers(0, 10**7, n)) * 1_000_000
        return pa.array(micros.astype("int64"), pa.timestamp("us", tz="UTC"), mask=mask)
    if kind == "date":
        return pa.array(rng.integers(19_000, 21_000, n).astype("int32"), pa.date32(), mask=mask)
    if kind == "time":
        return pa.array(["08:30:00.000"] * n, mask=mask)
    raise ValueError(kind)


def gold_rows(layout: SilverLayout, n: int, rng: np.random.Generator) -> pa.Table:
    """``n`` gold rows (ids 0..n-1), written long ago by CREATEs."""
    arrays: dict[str, pa.Array] = {"Id": pa.array([record_id(i) for i in range(n)])}
    schema = gold_schema(
        [f for f in layout.silver_schema().fields if f.name in dict(layout.field_columns())]
    )
    for f in layout.fields:
        if f.shape == "leaf":
            arrays[f.name] = _values(f.kind, n, rng, 0.3)
            continue
        children = [_values(c.kind, n, rng, 0.2) for c in f.children]
        struct = pa.StructArray.from_arrays(
            children, names=f.child_names(), mask=pa.array(rng.random(n) < 0.4)
        )
        if f.shape == "switchable":
            arrays[f.name] = _values("string", n, rng, 0.0)
            arrays[f.person_column] = pa.nulls(n, struct.type)
        else:
            arrays[f.name] = struct
    keys = [encode_order_key([START, i, None, 1, 1, i % 65536]) for i in range(n)]
    control: dict[str, Any] = {
        "_cdc_is_deleted": pa.array(np.zeros(n, dtype=bool)),
        "_cdc_deleted_at": pa.nulls(n, pa.timestamp("us", tz="UTC")),
        "_cdc_needs_resync": pa.array(np.zeros(n, dtype=bool)),
        "_cdc_resync_reason": pa.nulls(n, pa.string()),
        "_cdc_last_change_type": pa.array(["CREATE"] * n),
        "_cdc_last_commit_ts": pa.array([START] * n, pa.timestamp("us", tz="UTC")),
        "_cdc_last_commit_number": pa.array(np.arange(n, dtype=np.int64)),
        "_cdc_last_replay_id": pa.array([i.to_bytes(10, "big") for i in range(n)]),
        "_cdc_last_event_id": pa.array([f"ev-{i}" for i in range(n)]),
        "_cdc_order_key": pa.array(keys),
        "_cdc_updated_at": pa.array([START] * n, pa.timestamp("us", tz="UTC")),
    }
    assert [n for n, _ in CONTROL_COLUMNS] == list(control)
    arrays.update(control)
    return pa.table(arrays).cast(spark_schema_to_arrow(schema))


def silver_changes(layout: SilverLayout, records: int, n: int, seed: int) -> pa.Table:
    """``n`` silver change rows against ids ``0..records-1`` (and new ids beyond)."""
    rng = random.Random(seed)
    schema = spark_schema_to_arrow(layout.silver_schema())
    editable = [
        f
        for f in layout.fields
        if f.shape == "leaf" and f.kind in ("string", "double", "int", "boolean")
    ]
    address = next(f for f in layout.fields if f.name == "BillingAddress")
    hot = [rng.randrange(records) for _ in range(n // 40)]  # changed several times
    rows = []
    created = records
    for i in range(n):
        at = NOW + timedelta(seconds=i // 20)
        row: dict[str, Any] = {
            "_cdc_entity": "Account",
            "_cdc_commit_timestamp": at,
            "_cdc_commit_number": 10**15 + i,
            "_cdc_transaction_key": f"{i:08x}-0000-4000-8000-000000000000",
            "_cdc_sequence_number": 1,
            "_cdc_commit_user": "005000000000001AAA",
            "_cdc_change_origin": "",
            "_cdc_event_id": f"00000000-0000-4000-8000-{i:012d}",
            "_cdc_replay_id": (10**9 + i).to_bytes(10, "big"),
            "_cdc_schema_id": layout.schema_ids[0],
            "_cdc_nulled_fields": [],
            "_cdc_diff_fields": [],
            "_cdc_record_count": 1,
            "_cdc_is_wildcard": False,
            "_cdc_bronze_batch_id": 1 + i // 5000,
            "_cdc_bronze_batch_seq": i % 5000,
        }
        roll = rng.random()
        if roll < 0.2:
            row.update(Id=record_id(created), _cdc_change_type="CREATE", _cdc_changed_fields=[])
            row.update({f.name: f"new {i}" for f in editable if f.kind == "string"})
            row["Name"] = f"New Co {i}"
            created += 1
        elif roll < 0.25:
            row.update(
                Id=record_id(rng.randrange(records)),
                _cdc_change_type="DELETE",
                _cdc_changed_fields=[],
            )
        else:
            target = rng.choice(hot) if roll < 0.35 else rng.randrange(records)
            changed = rng.sample(editable, rng.randint(1, 3))
            names = [f.name for f in changed] + ["LastModifiedDate"]
            row.update(Id=record_id(target), _cdc_change_type="UPDATE")
            for f in changed:
                value = {
                    "string": f"v{i}",
                    "double": i / 7,
                    "int": i % 1000,
                    "boolean": i % 2 == 0,
                }[f.kind]
                row[f.name] = None if rng.random() < 0.1 else value
            row["_cdc_nulled_fields"] = [f.name for f in changed if row[f.name] is None]
            if rng.random() < 0.2:
                names.append("BillingAddress.City")
                row["BillingAddress"] = dict.fromkeys(address.child_names()) | {"City": "Lyon"}
            row["LastModifiedDate"] = at
            row["_cdc_changed_fields"] = names
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=schema)


def peak_rss_mb() -> tuple[float, float]:
    """Peak RSS of this process and of its child JVM (MB)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return own, children


def bench(
    engine: LakeEngine,
    table: pa.Table,
    changes: pa.Table,
    layout: SilverLayout,
    args: argparse.Namespace,
    *,
    floor: Path,
    deletion_vectors: bool = False,
) -> dict[str, Any]:
    if deletion_vectors:
        engine.ensure_table(GOLD, arrow_schema_to_spark(table.schema), deletion_vectors=True)
    engine.overwrite(GOLD, table)
    engine.append(SILVER, changes, txn=Txn("sfcdc.silver:Account", 1))
    schema = layout.silver_schema()
    plan = fold_plan(layout, processed_at=NOW)
    gold = gold_schema(body_fields(schema))

    # Warm-up (the spark engine's Python workers and code generation): a small fold.
    few = engine.rows(changes.slice(0, 1000), schema)
    engine.to_arrow(
        engine.map_batches(
            fold_rows(engine, few, schema=schema, plan=plan), GoldPart(gold.names), gold
        )
    )

    started = time.perf_counter()
    rows = engine.read_appends(SILVER, after_version=None).rows
    state = engine.read_keyed(GOLD, key="Id", keys=rows)
    folded = fold_rows(engine, rows, schema=schema, plan=plan, gold=state)
    source = engine.to_arrow(engine.map_batches(folded, GoldPart(gold.names), gold))
    fold_seconds = time.perf_counter() - started

    started = time.perf_counter()
    engine.overwrite(TableRef("gold", "account_rewrite"), table)
    rewrite_seconds = time.perf_counter() - started

    # The writer's floor: the same rows encoded by pyarrow into one Parquet file, no commit.
    started = time.perf_counter()
    pq.write_table(table, str(floor))
    floor_seconds = time.perf_counter() - started
    floor.unlink()

    update, delete = merge_conditions("soft")
    started = time.perf_counter()
    metrics = engine.merge(
        GOLD,
        source,
        on=["Id"],
        update_condition=update,
        delete_condition=delete,
        txn=Txn("sfcdc.gold:Account", 1),
    )
    merge_seconds = time.perf_counter() - started
    return {
        "fold": fold_seconds,
        "images": source.num_rows,
        "merge": merge_seconds,
        "rewrite": rewrite_seconds,
        "floor": floor_seconds,
        "metrics": metrics,
        "total": engine.count(engine.read(GOLD)),
        # delta-spark's count of deletion vectors the MERGE wrote (absent elsewhere).
        "vectors": engine.history(GOLD, limit=1)[0].metrics.get("numTargetDeletionVectorsAdded"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="rows of the gold table")
    parser.add_argument("--changes", type=int, default=100_000, help="silver rows to apply")
    parser.add_argument(
        "--small-changes", type=int, default=10_000, help="silver rows of the small batch"
    )
    parser.add_argument("--engine", choices=["both", "local", "spark"], default="both")
    parser.add_argument(
        "--spark-memory", default="10g", help="driver heap of the spark engine's session"
    )
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: temp)")
    args = parser.parse_args()
    # Spark's Python workers must import this checkout.
    root = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    layout = build_layout("Account", [schema_versions("Account")[0]])
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="sfcdc-bench-gold-"))
    # spark+dv: the spark engine with gold.deletion_vectors on.
    names = {"both": ["local", "spark", "spark+dv"], "local": ["local"]}.get(
        args.engine, ["spark", "spark+dv"]
    )
    started = time.perf_counter()
    table = gold_rows(layout, args.records, np.random.default_rng(7))
    changes = silver_changes(layout, args.records, args.changes, 11)
    small = silver_changes(layout, args.records, args.small_changes, 13)
    prepared = time.perf_counter() - started
    results: dict[str, dict[str, Any]] = {}
    small_results: dict[str, dict[str, Any]] = {}
    spark = None
    try:
        for name in names:
            if name != "local" and spark is None:
                from pipelines.session import local_session

                spark = local_session(
                    "sfcdc-bench-gold",
                    delta=True,
                    workdir=scratch,
                    conf={"spark.driver.memory": args.spark_memory},
                )
            for batch, out in ((changes, results), (small, small_results)):
                folder = scratch / f"{name}-{batch.num_rows}"
                engine: LakeEngine = (
                    LocalEngine(location=folder)
                    if spark is None or name == "local"
                    else SparkEngine(spark, location=folder)
                )
                out[name] = bench(
                    engine,
                    table,
                    batch,
                    layout,
                    args,
                    floor=scratch / "floor.parquet",
                    deletion_vectors=name.endswith("+dv"),
                )
    finally:
        if spark is not None:
            spark.stop()
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)

    print(
        f"gold table {args.records:,} rows x {table.num_columns} columns, {args.changes:,} silver "
        f"changes; cores={os.cpu_count()}; data prepared in {prepared:.0f} s"
    )
    header = f"{'':28}" + "".join(f"{n:>22}" for n in results)
    print(header)

    def line(label: str, cell: Any) -> None:
        print(f"{label:28}" + "".join(f"{cell(r):>22}" for r in results.values()))

    line("fold (s)", lambda r: f"{r['fold']:.2f}")
    line("fold (silver rows/s)", lambda r: f"{args.changes / r['fold']:,.0f}")
    line("post-images", lambda r: f"{r['images']:,}")
    line("merge (s)", lambda r: f"{r['merge']:.2f}")
    line(
        "  inserted/updated/deleted",
        lambda r: f"{r['metrics'].inserted:,}/{r['metrics'].updated:,}/{r['metrics'].deleted:,}",
    )
    line("rewrite, baseline (s)", lambda r: f"{r['rewrite']:.2f}")
    line("merge / rewrite", lambda r: f"{r['merge'] / r['rewrite']:.2f}x")
    line("fold + merge / rewrite", lambda r: f"{(r['fold'] + r['merge']) / r['rewrite']:.2f}x")
    line("pyarrow write of the rows (s)", lambda r: f"{r['floor']:.2f}")
    line("fold + merge / that write", lambda r: f"{(r['fold'] + r['merge']) / r['floor']:.2f}x")
    line("rows after", lambda r: f"{r['total']:,}")
    print(f"small batch: {args.small_changes:,} silver changes into the same table")
    for name, r in small_results.items():
        total = (r["fold"] + r["merge"]) / r["rewrite"]
        print(
            f"  {name}: fold {r['fold']:.2f} s + merge {r['merge']:.2f} s, rewrite "
            f"{r['rewrite']:.2f} s: fold + merge / rewrite {total:.2f}x"
            + (f" ({r['vectors']} deletion vectors written)" if r["vectors"] else "")
        )
    if "local" in results:
        big, few = results["local"], small_results["local"]
        print("local engine against the targets:")
        for label, figure, target, met in (
            (
                "merge / rewrite",
                f"{big['merge'] / big['rewrite']:.2f}x",
                "<= 1.5x",
                big["merge"] / big["rewrite"] <= 1.5,
            ),
            (
                "fold (silver rows/s)",
                f"{args.changes / big['fold']:,.0f}",
                ">= 50,000",
                args.changes / big["fold"] >= 50_000,
            ),
            (
                f"fold + merge / rewrite, {args.changes:,} changes",
                f"{(big['fold'] + big['merge']) / big['rewrite']:.2f}x",
                "<= 1.2x",
                (big["fold"] + big["merge"]) / big["rewrite"] <= 1.2,
            ),
            (
                f"fold + merge / rewrite, {args.small_changes:,} changes",
                f"{(few['fold'] + few['merge']) / few['rewrite']:.2f}x",
                "<= 0.2x",
                (few["fold"] + few["merge"]) / few["rewrite"] <= 0.2,
            ),
        ):
            print(f"  {label:42} {figure:>10}  target {target:>9}: {'meets' if met else 'misses'}")
    own, jvm = peak_rss_mb()
    print(f"peak RSS: this process {own:,.0f} MB, child processes (JVM) {jvm:,.0f} MB")


if __name__ == "__main__":
    main()
