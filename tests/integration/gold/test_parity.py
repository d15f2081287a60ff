"""Parity: one event stream through each lake engine gives the same bronze, silver and gold.

The emulator serves a seeded workload (creates, updates with nulled and diff-encoded fields,
compound children, deletes and undeletes, gap and overflow events, wildcard updates, a schema
change of Account, platform events); each engine lands it into its own lake and builds silver
and gold from it -- Contact with hard deletes and SCD2 history, so tombstones and history
tables take part. Every table's content hash must be the same in both lakes. Columns that say
when or in which landing batch something happened (receive times, batch numbers, the stream
tie-break of order keys, the run's timestamps) are left out of the hash: the two landings
batch the same events at different moments.
"""

from __future__ import annotations

import hashlib
import json
import textwrap
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.server import Emulator, EmulatorConfig
from ingest.emulator.workload import Workload, WorkloadMix
from pipelines.commands.ingest import land
from pipelines.engines import LakeEngine, SparkEngine
from pipelines.engines.local import LocalEngine
from pipelines.gold.job import run_gold
from pipelines.gold.resync import RESYNC_TABLE
from pipelines.silver.job import run_silver
from pipelines.spec import load_conf

# Every spark step of a tiny batch costs a second or more; on a busy two-core machine this
# test has taken ten minutes.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.spark,
    pytest.mark.spark_engine,
    pytest.mark.timeout(1500),
]

EVENTS = 2400
SEED = 20261125
RUN_AT = datetime(2026, 1, 1, tzinfo=timezone.utc)
# When or in which landing batch, not what: left out of the hashes.
UNSTABLE = {
    "received_at",
    "batch_id",
    "batch_seq",
    "committed_at",
    "first_seen_at",
    "_cdc_bronze_batch_id",
    "_cdc_bronze_batch_seq",
    "_cdc_order_key",
    "_scd_order_key",
    "bronze_batch_id",
}
OBJECTS = {
    "account": "object: Account\nkind: change_events\n",
    "contact": "object: Contact\nkind: change_events\n"
    "gold:\n  deletes: hard\n  scd2: {enabled: true, track: all}\n",
    "opportunity": "object: Opportunity\nkind: change_events\n",
    "invoice": "object: Invoice__c\nkind: change_events\n",
    "order": "object: Order_Shipped__e\nkind: platform_event\n",
}


def _conf(root: Path, emulator: Emulator, engine: str) -> Path:
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
            lake: {{engine: {engine}, location: {root / "lake"}}}
            defaults:
              replay: {{start: earliest, on_corrupted: fail}}
              batching: {{max_events: 700, max_bytes: 8MiB, max_age_seconds: 0.5}}
            ingest:
              maintain_every_commits: 3
            """
        )
    )
    for name, text in OBJECTS.items():
        (conf / "objects" / f"{name}.yml").write_text(text)
    return conf


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in sorted(value.items()) if k not in UNSTABLE}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def content_hash(table: pa.Table) -> tuple[int, str]:
    """Rows and a hash of the table's content, in any row order, without :data:`UNSTABLE`
    columns."""
    kept = table.select([c for c in table.column_names if c not in UNSTABLE])
    rows = sorted(json.dumps(_plain(r), sort_keys=True) for r in kept.to_pylist())
    digest = hashlib.sha256("\n".join(rows).encode()).hexdigest()
    return len(rows), digest


# Records of how each run went (commit times and durations, lease holders, keepalive positions),
# not of the data: they differ from run to run on one engine too.
OPERATIONAL = {"sfcdc_checkpoints", "sfcdc_commits", "sfcdc_leases"}


def _tables(engine: LakeEngine) -> dict[str, tuple[int, str]]:
    return {
        str(t): content_hash(engine.to_arrow(engine.read(t)))
        for t in engine.tables()  # type: ignore[attr-defined]
        if t.name not in OPERATIONAL
    }


def test_one_stream_through_both_engines_gives_the_same_tables(spark: Any, tmp_path: Path) -> None:
    catalogue = default_catalogue()
    # Gaps, overflows and wildcards a few times more often than a real org sends them, so a
    # short stream has each of them.
    mix = WorkloadMix(gap=1.5, overflow=0.3, wildcard=0.05)
    workload = Workload(catalogue, seed=SEED, mix=mix)
    engines: dict[str, LakeEngine] = {
        "local": LocalEngine(location=tmp_path / "local" / "lake"),
        "spark": SparkEngine(spark, location=tmp_path / "spark" / "lake"),
    }
    with Emulator(catalogue, EmulatorConfig(keepalive_interval=0.2)) as emulator:
        confs = {name: load_conf(_conf(tmp_path / name, emulator, name)) for name in engines}
        # Two rounds, so that gold also folds onto what it built before; Account's schema
        # changes between them.
        for round_ in range(2):
            if round_:
                workload.change_schema("Account")
            emulator.append(list(workload.events(EVENTS // 2)))
            for name, engine in engines.items():
                conf = confs[name]
                assert land(conf, once=True).events > 0
                run_silver(engine, conf, now=lambda: RUN_AT)
                run_gold(engine, conf, now=lambda: RUN_AT)
    lakes = {name: _tables(engine) for name, engine in engines.items()}
    local, remote = lakes["local"], lakes["spark"]
    assert set(local) == set(remote)
    assert {"gold.contact_tombstones", "gold.contact_history", "silver.order_shipped"} <= set(local)
    # The stream had gap and overflow events (gold lists them for re-sync).
    reasons = set(engines["local"].read_arrow(RESYNC_TABLE)["reason"].to_pylist())
    assert {"gap", "overflow"} <= reasons, reasons
    different = {t: (local[t], remote[t]) for t in local if local[t] != remote[t]}
    assert not different, f"tables differ between the engines: {different}"
    summary = ", ".join(f"{t} {n} rows" for t, (n, _h) in sorted(local.items()))
    print(f"same content on both engines: {summary}")
