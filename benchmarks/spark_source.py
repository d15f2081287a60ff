"""The ``salesforce`` Spark source's throughput into a Delta table, beside sfcdc's own bronze
landing in the same run.

The emulator runs in its own process (``bronze_landing.py --serve``: a backlog of 1 KB
platform events with random text on one topic). Then, each in a fresh process:

- bronze landing: ``bronze_landing.py --measure landing`` (``BronzeLanding``, local engine),
  timed until the last event is committed in Delta;
- spark source: a local Spark session with Delta (all cores) runs
  ``spark.readStream.format("salesforce")`` (``decode`` raw, ``startingReplay`` earliest)
  into Delta's streaming sink, timed from ``start()`` until the micro-batches' progress
  reports every event written (the JVM's start is not counted);
- baseline, in the same session: Spark's own Delta source streams the rows the source wrote
  (one file, so one micro-batch of the same size, per trigger) into another Delta table. It
  is what any streaming source reaches through Spark and Delta on this machine.

Target: the source reaches >= 50% of landing's events/s. Also printed: the mean time per
micro-batch of each phase Spark reports (``addBatch`` is the write, ``latestOffset`` the
source's read), and with ``--sink noop`` the rows are made and dropped, which separates the
source and its hand-off to the JVM from the Delta write.

    python benchmarks/spark_source.py [--events 200000] [--size 1024] [--per-trigger 50000]
        [--sink delta|noop]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bronze_landing import backlog_server

ROOT = Path(__file__).resolve().parent.parent
LANDING = ROOT / "benchmarks" / "bronze_landing.py"
TOPIC = "/event/Bench_Event__e"
TARGET = 0.5


def measure_source(
    info: dict[str, int], events: int, per_trigger: int, sink: str
) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from pipelines.session import local_session
    from pipelines.spark_source import SalesforceSource

    with tempfile.TemporaryDirectory(prefix="sfcdc-bench-") as tmp:
        spark = local_session(
            "sfcdc-bench-spark-source",
            conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "1"},
            delta=True,
            workdir=tmp,
        )
        spark.dataSource.register(SalesforceSource)
        options = {
            "connection.emulator.mode": "external",
            "connection.emulator.grpc_port": str(info["grpc_port"]),
            "connection.emulator.http_port": str(info["http_port"]),
            "topic": TOPIC,
            "startingReplay": "earliest",
            "maxEventsPerTrigger": str(per_trigger),
        }
        stream = spark.readStream.format("salesforce").options(**options).load()
        started = time.perf_counter()
        query = (
            stream.writeStream.format(sink)
            .option("checkpointLocation", str(Path(tmp) / "checkpoint"))
            .start(str(Path(tmp) / "events"))
        )
        written, batches = _run_until(query, events)
        seconds = time.perf_counter() - started
        sustained, phases = _sustained(query)
        query.stop()
        # Spark's own ceiling on this machine: the same rows, already in Parquet, streamed by
        # Spark's Delta source (one file, one micro-batch, per trigger) into the same sink.
        ceiling = 0.0
        if sink == "delta":
            ceiling_query = (
                spark.readStream.format("delta")
                .option("maxFilesPerTrigger", 1)
                .load(str(Path(tmp) / "events"))
                .writeStream.format(sink)
                .option("checkpointLocation", str(Path(tmp) / "ceiling-checkpoint"))
                .start(str(Path(tmp) / "ceiling"))
            )
            _run_until(ceiling_query, written)
            ceiling, _ = _sustained(ceiling_query)
            ceiling_query.stop()
        spark.stop()
    return {
        "events": written,
        "seconds": seconds,
        "batches": batches,
        "sustained": sustained,
        "phases": phases,
        "ceiling": ceiling,
    }


def _run_until(query: Any, events: int) -> tuple[int, int]:
    """Wait until ``query``'s micro-batches report ``events`` rows; return the rows and the
    non-empty micro-batches."""
    written = 0
    seen: set[int] = set()
    batches = 0
    while written < events:
        if query.exception() is not None:
            raise SystemExit(f"the query failed: {query.exception()}")
        for progress in query.recentProgress:
            if progress["batchId"] not in seen:
                seen.add(progress["batchId"])
                written += int(progress["numInputRows"])
                batches += progress["numInputRows"] > 0
        time.sleep(0.02)
    return written, batches


def _sustained(query: Any) -> tuple[float, dict[str, float]]:
    """Events/s of ``query``'s non-empty micro-batches after its first, and their mean
    milliseconds per phase. The first also creates the table and warms the JVM up (code
    generation, the Python workers)."""
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    later = [p for p in progress if p["batchId"] > min(p["batchId"] for p in progress)]
    events = sum(int(p["numInputRows"]) for p in later)
    ms = sum(int(p["durationMs"]["triggerExecution"]) for p in later)
    phases: dict[str, float] = {}
    for p in later:
        for phase, value in p["durationMs"].items():
            phases[phase] = phases.get(phase, 0) + int(value) / max(len(later), 1)
    return events / max(ms, 1) * 1000, phases


def _child(args: list[str]) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYSPARK_PYTHON=sys.executable)
    done = subprocess.run(args, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{args[1:4]} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024, help="payload bytes per event")
    parser.add_argument("--per-trigger", type=int, default=50_000, help="maxEventsPerTrigger")
    parser.add_argument(
        "--sink",
        choices=("delta", "noop"),
        default="delta",
        help="the query's sink: delta (the target's), or noop (the rows are produced and "
        "dropped: what the source itself reaches through Spark, without the write)",
    )
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--info", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        info = json.loads(args.info)
        print(json.dumps(measure_source(info, args.events, args.per_trigger, args.sink)))
        return 0

    with backlog_server(args.events, args.size) as (info, _):
        landing = _child(
            [
                *(sys.executable, str(LANDING), "--measure", "landing"),
                *("--info", json.dumps(info), "--events", str(args.events)),
            ]
        )
        source = _child(
            [
                *(sys.executable, __file__, "--measure", "--info", json.dumps(info)),
                *("--events", str(args.events), "--per-trigger", str(args.per_trigger)),
                *("--sink", args.sink),
            ]
        )

    print(
        f"spark source vs bronze landing: {args.events:,} events of {args.size} B on one "
        f"topic, emulator in its own process, cores={os.cpu_count()}"
    )
    print(f"{'':34}{'events':>11}{'seconds':>9}{'events/s':>11}")
    rates = {}
    for label, r in (
        ("bronze landing (local engine)", landing),
        (f"spark source -> {args.sink} sink ({source['batches']} batches)", source),
    ):
        rates[label] = r["events"] / r["seconds"]
        print(f"{label:34}{r['events']:>11,.0f}{r['seconds']:>9.2f}{rates[label]:>11,.0f}")
    landing_rate, source_rate = rates.values()
    sustained = source["sustained"]
    print(f"spark source, sustained after its first micro-batch: {sustained:,.0f} events/s")
    shown = sorted(source["phases"].items(), key=lambda kv: -kv[1])
    print("  ms per micro-batch after the first: " + ", ".join(f"{k} {v:,.0f}" for k, v in shown))
    if source["ceiling"]:
        print(
            f"spark's own delta source -> delta sink, the same rows one file per micro-batch, "
            f"sustained: {source['ceiling']:,.0f} events/s ({source['ceiling'] / landing_rate:.2f} "
            f"of landing; the source reaches {sustained / source['ceiling']:.2f} of it)"
        )
    print(f"machine load average during the run: {os.getloadavg()[0]:.1f}")
    for label, ratio in (
        ("from start", source_rate / landing_rate),
        ("sustained", sustained / landing_rate),
    ):
        verdict = "meets" if ratio >= TARGET else "MISSES"
        print(f"source / landing ({label}): {ratio:.2f}; {verdict} the target of {TARGET:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
