"""refresh_from_rest without a JVM: the local engine writes real Delta tables through delta-rs,
the records come from the emulator's REST endpoint. Soft and hard deletes, records Salesforce
no longer has, and the re-sync rows a snapshot resolves."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from ingest.auth import ClientCredentials, Secret, TokenManager
from ingest.client import TlsSettings
from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.server import DEFAULT_CLIENT, Emulator, EmulatorConfig
from ingest.emulator.workload import Workload, WorkloadMix
from ingest.rest import RestClient
from pipelines.bootstrap import SNAPSHOT_CHANGE_TYPE, refresh_from_rest
from pipelines.bronze.checkpoint import CheckpointStore
from pipelines.bronze.tables import bronze_tables
from pipelines.engines import LocalEngine, TableRef
from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.gold.columns import gold_schema
from pipelines.gold.job import history_table, tombstone_table
from pipelines.gold.resync import RESYNC_SCHEMA, RESYNC_TABLE, resync_row
from pipelines.gold.scd2 import history_schema
from pipelines.silver.job import read_registry, silver_layout
from pipelines.spec import Conf, load_conf
from tests.integration.gold.test_oracle import expected_row

AT = datetime(2026, 6, 1, tzinfo=timezone.utc)
GONE = "001000000000GONEAA"
TOPIC = "/data/AccountChangeEvent"


@pytest.fixture(scope="module")
def org() -> Iterator[tuple[Emulator, Workload]]:
    catalogue = default_catalogue()
    with Emulator(catalogue, EmulatorConfig()) as emulator:
        mix = WorkloadMix(platform_event=0.0, entity_weights={"Account": 1.0})
        workload = Workload(catalogue, seed=11, mix=mix)
        emulator.append(list(workload.events(250)))
        emulator.rest.attach(workload.truth)
        emulator.rest.page_size = 30
        yield emulator, workload


def _conf(root: Path, deletes: str, extra: str = "") -> Conf:
    conf = root / "conf"
    (conf / "objects").mkdir(parents=True)
    (conf / "pipeline.yml").write_text(
        textwrap.dedent(
            f"""\
            connection: {{emulator: {{mode: external, grpc_port: 1, http_port: 2,
                                      tls: {{enabled: false}}}}}}
            lake: {{engine: local, location: {root / "lake"}}}
            """
        )
    )
    (conf / "objects" / "account.yml").write_text(
        f"object: Account\nkind: change_events\ngold: {{deletes: {deletes}{extra}}}\n"
    )
    return load_conf(conf)


def _rest(emulator: Emulator) -> RestClient:
    tokens = TokenManager(
        ClientCredentials(
            emulator.http_url,
            client_id=DEFAULT_CLIENT.client_id,
            client_secret=Secret(DEFAULT_CLIENT.client_secret),
        )
    )
    return RestClient(tokens, tls=TlsSettings(enabled=False))


def _lake(emulator: Emulator, conf: Conf) -> LocalEngine:
    """A lake whose registry holds Account's schema, whose gold table has a live row of a
    record Salesforce does not have, and whose re-sync table has open rows."""
    engine = LocalEngine.from_spec(conf.pipeline.lake, None)
    schema = emulator.catalogue.topic(TOPIC).current_schema
    assert schema is not None
    CheckpointStore(engine, bronze_tables(conf.topics())).register_schemas(
        TOPIC, {schema.schema_id: schema.json}
    )
    (obj,) = conf.objects
    layout = silver_layout(obj, read_registry(engine))
    gold = gold_schema(layout.silver_schema().fields[1:])
    row: dict[str, Any] = dict.fromkeys(gold.fieldNames())
    row.update(
        {
            "Id": GONE,
            "Phone": "+33 1",
            "_cdc_is_deleted": False,
            "_cdc_needs_resync": True,
            "_cdc_resync_reason": "gap",
            "_cdc_last_change_type": "GAP_UPDATE",
            "_cdc_order_key": "1abc",
            "_cdc_last_event_id": "evt-9",
        }
    )
    engine.append(
        TableRef("gold", "account"), pa.Table.from_pylist([row], schema=spark_schema_to_arrow(gold))
    )
    common: dict[str, Any] = {
        "object_name": "Account",
        "change_type": None,
        "commit_timestamp": None,
        "replay_id": None,
        "bronze_batch_id": 1,
        "detected_at": AT,
    }
    rows = [
        resync_row(record_id=GONE, reason="gap", detail="x", event_id="evt-9", **common),
        resync_row(record_id=None, reason="overflow", detail="y", event_id="evt-7", **common),
        {
            **resync_row(record_id=None, reason="gap", detail="z", event_id="e", **common),
            "object": "Contact",
        },
    ]
    engine.append(
        RESYNC_TABLE, pa.Table.from_pylist(rows, schema=spark_schema_to_arrow(RESYNC_SCHEMA))
    )
    return engine


def _values_match(
    engine: LocalEngine, conf: Conf, gold: dict[str, dict[str, Any]], workload: Workload
) -> None:
    (obj,) = conf.objects
    fields = silver_layout(obj, read_registry(engine)).fields
    for record_id, row in gold.items():
        if record_id == GONE:
            continue
        want = expected_row(fields, workload.truth.record("Account", record_id))
        assert {c: row[c] for c in want} == want, record_id
        assert row["_cdc_last_change_type"] == SNAPSHOT_CHANGE_TYPE
        assert row["_cdc_order_key"] == "" and not row["_cdc_needs_resync"]


def test_a_full_snapshot_with_soft_deletes(org: tuple[Emulator, Workload], tmp_path: Path) -> None:
    emulator, workload = org
    conf = _conf(tmp_path, "soft")
    engine = _lake(emulator, conf)
    with _rest(emulator) as rest:
        # Small chunks: several MERGEs, as for an object of millions of records.
        result = refresh_from_rest(
            engine,
            conf,
            conf.objects[0],
            rest=rest,
            mode="resync",
            ids=None,
            chunk_rows=40,
            now=lambda: AT,
        )
    truth = workload.truth
    assert result.full and result.read == len(truth.records("Account"))
    assert result.deleted_read == len(truth.deleted("Account")) > 0
    assert result.marked_deleted == 1 and result.resolved == 2
    assert result.merge is not None
    assert (result.merge.inserted, result.merge.updated) == (result.read, 1)
    gold = {r["Id"]: r for r in engine.read_arrow(TableRef("gold", "account")).to_pylist()}
    assert set(gold) == set(truth.records("Account")) | {GONE}
    gone = gold[GONE]
    # Not even in the recycle bin: deleted, values kept, the event applied last remembered.
    assert gone["_cdc_is_deleted"] and gone["_cdc_deleted_at"] == AT and gone["Phone"] == "+33 1"
    assert gone["_cdc_order_key"] == "1abc~snapshot" and gone["_cdc_last_event_id"] == "evt-9"
    assert {r for r, row in gold.items() if row["_cdc_is_deleted"]} == truth.deleted("Account") | {
        GONE
    }
    _values_match(engine, conf, gold, workload)
    resync = engine.read_arrow(RESYNC_TABLE).to_pylist()
    assert {(r["object"], r["resolved_at"] is not None) for r in resync} == {
        ("Account", True),
        ("Contact", False),
    }


def test_a_record_level_read_with_hard_deletes(
    org: tuple[Emulator, Workload], tmp_path: Path
) -> None:
    emulator, workload = org
    conf = _conf(tmp_path, "hard")
    engine = _lake(emulator, conf)
    truth = workload.truth
    live = sorted(truth.live("Account"))[:3]
    deleted = sorted(truth.deleted("Account"))[:2]
    with _rest(emulator) as rest:
        result = refresh_from_rest(
            engine,
            conf,
            conf.objects[0],
            rest=rest,
            mode="resync",
            ids=[*live, *deleted, GONE, live[0]],
            chunk_rows=2,
            now=lambda: AT,
        )
    assert not result.full and result.requested == 6 and result.read == 5
    assert result.deleted_read == 2 and result.marked_deleted == 1
    # Only the gap row of the record read is resolved; the whole-object row stays open.
    assert result.resolved == 1
    gold = {r["Id"]: r for r in engine.read_arrow(TableRef("gold", "account")).to_pylist()}
    assert set(gold) == set(live)
    _values_match(engine, conf, gold, workload)
    stones = engine.read_arrow(tombstone_table(conf.objects[0])).to_pylist()
    assert {r["Id"] for r in stones} == {*deleted, GONE}
    assert all(r["_cdc_is_deleted"] and r["_cdc_last_change_type"] == "SNAPSHOT" for r in stones)


def test_snapshots_start_scd2_versions_only_when_tracked_values_change(
    org: tuple[Emulator, Workload], tmp_path: Path
) -> None:
    emulator, workload = org
    conf = _conf(tmp_path, "soft", ", scd2: {enabled: true, track: [Phone]}")
    engine = _lake(emulator, conf)
    history = history_table(conf.objects[0])
    schema = history_schema([T.StructField("Phone", T.StringType())])
    engine.append(
        history,
        pa.Table.from_pylist(
            [
                {
                    "Id": GONE,
                    "Phone": "+33 1",
                    "_scd_valid_from": datetime(2026, 1, 1, tzinfo=timezone.utc),
                    "_scd_valid_to": None,
                    "_scd_is_current": True,
                    "_scd_is_deleted": False,
                    "_scd_change_type": "GAP_UPDATE",
                    "_scd_order_key": "1abc",
                    "_scd_event_id": "evt-9",
                }
            ],
            schema=spark_schema_to_arrow(schema),
        ),
    )
    for _ in range(2):  # the second snapshot finds nothing changed: no version
        with _rest(emulator) as rest:
            refresh_from_rest(
                engine, conf, conf.objects[0], rest=rest, mode="resync", ids=None, now=lambda: AT
            )
        rows = engine.read_arrow(history).to_pylist()
        truth = workload.truth
        assert len(rows) == len(truth.records("Account")) + 2
        versions = {(r["Id"], r["_scd_order_key"]): r for r in rows}
        closed = versions[(GONE, "1abc")]
        assert not closed["_scd_is_current"] and closed["_scd_valid_to"] == AT
        current = versions[(GONE, "1abc~snapshot")]
        assert current["_scd_is_current"] and current["_scd_is_deleted"]
        assert current["_scd_change_type"] == "SNAPSHOT" and current["_scd_valid_from"] == AT
        for record_id, values in truth.records("Account").items():
            version = versions[(record_id, "")]
            assert version["_scd_is_current"] and version["Phone"] == values["Phone"]
            assert version["_scd_is_deleted"] == (record_id in truth.deleted("Account"))
