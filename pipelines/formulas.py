"""Formula fields in gold, refreshed on a schedule (``formulas.refresh_every``).

Salesforce computes a formula field when a record is read; Change Data Capture does not support
them (change events never carry their values), and a formula's value changes when its inputs
change, on that record or on others, without any event of its own. A replica built from events
(or from polls on ``SystemModstamp``, which a formula's change does not move) therefore keeps
them current only by reading them again. :func:`refresh_formulas`, for each object whose
refresh is due:

1. asks for the object's describe (one REST request) and takes its formula fields (those
   marked ``calculated``);
2. adds a column per formula field (typed as silver types the describe's type) and
   ``_cdc_formulas_refreshed_at`` to the gold table when it lacks them;
3. reads ``SELECT Id, <formula fields> FROM <Object>`` with ``queryAll`` (gold keeps deleted
   records' rows: their formulas are refreshed too), with one Bulk API 2.0 query job
   (``formulas.api``);
4. sets only those columns, and ``_cdc_formulas_refreshed_at``, of the gold rows it read
   (:meth:`~pipelines.engines.base.LakeEngine.update_columns`: every other column keeps its
   value; records gold does not have are not added, the next gold run or re-sync brings them);
5. records the refresh in ``gold.sfcdc_formulas`` (:data:`FORMULA_SCHEMA`): one row per object
   and run, with the fields it read; the schedule counts from the last row's ``finished_at``,
   so a restarted run keeps it.

Every other writer of gold leaves these columns alone: the gold fold and the MERGE of polled
rows write the columns of the object's silver table only (formula fields are in no change event
schema and a poll's silver rows leave them out), and a MERGE leaves the columns its source does
not have as they are. A snapshot (bootstrap, re-sync, reconcile's repair) reads a whole record,
so it reads the formula fields the last refresh read too, and sets them with the time it read
them: a record a re-sync brings into gold has its formulas at once.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T

from ingest.errors import ConfigError
from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.engines.base import LakeEngine
from pipelines.gold.columns import FORMULAS_REFRESHED_AT, ID
from pipelines.gold.tables import FORMULA_SCHEMA, FORMULA_TABLE, gold_table
from pipelines.ops.table import CommitRecord
from pipelines.polled.layout import calculated_fields
from pipelines.silver.columns import LeafKind, spark_type
from pipelines.silver.cometd import describe_layout
from pipelines.snapshot_read import RecordReader, SnapshotSource
from pipelines.snapshot_rows import rest_value
from pipelines.spec.conf import Conf
from pipelines.spec.models import ObjectSpec

__all__ = [
    "FORMULA_SCHEMA",
    "FORMULA_TABLE",
    "FormulaResult",
    "ensure_formula_table",
    "formula_columns",
    "formula_kinds",
    "formulas_due",
    "refresh_formulas",
]

_log = logging.getLogger(__name__)
_UTC = timezone.utc


@dataclass(frozen=True)
class FormulaResult:
    """One object's refresh: the formula fields read, the records read (over ``api``) and the
    gold rows updated."""

    object: str
    run_id: str
    fields: tuple[str, ...]
    records: int
    updated: int
    api: str | None
    duration_s: float


def ensure_formula_table(engine: LakeEngine) -> None:
    """Create ``gold.sfcdc_formulas`` (empty) when it does not exist yet."""
    engine.ensure_table(FORMULA_TABLE, FORMULA_SCHEMA)


def _refreshable(conf: Conf, names: Sequence[str] | None) -> list[ObjectSpec]:
    chosen = [
        o
        for o in conf.enabled_objects()
        if o.kind in ("change_events", "polled") and o.formulas.refresh_every is not None
    ]
    if names:
        wanted = set(names)
        chosen = [o for o in chosen if o.api_name in wanted]
    return chosen


def _last(engine: LakeEngine, obj: ObjectSpec) -> Mapping[str, Any] | None:
    if not engine.exists(FORMULA_TABLE):
        return None
    rows = engine.read_arrow(
        FORMULA_TABLE, columns=["finished_at", "fields"], where=[("object", "=", obj.api_name)]
    ).to_pylist()
    return max(rows, key=lambda r: r["finished_at"]) if rows else None


def formula_columns(engine: LakeEngine, obj: ObjectSpec) -> tuple[str, ...]:
    """The formula fields ``obj``'s last refresh read (none: refresh is off, or never ran):
    the gold columns a snapshot of its records reads and sets too."""
    if obj.formulas.refresh_every is None:
        return ()
    last = _last(engine, obj)
    return tuple(last["fields"] or ()) if last is not None else ()


def formulas_due(
    engine: LakeEngine, conf: Conf, names: Sequence[str] | None, *, now: datetime
) -> list[ObjectSpec]:
    """The objects (of ``names``) whose refresh is due at ``now``: refresh on, a gold table,
    and never refreshed or ``refresh_every`` since the last refresh finished."""
    due = []
    for obj in _refreshable(conf, names):
        if not engine.exists(gold_table(obj)):
            continue
        last = _last(engine, obj)
        every = obj.formulas.refresh_every
        assert every is not None
        if last is None:
            due.append(obj)
            continue
        finished = last["finished_at"]
        finished = finished if finished.tzinfo else finished.replace(tzinfo=_UTC)
        if now >= finished + timedelta(seconds=every):
            due.append(obj)
    return due


def formula_kinds(describe: Mapping[str, Any]) -> dict[str, LeafKind]:
    """The describe's formula fields with the kind of their column (as silver types the
    describe's type: ``currency`` a double, ``date`` a date, ...)."""
    fields = calculated_fields(describe)
    layouts = describe_layout({"fields": fields}, None)
    return {name: f.kind for name, f in layouts.items() if f.shape == "leaf"}


def refresh_formulas(
    engine: LakeEngine,
    conf: Conf,
    names: Sequence[str] | None = None,
    *,
    rest: Any,
    bulk: RecordReader | None = None,
    force: bool = False,
    on_record: Callable[[CommitRecord], object] | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(_UTC),
    clock: Callable[[], float] = time.perf_counter,
) -> list[FormulaResult]:
    """Refresh the formula fields of the objects (of ``names``) whose refresh is due, or of
    every one with refresh on and a gold table with ``force`` (steps 1 to 5 of the module
    docstring). ``rest`` describes (and reads over REST, and counts, for ``formulas.api``
    rest or auto), ``bulk`` reads with Bulk API 2.0 jobs."""
    ensure_formula_table(engine)
    objs = (
        [o for o in _refreshable(conf, names) if engine.exists(gold_table(o))]
        if force
        else formulas_due(engine, conf, names, now=now())
    )
    results = []
    for obj in objs:
        if obj.formulas.api != "rest" and bulk is None:
            raise ConfigError(
                f"formula refresh of {obj.api_name}: formulas.api is {obj.formulas.api} but "
                "no Bulk API reader was given"
            )
        results.append(
            _refresh(engine, obj, rest=rest, bulk=bulk, on_record=on_record, now=now, clock=clock)
        )
    return results


def _refresh(
    engine: LakeEngine,
    obj: ObjectSpec,
    *,
    rest: Any,
    bulk: RecordReader | None,
    on_record: Callable[[CommitRecord], object] | None,
    now: Callable[[], datetime],
    clock: Callable[[], float],
) -> FormulaResult:
    started = clock()
    started_at = now()
    run_id = uuid.uuid4().hex
    entity = obj.api_name
    gold = gold_table(obj)
    kinds = formula_kinds(rest.describe(entity))
    names = list(kinds)
    records = updated = 0
    api: str | None = None
    if names:
        current = engine.schema(gold)
        assert current is not None
        have = {f.name.lower() for f in current.fields}
        added = [T.StructField(n, spark_type(k)) for n, k in kinds.items() if n.lower() not in have]
        if FORMULAS_REFRESHED_AT.lower() not in have:
            added.append(T.StructField(FORMULAS_REFRESHED_AT, T.TimestampType()))
        if added:
            engine.ensure_table(gold, T.StructType([*current.fields, *added]))
        source = SnapshotSource(rest, bulk=bulk, api=obj.formulas.api, logger=_log)
        read = source.whole(f"SELECT Id, {', '.join(names)} FROM {entity}", entity)
        api = read.api
        rows = []
        for record in read.records:
            row = {ID: record["Id"], FORMULAS_REFRESHED_AT: started_at}
            for name, kind in kinds.items():
                row[name] = rest_value(kind, record.get(name), f"{entity}.{name} of {record['Id']}")
            rows.append(row)
        records = len(rows)
        schema = spark_schema_to_arrow(
            T.StructType(
                [
                    T.StructField(ID, T.StringType()),
                    T.StructField(FORMULAS_REFRESHED_AT, T.TimestampType()),
                    *(T.StructField(n, spark_type(k)) for n, k in kinds.items()),
                ]
            )
        )
        if rows:
            metrics = engine.update_columns(
                gold,
                pa.Table.from_pylist(rows, schema=schema),
                on=[ID],
                columns=[*names, FORMULAS_REFRESHED_AT],
                metadata={"sfcdc.formulas": f"{entity} {started_at.isoformat()}"},
            )
            updated = metrics.updated
    finished_at = now()
    result = FormulaResult(entity, run_id, tuple(names), records, updated, api, clock() - started)
    engine.append(
        FORMULA_TABLE,
        pa.Table.from_pylist(
            [
                {
                    "run_id": run_id,
                    "object": entity,
                    "started_at": started_at,
                    "finished_at": finished_at,
                    "api": api,
                    "fields": list(names),
                    "records": records,
                    "updated": updated,
                    "duration_s": result.duration_s,
                }
            ],
            schema=spark_schema_to_arrow(FORMULA_SCHEMA),
        ),
    )
    if on_record is not None:
        on_record(
            CommitRecord(
                layer="gold",
                kind="commit",
                visible_at=finished_at,
                topic=obj.topic,
                object=entity,
                table=str(gold),
                events=records,
                rows=updated,
                duration_seconds=result.duration_s,
                message=f"formula refresh of {', '.join(names) or 'no formula field'}",
            )
        )
    _log.info(
        "formulas: %s: %s of %d records read over %s, %d gold rows updated (%.1f s)",
        gold,
        ", ".join(names) or "no formula field",
        records,
        "the Bulk API" if api == "bulk" else "REST",
        updated,
        result.duration_s,
    )
    return result
