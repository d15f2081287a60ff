"""Gold from a ``decode=silver`` Structured Streaming query through :class:`GoldSink` in
``foreachBatch``, against the emulator over a socket, on real delta-spark tables.

The workload is Account's: creates, partial updates (with nulled fields, compound children and
diff-encoded long text), wildcard updates, deletes and undeletes; no gaps, so every record is
known to the events. Gold must equal the emulator's ground truth cell for cell, after several
micro-batches, after a driver SIGKILLed between a micro-batch's silver append and its gold run
(restarted from its checkpoint, Spark runs that batch again), and after a batch handed to the
sink twice; silver must hold every change once.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from ingest.emulator.workload import WorkloadMix
from ingest.errors import ConfigError
from pipelines.silver.columns import FieldLayout, build_layout
from pipelines.spark_source import GoldSink, SalesforceSource
from tests.integration.gold.test_oracle import check_gold, expected_row
from tests.spark_source.conftest import ACCOUNT, ROOT, Driver, Org

pytestmark = [pytest.mark.integration, pytest.mark.spark_source]

# Account only (the query reads one object's topic); no gap or overflow events, which leave a
# record to a re-sync; more deletes, undeletes and wildcards than a real org sends.
MIX = WorkloadMix(
    entity_weights={"Account": 1.0},
    platform_event=0.0,
    lead_conversion=0.0,
    gap=0.0,
    overflow=0.0,
    delete=6.0,
    undelete=4.0,
    wildcard=1.5,
)
GOLD_APP = "sfcdc.gold:Account"


def write_conf(root: Path, org: Org) -> Path:
    """A conf/ for the emulator (external, no TLS), Account, and a lake under ``root``."""
    conf = root / "conf"
    (conf / "objects").mkdir(parents=True)
    (conf / "pipeline.yml").write_text(
        textwrap.dedent(
            f"""\
            connection:
              emulator:
                mode: external
                grpc_port: {org.emulator.grpc_port}
                http_port: {org.emulator.http_port}
                tls: {{enabled: false}}
            lake: {{engine: spark, location: {root / "lake"}}}
            defaults:
              replay: {{start: earliest, on_corrupted: fail}}
            """
        )
    )
    (conf / "objects" / "account.yml").write_text("object: Account\nkind: change_events\n")
    return conf


def fields(org: Org) -> tuple[FieldLayout, ...]:
    schema = org.emulator.catalogue.topic_for_entity("Account").current_schema
    assert schema is not None
    return build_layout("Account", [schema]).fields


def rows(path: Path) -> list[dict[str, Any]]:
    if not DeltaTable.is_deltatable(str(path)):
        return []
    out: list[dict[str, Any]] = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return out


def gold_mismatches(org: Org, lake: Path) -> list[str]:
    """How gold differs from the ground truth (empty: equal, every record, every column)."""
    gold = {r["Id"]: r for r in rows(lake / "gold" / "account")}
    truth = org.workload.truth
    records = truth.records("Account")
    deleted = truth.deleted("Account")
    problems = [f"{r}: not in gold" for r in sorted(set(records) - set(gold))]
    problems += [f"{r}: unknown to the truth" for r in sorted(set(gold) - set(records))]
    layout = fields(org)
    for record_id, record in records.items():
        got = gold.get(record_id)
        if got is None:
            continue
        if got["_cdc_is_deleted"] != (record_id in deleted):
            problems.append(f"{record_id}: deleted is {got['_cdc_is_deleted']}")
        if got["_cdc_needs_resync"]:
            problems.append(f"{record_id}: flagged for re-sync ({got['_cdc_resync_reason']})")
        for column, value in expected_row(layout, record).items():
            if column not in got:
                problems.append(f"{record_id}.{column}: not a column of gold")
            elif got[column] != value:
                problems.append(f"{record_id}.{column}: want {value!r}, got {got[column]!r}")
    return problems


def assert_gold_equals_truth(org: Org, lake: Path) -> None:
    problems = gold_mismatches(org, lake)
    assert not problems, f"{len(problems)} differences, e.g. {problems[:5]}"


def assert_workload_covered(org: Org) -> None:
    """The workload exercised what the sink must get right."""
    log = [g for g in org.workload.log if g.entity == "Account"]
    kinds = {g.change_type for g in log}
    assert {"CREATE", "UPDATE", "DELETE", "UNDELETE"} <= kinds, kinds
    assert any(g.nulled for g in log if g.change_type == "UPDATE")
    assert any(g.diffed for g in log)
    assert any(g.record_ids == ("001*",) for g in log)


def assert_silver_holds_every_change_once(org: Org, lake: Path) -> list[dict[str, Any]]:
    silver = rows(lake / "silver" / "account")
    got = Counter((r["_cdc_event_id"], r["Id"]) for r in silver)
    assert [k for k, n in got.items() if n > 1] == [], "no change is appended twice"
    published = {e.event_id for e in org.emulator.log(ACCOUNT)}
    assert {r["_cdc_event_id"] for r in silver} == published
    # Each event has one place in the stream, and no two events share one.
    places = {
        (r["_cdc_bronze_batch_id"], r["_cdc_bronze_batch_seq"]): r["_cdc_event_id"] for r in silver
    }
    assert len(places) == len(published)
    return silver


def silver_batch(spark: SparkSession, org: Org, **options: str) -> DataFrame:
    """A batch read of Account's topic decoded to silver (until it is quiet for 1 s)."""
    spark.dataSource.register(SalesforceSource)
    settings = org.options(decode="silver", batchIdleSeconds="1", **options)
    return spark.read.format("salesforce").options(**settings).load()


def wait(done: Any, check: Any, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        check()
        assert time.monotonic() < deadline, "gold did not reach the ground truth in time"
        time.sleep(1.0)


@pytest.fixture(
    params=[
        pytest.param("spark", marks=pytest.mark.spark),
        pytest.param("spark_connect", marks=[pytest.mark.spark, pytest.mark.spark_connect]),
    ]
)
def session(request: pytest.FixtureRequest) -> SparkSession:
    """The shared classic session, or a Spark Connect session of its own Connect service (the
    test then runs as a Spark Connect process does)."""
    found: SparkSession = request.getfixturevalue(request.param)
    return found


def is_remote(session: SparkSession) -> bool:
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    return isinstance(session, RemoteSession)


def docs_example() -> str:
    docs = (ROOT / "docs" / "spark-source.md").read_text()
    section = docs[docs.index("### Gold in a Structured Streaming job") :]
    match = re.search(r"```py\n(.*?)```", section, re.S)
    assert match is not None, "the section shows its example in a ```py block"
    return match.group(1)


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_the_docs_example_builds_gold_equal_to_the_ground_truth(
    spark: SparkSession, org: Org, tmp_path: Path
) -> None:
    org.workload.mix = MIX
    org.publish(200)
    conf = write_conf(tmp_path, org)
    code = (
        docs_example()
        .replace('"conf/pipeline.yml"', repr(str(conf / "pipeline.yml")))
        .replace('conf_dir="conf"', f"conf_dir={str(conf)!r}")
        .replace("/tmp/sfcdc-gold", str(tmp_path))
    )
    scope: dict[str, Any] = {"spark": spark}
    exec(compile(code, "docs/spark-source.md", "exec"), scope)
    query = scope["query"]
    lake = tmp_path / "lake"

    def running() -> None:
        assert query.exception() is None, query.exception()

    try:
        wait(lambda: not gold_mismatches(org, lake), running)
        # Changes arrive while the query runs: several micro-batches, each folded onto the
        # gold rows the earlier ones left.
        for _ in range(3):
            for _ in range(3):
                org.publish(40)
                time.sleep(0.7)
            wait(lambda: not gold_mismatches(org, lake), running)
    finally:
        query.stop()
    assert_gold_equals_truth(org, lake)
    assert_workload_covered(org)
    silver = assert_silver_holds_every_change_once(org, lake)
    assert len({r["_cdc_bronze_batch_id"] for r in silver}) >= 4, "several micro-batches"
    assert len(org.workload.truth.records("Account")) >= 50


@pytest.mark.timeout(600)
def test_a_schema_change_mid_stream_reaches_gold_after_the_restart(
    session: SparkSession, org: Org, tmp_path: Path
) -> None:
    org.workload.mix = MIX
    org.publish(120)
    conf = write_conf(tmp_path, org)
    lake = tmp_path / "lake"
    session.dataSource.register(SalesforceSource)
    options = org.options(decode="silver", startingReplay="earliest")
    # Over Spark Connect the sink runs in a Python process of the server (pickled, with no
    # session of its own until its first micro-batch), where the query's id is not known.
    app_id = "schema-change" if is_remote(session) else None

    def start() -> StreamingQuery:
        sink = GoldSink(session, conf_dir=conf, object="Account", app_id=app_id)
        return (
            session.readStream.format("salesforce")
            .options(**options)
            .load()
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    def running(query: StreamingQuery) -> Callable[[], None]:
        def check() -> None:
            assert query.exception() is None, query.exception()

        return check

    first = start()
    try:
        wait(lambda: not gold_mismatches(org, lake), running(first))
        assert "Tier__c" not in rows(lake / "gold" / "account")[0]
        org.workload.change_schema("Account")
        org.publish(120)
        with pytest.raises(StreamingQueryException, match="SchemaChangedError"):
            first.awaitTermination(120)
    finally:
        first.stop()
    second = start()
    try:
        # The restarted sink meets the new columns, adds them to silver and gold, and folds
        # both versions' changes.
        wait(lambda: not gold_mismatches(org, lake), running(second))
    finally:
        second.stop()
    gold = rows(lake / "gold" / "account")
    assert any(r["Tier__c"] is not None for r in gold), "the new field reached gold"
    silver = assert_silver_holds_every_change_once(org, lake)
    assert len({r["_cdc_schema_id"] for r in silver}) == 2


@dataclass
class GoldDriver(Driver):
    """:class:`Driver` running ``tests.spark_source.gold_driver`` (the gold sink)."""

    def start(self, options: dict[str, str] | None = None, **more: Any) -> subprocess.Popen[str]:
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYSPARK_PYTHON=sys.executable)
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / "driver.log").open("a") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.spark_source.gold_driver",
                    self.settings(options, **more),
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
            )
        self.runs.append(proc)
        return proc


def batch_ids(folder: Path) -> set[int]:
    return {int(p.name) for p in folder.iterdir() if p.name.isdigit()} if folder.exists() else set()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_batch_run_again_after_a_crash_between_silver_and_gold_is_appended_once(
    org: Org, tmp_path: Path
) -> None:
    org.workload.mix = MIX
    org.publish(200)
    conf = write_conf(tmp_path, org)
    lake = tmp_path / "lake"
    options = {
        "pipeline": str(conf / "pipeline.yml"),
        "topic": ACCOUNT,
        "decode": "silver",
        "maxEventsPerTrigger": "60",
    }
    driver = GoldDriver(tmp_path / "query", options)
    settings: dict[str, Any] = {"conf_dir": str(conf), "object": "Account", "timeout": 400}
    try:
        proc = driver.start(die_after_silver=1, **settings)
        driver.wait_started(proc)
        assert proc.stdout is not None
        lines = proc.stdout.read().splitlines()  # until the driver kills itself
        proc.wait(timeout=60)
        assert proc.returncode == -9, lines
        (killed,) = [int(line.split()[1]) for line in lines if line.startswith("SILVER ")]

        checkpoint = driver.root / "checkpoint"
        assert killed in batch_ids(checkpoint / "offsets") - batch_ids(checkpoint / "commits")
        query_id = json.loads((checkpoint / "metadata").read_text())["id"]
        app = f"sfcdc.spark_source:{query_id}"
        silver = DeltaTable(str(lake / "silver" / "account"))
        assert silver.transaction_version(app) == killed
        gold_path = str(lake / "gold" / "account")
        if DeltaTable.is_deltatable(gold_path):
            reached = DeltaTable(gold_path).transaction_version(GOLD_APP)
            assert reached is None or reached < silver.version(), "the batch never reached gold"
        first = Counter(r["_cdc_bronze_batch_id"] for r in rows(lake / "silver" / "account"))
        assert killed in first and max(first) == killed and len(first) >= 2

        org.publish(100)
        again = driver.start(**settings)
        driver.wait_started(again)
        driver.wait_for(again, lambda: not gold_mismatches(org, lake), timeout=300)
        driver.kill(again)
    finally:
        driver.close()
    assert killed in batch_ids(checkpoint / "commits"), "Spark ran the batch again"
    assert_gold_equals_truth(org, lake)
    assert_workload_covered(org)
    silver_rows = assert_silver_holds_every_change_once(org, lake)
    after = Counter(r["_cdc_bronze_batch_id"] for r in silver_rows)
    assert after[killed] == first[killed], "the batch run again was not appended again"
    assert (DeltaTable(str(lake / "silver" / "account")).transaction_version(app) or 0) > killed


@pytest.mark.timeout(600)
def test_a_batch_handed_to_the_sink_twice_changes_nothing_the_second_time(
    session: SparkSession, org: Org, tmp_path: Path
) -> None:
    org.workload.mix = MIX
    org.publish(150)
    conf = write_conf(tmp_path, org)
    lake = tmp_path / "lake"
    batch = silver_batch(session, org)
    outside = GoldSink(session, conf_dir=conf, object="Account")
    with pytest.raises(ConfigError, match="app_id="):
        outside.append_silver(batch, 0)

    sink = GoldSink(session, conf_dir=conf, object="Account", app_id="handed-twice")
    first = sink(batch, 7)
    silver_version = DeltaTable(str(lake / "silver" / "account")).version()
    gold_version = DeltaTable(str(lake / "gold" / "account")).version()
    second = sink(batch, 7)

    assert first.rows == first.silver.rows > 0 and not first.silver.skipped
    assert first.gold is not None and not first.gold.skipped
    assert first.gold.changes == first.silver.rows
    assert second.rows == first.rows
    assert second.silver.skipped and second.silver.rows == 0
    assert second.gold is not None and second.gold.skipped
    assert DeltaTable(str(lake / "silver" / "account")).version() == silver_version
    assert DeltaTable(str(lake / "gold" / "account")).version() == gold_version
    assert_gold_equals_truth(org, lake)
    silver = assert_silver_holds_every_change_once(org, lake)
    assert {r["_cdc_bronze_batch_id"] for r in silver} == {7}


@pytest.mark.timeout(600)
def test_gap_and_overflow_events_flag_exactly_the_records_they_touch_for_resync(
    session: SparkSession, org: Org, tmp_path: Path
) -> None:
    # Gap events (a change Salesforce could not capture in full) and overflows (too many
    # changes in one transaction) often: gold cannot know those records' values.
    org.workload.mix = replace(MIX, gap=3.0, overflow=0.5)
    org.publish(300)
    log = [g for g in org.workload.log if g.entity == "Account"]
    assert any(g.change_type.startswith("GAP_") and g.record_ids for g in log)
    assert any(g.change_type == "GAP_OVERFLOW" for g in log)
    conf = write_conf(tmp_path, org)
    lake = tmp_path / "lake"
    batch = silver_batch(session, org)
    result = GoldSink(session, conf_dir=conf, object="Account", app_id="gaps")(batch, 0)

    assert result.gold is not None and result.gold.resync_rows > 0
    summary = check_gold(
        "Account",
        fields(org),
        rows(lake / "gold" / "account"),
        org.workload.truth,
        rows(lake / "gold" / "sfcdc_resync"),
    )
    print(summary)
    assert "flagged for re-sync by gaps" in summary


@pytest.mark.timeout(600)
@pytest.mark.parametrize("policy", ["earliest", "latest"])
def test_a_replay_gap_becomes_one_whole_object_resync_row(
    session: SparkSession, org: Org, tmp_path: Path, policy: str
) -> None:
    org.workload.mix = MIX
    org.publish(120)
    logged = org.emulator.log(ACCOUNT)
    gone = logged[2].replay_id
    org.emulator.faults.purge(through=logged[4].replay_id)
    retained = {e.event_id for e in org.emulator.log(ACCOUNT)}
    conf = write_conf(tmp_path, org)
    lake = tmp_path / "lake"
    batch = silver_batch(
        session, org, startingReplay=base64.b64encode(gone).decode(), onCorrupted=policy
    )
    sink = GoldSink(session, conf_dir=conf, object="Account", app_id="gap")
    first = sink(batch, 5)
    again = sink(batch, 5)

    assert first.replay_gaps == 1 and again.replay_gaps == 1
    assert first.quarantined == 0, "a replay gap is not an undecodable event"
    resync = [r for r in rows(lake / "gold" / "sfcdc_resync") if r["reason"] == "replay_gap"]
    assert len(resync) == 1, "the batch handed over again adds no second row"
    (gap,) = resync
    assert gap["object"] == "Account" and gap["record_id"] is None
    assert gap["resolved_at"] is None and gap["bronze_batch_id"] == 5
    assert f"after {gone.hex()}" in gap["detail"] and f"resumed at {policy}" in gap["detail"]
    # latest: the micro-batch holds the gap alone (nothing was published after subscribing).
    landed = {r["_cdc_event_id"] for r in rows(lake / "silver" / "account")}
    assert landed == (retained if policy == "earliest" else set())


@pytest.mark.timeout(600)
def test_events_of_a_schema_the_server_refuses_are_quarantined_once_and_the_rest_go_on(
    session: SparkSession, org: Org, tmp_path: Path
) -> None:
    org.workload.mix = MIX
    org.publish(80)
    old = org.emulator.catalogue.topic_for_entity("Account").current_schema
    assert old is not None
    org.workload.change_schema("Account")
    org.publish(80)
    # An old version the integration user may no longer read: the query's columns come from
    # the current schema, which the server still serves.
    org.emulator.faults.refuse_schema(old.schema_id, "schema.meta.permission")
    conf = write_conf(tmp_path, org)
    lake = tmp_path / "lake"
    batch = silver_batch(session, org)
    sink = GoldSink(session, conf_dir=conf, object="Account", app_id="refused")
    first = sink(batch, 3)
    again = sink(batch, 3)

    events = org.emulator.log(ACCOUNT)
    refused = {e.event_id: e.replay_id for e in events if e.schema_id == old.schema_id}
    served = {e.event_id for e in events if e.schema_id != old.schema_id}
    assert refused and served
    quarantine = rows(lake / "silver" / "sfcdc_quarantine")
    assert {r["event_id"]: r["replay_id"] for r in quarantine} == refused
    assert len(quarantine) == len(refused), "each refused event is quarantined once"
    for row in quarantine:
        assert row["schema_id"] == old.schema_id
        assert row["reason_kind"] == "schema_unavailable"
        assert "schema.meta.permission" in row["reason"] and old.schema_id in row["reason"]
        assert row["bronze_table"] == "spark_source:refused" and row["payload"]
    assert first.quarantined == len(refused) and again.quarantined == 0
    silver = rows(lake / "silver" / "account")
    assert {r["_cdc_event_id"] for r in silver} == served
    assert first.gold is not None and first.gold.changes == len(silver)
    gold = rows(lake / "gold" / "account")
    # Every record a served change names is in gold (a wildcard update names none).
    assert {r["Id"] for r in gold} == {r["Id"] for r in silver} - {"001*"}


@pytest.mark.parametrize(
    ("name", "kind", "message"),
    [
        ("Contact", "change_events", "no object 'Contact'"),
        ("Order_Shipped__e", "platform_event", "platform event"),
    ],
)
def test_the_sink_names_a_configured_change_event_object(
    session: SparkSession, org: Org, tmp_path: Path, name: str, kind: str, message: str
) -> None:
    conf = write_conf(tmp_path, org)
    (conf / "objects" / "order.yml").write_text("object: Order_Shipped__e\nkind: platform_event\n")
    with pytest.raises(ConfigError, match=message):
        GoldSink(session, conf_dir=conf, object=name)
