"""Peak memory of silver and gold on the local engine follows the batch sizes, not the backlog.

The same workload at two sizes, ``--events`` bronze events (1x) and four times as many (4x):
UPDATE-shaped AccountChangeEvents (the 87-field schema of ``benchmarks/decode_throughput.py``,
a few changed fields each) of ``--records`` records, each created by a CREATE first, in commit
order, so that gold folds real changes onto existing rows. For each size the script

1. lands the events in a bronze table as landing does (commits of ``--bronze-batch`` events
   with their checkpoint rows), in a subprocess of its own;
2. runs ``run_silver`` over the whole backlog in a fresh subprocess, with
   ``silver.max_rows_per_commit`` = ``--batch``;
3. runs ``run_gold`` over the whole silver backlog in another fresh subprocess, with
   ``gold.max_rows_per_commit`` = ``--batch``;

and each of 2. and 3. prints its wall time and its peak RSS (``ru_maxrss`` of that subprocess:
that step's peak alone, imports included). Target: the 4x peak of each step at most 1.25 times
its 1x peak ("bounded"). As the baseline, in the same run, the 4x backlog goes through silver
and gold with batch sizes large enough to take it in one step each: the peak that the bound
avoids. Run from the repository root::

    PYTHONPATH=. python benchmarks/memory_bound.py [--events 200000] [--records 5000]
        [--batch 100000]

The machine is shared: treat single runs with care.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from fastavro import parse_schema, schemaless_writer

sys.path.insert(0, str(Path(__file__).resolve().parent))

import decode_throughput as shapes  # the 87-field schema and its records
import silver_throughput as landing  # bronze commits as landing makes them

from ingest.schema import parse_event_schema
from pipelines.engines.local import LocalEngine
from pipelines.gold.job import app_id, gold_table, run_gold
from pipelines.silver.job import run_silver
from pipelines.spec.conf import Conf
from pipelines.spec.models import ObjectSpec
from pipelines.spec.sections import GoldSpec, SilverSpec

TARGET = 1.25
# Large enough for any backlog of this script to be one step.
ONCE = 10**9
COMMIT_NUMBER = 1_709_303_151_782_928_388
EPOCH_MS = 1_700_000_000_000
DISTINCT_BODIES = 1_000


def record_id(n: int) -> str:
    return f"001{n:015d}"


def payloads(parsed: Any, events: int, records: int, seed: int = 7) -> list[bytes]:
    """``events`` Avro payloads: a CREATE of each of ``records`` records, then UPDATEs of
    records picked at random, every one with its own commit time, commit number and
    transaction, in that order (the UPDATEs' changed values come from a pool of bodies)."""
    rng = random.Random(seed)
    bodies = [shapes.update_record(rng) for _ in range(DISTINCT_BODIES)]
    out = []
    for i in range(events):
        if i < records:
            record, target = shapes.create_record(rng), i
        else:
            record, target = dict(bodies[i % len(bodies)]), rng.randrange(records)
        header = dict(record["ChangeEventHeader"])
        record["ChangeEventHeader"] = header
        header["recordIds"] = [record_id(target)]
        header["commitTimestamp"] = EPOCH_MS + i * 10
        header["commitNumber"] = COMMIT_NUMBER + i
        header["transactionKey"] = str(uuid.UUID(int=i))
        buf = io.BytesIO()
        schemaless_writer(buf, parsed, record)
        out.append(buf.getvalue())
    return out


def conf_of(batch: int) -> Conf:
    """The Account object with silver and gold steps of at most ``batch`` rows (rows are the
    only bound here: silver's payload bytes per step are left unbounded)."""
    obj = ObjectSpec(
        api_name="Account",
        kind="change_events",
        silver=SilverSpec(max_rows_per_commit=batch, max_bytes_per_commit=ONCE * 1024),
        gold=GoldSpec(max_rows_per_commit=batch),
    )
    return landing.conf_of(obj)


def peak_rss_mb() -> float:
    """Peak resident memory of this process (MB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ----------------------------------------------------------------------- the steps, one each


def land(lake: Path, args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    schema_json = json.dumps(shapes.account_schema(), separators=(",", ":"))
    schema = parse_event_schema(schema_json)
    pool = payloads(parse_schema(json.loads(schema_json)), args.events, args.records)
    engine = LocalEngine(location=lake)
    (obj,) = conf_of(args.batch).objects
    landing.register(engine, obj, schema_json, schema.schema_id)
    landing.write_bronze(engine, obj, pool, schema.schema_id, args.events, args.bronze_batch)
    return {"bytes": sum(map(len, pool)) / len(pool), "seconds": time.perf_counter() - started}


def silver(lake: Path, args: argparse.Namespace) -> dict[str, Any]:
    engine = LocalEngine(location=lake)
    started = time.perf_counter()
    result = run_silver(engine, conf_of(args.batch))
    seconds, peak = time.perf_counter() - started, peak_rss_mb()
    (account,) = result.objects
    assert account.events == args.events, account
    return {"seconds": seconds, "peak_rss": peak, "commits": account.commits}


def gold(lake: Path, args: argparse.Namespace) -> dict[str, Any]:
    engine = LocalEngine(location=lake)
    conf = conf_of(args.batch)
    started = time.perf_counter()
    result = run_gold(engine, conf)
    # Read before the checks below, which read the gold table.
    seconds, peak = time.perf_counter() - started, peak_rss_mb()
    (account,) = result.objects
    assert account.changes == args.events, account
    table = gold_table(conf.objects[0])
    gold_app = app_id(conf.objects[0])
    entries = engine.history(table, limit=10_000)
    merges = sum(1 for e in entries if e.txn is not None and e.txn.app_id == gold_app)
    rows = engine.read_arrow(table, columns=["Id"]).num_rows
    return {"seconds": seconds, "peak_rss": peak, "commits": merges, "rows": rows}


def idle(lake: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The floor: a process that imports the pipeline and opens the lake, and does nothing."""
    LocalEngine(location=lake)
    return {"peak_rss": peak_rss_mb()}


STEPS = {"idle": idle, "land": land, "silver": silver, "gold": gold}


def run_step(step: str, lake: Path, events: int, batch: int, args: argparse.Namespace) -> Any:
    """``step`` in a fresh Python process: its figures, with that process's peak RSS."""
    command = [
        sys.executable,
        __file__,
        "--step",
        step,
        "--lake",
        str(lake),
        "--events",
        str(events),
        "--records",
        str(args.records),
        "--batch",
        str(batch),
        "--bronze-batch",
        str(args.bronze_batch),
    ]
    done = subprocess.run(command, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"the {step} step of {events:,} events failed ({done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000, help="bronze events at 1x")
    parser.add_argument("--records", type=int, default=5_000, help="records they change")
    parser.add_argument(
        "--batch", type=int, default=100_000, help="silver and gold max_rows_per_commit"
    )
    parser.add_argument("--bronze-batch", type=int, default=50_000, help="rows per bronze commit")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: temp)")
    parser.add_argument("--step", choices=sorted(STEPS), help=argparse.SUPPRESS)
    parser.add_argument("--lake", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.step is not None:
        print(json.dumps(STEPS[args.step](args.lake, args)))
        return

    root = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [root, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    )
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="sfcdc-memory-bench-"))
    runs = [("1x", args.events, args.batch), ("4x", 4 * args.events, args.batch)]
    baseline = ("4x, at once", 4 * args.events, ONCE)
    results: dict[str, dict[str, Any]] = {}
    started = time.perf_counter()
    try:
        floor = run_step("idle", scratch / "idle", 0, args.batch, args)["peak_rss"]
        for label, events, _ in runs:
            lake = scratch / label
            landed = run_step("land", lake, events, args.batch, args)
            results[label] = {"events": events, "land": landed}
        # The baseline folds the very same 4x bronze backlog.
        shutil.copytree(scratch / "4x", scratch / "once")
        results[baseline[0]] = {"events": baseline[1], "land": results["4x"]["land"]}
        for (label, events, batch), lake in zip(
            [*runs, baseline], [scratch / "1x", scratch / "4x", scratch / "once"], strict=True
        ):
            for step in ("silver", "gold"):
                results[label][step] = run_step(step, lake, events, batch, args)
    finally:
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    total = time.perf_counter() - started

    size = results["1x"]["land"]["bytes"]
    landed_s = results["1x"]["land"]["seconds"] + results["4x"]["land"]["seconds"]
    print(
        f"peak memory, local engine, {os.cpu_count()} cores: UPDATE-shaped events "
        f"(~{size:,.0f} bytes) on {args.records:,} records; silver.max_rows_per_commit and "
        f"gold.max_rows_per_commit {args.batch:,}; each step in its own process "
        f"({total:.0f} s in all, {landed_s:.0f} s of it generating and landing the events); a "
        f"process that only imports the pipeline peaks at {floor:,.0f} MB"
    )
    header = (
        f"{'size':<12}{'events':>10}{'silver s':>10}{'commits':>9}{'silver peak':>13}"
        f"{'gold s':>9}{'commits':>9}{'gold peak':>11}{'gold rows':>11}"
    )
    print(header)
    for label, r in results.items():
        s, g = r["silver"], r["gold"]
        print(
            f"{label:<12}{r['events']:>10,}{s['seconds']:>10.1f}{s['commits']:>9}"
            f"{s['peak_rss']:>10,.0f} MB{g['seconds']:>9.1f}{g['commits']:>9}"
            f"{g['peak_rss']:>8,.0f} MB{g['rows']:>11,}"
        )
    one, four, once = results["1x"], results["4x"], results[baseline[0]]
    verdicts = []
    for step in ("silver", "gold"):
        base = one[step]["peak_rss"]
        ratio = four[step]["peak_rss"] / base
        verdicts.append(ratio <= TARGET)
        print(
            f"{step} peak 4x/1x: {ratio:.2f} (target <= {TARGET}: "
            f"{'bounded' if ratio <= TARGET else 'NOT bounded'}); baseline, 4x in one step: "
            f"{once[step]['peak_rss']:,.0f} MB = {once[step]['peak_rss'] / base:.2f} x the 1x peak"
        )
    print(
        "verdict: peak memory is "
        + ("bounded by the batch sizes" if all(verdicts) else "NOT bounded by the batch sizes")
    )


if __name__ == "__main__":
    main()
