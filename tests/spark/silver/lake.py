"""Bronze, registry and silver tables for the silver job tests, written and read through
whichever lake engine the test runs on."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa

from ingest.schema import EventSchema
from pipelines.bronze.tables import SCHEMA_REGISTRY_SCHEMA, bronze_app_id
from pipelines.engines import LakeEngine, TableRef, Txn
from pipelines.silver.job import QUARANTINE_TABLE, REGISTRY_TABLE, SilverResult
from pipelines.spec import Conf, ObjectSpec, PipelineSpec
from tests.lake_helpers import rows_of
from tests.unit.silver.support import (
    ACCOUNT_V1,
    CONTACT,
    HEADER,
    bronze_batch,
    change_event,
    change_schema,
    opt,
)

UTC = timezone.utc
DAY = 86_400_000
ACCOUNT_TOPIC = "/data/AccountChangeEvent"
CHANNEL = "/data/ChangeEvents"
OPPORTUNITY = change_schema(
    "Opportunity",
    [
        {"name": "ChangeEventHeader", "type": HEADER, "doc": "Data:ComplexValueType"},
        opt("StageName", "string", "Data:DynamicEnum"),
    ],
)
ACCOUNT = ObjectSpec(api_name="Account", kind="change_events")
ACCOUNT_SILVER = TableRef("silver", "account")


def conf_of(*objects: ObjectSpec) -> Conf:
    return Conf(pipeline=PipelineSpec(), objects=objects, conf_dir=Path("conf"))


def table_dir(lake: Path, table: TableRef) -> Path:
    """Where either engine keeps ``table`` of the lake at ``lake`` (no prefix)."""
    return lake / table.layer / table.name


def register(engine: LakeEngine, *schemas: EventSchema, topic: str = ACCOUNT_TOPIC) -> None:
    """Registry rows, as landing writes them before the events that use them."""
    now = datetime.now(UTC)
    engine.append(
        REGISTRY_TABLE,
        pa.table(
            {
                "schema_id": [s.schema_id for s in schemas],
                "schema_json": [s.json for s in schemas],
                "topic": [topic] * len(schemas),
                "first_seen_at": pa.array([now] * len(schemas), pa.timestamp("us", tz="UTC")),
            },
            schema=SCHEMA_REGISTRY_SCHEMA,
        ),
    )


def land(
    engine: LakeEngine, obj: ObjectSpec, events: list[tuple[str, bytes]], batch_id: int
) -> int:
    """One bronze landing commit (txn = batch id, as landing does); returns its version."""
    table = bronze_batch(events, batch_id=batch_id, topic=obj.topic)
    result = engine.append(
        TableRef("bronze", obj.tables.bronze), table, txn=Txn(bronze_app_id(obj.topic), batch_id)
    )
    assert result.version is not None
    return result.version


def silver(engine: LakeEngine, obj: ObjectSpec) -> list[dict[str, Any]]:
    """The object's silver rows in bronze order (then by Id)."""
    return sorted(
        rows_of(engine, TableRef("silver", obj.tables.silver)),
        key=lambda r: (r["_cdc_bronze_batch_id"], r["_cdc_bronze_batch_seq"], r.get("Id") or ""),
    )


def quarantine(engine: LakeEngine) -> list[dict[str, Any]]:
    """The quarantine's rows in bronze order."""
    return sorted(
        rows_of(engine, QUARANTINE_TABLE),
        key=lambda r: (r["bronze_batch_id"], r["bronze_batch_seq"]),
    )


def versions(engine: LakeEngine, *tables: TableRef) -> list[int | None]:
    return [engine.version(t) for t in tables]


def outcome(engine: LakeEngine, result: SilverResult, obj: ObjectSpec = ACCOUNT) -> tuple[Any, ...]:
    """What a silver run left: its counts, the silver rows and the quarantine rows (without
    their timestamps), for comparing runs."""
    return (
        result.rows,
        result.quarantined,
        silver(engine, obj),
        [{k: v for k, v in r.items() if k != "quarantined_at"} for r in quarantine(engine)],
    )


def account_batch_0() -> list[tuple[str, bytes]]:
    """Every kind of Account event, and a row for each quarantine reason."""
    s = ACCOUNT_V1
    sid = s.schema_id
    return [
        (sid, change_event(s, "CREATE", ["001A"], {"Name": "Acme", "SLA_Date__c": 20_089 * DAY})),
        (
            sid,
            change_event(
                s,
                "CREATE",
                ["001B"],
                {"Name": {"FirstName": "Ada", "LastName": "Lovelace"}, "Open_At__c": 9 * 3_600_000},
            ),
        ),
        (
            sid,
            change_event(
                s,
                "UPDATE",
                ["001A"],
                {"BillingAddress": {"City": "Paris"}, "Phone": "+33 1", "LastModifiedDate": 1},
                changed=["BillingAddress.City", "Phone", "Description", "LastModifiedDate"],
                nulled=["Description"],
                sequence=2,
            ),
        ),
        (sid, change_event(s, "DELETE", ["001C", "001D", "001E"])),
        (sid, change_event(s, "UPDATE", ["001*"], changed=["IsActive__c"], nulled=["IsActive__c"])),
        (sid, change_event(s, "GAP_OVERFLOW", [])),
        (sid, change_event(s, "UNDELETE", ["001C"], {"Name": "Back"})),
        (sid, change_event(s, "GAP_UPDATE", ["001A"])),
        (sid, change_event(s, "CREATE", ["001F"])[:-4]),  # truncated
        ("not-registered", change_event(s, "CREATE", ["001G"])),
        (CONTACT.schema_id, change_event(CONTACT, "CREATE", ["003A"], {"LastName": "X"})),
    ]
