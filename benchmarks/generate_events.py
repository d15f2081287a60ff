"""Events per second of the emulator's change event generator.

Generates ``--events`` events with :meth:`Workload.events` (default mix) and prints the rate
next to a baseline measured in the same run: ``fastavro.schemaless_writer`` alone re-encoding
a sample of the same events, i.e. the cost of nothing but the Avro encoding with the standard
library. Run it from the repository root::

    PYTHONPATH=. python benchmarks/generate_events.py --events 100000
"""

from __future__ import annotations

import argparse
import gc
import io
import time
from collections import Counter

from fastavro import schemaless_reader, schemaless_writer

from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.workload import Workload

TARGET = 20_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--baseline-sample", type=int, default=20_000)
    args = parser.parse_args()

    workload = Workload(default_catalogue(), seed=args.seed)
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    events = list(workload.events(args.events))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    rate = len(events) / wall

    sample = events[: args.baseline_sample]
    catalogue = workload.catalogue
    records = []
    for event in sample:
        schema = catalogue.schema(event.schema_id).parsed
        records.append((schema, schemaless_reader(io.BytesIO(event.payload), schema, None)))
    base = time.perf_counter()
    for schema, record in records:
        schemaless_writer(io.BytesIO(), schema, record)
    base = time.perf_counter() - base
    baseline = len(records) / base

    kinds = Counter(change.change_type for change in workload.log)
    truth = workload.truth
    print(f"generator: {len(events):,} events in {wall:.2f} s wall ({cpu:.2f} s CPU)")
    print(
        f"  -> {rate:,.0f} events/s (target >= {TARGET:,}: {'met' if rate >= TARGET else 'MISSED'})"
    )
    print(f"  -> {len(events) / cpu:,.0f} events per CPU-second")
    print(
        f"baseline, same run: fastavro.schemaless_writer alone re-encoding {len(records):,} of "
        f"those events: {baseline:,.0f} events/s"
    )
    print(f"generator rate / encoding-only baseline: {rate / baseline:.2f}")
    print("change types:", ", ".join(f"{k} {v:,}" for k, v in kinds.most_common()))
    print(
        "ground truth:",
        ", ".join(
            f"{e} {len(truth.records(e)):,} ({len(truth.deleted(e)):,} deleted, "
            f"{len(truth.resync(e).unknowable):,} to re-sync)"
            for e in truth.entities
        ),
    )


if __name__ == "__main__":
    main()
