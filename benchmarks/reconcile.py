"""Reconciliation next to a full extract of the same object, in the same run.

The emulator serves ``--records`` Account records (the real AccountChangeEvent fields: text,
numbers, dates, three addresses, a location, the person name union), some in the recycle bin.
A gold table holds the same records, a few of them drifting (older than their
``SystemModstamp``, missing, or live while deleted in Salesforce). Measured over the emulator's
Bulk API 2.0 (``queryAll`` jobs, 50,000 records per result set):

- the baseline, a full extract: every field of every record read with a Bulk job and typed as
  a bootstrap reads them (``BulkRecords.query_all``), nothing written;
- ``reconcile`` (measure only, ``repair=False``): the job of ``Id, SystemModstamp, IsDeleted``,
  gold's three columns read from Delta, the comparison, the drift rows written to the re-sync
  table and the counts to ``gold.sfcdc_reconcile``. Repairing costs one REST request per 200
  drifting records on top: proportional to the drift, not to the object.

Target: reconcile <= 0.25x the extract. Client and emulator share this process (and the CPU
with whatever else runs). Run from the repository root::

    PYTHONPATH=. python benchmarks/reconcile.py [--records 1000000] [--drift 1000]

The last lines print both times and ``reconcile / extract: N.NNx``.
"""

from __future__ import annotations

import argparse
import random
import resource
import shutil
import sys
import tempfile
import textwrap
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.emulator_rest import rest_and_bulk  # noqa: E402
from ingest.emulator.catalogue import default_catalogue  # noqa: E402
from ingest.emulator.ids import to_18  # noqa: E402
from ingest.emulator.server import Emulator, EmulatorConfig  # noqa: E402
from ingest.emulator.workload import Workload, WorkloadMix  # noqa: E402
from ingest.rest import RestClient  # noqa: E402
from pipelines.engines import TableRef  # noqa: E402
from pipelines.gold.columns import DELETED, ID, LAST_COMMIT_TS  # noqa: E402
from pipelines.reconcile import reconcile_objects  # noqa: E402
from pipelines.session import engine_for  # noqa: E402
from pipelines.snapshot_read import SnapshotSource  # noqa: E402
from pipelines.spec.load import load_conf  # noqa: E402

TARGET = 0.25
ENTITY = "Account"


def _org(records: int) -> Workload:
    """A workload's Account records, cloned up to ``records`` (every clone its own id and
    SystemModstamp), some of them in the recycle bin."""
    workload = Workload(
        default_catalogue(),
        seed=38,
        mix=WorkloadMix(platform_event=0.0, gap=0.0, overflow=0.0, wildcard=0.0),
    )
    list(workload.events(3000))
    truth = workload.truth
    originals = list(truth.records(ENTITY).items())
    deleted = set(truth.deleted(ENTITY))
    base = max(truth.modstamps(ENTITY).values())
    copies = 0
    while len(truth.records(ENTITY)) < records:
        record_id, values = originals[copies % len(originals)]
        copies += 1
        copy_id = to_18(f"001Z{copies:011d}")
        stamp = base + 1000 * (copies % 86_400)
        truth.create(ENTITY, copy_id, values, event_id=f"c{copies}", modstamp=stamp)
        if record_id in deleted:
            truth.delete(ENTITY, copy_id, event_id=f"d{copies}", modstamp=stamp)
    return workload


def _gold(workload: Workload, drift: int, rng: random.Random) -> tuple[pa.Table, int]:
    """Gold's view of the records: every one, with its deleted flag and the time of its last
    change; ``drift`` of them made older, missing or wrongly live."""
    truth = workload.truth
    stamps = truth.modstamps(ENTITY)
    deleted = truth.deleted(ENTITY)
    ids = list(truth.records(ENTITY))
    chosen = rng.sample(range(len(ids)), drift)
    stale = set(chosen[: drift // 2])
    missing = set(chosen[drift // 2 : drift * 3 // 4])
    wrong_live = set(chosen[drift * 3 // 4 :])
    out_ids, out_deleted, out_ts = [], [], []
    for i, record_id in enumerate(ids):
        if i in missing:
            continue
        stamp = stamps[record_id] - (5000 if i in stale else 0)
        out_ids.append(record_id)
        out_deleted.append(record_id in deleted and i not in wrong_live)
        out_ts.append(datetime.fromtimestamp(stamp / 1000, tz=timezone.utc))
    table = pa.table(
        {
            ID: pa.array(out_ids, pa.string()),
            DELETED: pa.array(out_deleted, pa.bool_()),
            LAST_COMMIT_TS: pa.array(out_ts, pa.timestamp("us", tz="UTC")),
        }
    )
    expected = len(stale) + len(missing) + sum(1 for i in wrong_live if ids[i] in deleted)
    return table, expected


def _conf(root: Path, emulator: Emulator) -> Path:
    conf = root / "conf"
    (conf / "objects").mkdir(parents=True)
    (conf / "pipeline.yml").write_text(
        textwrap.dedent(
            f"""\
            connection:
              emulator:
                mode: external
                grpc_port: {emulator.grpc_port}
                http_port: {emulator.http_port}
                tls: {{enabled: false}}
            lake: {{engine: local, location: {root / "lake"}}}
            """
        )
    )
    (conf / "objects" / "account.yml").write_text("object: Account\nkind: change_events\n")
    return conf


def _extract_soql(rest: RestClient) -> str:
    # Every field a bootstrap reads: the describe's fields, compounds instead of their parts.
    fields = rest.describe(ENTITY)["fields"]
    names = [f["name"] for f in fields if not f.get("compoundFieldName")]
    return f"SELECT {', '.join(names)} FROM {ENTITY}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records of the object")
    parser.add_argument("--drift", type=int, default=1_000, help="drifting records in gold")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: temp)")
    args = parser.parse_args()
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="sfcdc-bench-reconcile-"))
    rng = random.Random(38)

    started = time.perf_counter()
    workload = _org(args.records)
    gold, expected = _gold(workload, args.drift, rng)
    print(
        f"org: {len(workload.truth.records(ENTITY)):,} {ENTITY} records "
        f"({len(workload.truth.deleted(ENTITY)):,} in the recycle bin), gold {gold.num_rows:,} "
        f"rows, {expected:,} drifting; built in {time.perf_counter() - started:.0f} s"
    )
    try:
        with Emulator(workload.catalogue, EmulatorConfig()) as emulator:
            emulator.serve_records(workload.truth)
            conf = load_conf(_conf(scratch, emulator))
            engine = engine_for(conf.pipeline.lake)
            engine.append(TableRef("gold", "account"), gold)
            with rest_and_bulk(emulator) as (rest, bulk):
                source = SnapshotSource(rest, bulk=bulk, api="bulk")

                t0 = time.perf_counter()
                extracted = sum(1 for _ in bulk.query_all(_extract_soql(rest)))
                extract = time.perf_counter() - t0

                t0 = time.perf_counter()
                (result,) = reconcile_objects(engine, conf, [ENTITY], source=source, repair=False)
                reconcile = time.perf_counter() - t0
    finally:
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    assert extracted == args.records, extracted
    assert result.drift == expected, (result, expected)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"reconcile found drift_missing {result.drift_missing:,}, drift_extra "
        f"{result.drift_extra:,}, drift_stale {result.drift_stale:,} of {expected:,} made; "
        f"peak RSS {rss:,.0f} MB"
    )
    print(f"full Bulk extract of {extracted:,} records: {extract:6.1f} s")
    print(f"reconcile of {result.salesforce_records:,} records: {reconcile:6.1f} s")
    ratio = reconcile / extract
    verdict = "meets" if ratio <= TARGET else "misses"
    print(f"reconcile / extract: {ratio:.2f}x ({verdict} the target <= {TARGET:.2f}x)")


if __name__ == "__main__":
    main()
