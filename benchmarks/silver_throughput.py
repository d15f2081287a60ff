"""Silver throughput end to end on each lake engine: read bronze, decode, write silver.

For each shape (UPDATE-shaped: a few changed fields, the rest null, ~270 bytes; CREATE-shaped:
every field set, ~2.4 KB) of the 87-field AccountChangeEvent defined in
``benchmarks/decode_throughput.py``, and for each engine, the script

1. writes ``--events`` rows to a bronze table as landing does (commits of ``--bronze-batch``
   rows, each with its app transaction) and registers the schema;
2. warms up with a silver run of the same shape on a separate ``--warmup``-row lake (the spark
   engine's Python workers and code generation, the decoders: start-up, not throughput);
3. times ``run_silver`` on the bronze table: Delta reads (the change data feed), decoding and
   shaping (the same batch functions on both engines: in this process for the local engine,
   in Spark tasks for the spark engine), the Delta writes, with the defaults
   (``silver.max_rows_per_commit``);
4. in the same run, times a plain single-process fastavro loop
   (``schemaless_reader`` with the schema parsed once, records kept) over the same payloads:
   the reference ceiling of one core.

The bronze rows cycle through ``--distinct`` distinct payloads (each row keeps its own event
id, replay id and bronze coordinates). CPU seconds per process kind (driver, JVM, Python
workers) come from /proc and show where the time goes; peak RSS per run likewise. Run from the
repository root::

    PYTHONPATH=. python benchmarks/silver_throughput.py [--events 1000000] [--shape both]
        [--engine both|local|spark]

Targets on 2 cores: >= 40,000 UPDATE-shaped and >= 20,000 CREATE-shaped events/s, and >= 50,000
UPDATE-shaped rows/s on the local engine. The machine is shared: treat single runs with care.
"""

from __future__ import annotations

import argparse
import functools
import gc
import io
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from fastavro import parse_schema, schemaless_reader, schemaless_writer

sys.path.insert(0, str(Path(__file__).resolve().parent))

import decode_throughput as shapes  # the 87-field schema and its records

from ingest.replay import ReplayId
from ingest.schema import parse_event_schema
from pipelines.bronze import BRONZE_SCHEMA, CheckpointRow, CheckpointStore, bronze_tables
from pipelines.bronze.tables import bronze_app_id
from pipelines.engines import LakeEngine, SparkEngine, Txn
from pipelines.engines.local import LocalEngine
from pipelines.silver.job import run_silver
from pipelines.spec.conf import Conf
from pipelines.spec.models import ObjectSpec, PipelineSpec

TARGETS = {"update": 40_000, "create": 20_000}
LOCAL_UPDATE_ROWS_TARGET = 50_000


def conf_of(obj: ObjectSpec) -> Conf:
    return Conf(pipeline=PipelineSpec(), objects=(obj,), conf_dir=Path("conf"))


MAKERS: dict[str, Callable[[random.Random], dict[str, Any]]] = {
    "update": shapes.update_record,
    "create": shapes.create_record,
}


# ---------------------------------------------------------------------------- CPU per process


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        with suppress(OSError):
            out.extend(int(c) for c in (task / "children").read_text().split())
    return out


def _family() -> list[int]:
    me = os.getpid()
    todo, seen = [me], []
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo.extend(_children(pid))
    return seen


def peak_rss_mb() -> float:
    """Peak resident memory of this process and its children still running (MB)."""
    total = 0
    for pid in _family():
        with suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
    return total / 1024


def cpu_seconds() -> dict[str, float]:
    """CPU seconds so far of this process (driver), its JVM and the JVM's Python workers."""
    tick = os.sysconf("SC_CLK_TCK")
    totals = {"driver": 0.0, "jvm": 0.0, "python workers": 0.0}
    me = os.getpid()
    for pid in _family():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        used = (int(stat[11]) + int(stat[12])) / tick
        kind = "driver" if pid == me else "jvm" if comm == "java" else "python workers"
        totals[kind] += used
    return totals


@dataclass
class Measure:
    wall: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)


@contextmanager
def measured() -> Iterator[Measure]:
    m = Measure()
    before, started = cpu_seconds(), time.perf_counter()
    yield m
    m.wall = time.perf_counter() - started
    after = cpu_seconds()
    m.cpu = {k: after[k] - before.get(k, 0.0) for k in after}


# ------------------------------------------------------------------------------- the data


def payloads(parsed: Any, shape: str, n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    make = MAKERS[shape]
    out = []
    for _ in range(n):
        buf = io.BytesIO()
        schemaless_writer(buf, parsed, make(rng))
        out.append(buf.getvalue())
    return out


def write_bronze(
    engine: LakeEngine,
    obj: ObjectSpec,
    pool: list[bytes],
    schema_id: str,
    events: int,
    batch: int,
) -> None:
    """Bronze commits as landing makes them: the rows with their app transaction, then the
    checkpoint row saying how many events and payload bytes the commit holds."""
    (topic,) = conf_of(obj).topics()
    tables = bronze_tables([topic])
    store = CheckpointStore(engine, tables)
    now = int(time.time() * 1_000_000)
    for start in range(0, events, batch):
        n = min(batch, events - start)
        batch_id = start // batch + 1
        rows = range(start, start + n)
        replay_ids = [i.to_bytes(8, "big") + b"\x00\x00" for i in rows]
        payloads = [pool[i % len(pool)] for i in rows]
        data = pa.table(
            {
                "replay_id": replay_ids,
                "event_id": [f"00000000-0000-4000-8000-{i:012d}" for i in rows],
                "schema_id": [schema_id] * n,
                "payload": payloads,
                "topic": [obj.topic] * n,
                "received_at": pa.array([now] * n, pa.timestamp("us", tz="UTC")),
                "batch_id": [batch_id] * n,
                "batch_seq": list(range(n)),
            },
            schema=BRONZE_SCHEMA,
        )
        result = engine.append(
            tables.bronze(obj.topic), data, txn=Txn(bronze_app_id(obj.topic), batch_id)
        )
        store.write(
            CheckpointRow(
                topic=obj.topic,
                batch_id=batch_id,
                kind="events",
                replay_id=ReplayId(replay_ids[-1]),
                event_count=n,
                payload_bytes=sum(map(len, payloads)),
                bronze_version=result.version,
            )
        )


def register(engine: LakeEngine, obj: ObjectSpec, schema_json: str, schema_id: str) -> None:
    (topic,) = conf_of(obj).topics()
    CheckpointStore(engine, bronze_tables([topic])).register_schemas(
        obj.topic, {schema_id: schema_json}
    )


def fastavro_rate(parsed: Any, sample: list[bytes]) -> float:
    gc.collect()
    started = time.perf_counter()
    kept = [schemaless_reader(io.BytesIO(p), parsed, None) for p in sample]
    elapsed = time.perf_counter() - started
    del kept
    return len(sample) / elapsed


# ------------------------------------------------------------------------------------ main


def bench(
    make: Callable[[Path], LakeEngine], root: Path, shape: str, args: argparse.Namespace
) -> dict[str, Any]:
    schema_json = json.dumps(shapes.account_schema(), separators=(",", ":"))
    schema = parse_event_schema(schema_json)
    parsed = parse_schema(json.loads(schema_json))
    started = time.perf_counter()
    pool = payloads(parsed, shape, min(args.distinct, args.events), seed=7)
    generated = time.perf_counter() - started
    size = sum(map(len, pool)) / len(pool)

    lake = root / shape
    obj = ObjectSpec(api_name="Account", kind="change_events")
    conf = conf_of(obj)
    # The warm-up runs the same query on its own lake (same table names, so Spark reuses the
    # code it generated) and leaves the measured tables untouched.
    warm = make(root / f"{shape}-warmup")
    register(warm, obj, schema_json, schema.schema_id)
    write_bronze(warm, obj, pool, schema.schema_id, args.warmup, args.bronze_batch)
    run_silver(warm, conf)

    engine = make(lake)
    register(engine, obj, schema_json, schema.schema_id)
    started = time.perf_counter()
    write_bronze(engine, obj, pool, schema.schema_id, args.events, args.bronze_batch)
    landed = time.perf_counter() - started
    gc.collect()
    with measured() as m:
        result = run_silver(engine, conf)
    (account,) = result.objects
    assert account.events == args.events, account

    sample = [pool[i % len(pool)] for i in range(min(args.baseline_sample, args.events))]
    baseline = fastavro_rate(parsed, sample)
    shutil.rmtree(lake, ignore_errors=True)
    return {
        "shape": shape,
        "size": size,
        "generated": generated,
        "landed": landed,
        "wall": m.wall,
        "cpu": m.cpu,
        "rate": args.events / m.wall,
        "rows": account.rows,
        "commits": account.commits,
        "baseline": baseline,
        "sample": len(sample),
        "peak_rss": peak_rss_mb(),
    }


def _spark_engine(spark: Any, path: Path) -> LakeEngine:
    return SparkEngine(spark, location=path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--shape", choices=["update", "create", "both"], default="both")
    parser.add_argument("--engine", choices=["both", "local", "spark"], default="both")
    parser.add_argument("--distinct", type=int, default=100_000, help="distinct payloads")
    parser.add_argument("--bronze-batch", type=int, default=50_000, help="rows per bronze commit")
    parser.add_argument("--warmup", type=int, default=60_000, help="rows of the warm-up run")
    parser.add_argument("--baseline-sample", type=int, default=200_000)
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: temp)")
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    root_dir = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [root_dir, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    )
    root = Path(args.dir or tempfile.mkdtemp(prefix="sfcdc-silver-bench-"))
    shapes_to_run = ["update", "create"] if args.shape == "both" else [args.shape]
    engines = ["local", "spark"] if args.engine == "both" else [args.engine]
    results: list[dict[str, Any]] = []
    spark = None
    try:
        for name in engines:
            make: Callable[[Path], LakeEngine]
            if name == "local":
                make = lambda path: LocalEngine(location=path)  # noqa: E731
            else:
                from pipelines.session import local_session

                spark = local_session("sfcdc-silver-bench", cores=2, delta=True, workdir=root)
                make = functools.partial(_spark_engine, spark)
            for shape in shapes_to_run:
                results.append({"engine": name, **bench(make, root / name, shape, args)})
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if spark is not None:
            spark.stop()

    print(f"silver throughput, 2 cores, {args.events:,} bronze events per shape and engine")
    for r in results:
        target = TARGETS[r["shape"]]
        met = "met" if r["rate"] >= target else "MISSED"
        cpu = r["cpu"]
        total = sum(cpu.values())
        print(
            f"  {r['engine']:>5} engine, {r['shape'].upper()}-shaped ({r['size']:,.0f} bytes): "
            f"{r['wall']:.1f} s -> {r['rate']:,.0f} events/s (target >= {target:,}: {met}); "
            f"{r['rows']:,} silver rows ({r['rows'] / r['wall']:,.0f} rows/s) in "
            f"{r['commits']} commits; peak RSS {r['peak_rss']:,.0f} MB"
        )
        print(
            f"    CPU {total:.1f} s: "
            + ", ".join(
                f"{k} {v:.1f} s ({v * 1e6 / args.events:.1f} µs/event)" for k, v in cpu.items()
            )
        )
        print(
            f"    baseline, same run: one-process fastavro loop over {r['sample']:,} of the same "
            f"payloads: {r['baseline']:,.0f} events/s; silver / baseline = "
            f"{r['rate'] / r['baseline']:.2f}"
        )
    local_update = [r for r in results if r["engine"] == "local" and r["shape"] == "update"]
    for r in local_update:
        rate = r["rows"] / r["wall"]
        met = "met" if rate >= LOCAL_UPDATE_ROWS_TARGET else "MISSED"
        print(f"  local UPDATE rows/s {rate:,.0f} (target >= {LOCAL_UPDATE_ROWS_TARGET:,}: {met})")


if __name__ == "__main__":
    main()
