"""``sfcdc silver --retry-quarantine``: decode quarantined rows whose schema can now be had.

Landing stores an event even when GetSchema refuses its schema id (``bronze.sfcdc_schema_failures``
records the refusal) and silver quarantines such rows as ``schema_unavailable`` (or
``unknown_schema``). Once the server serves the schema again, :func:`retry_quarantine`

1. fetches every schema id missing from the registry that open quarantine rows use, through
   the configured source (``fetch``), and registers the ones it gets in ``bronze.sfcdc_schemas``;
2. decodes the open quarantine rows whose schema is now registered with the same batch
   functions as the silver job (:class:`~pipelines.silver.decode.SilverRows`), for the object
   of each schema's entity on the row's topic;
3. appends the rows that decode to the object's silver table, leaving out any whose bronze
   coordinates (batch id, batch position) the table already holds, so a retry that ran before,
   or stopped between its two writes, never adds a row twice;
4. marks the quarantine rows it decoded as resolved (``resolved_at``, a MERGE on the bronze
   coordinates). They stay in the table, so what was quarantined and when it was resolved stays
   visible; ``WHERE resolved_at IS NULL`` selects what is still open.

Rows that still do not decode (a payload that does not match the schema after all) stay open
with their original reason. The re-decoded rows reach gold on its next run like any new silver
rows; gold applies a change only over an older one, so a late change of a record that gold has
since seen changed again is recorded as ignored, not applied over the newer state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc

from ingest.errors import PubSubError
from pipelines.bronze.tables import SCHEMA_REGISTRY_SCHEMA
from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.engines.base import LakeEngine, TableRef
from pipelines.silver.decode import DecodePlan, SilverRows
from pipelines.silver.quarantine import QUARANTINE_KEYS, QUARANTINE_SCHEMA, SilverPart
from pipelines.silver.registry import (
    REGISTRY_TABLE,
    RegistryEntry,
    object_schemas,
    read_registry,
    silver_layout,
)
from pipelines.silver.shape import shaped_struct
from pipelines.silver.tables import QUARANTINE_TABLE, silver_table
from pipelines.silver.topic_run import BRONZE_READ_SCHEMA, check_types
from pipelines.spec.conf import Conf
from pipelines.spec.models import ObjectSpec

__all__ = ["RETRIED_KINDS", "RetryResult", "retry_quarantine"]

_log = logging.getLogger(__name__)

# The reasons a later GetSchema can cure.
RETRIED_KINDS = ("schema_unavailable", "unknown_schema")
_QUARANTINE = spark_schema_to_arrow(QUARANTINE_SCHEMA)


@dataclass(frozen=True)
class RetryResult:
    """What a retry did: schemas fetched (and those the server still refuses, with its
    answer), rows appended to silver per object, quarantine rows resolved, rows still open."""

    fetched: tuple[str, ...]
    refused: Mapping[str, str]
    appended: Mapping[str, int]
    resolved: int
    still_open: int


def _open_rows(engine: LakeEngine) -> pa.Table:
    rows = engine.read_arrow(QUARANTINE_TABLE, where=[("reason_kind", "in", list(RETRIED_KINDS))])
    if "resolved_at" in rows.column_names:
        rows = rows.filter(pc.is_null(rows.column("resolved_at")))
    return rows


def _register(
    engine: LakeEngine, missing: Mapping[str, str], fetch: Callable[[str], str], now: datetime
) -> tuple[list[str], dict[str, str]]:
    """Fetch and register the ``missing`` schema ids (id -> topic): (fetched, refused)."""
    fetched: dict[str, tuple[str, str]] = {}
    refused: dict[str, str] = {}
    for sid, topic in sorted(missing.items()):
        try:
            fetched[sid] = (fetch(sid), topic)
        except (PubSubError, ValueError) as exc:
            refused[sid] = str(exc)
    if fetched:
        table = pa.Table.from_pylist(
            [
                {"schema_id": sid, "schema_json": text, "topic": topic, "first_seen_at": now}
                for sid, (text, topic) in fetched.items()
            ],
            schema=SCHEMA_REGISTRY_SCHEMA,
        )
        engine.append(REGISTRY_TABLE, table, metadata={"sfcdc.silver": "retry-quarantine"})
    return sorted(fetched), refused


def _held(engine: LakeEngine, table: TableRef, rows: pa.Table) -> set[tuple[int, int]]:
    """Bronze coordinates of ``rows`` that ``table`` already holds."""
    if not engine.exists(table) or rows.num_rows == 0:
        return set()
    batches = sorted(set(rows.column("bronze_batch_id").to_pylist()))
    existing = engine.read_arrow(
        table,
        columns=["_cdc_bronze_batch_id", "_cdc_bronze_batch_seq"],
        where=[("_cdc_bronze_batch_id", "in", batches)],
    )
    return set(
        zip(
            existing.column("_cdc_bronze_batch_id").to_pylist(),
            existing.column("_cdc_bronze_batch_seq").to_pylist(),
            strict=True,
        )
    )


def _decode(
    engine: LakeEngine, obj: ObjectSpec, rows: pa.Table, entries: Mapping[str, RegistryEntry]
) -> tuple[pa.Table, set[tuple[int, int]]]:
    """The silver rows of the quarantined ``rows`` that now decode, and the bronze coordinates
    of every row that decoded."""
    layout = silver_layout(obj, entries)
    table = silver_table(obj)
    check_types(engine, table, layout)
    ids = [s.schema_id for s in object_schemas(obj, entries)]
    bronze = pa.table(
        {
            "batch_id": rows.column("bronze_batch_id"),
            "batch_seq": rows.column("bronze_batch_seq"),
            "event_id": rows.column("event_id"),
            "replay_id": rows.column("replay_id"),
            "schema_id": rows.column("schema_id"),
            "payload": rows.column("payload"),
        }
    )
    plan = DecodePlan(
        layout=layout,
        schemas={sid: entries[sid].schema_json for sid in ids},
        registry=str(REGISTRY_TABLE),
    )
    decoded = engine.to_arrow(
        engine.map_batches(
            engine.rows(bronze, BRONZE_READ_SCHEMA), SilverRows(plan), shaped_struct(layout)
        )
    )
    schema = layout.silver_schema()
    ok = decoded.filter(pc.is_null(decoded.column("_cdc_error")))
    coordinates = set(
        zip(
            ok.column("_cdc_bronze_batch_id").to_pylist(),
            ok.column("_cdc_bronze_batch_seq").to_pylist(),
            strict=True,
        )
    )
    silver = engine.to_arrow(
        engine.map_batches(
            engine.rows(decoded, shaped_struct(layout)), SilverPart(schema.names), schema
        )
    )
    return silver, coordinates


def _objects_by_entity(conf: Conf, topic: str) -> dict[str, ObjectSpec]:
    return {o.api_name: o for o in conf.enabled_objects() if o.topic == topic}


def retry_quarantine(
    engine: LakeEngine,
    conf: Conf,
    *,
    fetch: Callable[[str], str],
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
) -> RetryResult:
    """Fetch the missing schemas with ``fetch`` (schema id -> JSON, e.g. a
    :class:`~ingest.client.SchemaCache` on the configured source), decode the quarantined rows
    that now can be, append them to silver once and mark them resolved (see the module
    notes)."""
    if not engine.exists(QUARANTINE_TABLE):
        return RetryResult((), {}, {}, 0, 0)
    stamp = now()
    open_rows = _open_rows(engine)
    registry = read_registry(engine)
    missing: dict[str, str] = {}
    for sid, topic in zip(
        open_rows.column("schema_id").to_pylist(),
        open_rows.column("topic").to_pylist(),
        strict=True,
    ):
        if sid and sid not in registry:
            missing.setdefault(sid, topic)
    fetched, refused = _register(engine, missing, fetch, stamp)
    if fetched:
        registry = read_registry(engine)
    appended: dict[str, int] = {}
    resolved_keys: set[tuple[str, int, int]] = set()
    for topic in sorted(set(open_rows.column("topic").to_pylist())):
        objects = _objects_by_entity(conf, topic)
        of_topic = open_rows.filter(pc.equal(open_rows.column("topic"), topic))
        by_object: dict[str, list[str]] = {}
        for sid in set(of_topic.column("schema_id").to_pylist()):
            entry = registry.get(sid) if sid else None
            if entry is None or entry.schema is None:
                continue
            if entry.schema.entity_name in objects:
                by_object.setdefault(entry.schema.entity_name, []).append(sid)
        for name, sids in sorted(by_object.items()):
            obj = objects[name]
            rows = of_topic.filter(pc.is_in(of_topic.column("schema_id"), pa.array(sids)))
            silver, decoded = _decode(engine, obj, rows, registry)
            table = silver_table(obj)
            held = _held(engine, table, rows)
            if held:
                keep = [
                    (b, s) not in held
                    for b, s in zip(
                        silver.column("_cdc_bronze_batch_id").to_pylist(),
                        silver.column("_cdc_bronze_batch_seq").to_pylist(),
                        strict=True,
                    )
                ]
                silver = silver.filter(pa.array(keep, pa.bool_()))
            if silver.num_rows:
                if not engine.exists(table):
                    engine.ensure_table(table, silver_layout(obj, registry).silver_schema())
                engine.append(table, silver, metadata={"sfcdc.silver": "retry-quarantine"})
            appended[name] = silver.num_rows
            bronze_table = rows.column("bronze_table").to_pylist()
            for bt, b, s in zip(
                bronze_table,
                rows.column("bronze_batch_id").to_pylist(),
                rows.column("bronze_batch_seq").to_pylist(),
                strict=True,
            ):
                if (b, s) in decoded:
                    resolved_keys.add((bt, b, s))
    resolved = _resolve(engine, open_rows, resolved_keys, stamp)
    _log.info(
        "silver: retried the quarantine: %d schemas fetched, %d still refused, %d rows "
        "appended to silver, %d quarantine rows resolved",
        len(fetched),
        len(refused),
        sum(appended.values()),
        resolved,
    )
    return RetryResult(tuple(fetched), refused, appended, resolved, open_rows.num_rows - resolved)


def _resolve(
    engine: LakeEngine, rows: pa.Table, keys: set[tuple[str, int, int]], at: datetime
) -> int:
    """Mark the quarantine rows with these bronze coordinates resolved at ``at``."""
    if not keys:
        return 0
    mask = [
        k in keys for k in zip(*(rows.column(c).to_pylist() for c in QUARANTINE_KEYS), strict=True)
    ]
    chosen = rows.filter(pa.array(mask, pa.bool_()))
    columns: list[pa.Array] = []
    for f in _QUARANTINE:
        if f.name == "resolved_at":
            columns.append(pa.repeat(pa.scalar(at, f.type), chosen.num_rows))
        else:
            columns.append(chosen.column(f.name).combine_chunks().cast(f.type))
    source = pa.Table.from_arrays(columns, schema=_QUARANTINE)
    metrics = engine.merge(
        QUARANTINE_TABLE,
        source,
        on=list(QUARANTINE_KEYS),
        update_condition="target.resolved_at IS NULL",
        insert=False,
    )
    return metrics.updated
