"""The whole org in gold, judged against the emulator's ground truth on both lake engines.

The org has objects with change events and objects without (``kind: polled``: Change Data
Capture is off for them, so the emulator serves them over REST and Bulk only), and formula
fields on both kinds (computed when read, in no event). What events alone cannot give, in one
run: an outage longer than the event retention (the stored position expires; ``replay.on_expired:
rebootstrap`` reads every record again and hands off to the stream), a landing and a poller
SIGKILLed while the org keeps changing, gap events and overflows, events Salesforce loses before
storing them, records emptied from the Recycle Bin (no event, and no poll sees them again), and
formula values that change with their inputs. After ``sfcdc run --once`` and ``sfcdc
reconcile``, every gold table (change event and polled) equals the ground truth cell for cell,
formula columns included, with nothing flagged or open, and ``reconcile`` run again reports
zero drift.

The local engine runs every scenario; the spark engine runs what is particular to it (its
landing killed once, its silver of polled rows, gold MERGEs, column updates and snapshots) on
one object of each kind and fewer steps, since every Spark job costs seconds.

The lost events are the org's last changes: reconciliation compares ``SystemModstamp`` with the
time of gold's last change, so a lost change is seen as long as no later change of the same
record reached gold (docs/reconcile.md says why); a later full image (create, undelete, a
re-sync) repairs it anyway.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.formulas import DEFAULT_FORMULAS
from ingest.emulator.server import Emulator, EmulatorConfig
from ingest.emulator.workload import Workload, WorkloadMix
from pipelines.bronze import CHECKPOINT_TABLE
from pipelines.cli import main
from pipelines.engines import LakeEngine, TableRef
from pipelines.gold.resync import RESYNC_TABLE
from pipelines.gold.tables import FORMULA_TABLE, RECONCILE_TABLE
from pipelines.polled import poll_state, polled_table
from pipelines.spec import Conf, load_conf
from tests.cli_env import cli_env
from tests.integration.gold.test_oracle import ROOT, Producer, _kill_while_landing, _tail
from tests.integration.rest.oracle import assert_gold_equals_truth
from tests.integration.rest.test_rebootstrap import rebootstrap_conf

# A spark-engine pass starts Spark jobs per object and layer: allow for a busy machine.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1800)]

SEED = 20261128
# Objects (file -> API name) and their files' bodies: two with change events, two polled (over
# REST and over the Bulk API), formula fields on one of each kind.
OBJECTS = {
    "local": {
        "account": "Account",
        "contact": "Contact",
        "opportunity": "Opportunity",
        "invoice": "Invoice__c",
    },
    "spark": {"account": "Account", "opportunity": "Opportunity"},
}
BODIES = {
    "account": "kind: change_events\nformulas: {refresh_every: 1s}\n",
    "contact": "kind: change_events\n",
    "opportunity": (
        "kind: polled\npoll: {every: 1s, lookback: 2s, api: rest}\nformulas: {refresh_every: 1s}\n"
    ),
    "invoice": "kind: polled\npoll: {every: 1s, lookback: 0s, api: bulk}\n",
}
POLLED = ("Opportunity", "Invoice__c")
# The landing SIGKILLed while the org changes; on the local engine a poller too.
KILLS = {"local": 2, "spark": 1}
POLLER_KILLS = {"local": 1, "spark": 0}
# Events the producer appends while ingest is killed (a spark-engine ingest starts a JVM first,
# so its producer is paced and keeps going until the kill).
EVENTS = {"local": 1_500, "spark": 300}
RATES: dict[str, float | None] = {"local": None, "spark": 30.0}
MIX = WorkloadMix(platform_event=0.0, gap=1.0, overflow=0.3, wildcard=0.1)


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    catalogue = default_catalogue()
    catalogue.add_formulas(DEFAULT_FORMULAS)
    catalogue.disable_change_events(*POLLED)
    with Emulator(catalogue, EmulatorConfig(keepalive_interval=0.2, idle_timeout=30.0)) as running:
        running.bulk.settings.max_records = 200
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


def _conf(root: Path, emulator: Emulator, engine: str) -> Path:
    conf_dir = rebootstrap_conf(root, emulator, engine, objects=OBJECTS[engine])
    for name in OBJECTS[engine]:
        (conf_dir / "objects" / f"{name}.yml").write_text(
            f"object: {OBJECTS[engine][name]}\n{BODIES[name]}"
        )
    return conf_dir


def _kill_while_polling(conf: Path, log: Path, rng: random.Random) -> None:
    """A process polling every polled object back to back, SIGKILLed once a few polls have
    committed: at a random instant of a poll (reading, building its rows, committing)."""
    driver = (
        "import sys\nfrom pipelines.cli import main\n"
        "while True:\n    main(['poll', '--all', '--conf', sys.argv[1]])\n"
    )
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", driver, str(conf)],
            cwd=ROOT,
            env=cli_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 180
    while log.read_text(errors="replace").count(": poll ") < 4:
        assert process.poll() is None, f"the poller exited:\n{_tail(log)}"
        assert time.monotonic() < deadline, f"the poller did not poll:\n{_tail(log)}"
        time.sleep(0.05)
    time.sleep(rng.uniform(0.0, 1.0))
    assert process.poll() is None, f"the poller stopped by itself:\n{_tail(log)}"
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)


def _assert_polls_whole(engine: LakeEngine, conf: Conf) -> int:
    """Every poll committed is in its table once and whole (its records and the watermark past
    them), and nothing of a poll that did not commit: batches 1..N, N the table's txn
    version. Returns the polls counted."""
    polls = 0
    for obj in conf.polled_objects():
        state = poll_state(engine, obj)
        assert state.batch_id is not None, f"{obj.api_name} was never polled"
        rows = engine.read_arrow(
            polled_table(obj), columns=["kind", "batch_id", "records"]
        ).to_pylist()
        marks = {}
        counts: dict[int, int] = {}
        for row in rows:
            if row["kind"] == "watermark":
                assert row["batch_id"] not in marks, f"{obj.api_name}: poll {row['batch_id']} twice"
                marks[row["batch_id"]] = row["records"]
            elif row["kind"] == "record":
                counts[row["batch_id"]] = counts.get(row["batch_id"], 0) + 1
        assert sorted(marks) == list(range(1, state.batch_id + 1)), (obj.api_name, sorted(marks))
        assert all(counts.get(b, 0) == n for b, n in marks.items()), (obj.api_name, marks, counts)
        polls += len(marks)
    return polls


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
    conf_dir = _conf(tmp_path, emulator, lake_kind)
    conf = load_conf(conf_dir)
    engine = make_engine(conf.pipeline.lake.location)
    change_event_objects = {o.api_name for o in conf.objects if o.kind == "change_events"}

    # 1. History, landed: the lake stores a position on every topic.
    emulator.append(list(workload.events(300)))
    assert _cli("ingest", "--once", "--conf", str(conf_dir)) == 0

    # 2. An outage past the retention: changes nobody lands, every event so far dropped with
    #    the positions the lake stored, changes committed while nobody listened. The first
    #    run re-reads the change event objects whole, polls the others whole and refreshes the
    #    formulas.
    if lake_kind == "local":
        missed = emulator.append(list(workload.events(150)))
        assert emulator.faults.purge(through=missed[-1]) > 0
        emulator.append(list(workload.events(80)))
    assert _cli("run", "--once", "--conf", str(conf_dir)) == 0
    gaps = [r for r in _rows(engine, RESYNC_TABLE) if r["reason"] == "replay_gap"]
    if lake_kind == "local":
        assert {r["object"] for r in gaps} == change_event_objects
        assert all(r["resolved_at"] is not None for r in gaps), "the rebootstrap did not run"
    assert {r["object"] for r in _rows(engine, FORMULA_TABLE)} == {"Account", "Opportunity"}

    # 3. The org keeps changing while the landing (and the poller) are SIGKILLed.
    producer = Producer(emulator, workload, EVENTS[lake_kind], RATES[lake_kind])
    producer.start()
    try:
        for kill in range(KILLS[lake_kind]):
            _kill_while_landing(conf_dir, tmp_path / f"ingest-{kill}.log", rng)
        for kill in range(POLLER_KILLS[lake_kind]):
            _kill_while_polling(conf_dir, tmp_path / f"poll-{kill}.log", rng)
    finally:
        producer.kills_over.set()
        producer.join(timeout=300)
    assert producer.error is None, producer.error
    assert producer.produced >= EVENTS[lake_kind]
    polls = _assert_polls_whole(engine, conf)
    assert _cli("ingest", "--once", "--conf", str(conf_dir)) == 0

    # 4. The last changes are lost before they are stored; deleted records are emptied from
    #    the Recycle Bin (a delete whose event was lost among them leaves gold live, and a
    #    polled record deleted and emptied between two polls is never seen deleted).
    #    Changes of polled objects publish no event, so the org changes until 25 are lost.
    emulator.faults.lose_events(25)
    for _ in range(100):
        emulator.append(list(workload.events(5)))
        if len(emulator.faults.lost_event_ids) == 25:
            break
    assert len(emulator.faults.lost_event_ids) == 25
    purged = sum(len(workload.empty_recycle_bin(e, 3)) for e in entities)
    assert purged > 0

    # 5. The pipeline, then reconciliation: gold equals the org, formulas included.
    assert _cli("run", "--once", "--conf", str(conf_dir)) == 0
    capsys.readouterr()
    assert _cli("reconcile", "--conf", str(conf_dir)) == 0
    out = capsys.readouterr().out
    found = [r for r in _rows(engine, RECONCILE_TABLE) if r["api"] is not None]
    assert {r["object"] for r in found} == entities
    drift = sum(r["drift_missing"] + r["drift_extra"] + r["drift_stale"] for r in found)
    assert drift > 0, out
    assert all(
        r["repaired"] == r["drift_missing"] + r["drift_extra"] + r["drift_stale"] for r in found
    ), found
    report = assert_gold_equals_truth(engine, conf, workload.truth)
    if lake_kind == "local":
        checkpoints = _rows(engine, TableRef("bronze", CHECKPOINT_TABLE))
        topics = {c["topic"] for c in checkpoints if c["kind"] == "replay_gap"}
        assert len(topics) == len(change_event_objects), topics

    # 6. Nothing left to find.
    assert _cli("reconcile", "--conf", str(conf_dir)) == 0
    again = capsys.readouterr().out
    assert f"drift: 0 records in {len(objects)} objects" in again, again
    print(f"{lake_kind}: {report}")
    print(
        f"{lake_kind}: {producer.produced} events while killed, {polls} polls, drift found "
        f"{drift} ({next(line for line in out.splitlines() if line.startswith('drift:'))}), "
        f"{purged} hard-deleted, whole test {time.monotonic() - started:.0f} s"
    )
