"""The whole org in gold, judged against the emulator's ground truth on both lake engines.

What events alone cannot give, in one run: an outage longer than the event retention (the
stored position expires; ``replay.on_expired: rebootstrap`` reads every record again and hands
off to the stream), a landing SIGKILLed while the org keeps changing, gap events and overflows,
events Salesforce loses before storing them, and records emptied from the Recycle Bin (no event
at all). After ``sfcdc run --once`` and ``sfcdc reconcile``, every gold table equals the ground
truth cell for cell, with nothing flagged or open, and ``reconcile`` run again reports zero
drift.

The lost events are the org's last changes: reconciliation compares ``SystemModstamp`` with the
time of gold's last change, so a lost change is seen as long as no later change of the same
record reached gold (docs/reconcile.md says why); a later full image (create, undelete, a
re-sync) repairs it anyway.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.server import Emulator, EmulatorConfig
from ingest.emulator.workload import Workload, WorkloadMix
from pipelines.bronze import CHECKPOINT_TABLE
from pipelines.cli import main
from pipelines.engines import TableRef
from pipelines.gold.resync import RESYNC_TABLE
from pipelines.reconcile import RECONCILE_TABLE
from pipelines.spec import load_conf
from tests.integration.gold.test_oracle import Producer, _ingest, _kill_while_landing, _tail
from tests.integration.rest.oracle import assert_gold_equals_truth
from tests.integration.rest.test_rebootstrap import rebootstrap_conf

# A spark-engine pass starts Spark jobs per object and layer: allow for a busy machine.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1800)]

SEED = 20261128
ALL_OBJECTS = {
    "account": "Account",
    "contact": "Contact",
    "opportunity": "Opportunity",
    "invoice": "Invoice__c",
}
# Every spark-engine pass runs Spark jobs per object: two objects (a parent and its cascading
# children) keep its run short; the local engine takes all four.
OBJECTS = {
    "local": ALL_OBJECTS,
    "spark": {"account": "Account", "contact": "Contact"},
}
KILLS = {"local": 2, "spark": 1}
# Events the producer appends while ingest is killed (a spark-engine ingest starts a JVM first,
# so its producer is paced and keeps going until the kill).
EVENTS = {"local": 1_500, "spark": 300}
RATES: dict[str, float | None] = {"local": None, "spark": 30.0}
MIX = WorkloadMix(platform_event=0.0, gap=1.0, overflow=0.3, wildcard=0.1)


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    with Emulator(
        default_catalogue(), EmulatorConfig(keepalive_interval=0.2, idle_timeout=30.0)
    ) as running:
        yield running


def _cli(*argv: str) -> int:
    began = time.monotonic()
    try:
        return main(["-q", *argv])
    finally:
        # Shown with -s, and in the log of a run that times out.
        print(f"sfcdc {argv[0]}: {time.monotonic() - began:.1f} s", flush=True)


def _rows(engine: Any, table: TableRef) -> list[dict[str, Any]]:
    return engine.read_arrow(table).to_pylist() if engine.exists(table) else []


def test_gold_equals_the_whole_org(
    lake_kind: str,
    make_engine: Any,
    emulator: Emulator,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    started = time.monotonic()
    rng = random.Random(SEED)
    objects = OBJECTS[lake_kind]
    entities = set(objects.values())
    mix = MIX if lake_kind == "local" else replace(MIX, entity_weights=dict.fromkeys(entities, 1.0))
    workload = Workload(emulator.catalogue, seed=SEED, mix=mix)
    emulator.serve_records(workload.truth)
    conf_dir = rebootstrap_conf(tmp_path, emulator, lake_kind, objects=objects)
    conf = load_conf(conf_dir)
    engine = make_engine(conf.pipeline.lake.location)

    # 1. History, landed: the lake stores a position on every topic.
    emulator.append(list(workload.events(300)))
    assert _cli("ingest", "--once", "--conf", str(conf_dir)) == 0

    # 2. An outage past the retention: changes nobody lands, every event so far dropped with
    #    the positions the lake stored, changes committed while nobody listened.
    missed = emulator.append(list(workload.events(150)))
    assert emulator.faults.purge(through=missed[-1]) > 0
    emulator.append(list(workload.events(80)))
    assert _cli("run", "--once", "--conf", str(conf_dir)) == 0
    gaps = [r for r in _rows(engine, RESYNC_TABLE) if r["reason"] == "replay_gap"]
    assert {r["object"] for r in gaps} == entities
    assert all(r["resolved_at"] is not None for r in gaps), "the rebootstrap did not run"

    # 3. The org keeps changing while the landing is SIGKILLed twice.
    producer = Producer(emulator, workload, EVENTS[lake_kind], RATES[lake_kind])
    producer.start()
    try:
        for kill in range(KILLS[lake_kind]):
            _kill_while_landing(conf_dir, tmp_path / f"ingest-{kill}.log", rng)
    finally:
        producer.kills_over.set()
        producer.join(timeout=300)
    assert producer.error is None, producer.error
    assert producer.produced >= EVENTS[lake_kind]
    log = tmp_path / "drain.log"
    assert _ingest(conf_dir, log, "--once").wait(timeout=600) == 0, _tail(log)

    # 4. The last changes are lost before they are stored; deleted records are emptied from
    #    the Recycle Bin (a delete whose event was lost among them leaves gold live).
    emulator.faults.lose_events(25)
    emulator.append(list(workload.events(25)))
    assert len(emulator.faults.lost_event_ids) == 25
    purged = sum(len(workload.empty_recycle_bin(e, 3)) for e in entities)
    assert purged > 0

    # 5. The pipeline, then reconciliation: gold equals the org.
    assert _cli("run", "--once", "--conf", str(conf_dir)) == 0
    capsys.readouterr()
    assert _cli("reconcile", "--conf", str(conf_dir)) == 0
    out = capsys.readouterr().out
    found = [r for r in _rows(engine, RECONCILE_TABLE) if r["api"] is not None]
    drift = sum(r["drift_missing"] + r["drift_extra"] + r["drift_stale"] for r in found)
    assert drift > 0, out
    assert all(
        r["repaired"] == r["drift_missing"] + r["drift_extra"] + r["drift_stale"] for r in found
    ), found
    report = assert_gold_equals_truth(engine, conf, workload.truth)
    checkpoints = _rows(engine, TableRef("bronze", CHECKPOINT_TABLE))
    topics = {c["topic"] for c in checkpoints if c["kind"] == "replay_gap"}
    assert len(topics) == len(objects), topics

    # 6. Nothing left to find.
    assert _cli("reconcile", "--conf", str(conf_dir)) == 0
    again = capsys.readouterr().out
    assert f"drift: 0 records in {len(objects)} objects" in again, again
    print(f"{lake_kind}: {report}")
    print(
        f"{lake_kind}: {producer.produced} events while killed, drift found {drift} "
        f"({next(line for line in out.splitlines() if line.startswith('drift:'))}), {purged} "
        f"hard-deleted, whole test "
        f"{time.monotonic() - started:.0f} s"
    )
