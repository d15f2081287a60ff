"""Parts of the silver job that need no Spark: chunk planning, the registry, object
selection, layouts per object, and the command's summary."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest

from ingest.errors import ConfigError
from pipelines.bronze.tables import SCHEMA_REGISTRY_SCHEMA
from pipelines.chunking import plan_chunks, version_sizes
from pipelines.commands.silver import summary
from pipelines.engines import HistoryEntry, LocalEngine, TableRef
from pipelines.silver.job import (
    QUARANTINE_TABLE,
    REGISTRY_TABLE,
    ObjectResult,
    SilverResult,
    TopicResult,
    read_registry,
    run_silver,
    silver_layout,
)
from pipelines.spec import Conf, ObjectSpec, PipelineSpec, TablesSpec
from tests.unit.silver.support import (
    ACCOUNT_V1,
    ACCOUNT_V2,
    ORDER_SHIPPED,
    bronze_batch,
    change_event,
)

UTC = timezone.utc
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def entry(version: int, rows: int | None, key: str = "num_added_rows") -> HistoryEntry:
    metrics = {} if rows is None else {key: rows}
    return HistoryEntry(version=version, timestamp=T0, operation="WRITE", metrics=metrics)


def test_plan_chunks_bounds_rows_and_bytes_per_step_without_splitting_a_version() -> None:
    history = [entry(0, 100), entry(1, 100), entry(2, 250), entry(3, 50), entry(4, None)]
    sizes = version_sizes(history)
    assert plan_chunks(sizes, None, 4, max_rows=200, max_bytes=10**9) == [1, 2, 4]
    assert plan_chunks(sizes, 1, 4, max_rows=1_000, max_bytes=10**9) == [4]
    assert plan_chunks(sizes, 4, 4, max_rows=200, max_bytes=10**9) == []
    # Delta Spark's metric name, as DESCRIBE HISTORY shows it.
    spark_sizes = version_sizes([entry(5, 300, "numOutputRows"), entry(6, 300, "numOutputRows")])
    assert plan_chunks(spark_sizes, 4, 6, max_rows=400, max_bytes=10**9) == [5, 6]
    # Versions the history no longer shows count as empty.
    assert plan_chunks({}, 9, 12, max_rows=10, max_bytes=10) == [12]
    # Landing's checkpoints give the payload bytes; the byte bound cuts before the row bound.
    checkpoints = [
        {"bronze_version": 0, "event_count": 100, "payload_bytes": 600},
        {"bronze_version": 1, "event_count": 100, "payload_bytes": 600},
        {"bronze_version": 2, "event_count": 250, "payload_bytes": 100},
        {"bronze_version": None, "event_count": 0, "payload_bytes": 0},  # a keepalive
    ]
    sizes = version_sizes(history, checkpoints)
    assert sizes[1] == (100, 600) and sizes[4] == (0, 0)
    assert plan_chunks(sizes, None, 4, max_rows=10**6, max_bytes=1_000) == [0, 4]


def register_rows(engine: LocalEngine, rows: list[tuple[str, str, datetime]]) -> None:
    engine.append(
        REGISTRY_TABLE,
        pa.table(
            {
                "schema_id": [r[0] for r in rows],
                "schema_json": [r[1] for r in rows],
                "topic": ["/data/AccountChangeEvent"] * len(rows),
                "first_seen_at": pa.array([r[2] for r in rows], pa.timestamp("us", tz="UTC")),
            },
            schema=SCHEMA_REGISTRY_SCHEMA,
        ),
    )


def test_read_registry_orders_versions_and_reports_unusable_schemas(tmp_path: Path) -> None:
    engine = LocalEngine(None, location=tmp_path)
    assert read_registry(engine) == {}
    later = T0 + timedelta(hours=1)
    register_rows(
        engine,
        [
            (ACCOUNT_V2.schema_id, ACCOUNT_V2.json, later),
            (ACCOUNT_V1.schema_id, ACCOUNT_V1.json, T0),
            (ACCOUNT_V1.schema_id, ACCOUNT_V1.json, later),  # registered again after a crash
            ("broken", "{not json", T0),
        ],
    )
    registry = read_registry(engine)
    # Oldest first (ties by id): the order of the object's schema versions.
    assert list(registry) == [ACCOUNT_V1.schema_id, "broken", ACCOUNT_V2.schema_id]
    assert registry[ACCOUNT_V1.schema_id].first_seen_at == T0
    assert registry["broken"].schema is None
    assert "schema broken in bronze.sfcdc_schemas is not a valid event schema" in str(
        registry["broken"].problem
    )
    account = ObjectSpec(api_name="Account", kind="change_events")
    layout = silver_layout(account, registry)
    assert layout.schema_ids == (ACCOUNT_V1.schema_id, ACCOUNT_V2.schema_id)
    # An object with no schema yet has the metadata columns only.
    empty = silver_layout(ObjectSpec(api_name="Lead", kind="change_events"), registry)
    assert empty.fields == () and empty.silver_schema().names[0] == "Id"


def test_an_object_whose_schemas_are_of_the_other_kind_is_a_config_error(tmp_path: Path) -> None:
    engine = LocalEngine(None, location=tmp_path)
    register_rows(engine, [(ORDER_SHIPPED.schema_id, ORDER_SHIPPED.json, T0)])
    wrong = ObjectSpec(
        api_name="Order_Shipped__e", kind="change_events", topic="/data/ChangeEvents"
    )
    with pytest.raises(ConfigError, match="configured as kind change_events, but its schemas"):
        silver_layout(wrong, read_registry(engine))


def conf_of(*objects: ObjectSpec) -> Conf:
    return Conf(pipeline=PipelineSpec(), objects=objects, conf_dir=Path("conf"))


def test_objects_are_checked_before_anything_runs(tmp_path: Path) -> None:
    engine = LocalEngine(None, location=tmp_path)
    conf = conf_of(
        ObjectSpec(api_name="Account", kind="change_events"),
        ObjectSpec(api_name="Lead", kind="change_events", enabled=False),
    )
    with pytest.raises(ConfigError) as info:
        run_silver(engine, conf, objects=["Acount", "Lead"])
    assert info.value.problems == [
        "--objects: no object 'Acount' in conf (configured: Account, Lead)",
        "--objects: Lead is disabled (enabled: false in its file)",
    ]
    reserved = conf_of(
        ObjectSpec(
            api_name="Account", kind="change_events", tables=TablesSpec(silver="sfcdc_quarantine")
        )
    )
    with pytest.raises(ConfigError, match="'sfcdc_quarantine' is reserved for the quarantine"):
        run_silver(engine, reserved)


def test_tables_created_during_the_run_come_before_any_write(tmp_path: Path) -> None:
    """The bookkeeping and silver tables are created while the run reads and decodes; the
    first write waits for them, so a table that cannot be created stops the run before any
    write, as when they were created first, and a run that can create them lands its rows."""
    engine = LocalEngine(None, location=tmp_path)
    register_rows(engine, [(ACCOUNT_V1.schema_id, ACCOUNT_V1.json, T0)])
    payloads = [
        (ACCOUNT_V1.schema_id, change_event(ACCOUNT_V1, "CREATE", [f"001{n:015d}"], {"Name": "A"}))
        for n in range(3)
    ]
    bronze = TableRef("bronze", "account_change_event")
    engine.append(bronze, bronze_batch(payloads))
    conf = conf_of(ObjectSpec(api_name="Account", kind="change_events"))
    # A file where the quarantine table's directory goes: its creation fails.
    blocked = Path(engine.path(QUARANTINE_TABLE))
    blocked.parent.mkdir(parents=True, exist_ok=True)
    blocked.write_text("not a table")
    with pytest.raises(OSError, match="sfcdc_quarantine"):
        run_silver(engine, conf)
    silver = TableRef("silver", "account")
    assert engine.version(silver) is None or engine.read_arrow(silver).num_rows == 0
    assert engine.txn_version(silver, "sfcdc.silver:Account") is None

    blocked.unlink()
    result = run_silver(engine, conf)
    assert [(o.events, o.rows) for o in result.objects] == [(3, 3)]
    assert engine.read_arrow(silver, columns=["Id"]).column(0).to_pylist() == [
        f"001{n:015d}" for n in range(3)
    ]
    assert engine.read_arrow(QUARANTINE_TABLE).num_rows == 0


def test_summary_lines() -> None:
    bronze = TableRef("bronze", "account_change_event")
    table = TableRef("silver", "account")
    result = SilverResult(
        (
            TopicResult(
                "/data/AccountChangeEvent",
                bronze,
                3,
                5,
                1200,
                2,
                (ObjectResult("Account", table, bronze, 3, 5, 1198, 1300, 2, 7, 1.5),),
            ),
            TopicResult(
                "/event/Order_Shipped__e",
                TableRef("bronze", "order_shipped__e"),
                9,
                9,
                0,
                0,
                (
                    ObjectResult(
                        "Order_Shipped__e",
                        TableRef("silver", "order_shipped"),
                        TableRef("bronze", "order_shipped__e"),
                        9,
                        9,
                    ),
                ),
            ),
        )
    )
    assert summary(result) == [
        "Account: 1198 events -> 1300 rows in silver.account (version 7, 2 commits), bronze "
        "bronze.account_change_event up to version 5",
        "Order_Shipped__e: up to date (silver.order_shipped has bronze bronze.order_shipped__e "
        "up to version 9)",
        "quarantined: 2 rows in silver.sfcdc_quarantine",
    ]
