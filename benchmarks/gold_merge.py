"""Gold on the local engine: folding throughput, and MERGE next to a plain rewrite.

A gold table of Account (the emulator's real AccountChangeEvent schema: text, numbers,
dates, datetimes, three Address structs, a Location, the person name union) holds
``--records`` rows. A batch of ``--changes`` silver changes arrives: updates of existing
records (one to three fields each, a tenth of the records changed several times in the batch,
some long text nulled), creates of new records, deletes. The run measures

- the fold: reading the touched gold rows, folding the changes in order, collecting the
  post-images as Arrow (silver rows per second);
- the MERGE of those post-images into the gold table (``engine.merge`` on ``Id`` with the
  order-key guard), next to the baseline measured in the same run: rewriting the whole table
  (``engine.overwrite`` of all its rows, already in memory). Target: MERGE <= 1.5x rewrite.

    python benchmarks/gold_merge.py [--records 1000000] [--changes 100000]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ingest.emulator.catalogue import schema_versions
from pipelines.engines import LocalEngine, TableRef, Txn
from pipelines.engines.arrow import dataframe_to_arrow, spark_schema_to_arrow
from pipelines.gold.columns import CONTROL_COLUMNS, gold_schema
from pipelines.gold.fold import (
    encode_order_key,
    fold_changes,
    fold_plan,
    gold_changes,
    merge_conditions,
)
from pipelines.session import local_session
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="rows of the gold table")
    parser.add_argument("--changes", type=int, default=100_000, help="silver rows to apply")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: temp)")
    args = parser.parse_args()
    # Spark's Python workers must import this checkout.
    root = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    layout = build_layout("Account", [schema_versions("Account")[0]])
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="sfcdc-bench-gold-"))
    spark = local_session("sfcdc-bench-gold")
    try:
        engine = LocalEngine(spark, location=scratch / "lake")
        started = time.perf_counter()
        table = gold_rows(layout, args.records, np.random.default_rng(7))
        engine.overwrite(GOLD, table)
        engine.append(
            SILVER,
            silver_changes(layout, args.records, args.changes, 11),
            txn=Txn("sfcdc.silver:Account", 1),
        )
        prepared = time.perf_counter() - started

        # Warm up Spark and the Python workers on a small fold so the fold timing does not pay
        # for their start.
        plan = fold_plan(layout, processed_at=NOW)
        warm = engine.read(SILVER).limit(1000)
        dataframe_to_arrow(gold_changes(fold_changes(warm, None, plan=plan)))

        from pyspark.sql import functions as F

        started = time.perf_counter()
        changes = engine.read(SILVER)
        ids = F.broadcast(changes.select("Id").distinct())  # as the gold job reads them
        state = engine.read(GOLD).join(ids, on="Id", how="left_semi")
        source = dataframe_to_arrow(gold_changes(fold_changes(changes, state, plan=plan)))
        fold_seconds = time.perf_counter() - started
        assert changes.where(F.col("Id").isNotNull()).count() == args.changes

        # The baseline: rewrite the whole table from rows already in memory.
        started = time.perf_counter()
        engine.overwrite(TableRef("gold", "account_rewrite"), table)
        rewrite_seconds = time.perf_counter() - started

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
        total = engine.read(GOLD).count()
    finally:
        spark.stop()
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)

    print(
        f"gold table {args.records:,} rows x {table.num_columns} columns, {args.changes:,} silver "
        f"changes -> {source.num_rows:,} post-images; cores={os.cpu_count()}; "
        f"data prepared in {prepared:.0f} s"
    )
    print(
        f"fold   {fold_seconds:7.2f} s  {args.changes / fold_seconds:10,.0f} silver rows/s "
        "(read touched gold rows, fold in order, collect post-images)"
    )
    print(
        f"merge  {merge_seconds:7.2f} s  {metrics.inserted:,} inserted, {metrics.updated:,} "
        f"updated, {metrics.deleted:,} deleted -> {total:,} rows"
    )
    print(f"rewrite{rewrite_seconds:7.2f} s  (baseline: overwrite all {args.records:,} rows)")
    ratio = merge_seconds / rewrite_seconds
    verdict = "meets" if ratio <= 1.5 else "misses"
    print(f"merge / rewrite: {ratio:.2f}x ({verdict} the 1.5x target)")


if __name__ == "__main__":
    main()
