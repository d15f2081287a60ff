"""Emulator -> bronze (the real landing, over a socket) -> silver, on real Delta tables.

One generated org feeds everything: every change type (gaps and overflows included),
multi-record and wildcard events, long text diffs, compound fields, dates, datetimes and
times, a schema change of Account mid-stream, platform events, and payloads corrupted in
bronze by hand. The generator's own log (what each event says) is the oracle; payloads are
decoded independently with fastavro for the values.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import textwrap
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.server import Emulator, EmulatorConfig
from ingest.emulator.workload import GeneratedChange, Workload, WorkloadMix
from pipelines.bronze.tables import BRONZE_SCHEMA
from pipelines.cli import main
from pipelines.commands.ingest import land
from pipelines.engines import LakeEngine, TableRef
from pipelines.session import engine_for
from pipelines.silver.job import QUARANTINE_TABLE, SilverResult, run_silver
from pipelines.spec import Conf, load_conf
from tests.conftest import engine_params
from tests.lake_helpers import rows_of

pytestmark = pytest.mark.integration

UTC = dt.timezone.utc
ACCOUNT_TOPIC = "/data/AccountChangeEvent"
CHANNEL = "/data/ChangeEvents"
ORDERS = "/event/Order_Shipped__e"
OBJECTS = {
    "account": "object: Account\nkind: change_events\n",
    "contact": (
        "object: Contact\nkind: change_events\ntopic: /data/ChangeEvents\n"
        "silver: {compound_fields: flattened}\n"
    ),
    "invoice": "object: Invoice__c\nkind: change_events\ntopic: /data/ChangeEvents\n",
    "order": "object: Order_Shipped__e\nkind: platform_event\n",
}
SILVER = {
    "Account": TableRef("silver", "account"),
    "Contact": TableRef("silver", "contact"),
    "Invoice__c": TableRef("silver", "invoice"),
    "Order_Shipped__e": TableRef("silver", "order_shipped"),
}
INJECTED_BATCH = 1_000_000
ALL_CHANGE_TYPES = {
    "CREATE",
    "UPDATE",
    "DELETE",
    "UNDELETE",
    "GAP_CREATE",
    "GAP_UPDATE",
    "GAP_DELETE",
    "GAP_UNDELETE",
    "GAP_OVERFLOW",
}


@dataclass
class Run:
    conf: Conf
    engine: LakeEngine
    emulator: Emulator
    workload: Workload
    first_cli_exit: int
    first_columns: list[str]
    second: SilverResult
    third: SilverResult
    versions_before_third: dict[str, int | None]
    injected: list[dict[str, Any]]


def write_conf(root: Path, emulator: Emulator, engine: str) -> Path:
    conf = root / "conf"
    (conf / "objects").mkdir(parents=True)
    (conf / "pipeline.yml").write_text(
        textwrap.dedent(
            f"""\
            connection:
              source: emulator
              emulator:
                mode: external
                host: 127.0.0.1
                grpc_port: {emulator.grpc_port}
                http_port: {emulator.http_port}
                tls: {{enabled: false}}
            lake:
              engine: {engine}
              location: {root / "lake"}
            defaults:
              replay: {{start: earliest, on_corrupted: fail}}
              batching: {{max_events: 400, max_bytes: 4MiB, max_age_seconds: 0.2}}
            ingest:
              num_requested: 100
              progress_interval_seconds: 5
              maintain_every_commits: 0
              retry: {{max_attempts: 20, initial_backoff_seconds: 0.02, max_backoff_seconds: 0.2}}
            """
        )
    )
    for name, text in OBJECTS.items():
        (conf / "objects" / f"{name}.yml").write_text(text)
    return conf


def inject_corrupt_rows(engine: LakeEngine, emulator: Emulator) -> list[dict[str, Any]]:
    """Rows no decoder accepts, appended to the Account bronze table by hand."""
    logged = list(emulator.log(ACCOUNT_TOPIC))
    first, last = logged[0], logged[-1]
    schema = emulator.catalogue.schema(last.schema_id)
    parsed = parse_schema(json.loads(schema.json))
    record = schemaless_reader(io.BytesIO(last.payload), parsed, None)
    record["ChangeEventHeader"]["changedFields"] = ["0x" + "FF" * 12]  # bits past the schema
    out = io.BytesIO()
    schemaless_writer(out, parsed, record)
    rows = [
        (first.schema_id, first.payload[: len(first.payload) // 2], "corrupt_payload"),
        (last.schema_id, out.getvalue(), "bad_bitmap"),
        ("AAAAAAAAAAAAAAAAAAAAAA", last.payload, "unknown_schema"),
        (last.schema_id, b"\x02" + b"\xff" * 40, "corrupt_payload"),
    ]
    n = len(rows)
    table = pa.table(
        {
            "replay_id": [b"\xee" * 10] * n,
            "event_id": [f"injected-{i}" for i in range(n)],
            "schema_id": [sid for sid, _, _ in rows],
            "payload": [p for _, p, _ in rows],
            "topic": [ACCOUNT_TOPIC] * n,
            "received_at": pa.array([dt.datetime.now(UTC)] * n, pa.timestamp("us", tz="UTC")),
            "batch_id": [INJECTED_BATCH] * n,
            "batch_seq": list(range(n)),
        },
        schema=BRONZE_SCHEMA,
    )
    engine.append(TableRef("bronze", "account_change_event"), table)
    return [
        {"event_id": f"injected-{i}", "payload": p, "reason_kind": k}
        for i, (_, p, k) in enumerate(rows)
    ]


@pytest.fixture(scope="module", params=engine_params())
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """The whole flow on one lake engine: landing, the ``silver`` command and the job all use
    the engine ``lake.engine`` names (the spark engine in the tests' shared session)."""
    name = str(request.param)
    if name == "spark":
        request.getfixturevalue("spark")  # the active session the commands find
    root = tmp_path_factory.mktemp(f"silver-{name}")
    catalogue = default_catalogue()
    workload = Workload(
        catalogue,
        seed=12,
        mix=WorkloadMix(
            gap=4, overflow=1.5, wildcard=2, undelete=4, mass_delete=2, platform_event=4
        ),
    )
    config = EmulatorConfig(keepalive_interval=0.2, idle_timeout=10.0)
    with Emulator(catalogue, config) as emulator:
        conf_dir = write_conf(root, emulator, name)
        conf = load_conf(conf_dir)
        emulator.append(workload.events(900))
        land(conf, once=True)
        # The command, in this process.
        first_cli_exit = main(["-q", "silver", "--conf", str(conf_dir)])
        engine = engine_for(conf.pipeline.lake)
        assert engine.name == name
        first_columns = engine.schema(SILVER["Account"]).names  # type: ignore[union-attr]

        # Account's schema changes mid-stream; later events use version 2.
        workload.change_schema("Account")
        emulator.append(workload.events(500))
        land(conf, once=True)
        injected = inject_corrupt_rows(engine, emulator)
        second = run_silver(engine, conf)
        tables = [*SILVER.values(), QUARANTINE_TABLE]
        before = {str(t): engine.version(t) for t in tables}
        third = run_silver(engine, conf)
        yield Run(
            conf,
            engine,
            emulator,
            workload,
            first_cli_exit,
            first_columns,
            second,
            third,
            before,
            injected,
        )


def silver_rows(run: Run, entity: str) -> list[dict[str, Any]]:
    return rows_of(run.engine, SILVER[entity])


def changes(run: Run, entity: str) -> list[GeneratedChange]:
    return [g for g in run.workload.log if g.entity == entity]


@pytest.mark.parametrize("entity", ["Account", "Contact", "Invoice__c"])
def test_one_row_per_event_and_record_id_as_emitted(run: Run, entity: str) -> None:
    expected = Counter()
    for g in changes(run, entity):
        ids = g.record_ids or (None,)
        for record_id in ids:
            expected[
                (
                    g.event_id,
                    record_id,
                    g.change_type,
                    g.changed,
                    g.nulled,
                    g.diffed,
                    len(g.record_ids),
                    bool(record_id and record_id.endswith("*")),
                    g.transaction_key,
                    g.sequence_number,
                )
            ] += 1
    rows = silver_rows(run, entity)
    got = Counter(
        (
            r["_cdc_event_id"],
            r["Id"],
            r["_cdc_change_type"],
            tuple(r["_cdc_changed_fields"]),
            tuple(r["_cdc_nulled_fields"]),
            tuple(r["_cdc_diff_fields"]),
            r["_cdc_record_count"],
            r["_cdc_is_wildcard"],
            r["_cdc_transaction_key"],
            r["_cdc_sequence_number"],
        )
        for r in rows
        if not r["_cdc_event_id"].startswith("injected-")
    )
    assert got == expected
    assert {r["_cdc_change_type"] for r in rows} == ALL_CHANGE_TYPES
    assert any(r["_cdc_record_count"] > 1 for r in rows)
    assert all(r["_cdc_entity"] == entity for r in rows)


def _decoded(run: Run, topic: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """event id -> (schema id, record) decoded by fastavro with the event's own schema."""
    out = {}
    for e in run.emulator.log(topic):
        parsed = parse_schema(json.loads(run.emulator.catalogue.schema(e.schema_id).json))
        out[e.event_id] = (e.schema_id, schemaless_reader(io.BytesIO(e.payload), parsed, None))
    return out


def _ts(ms: int | None) -> dt.datetime | None:
    return (
        None if ms is None else dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(milliseconds=ms)
    )


def _date(ms: int | None) -> dt.date | None:
    return None if ms is None else dt.date(1970, 1, 1) + dt.timedelta(days=ms // 86_400_000)


def test_account_values_decode_with_each_events_own_schema(run: Run) -> None:
    decoded = _decoded(run, ACCOUNT_TOPIC)
    rows = [r for r in silver_rows(run, "Account") if r["_cdc_event_id"] in decoded]
    versions = Counter()
    for row in rows:
        sid, record = decoded[row["_cdc_event_id"]]
        versions[sid] += 1
        assert row["_cdc_schema_id"] == sid
        header = record["ChangeEventHeader"]
        assert row["_cdc_commit_number"] == header["commitNumber"]
        assert row["_cdc_commit_timestamp"] == _ts(header["commitTimestamp"])
        name = record["Name"]
        assert row["Name"] == (name if isinstance(name, str) else None)
        person = row["Name_PersonName"]
        if isinstance(name, dict):
            assert {k: person[k] for k in name} == name
        else:
            assert person is None
        address = record["BillingAddress"]
        assert (row["BillingAddress"] or {}).get("City") == (address or {}).get("City")
        assert row["HQ_Location__c"] == record["HQ_Location__c"]
        assert row["PersonBirthdate"] == _date(record["PersonBirthdate"])
        assert row["LastModifiedDate"] == _ts(record["LastModifiedDate"])
        assert row["Description"] == record["Description"]  # diffs are kept as sent
        assert row["AnnualRevenue"] == record["AnnualRevenue"]
        assert row["NumberOfEmployees"] == record["NumberOfEmployees"]
        assert row.get("Tier__c") == record.get("Tier__c")
        assert row.get("RecordTypeId") == record.get("RecordTypeId")
    assert len(versions) == 2  # events before and after the schema change


def test_schema_change_adds_columns(run: Run) -> None:
    assert run.first_cli_exit == 0
    assert "Tier__c" not in run.first_columns and "RecordTypeId" not in run.first_columns
    names = run.engine.schema(SILVER["Account"]).names  # type: ignore[union-attr]
    assert names[: len(run.first_columns)] == run.first_columns
    assert {"Tier__c", "RecordTypeId"} <= set(names[len(run.first_columns) :])
    rows = silver_rows(run, "Account")
    old_schema = run.workload.catalogue.topic(ACCOUNT_TOPIC).schemas[0].schema_id
    assert all(r["Tier__c"] is None for r in rows if r["_cdc_schema_id"] == old_schema)
    assert any(r["Tier__c"] is not None for r in rows if r["_cdc_schema_id"] != old_schema)


def test_invoice_dates_times_and_compounds(run: Run) -> None:
    decoded = _decoded(run, "/data/Invoice__ChangeEvent")
    rows = silver_rows(run, "Invoice__c")
    assert rows
    for row in rows:
        _, record = decoded[row["_cdc_event_id"]]
        assert row["Issue_Date__c"] == _date(record["Issue_Date__c"])
        assert row["Paid_At__c"] == _ts(record["Paid_At__c"])
        window = record["Delivery_Window__c"]
        if window is None:
            assert row["Delivery_Window__c"] is None
        else:
            h, rest = divmod(window, 3_600_000)
            m, rest = divmod(rest, 60_000)
            s, ms = divmod(rest, 1000)
            assert row["Delivery_Window__c"] == f"{h:02d}:{m:02d}:{s:02d}.{ms:03d}"
        assert row["Ship_To__c"] == record["Ship_To__c"]
        assert (row["Amount__c"], row["Line_Count__c"], row["Is_Paid__c"]) == (
            record["Amount__c"],
            record["Line_Count__c"],
            record["Is_Paid__c"],
        )


def test_contact_compounds_flattened(run: Run) -> None:
    decoded = _decoded(run, "/data/ContactChangeEvent")
    rows = silver_rows(run, "Contact")
    assert "MailingAddress" not in rows[0] and "Name" not in rows[0]
    for row in rows:
        _, record = decoded[row["_cdc_event_id"]]
        name = record["Name"] or {}
        assert row["Name_LastName"] == name.get("LastName")
        assert row["MailingAddress_City"] == (record["MailingAddress"] or {}).get("City")
        assert row["Birthdate"] == _date(record["Birthdate"])


def test_platform_events(run: Run) -> None:
    logged = {e.event_id: e for e in run.emulator.log(ORDERS)}
    decoded = _decoded(run, ORDERS)
    rows = silver_rows(run, "Order_Shipped__e")
    assert sorted(r["_cdc_event_id"] for r in rows) == sorted(logged)
    for row in rows:
        _, record = decoded[row["_cdc_event_id"]]
        assert row["CreatedDate"] == _ts(record["CreatedDate"])
        assert row["Delivery_Date__c"] == _date(record["Delivery_Date__c"])
        assert row["_cdc_replay_id"] == logged[row["_cdc_event_id"]].replay_id


def test_corrupt_rows_reach_quarantine_while_the_rest_lands(run: Run) -> None:
    rows = rows_of(run.engine, QUARANTINE_TABLE)
    assert sorted((r["event_id"], r["reason_kind"]) for r in rows) == sorted(
        (i["event_id"], i["reason_kind"]) for i in run.injected
    )
    by_id = {r["event_id"]: r for r in rows}
    for injected in run.injected:
        row = by_id[injected["event_id"]]
        assert row["payload"] == injected["payload"]
        assert (row["bronze_table"], row["topic"]) == ("account_change_event", ACCOUNT_TOPIC)
        assert row["bronze_batch_id"] == INJECTED_BATCH and row["reason"]
    assert "not in bronze.sfcdc_schemas" in by_id["injected-2"]["reason"]
    assert "past the last field" in by_id["injected-1"]["reason"]
    # Every emitted Account event is in silver.
    events = {r["_cdc_event_id"] for r in silver_rows(run, "Account")}
    assert events == {e.event_id for e in run.emulator.log(ACCOUNT_TOPIC)}
    assert run.second.quarantined == len(run.injected)


def test_channel_rows_of_other_objects_are_counted_not_decoded(run: Run) -> None:
    (channel,) = [t for t in run.second.topics if t.topic == CHANNEL]
    assert set(channel.other_entities) == {"Account", "Opportunity"}
    assert {o.object for o in channel.objects} == {"Contact", "Invoice__c"}


def test_running_again_changes_nothing(run: Run) -> None:
    after = {str(t): run.engine.version(t) for t in [*SILVER.values(), QUARANTINE_TABLE]}
    assert after == run.versions_before_third
    assert all(o.up_to_date for o in run.third.objects)
    assert run.third.rows == 0 and run.third.quarantined == 0
