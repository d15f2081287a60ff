"""Reconciliation: how far gold is from the org, measured against the org itself, and repaired.

Change events can be lost: Salesforce states that in rare cases an event is not persisted and
cannot be recovered, emptying the Recycle Bin hard-deletes records without any event, and a
subscription that falls behind the 72-hour retention misses what expired. None of that shows
in the stream. ``sfcdc reconcile`` (:func:`reconcile_objects`) compares gold with Salesforce:

1. silver and gold catch up with what bronze holds, so every landed change is applied;
2. one query per object reads ``Id, SystemModstamp, IsDeleted`` of every record, those in the
   Recycle Bin included (``queryAll``), over a Bulk API 2.0 job for large objects or REST for
   small ones (:class:`~pipelines.snapshot_read.SnapshotSource`): three columns, not a full
   extract;
3. :func:`find_drift` compares them with gold's ``Id``, ``_cdc_is_deleted`` and
   ``_cdc_last_commit_ts``:

   - ``missing``: Salesforce has the record and gold has no row for it (with soft deletes a
     record in the Recycle Bin counts too: gold keeps deleted rows);
   - ``extra``: gold holds the record live but Salesforce has it deleted, or no longer has it at
     all (hard-deleted from the Recycle Bin);
   - ``stale``: both have it, but gold's last change is older than ``SystemModstamp`` (the time
     Salesforce last saved the record), or gold has it deleted while it is live in Salesforce
     (an undelete was lost);

   records saved after the query's start minus ``lookback`` are *in flight* (their event may
   not have been landed yet): counted, not judged;
4. every drifting record gets an open row in ``gold.sfcdc_resync`` with reason ``drift``, and
   the existing re-sync path (:func:`pipelines.bootstrap.resync_objects`) re-reads them, with
   every other open row of the object (gap events, overflows, replay gaps), and writes them
   into gold as snapshot rows; a record Salesforce no longer has is marked deleted (soft) or
   removed (hard);
5. the counts go to ``gold.sfcdc_reconcile`` (:data:`RECONCILE_SCHEMA`), one row per object and
   run, which ``sfcdc status``, the metrics and the dashboard read.

What the comparison rests on: Salesforce sets ``SystemModstamp`` whenever it saves a record, a
change event's ``commitTimestamp`` is the commit of that save (never earlier), and gold keeps
the commit timestamp of the last change it applied (a snapshot row: the time it was read, after
the save). So a gold row whose time is older than ``SystemModstamp`` missed a save. Two saves of
one record within the same second (``SystemModstamp`` has whole seconds) cannot be told apart
by time; a lost second one of those is not seen until the record is saved again. System
updates that change ``SystemModstamp`` without a change event show as ``stale`` once and are
re-read.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingest.errors import ConfigError
from pipelines.bootstrap import SnapshotResult, resync_objects
from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.engines.base import LakeEngine
from pipelines.gold.columns import DELETED, ID, LAST_COMMIT_TS
from pipelines.gold.job import run_gold
from pipelines.gold.resync import RESYNC_SCHEMA, RESYNC_TABLE, resync_row
from pipelines.gold.tables import RECONCILE_SCHEMA, RECONCILE_TABLE, gold_table
from pipelines.ops.table import CommitRecord
from pipelines.silver.job import run_silver
from pipelines.snapshot_read import RecordReader, SnapshotSource
from pipelines.spec.conf import Conf
from pipelines.spec.models import ObjectSpec

__all__ = [
    "DEFAULT_LOOKBACK",
    "DRIFT_KINDS",
    "RECONCILE_SCHEMA",
    "RECONCILE_TABLE",
    "ReconcileResult",
    "ensure_reconcile_table",
    "find_drift",
    "last_reconcile_at",
    "reconcile_objects",
    "reconcile_soql",
    "salesforce_table",
]

_log = logging.getLogger(__name__)

DRIFT_KINDS = ("missing", "extra", "stale")
# A change saved this recently may still be on its way to gold: not judged yet.
DEFAULT_LOOKBACK = timedelta(minutes=5)
_MS = pa.timestamp("ms", tz="UTC")
_DRIFT_SCHEMA = pa.schema(
    [
        pa.field(ID, pa.string()),
        pa.field("kind", pa.string()),
        pa.field("detail", pa.string()),
    ]
)


@dataclass(frozen=True)
class ReconcileResult:
    """One object's reconciliation: what Salesforce and gold hold, the drift found by kind,
    the records still in flight, and how many drifting records the re-sync repaired."""

    object: str
    run_id: str
    api: str
    salesforce_records: int
    salesforce_deleted: int
    gold_records: int
    in_flight: int
    drift_missing: int
    drift_extra: int
    drift_stale: int
    repaired: int
    duration_s: float
    resync: SnapshotResult | None = None

    @property
    def drift(self) -> int:
        return self.drift_missing + self.drift_extra + self.drift_stale

    def commit_record(self, finished_at: datetime) -> CommitRecord:
        """The row of the commits table (``kind`` ``reconcile``) the dashboard charts."""
        return CommitRecord(
            layer="gold",
            kind="reconcile",
            visible_at=finished_at,
            object=self.object,
            table=str(RECONCILE_TABLE),
            events=self.salesforce_records,
            rows=self.drift,
            resync_rows=self.repaired,
            duration_seconds=self.duration_s,
            message=(
                f"drift_missing {self.drift_missing}, drift_extra {self.drift_extra}, "
                f"drift_stale {self.drift_stale}, in flight {self.in_flight}"
            ),
        )

    def row(self, started_at: datetime, finished_at: datetime) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "object": self.object,
            "started_at": started_at,
            "finished_at": finished_at,
            "api": self.api,
            "salesforce_records": self.salesforce_records,
            "salesforce_deleted": self.salesforce_deleted,
            "gold_records": self.gold_records,
            "in_flight": self.in_flight,
            "drift_missing": self.drift_missing,
            "drift_extra": self.drift_extra,
            "drift_stale": self.drift_stale,
            "repaired": self.repaired,
            "duration_s": self.duration_s,
        }


def reconcile_soql(entity: str) -> str:
    """The one query reconciliation makes of an object (run as ``queryAll``)."""
    return f"SELECT Id, SystemModstamp, IsDeleted FROM {entity}"


def salesforce_table(records: Iterator[dict[str, Any]]) -> pa.Table:
    """Records of :func:`reconcile_soql` (REST JSON or Bulk rows shaped like it) as Arrow:
    ``Id``, ``modstamp`` (UTC, ms) and ``deleted``."""
    ids: list[str] = []
    stamps: list[str | None] = []
    deleted: list[bool] = []
    for record in records:
        ids.append(record["Id"])
        stamp = record.get("SystemModstamp")
        # REST writes ...T00:00:01.000+0000, Bulk ...T00:00:01.000Z: both are UTC.
        stamps.append(None if stamp is None else str(stamp)[:23])
        deleted.append(bool(record.get("IsDeleted")))
    modstamp = pa.array(stamps, pa.string()).cast(pa.timestamp("ms")).cast(_MS)
    return pa.table(
        {
            ID: pa.array(ids, pa.string()),
            "modstamp": modstamp,
            "deleted": pa.array(deleted, pa.bool_()),
        }
    )


def _utc_ms(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    kind = column.type
    if not pa.types.is_timestamp(kind):
        raise TypeError(f"expected a timestamp column (got {kind})")
    if kind.tz is None:
        column = pc.assume_timezone(column, "UTC")
    # Whole milliseconds, rounded down: SystemModstamp has no finer grain.
    return pc.floor_temporal(column, unit="millisecond").cast(_MS, safe=False)


def find_drift(
    salesforce: pa.Table,
    gold: pa.Table,
    *,
    hard_deletes: bool,
    horizon: datetime | None,
) -> tuple[pa.Table, int]:
    """The records where ``gold`` (``Id``, ``_cdc_is_deleted``, ``_cdc_last_commit_ts``)
    differs from ``salesforce`` (:func:`salesforce_table`), as rows of ``Id``, ``kind`` (one
    of :data:`DRIFT_KINDS`) and ``detail``; and how many records were saved after ``horizon``
    (in flight, not judged). ``hard_deletes``: gold removes deleted records instead of keeping
    them flagged. The rules are the module docstring's."""
    sf = salesforce.select([ID, "modstamp", "deleted"]).rename_columns([ID, "sf_ts", "sf_del"])
    gd = pa.table(
        {
            ID: gold[ID],
            "g_ts": _utc_ms(gold[LAST_COMMIT_TS]),
            "g_del": pc.fill_null(gold[DELETED], False),
            "g_has": pa.array([True] * gold.num_rows, pa.bool_()),
        },
        schema=pa.schema(
            [(ID, pa.string()), ("g_ts", _MS), ("g_del", pa.bool_()), ("g_has", pa.bool_())]
        ),
    )
    both = sf.join(gd, keys=ID, join_type="full outer", coalesce_keys=True)
    in_sf = pc.is_valid(both["sf_del"])
    in_gold = pc.fill_null(both["g_has"], False)
    sf_del = pc.fill_null(both["sf_del"], False)
    g_del = pc.fill_null(both["g_del"], False)
    if horizon is not None:
        after = pc.fill_null(pc.greater(both["sf_ts"], pa.scalar(horizon, _MS)), False)
        late = pc.and_(in_sf, after)
    else:
        late = pa.array([False] * both.num_rows, pa.bool_())
    judged = pc.invert(late)
    # Salesforce has it, gold has no row (a Recycle Bin record counts with soft deletes).
    wanted = in_sf if not hard_deletes else pc.and_(in_sf, pc.invert(sf_del))
    missing = pc.and_(judged, pc.and_(wanted, pc.invert(in_gold)))
    # Gold has it live, Salesforce has it deleted or not at all.
    gold_live = pc.and_(in_gold, pc.invert(g_del))
    extra = pc.and_(judged, pc.and_(gold_live, pc.or_(pc.invert(in_sf), sf_del)))
    # Both have it: gold's last change older than the last save, or a lost undelete.
    older = pc.fill_null(pc.less(both["g_ts"], both["sf_ts"]), False)
    undeleted = pc.and_(g_del, pc.invert(sf_del))
    stale = pc.and_(
        judged,
        pc.and_(
            pc.and_(in_sf, in_gold),
            pc.and_(pc.invert(extra), pc.or_(older, undeleted)),
        ),
    )
    rows: list[dict[str, Any]] = []
    for kind, mask in (("missing", missing), ("extra", extra), ("stale", stale)):
        picked = both.filter(mask)
        for r in picked.to_pylist():
            rows.append({ID: r[ID], "kind": kind, "detail": _detail(kind, r)})
    return pa.Table.from_pylist(rows, schema=_DRIFT_SCHEMA), pc.sum(late).as_py() or 0


def _stamp(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _detail(kind: str, r: dict[str, Any]) -> str:
    if kind == "missing":
        state = "in the Recycle Bin" if r["sf_del"] else "live"
        return f"{state} in Salesforce (SystemModstamp {_stamp(r['sf_ts'])}), no gold row"
    if kind == "extra":
        if r["sf_del"] is None:
            return "live in gold, gone from Salesforce (hard-deleted from the Recycle Bin)"
        return f"live in gold, deleted in Salesforce (SystemModstamp {_stamp(r['sf_ts'])})"
    if r["g_del"] and not r["sf_del"]:
        return f"deleted in gold, live in Salesforce (SystemModstamp {_stamp(r['sf_ts'])})"
    return (
        f"gold's last change {_stamp(r['g_ts'])} is older than SystemModstamp {_stamp(r['sf_ts'])}"
    )


# ------------------------------------------------------------------------------------ command


def _objects(conf: Conf, names: Sequence[str] | None) -> list[ObjectSpec]:
    candidates = [o for o in conf.enabled_objects() if o.kind in ("change_events", "polled")]
    if not names:
        return candidates
    by_name = {o.api_name: o for o in candidates}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        known = ", ".join(sorted(by_name)) or "none"
        raise ConfigError(
            f"reconcile: no enabled change event or polled object "
            f"{', '.join(map(repr, unknown))} in "
            f"{conf.conf_dir} (configured: {known}; names are case-sensitive)"
        )
    return [by_name[n] for n in names]


def _write_drift(
    engine: LakeEngine, obj: ObjectSpec, drift: pa.Table, *, run_id: str, at: datetime
) -> list[str]:
    """Open ``drift`` re-sync rows for the drifting records; returns their ``resync_id``s."""
    rows = [
        resync_row(
            object_name=obj.api_name,
            record_id=r[ID],
            reason="drift",
            change_type=None,
            detail=f"{r['kind']}: {r['detail']}",
            commit_timestamp=None,
            replay_id=None,
            event_id=None,
            bronze_batch_id=None,
            detected_at=at,
            cause=(run_id, r["kind"]),
        )
        for r in drift.to_pylist()
    ]
    if not rows:
        return []
    table = pa.Table.from_pylist(rows, schema=spark_schema_to_arrow(RESYNC_SCHEMA))
    engine.ensure_table(RESYNC_TABLE, RESYNC_SCHEMA)
    engine.merge(
        RESYNC_TABLE,
        table,
        on=["resync_id"],
        update_condition="source.resolved_at IS NOT NULL AND target.resolved_at IS NULL",
    )
    return [r["resync_id"] for r in rows]


def _resolved(engine: LakeEngine, obj: ObjectSpec, resync_ids: Sequence[str]) -> int:
    """How many of the rows ``resync_ids`` the re-sync resolved."""
    rows = engine.read_arrow(
        RESYNC_TABLE,
        columns=["resync_id", "resolved_at"],
        where=[("object", "=", obj.api_name), ("resync_id", "in", list(resync_ids))],
    )
    return int(pc.sum(pc.is_valid(rows["resolved_at"])).as_py() or 0)


def last_reconcile_at(engine: LakeEngine) -> datetime | None:
    """When the lake's last reconcile finished (``None``: never)."""
    if not engine.exists(RECONCILE_TABLE):
        return None
    finished = engine.read_arrow(RECONCILE_TABLE, columns=["finished_at"])["finished_at"]
    latest = pc.max(finished).as_py() if len(finished) else None
    if latest is not None and latest.tzinfo is None:
        latest = latest.replace(tzinfo=timezone.utc)
    return latest


def ensure_reconcile_table(engine: LakeEngine) -> None:
    """Create ``gold.sfcdc_reconcile`` (empty) when it does not exist yet."""
    engine.ensure_table(RECONCILE_TABLE, RECONCILE_SCHEMA)


def reconcile_objects(
    engine: LakeEngine,
    conf: Conf,
    names: Sequence[str] | None = None,
    *,
    source: RecordReader | SnapshotSource,
    repair: bool = True,
    lookback: timedelta = DEFAULT_LOOKBACK,
    on_record: Callable[[CommitRecord], None] | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    clock: Callable[[], float] = time.perf_counter,
) -> list[ReconcileResult]:
    """``sfcdc reconcile [--objects ...]``: steps 1 to 5 of the module docstring for each
    object (default: every enabled change event and polled object). With ``repair`` false, drift is
    measured and recorded but nothing is re-read. Objects without a gold table are skipped."""
    snapshot = source if isinstance(source, SnapshotSource) else SnapshotSource(source)
    objs = _objects(conf, names)
    ensure_reconcile_table(engine)
    results: list[ReconcileResult] = []
    for obj in objs:
        run_silver(engine, conf, objects=[obj.api_name])
        run_gold(engine, conf, objects=[obj.api_name])
        gold = gold_table(obj)
        if not engine.exists(gold):
            _log.info(
                "reconcile: %s has no gold table yet; skipped (run sfcdc bootstrap)", obj.api_name
            )
            continue
        started = clock()
        started_at = now()
        run_id = uuid.uuid4().hex
        whole = snapshot.whole(reconcile_soql(obj.api_name), obj.api_name)
        salesforce = salesforce_table(whole.records)
        current = engine.read_arrow(gold, columns=[ID, DELETED, LAST_COMMIT_TS])
        drift, in_flight = find_drift(
            salesforce,
            current,
            hard_deletes=obj.gold.deletes == "hard",
            horizon=started_at - lookback,
        )
        written = _write_drift(engine, obj, drift, run_id=run_id, at=started_at)
        counts = dict.fromkeys(DRIFT_KINDS, 0)
        for kind in drift["kind"].to_pylist():
            counts[kind] += 1
        resynced: SnapshotResult | None = None
        repaired = 0
        if repair:
            # Every open row of the object, not only this run's drift: gap events, overflows
            # and replay gaps are repaired by the same read, so gold ends equal to the org.
            done = resync_objects(engine, conf, [obj.api_name], rest=snapshot, now=now)
            resynced = done[0] if done else None
            repaired = _resolved(engine, obj, written) if written else 0
        result = ReconcileResult(
            object=obj.api_name,
            run_id=run_id,
            api=whole.api,
            salesforce_records=salesforce.num_rows,
            salesforce_deleted=pc.sum(salesforce["deleted"]).as_py() or 0,
            gold_records=current.num_rows,
            in_flight=in_flight,
            drift_missing=counts["missing"],
            drift_extra=counts["extra"],
            drift_stale=counts["stale"],
            repaired=repaired,
            duration_s=clock() - started,
            resync=resynced,
        )
        finished_at = now()
        record = pa.Table.from_pylist(
            [result.row(started_at, finished_at)], schema=spark_schema_to_arrow(RECONCILE_SCHEMA)
        )
        engine.append(RECONCILE_TABLE, record)
        if on_record is not None:
            on_record(result.commit_record(finished_at))
        _log.info(
            "reconcile: %s: %d records in Salesforce (%d deleted, %s), %d in gold: "
            "drift_missing %d, drift_extra %d, drift_stale %d (in flight %d); repaired %d "
            "(%.1f s)",
            obj.api_name,
            result.salesforce_records,
            result.salesforce_deleted,
            "Bulk API" if result.api == "bulk" else "REST",
            result.gold_records,
            result.drift_missing,
            result.drift_extra,
            result.drift_stale,
            result.in_flight,
            result.repaired,
            result.duration_s,
        )
        results.append(result)
    return results
