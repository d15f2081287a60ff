"""Objects without change events (``kind: polled``) and formula fields, end to end against the
emulator: ``sfcdc run --once`` polls (REST and Bulk API), lands the records with their watermark
in one commit, carries them through silver and gold beside a change event object, and refreshes
formula fields; gold equals the ground truth cell for cell, formulas included. A poll after more
changes reads only what was saved since the watermark minus the look-back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import get_args

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.formulas import DEFAULT_FORMULAS
from ingest.emulator.server import Emulator, EmulatorConfig
from ingest.emulator.workload import Workload, WorkloadMix
from ingest.emulator.workload_mix import TransactionKind
from pipelines.cli import main
from pipelines.engines import LakeEngine, TableRef
from pipelines.formulas import FORMULA_TABLE
from pipelines.polled import poll_state, polled_table
from pipelines.session import engine_for
from pipelines.spec import Conf, load_conf
from tests.integration.rest.oracle import assert_gold_equals_truth, write_conf

pytestmark = [pytest.mark.integration]

OBJECTS = {"account": "Account", "opportunity": "Opportunity", "invoice": "Invoice__c"}
MIX = WorkloadMix(
    platform_event=0.0,
    gap=0.0,
    overflow=0.0,
    entity_weights={"Account": 1.0, "Opportunity": 1.0, "Invoice__c": 1.0},
)
BODIES = {
    "account": "kind: change_events\nformulas: {refresh_every: 1s}\n",
    "opportunity": (
        "kind: polled\npoll: {every: 1h, lookback: 30s, api: rest}\nformulas: {refresh_every: 1s}\n"
    ),
    # Bulk API polls, soft deletes kept as rows; SCD2 history of a polled object.
    "invoice": (
        "kind: polled\npoll: {every: 1s, lookback: 0s, api: bulk}\ngold: {scd2: {enabled: true}}\n"
    ),
}


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    catalogue = default_catalogue()
    catalogue.add_formulas(DEFAULT_FORMULAS)
    catalogue.disable_change_events("Opportunity", "Invoice__c")
    with Emulator(catalogue, EmulatorConfig(keepalive_interval=0.2)) as running:
        running.rest.page_size = 150
        running.bulk.settings.max_records = 90
        yield running


def _org_and_lake(
    emulator: Emulator,
    tmp_path: Path,
    *,
    seed: int,
    mix: WorkloadMix,
    events: int,
    objects: dict[str, str],
    bodies: dict[str, str],
) -> tuple[Workload, Path, Conf, LakeEngine]:
    """An org of ``events`` changes served by ``emulator``, and a conf of ``objects`` (declared
    by ``bodies``) over a local lake."""
    workload = Workload(emulator.catalogue, seed=seed, mix=mix)
    emulator.serve_records(workload.truth)
    emulator.append(list(workload.events(events)))
    conf_dir = write_conf(
        tmp_path, emulator, objects, start="earliest", engine="local", bodies=bodies
    )
    conf = load_conf(conf_dir)
    return workload, conf_dir, conf, engine_for(conf.pipeline.lake)


def test_polled_objects_and_formulas_reach_gold(
    emulator: Emulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload, conf_dir, conf, engine = _org_and_lake(
        emulator, tmp_path, seed=380, mix=MIX, events=500, objects=OBJECTS, bodies=BODIES
    )
    assert main(["-q", "run", "--once", "--conf", str(conf_dir)]) == 0
    print(assert_gold_equals_truth(engine, conf, workload.truth))
    opportunity, invoice = conf.object("Opportunity"), conf.object("Invoice__c")
    first = poll_state(engine, opportunity)
    assert first.batch_id == 1 and first.watermark is not None
    bronze = engine.read_arrow(polled_table(opportunity)).to_pylist()
    kinds = [r["kind"] for r in bronze]
    assert kinds.count("describe") == 1 and kinds.count("watermark") == 1
    assert kinds.count("record") == len(workload.truth.records("Opportunity"))
    # One commit per poll: the records and the watermark past them, under the poll's txn.
    commits = [h for h in engine.history(polled_table(opportunity)) if h.txn is not None]
    assert [(h.txn.app_id, h.txn.version) for h in commits if h.txn] == [
        ("sfcdc.poll:Opportunity", 1)
    ]
    refreshed = engine.read_arrow(FORMULA_TABLE).to_pylist()
    assert {r["object"] for r in refreshed} == {"Account", "Opportunity"}
    assert {r["api"] for r in refreshed} == {"bulk"}

    # More changes: the next polls read only what was saved since the watermark (minus the
    # look-back); formulas change with their inputs and are refreshed.
    emulator.append(list(workload.events(300)))
    capsys.readouterr()
    assert main(["-q", "poll", "--conf", str(conf_dir)]) == 0
    out = capsys.readouterr().out
    assert "Opportunity: not due" in out, out
    assert "Invoice__c: poll 2 read" in out and "over the Bulk API" in out, out
    assert main(["-q", "poll", "--all", "--objects", "Opportunity", "--conf", str(conf_dir)]) == 0
    out = capsys.readouterr().out
    second = poll_state(engine, opportunity)
    assert second.batch_id == 2 and second.watermark is not None
    assert second.watermark > first.watermark
    since = first.watermark - timedelta(seconds=30)
    stamps = workload.truth.modstamps("Opportunity")
    expected = sum(1 for s in stamps.values() if s >= since.timestamp() * 1000 // 1000 * 1000)
    assert f"Opportunity: poll 2 read {expected} records" in out, out
    assert expected < len(stamps)
    assert main(["-q", "run", "--once", "--conf", str(conf_dir)]) == 0
    report = assert_gold_equals_truth(engine, conf, workload.truth)
    print(report)
    assert (
        "Opportunity (polled)" in report and "formulas Weighted_Amount__c, Is_Big_Deal__c" in report
    )
    history = engine.read_arrow(TableRef("gold", "invoice_history")).to_pylist()
    assert any(r["_scd_change_type"] == "POLLED" for r in history)
    gold = engine.read_arrow(TableRef("gold", "opportunity")).to_pylist()
    assert {r["_cdc_last_change_type"] for r in gold} <= {"POLLED", "POLLED_DELETED"}
    assert any(r["_cdc_last_change_type"] == "POLLED_DELETED" for r in gold)
    # Gold's formula columns are refreshed, never written by the fold.
    assert all(r["_cdc_formulas_refreshed_at"] is not None for r in gold)
    assert invoice.formulas.refresh_every is None
    assert "Total__c" not in engine.schema(TableRef("gold", "invoice")).names  # type: ignore[union-attr]


def test_formula_columns_are_written_by_the_refresh_and_snapshots_only(
    emulator: Emulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The gold fold never carries formula fields: an event leaves them as the last refresh
    set them (never null), a snapshot (reconcile's repair) reads them with the record, and a
    column no writer knows keeps its value through both."""
    workload, conf_dir, conf, engine = _org_and_lake(
        emulator,
        tmp_path,
        seed=381,
        mix=WorkloadMix(platform_event=0.0, gap=0.0, overflow=0.0, entity_weights={"Account": 1.0}),
        events=300,
        objects={"account": "Account"},
        bodies={"account": "kind: change_events\nformulas: {refresh_every: 24h}\n"},
    )
    gold = TableRef("gold", "account")
    assert main(["-q", "run", "--once", "--conf", str(conf_dir)]) == 0
    print(assert_gold_equals_truth(engine, conf, workload.truth))
    before = {r["Id"]: r for r in engine.read_arrow(gold).to_pylist()}
    # A column sfcdc does not write (a user's, or one a later version stops writing).
    schema = engine.schema(gold)
    assert schema is not None
    engine.ensure_table(gold, T.StructType([*schema.fields, T.StructField("Note", T.StringType())]))
    engine.update_columns(
        gold,
        pa.table({"Id": list(before), "Note": ["kept"] * len(before)}),
        on=["Id"],
        columns=["Note"],
    )

    # Events change records: the fold folds them, the formula columns stay as refreshed.
    emulator.append(list(workload.events(200)))
    assert main(["-q", "ingest", "--once", "--conf", str(conf_dir)]) == 0
    assert main(["-q", "silver", "--conf", str(conf_dir)]) == 0
    assert main(["-q", "gold", "--conf", str(conf_dir)]) == 0
    after = {r["Id"]: r for r in engine.read_arrow(gold).to_pylist()}
    changed = [
        r for r in before if after[r]["_cdc_last_commit_ts"] != before[r]["_cdc_last_commit_ts"]
    ]
    assert len(changed) > 20
    for record_id in changed:
        for column in ("Revenue_Per_Employee__c", "_cdc_formulas_refreshed_at"):
            assert after[record_id][column] == before[record_id][column], (record_id, column)
    assert all(r["Note"] == "kept" for r in after.values() if r["Id"] in before)
    stale = [
        r
        for r in changed
        if after[r]["Revenue_Per_Employee__c"]
        != workload.truth.formula_values("Account", r)["Revenue_Per_Employee__c"]
    ]
    assert stale, "no event changed a formula's input: the test shows nothing"

    # Events lost: reconcile re-reads those records whole, formulas included.
    emulator.faults.lose_events(10)
    emulator.append(list(workload.events(10)))
    assert main(["-q", "reconcile", "--api", "rest", "--conf", str(conf_dir)]) == 0
    repaired = {r["Id"]: r for r in engine.read_arrow(gold).to_pylist()}
    snapshots = [r for r in repaired.values() if r["_cdc_last_change_type"] == "SNAPSHOT"]
    assert snapshots
    for row in snapshots:
        want = workload.truth.formula_values("Account", row["Id"])["Revenue_Per_Employee__c"]
        assert row["Revenue_Per_Employee__c"] == want
        assert row["_cdc_formulas_refreshed_at"] == row["_cdc_updated_at"]
    assert all(r["Note"] == "kept" for r in repaired.values() if r["Id"] in before)
    # The next refresh makes every formula current again.
    assert main(["-q", "formulas", "--all", "--conf", str(conf_dir)]) == 0
    assert "Revenue_Per_Employee__c" in capsys.readouterr().out
    print(assert_gold_equals_truth(engine, conf, workload.truth))


def test_a_continuous_run_polls_what_is_due_and_a_conf_of_polled_objects_alone_runs(
    emulator: Emulator, tmp_path: Path
) -> None:
    workload, conf_dir, conf, engine = _org_and_lake(
        emulator,
        tmp_path,
        seed=382,
        mix=MIX,
        events=200,
        objects={"invoice": "Invoice__c"},
        bodies={"invoice": "kind: polled\npoll: {every: 0.5s, lookback: 0s, api: rest}\n"},
    )
    # No topic to land: the run polls (every pass, once 0.5 s have passed) and carries on.
    args = ["-q", "run", "--continuous", "--landing", "thread", "--interval", "0.2"]
    assert main([*args, "--for", "3", "--conf", str(conf_dir)]) == 0
    state = poll_state(engine, conf.object("Invoice__c"))
    assert state.batch_id is not None and state.batch_id >= 3, state
    print(assert_gold_equals_truth(engine, conf, workload.truth))


def test_a_lossy_type_conversion_makes_the_next_poll_read_the_whole_object(
    emulator: Emulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Converting a custom field to a type that cannot hold its data empties it on every
    record without moving any SystemModstamp: only the describe shows it. The next poll reads
    the whole object again, and gold holds the emptied field."""
    mix = replace(MIX, wildcard=0.0, entity_weights={"Invoice__c": 1.0})
    workload, conf_dir, conf, engine = _org_and_lake(
        emulator,
        tmp_path,
        seed=383,
        mix=mix,
        events=200,
        objects={"invoice": "Invoice__c"},
        bodies={"invoice": "kind: polled\npoll: {every: 1h, lookback: 0s, api: rest}\n"},
    )
    assert main(["-q", "run", "--once", "--conf", str(conf_dir)]) == 0
    print(assert_gold_equals_truth(engine, conf, workload.truth))
    stamps = dict(workload.truth.modstamps("Invoice__c"))

    # One wildcard change: a field's type converted, its data lost everywhere.
    only = {**dict.fromkeys(get_args(TransactionKind), 0.0), "wildcard": 1.0}
    workload.mix = replace(mix, **only)
    emulator.append(workload.transaction())
    (field, converted), *_ = emulator.catalogue.retyped_of("Invoice__c")
    assert all(r.get(field) is None for r in workload.truth.records("Invoice__c").values())
    assert dict(workload.truth.modstamps("Invoice__c")) == stamps
    gold = {r["Id"]: r for r in engine.read_arrow(TableRef("gold", "invoice")).to_pylist()}
    assert any(r[field] is not None for r in gold.values()), f"{field} was empty already"
    capsys.readouterr()
    assert main(["-q", "poll", "--all", "--conf", str(conf_dir)]) == 0
    out = capsys.readouterr().out
    assert f"Invoice__c: poll 2 read {len(stamps)} records" in out, out
    assert main(["-q", "run", "--once", "--conf", str(conf_dir)]) == 0
    print(assert_gold_equals_truth(engine, conf, workload.truth))
    bronze = engine.read_arrow(polled_table(conf.object("Invoice__c"))).to_pylist()
    described = {r["batch_id"]: r["payload"] for r in bronze if r["kind"] == "describe"}
    assert sorted(described) == [1, 2]
    types = {f["name"]: f["type"] for f in json.loads(described[2])["fields"]}
    assert types[field] == converted
