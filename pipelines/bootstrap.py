"""Initial load and re-sync: gold rows read from Salesforce's REST API instead of from events.

:func:`bootstrap_object` (``sfcdc bootstrap <object>``) and :func:`resync_objects`
(``sfcdc resync [<object>]``) share one path, :func:`refresh_from_rest`:

1. (bootstrap only) the stream position is recorded first: the object's topic must have a
   bronze checkpoint, and when it has none a landing is run until the topic is drained, which
   writes one. From then on every event committed later, including those committed while
   the snapshot is read, is after that position and will be landed;
2. silver and gold are brought up to date with what bronze holds, so gold has applied every
   landed event and the re-sync table lists every gap, overflow and replay gap found so far;
3. the records are read with SOQL through :class:`~ingest.rest.RestClient` (``queryAll``, so
   records in the recycle bin come back with their values and ``IsDeleted``): the whole object
   for a bootstrap, after a ``GAP_OVERFLOW`` or a replay gap; otherwise only the records the
   open re-sync rows name (gap events, diffs that could not be rebuilt, changes of records
   gold never saw), in ``WHERE Id IN (...)`` chunks;
4. REST values become gold's typed columns (dates, timestamps, time-of-day text, compound
   structs or flattened columns, Account's ``Name`` / ``Name_PersonName``), and the rows are
   MERGEd into gold flagged as a snapshot (``_cdc_last_change_type = 'SNAPSHOT'``), with
   ``_cdc_needs_resync`` cleared; a gold row the full read (or the id read) does not return is
   marked deleted (Salesforce no longer has it, not even in the recycle bin);
5. the open re-sync rows the read covered are marked resolved (``resolved_by`` names the
   snapshot).

The order key of a snapshot row
-------------------------------
Gold applies a change to a record only when its order key is greater than the row's
``_cdc_order_key`` (:mod:`pipelines.gold.fold`). A snapshot row must therefore get a key that
(a) is not below any change already reflected in the values read, so that such a change,
delivered again, cannot overwrite the snapshot, and (b) is below every change that may not be
reflected, so that it still applies on top.

Let ``k`` be the key the record's gold row has when the snapshot is read (step 2 ran first).
Every change with a key ``<= k`` was committed before gold applied it, hence before the read
began, so the values read reflect it: (a) needs the snapshot key ``>= k``. Any change not yet
in gold has, for this record, a key ``> k`` (keys follow the record's commit order; gold
already relies on this). Such a change may or may not be reflected in the values read; applying
it again is harmless: an UPDATE sets the same fields to the same values and the later changes
follow in order, a CREATE or UNDELETE writes its full image, a DELETE marks the row deleted. So
(b) needs the snapshot key to be below every key ``> k``.

The key chosen is ``k + "~snapshot"``. All keys of an object are built from the same columns,
each encoded prefix-free, so a key ``k' > k`` differs from ``k`` at a position within ``k``'s
length, and there ``k + "~snapshot"`` has ``k``'s character: ``k < k + "~snapshot" < k'``.
A record gold has no row for gets the empty key ``""``, below every event key; a row that is
already a snapshot keeps its key (its ``k`` part has not changed, since no event was applied
after it). The snapshot MERGE itself replaces the row unconditionally: it runs after gold
caught up, as the only gold writer (one gold run per lake at a time).

One more case: the same event delivered twice lands in two bronze batches, and the stream order
(batch, position) ends every key, so the second copy of the change behind ``k`` has a key above
``k + "~snapshot"``. Gold recognises it by its event id (``_cdc_last_event_id``), which the
snapshot row therefore keeps from the row it replaces.

What this cannot prove, it flags instead of guessing: a change committed while the snapshot
was read may not fit the snapshot when it arrives (a diff whose base already changed, an
UPDATE of a record the snapshot saw deleted, a gap event). The values are right, but gold
cannot vouch for them; the next ``sfcdc resync`` re-reads those records.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import TYPE_CHECKING, Any, Literal, Protocol

import pyarrow as pa

from ingest.errors import CheckpointError, ConfigError, RestError
from ingest.schema import EventSchema, FieldInfo
from pipelines.bronze.checkpoint import Checkpoint, CheckpointStore
from pipelines.bronze.tables import bronze_tables
from pipelines.engines import LakeEngine, MergeMetrics, TableRef
from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.gold.columns import (
    DELETED,
    DELETED_AT,
    ID,
    LAST_CHANGE_TYPE,
    LAST_COMMIT_NUMBER,
    LAST_COMMIT_TS,
    LAST_EVENT_ID,
    LAST_REPLAY_ID,
    NEEDS_RESYNC,
    ORDER_KEY,
    RESERVED_PREFIX,
    RESYNC_REASON,
    UPDATED_AT,
    body_fields,
    gold_schema,
    tombstone_schema,
)
from pipelines.gold.job import gold_table, history_table, run_gold, tombstone_table
from pipelines.gold.resync import RESYNC_SCHEMA, RESYNC_TABLE
from pipelines.gold.scd2 import (
    HISTORY_KEYS,
    SCD_CHANGE_TYPE,
    SCD_EVENT_ID,
    SCD_IS_CURRENT,
    SCD_IS_DELETED,
    SCD_ORDER_KEY,
    SCD_VALID_FROM,
    SCD_VALID_TO,
    history_schema,
)
from pipelines.progress import progress
from pipelines.silver.columns import FieldLayout, LeafKind, SilverLayout
from pipelines.silver.job import REGISTRY_TABLE, read_registry, run_silver, silver_layout
from pipelines.spec import Conf, ObjectSpec

if TYPE_CHECKING:
    from pyspark.sql import types as T

__all__ = [
    "CHUNK_ROWS",
    "ID_CHUNK",
    "SNAPSHOT_CHANGE_TYPE",
    "SNAPSHOT_MARK",
    "Mode",
    "RecordReader",
    "SnapshotResult",
    "bootstrap_object",
    "record_position",
    "refresh_from_rest",
    "rest_row",
    "resync_objects",
    "snapshot_key",
    "snapshot_soql",
]

_log = logging.getLogger(__name__)

SNAPSHOT_CHANGE_TYPE = "SNAPSHOT"
SNAPSHOT_MARK = "~snapshot"
# Records per snapshot MERGE: bounds the memory a bootstrap of a large object needs.
CHUNK_ROWS = 50_000
# Ids per WHERE Id IN (...) query: keeps the GET URL far below Salesforce's 16,384 characters.
ID_CHUNK = 200

Mode = Literal["bootstrap", "resync"]


class RecordReader(Protocol):
    """What the refresh needs of a REST client: ``query_all(soql)`` yielding records
    (:class:`ingest.rest.RestClient` is one)."""

    def query_all(self, soql: str) -> Iterator[dict[str, Any]]:
        """Every record ``soql`` selects, deleted ones included."""
        ...


@dataclass(frozen=True)
class SnapshotResult:
    """What one bootstrap or re-sync did for one object.

    ``full`` says the whole object was read (else ``requested`` record ids); ``read`` counts
    the records REST returned, ``marked_deleted`` the gold rows it no longer has, ``resolved``
    the re-sync rows closed. ``position`` is the bronze checkpoint the stream continues from
    (bootstrap). ``merge`` is ``None`` when nothing was written.
    """

    object: str
    mode: Mode
    table: TableRef
    full: bool
    requested: int
    read: int
    deleted_read: int
    marked_deleted: int
    resolved: int
    merge: MergeMetrics | None
    position: str | None
    duration_s: float


# --------------------------------------------------------------------------- the stream position


def record_position(
    engine: LakeEngine, conf: Conf, obj: ObjectSpec, *, land: Callable[[], object]
) -> Checkpoint:
    """The bronze checkpoint of ``obj``'s topic; without one, ``land()`` (a landing of the
    topic until drained) runs first to write it."""
    store = CheckpointStore(engine, bronze_tables(conf.topics()))
    checkpoint = store.latest(obj.topic)
    if checkpoint is None:
        _log.info("bootstrap: %s has no checkpoint yet; landing it to record one", obj.topic)
        land()
        checkpoint = store.latest(obj.topic)
    if checkpoint is None:
        raise CheckpointError(
            f"bootstrap of {obj.api_name}: landing {obj.topic} wrote no checkpoint, so there "
            "is no stream position to continue from; check that the topic exists and that "
            "`sfcdc ingest --once` lands it"
        )
    return checkpoint


def _describe(checkpoint: Checkpoint) -> str:
    replay = checkpoint.replay_id.hex() if checkpoint.replay_id is not None else "-"
    return f"{checkpoint.topic} batch {checkpoint.batch_id} (replay id {replay})"


def _ensure_schema(
    engine: LakeEngine,
    conf: Conf,
    obj: ObjectSpec,
    fetch_schema: Callable[[str], EventSchema] | None,
) -> None:
    """Registers the topic's current schema when no event brought one yet (an object whose
    events all predate the subscription): gold's columns come from it."""
    if silver_layout(obj, read_registry(engine)).fields or fetch_schema is None:
        return
    try:
        schema = fetch_schema(obj.topic)
    except ValueError as exc:
        # A multi-entity channel has no schema of its own: only its events name theirs.
        raise ConfigError(
            f"bootstrap of {obj.api_name}: no schema of its events is registered and {obj.topic} "
            f"cannot give one ({exc}); land at least one of its events with `sfcdc ingest` first"
        ) from exc
    store = CheckpointStore(engine, bronze_tables(conf.topics()))
    store.register_schemas(obj.topic, {schema.schema_id: schema.json})
    _log.info("bootstrap: registered %s's current schema %s", obj.topic, schema.schema_id)


# ------------------------------------------------------------------------------ SOQL and values


@dataclass(frozen=True)
class _Shape:
    """How a compound field reads from REST: a nested object, or name parts as fields."""

    field: FieldLayout
    parts: bool


def _infos(obj: ObjectSpec, registry: Mapping[str, Any]) -> dict[str, FieldInfo]:
    infos: dict[str, FieldInfo] = {}
    entries = sorted(
        (e for e in registry.values() if e.schema is not None),
        key=lambda e: (e.first_seen_at is None, e.first_seen_at or datetime.min, e.schema_id),
    )
    for entry in entries:
        if entry.schema.entity_name == obj.api_name:
            infos.update(entry.schema.by_name)
    return infos


def _shapes(layout: SilverLayout, infos: Mapping[str, FieldInfo]) -> list[_Shape]:
    shapes = []
    for f in layout.fields:
        info = infos.get(f.name)
        # The REST API returns a person name as text with its parts as fields of their own;
        # Address and Location come as nested objects.
        parts = f.shape == "switchable" or (info is not None and info.sf_type == "PersonName")
        shapes.append(_Shape(f, parts))
    return shapes


def snapshot_soql(
    layout: SilverLayout, infos: Mapping[str, FieldInfo], ids: Sequence[str] | None = None
) -> str:
    """The SOQL that reads every gold column of ``layout``'s object (of ``ids`` only, when
    given): ``SELECT Id, IsDeleted, <fields> FROM <Object> [WHERE Id IN (...)]``."""
    names = ["Id", "IsDeleted"]
    for shape in _shapes(layout, infos):
        f = shape.field
        if f.shape == "leaf" or not shape.parts:
            names.append(f.name)
        elif f.shape == "switchable":
            names.extend([f.name, *f.child_names(), "IsPersonAccount"])
        else:
            names.extend(f.child_names())
    soql = f"SELECT {', '.join(dict.fromkeys(names))} FROM {layout.entity}"
    if ids:
        bad = [i for i in ids if not i.isalnum()]
        if bad:
            raise ValueError(f"record ids are alphanumeric (got {bad[:3]})")
        soql += " WHERE Id IN (" + ", ".join(f"'{i}'" for i in ids) + ")"
    return soql


def _lower_camel(name: str) -> str:
    return name[:1].lower() + name[1:]


def _value(kind: LeafKind, value: Any, where: str) -> Any:
    if value is None:
        return None
    try:
        if kind in ("string", "json", "binary"):
            return value if isinstance(value, str) else str(value)
        if kind == "boolean":
            if not isinstance(value, bool):
                raise TypeError
            return value
        if kind in ("int", "long"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError
            return int(value)
        if kind == "double":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError
            return float(value)
        if kind == "date":
            return date.fromisoformat(str(value)[:10])
        if kind == "timestamp":
            text = str(value)
            if len(text) == 10:
                return datetime.fromisoformat(text).replace(tzinfo=timezone.utc)
            parsed = datetime.strptime(text.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")
            return parsed.astimezone(timezone.utc)
        if kind == "time":
            return str(value).removesuffix("Z")
    except (TypeError, ValueError):
        pass
    raise RestError(
        f"REST value of {where}: expected a {kind} value as Salesforce's REST API writes it "
        f"(got {value!r})"
    )


def _struct(f: FieldLayout, values: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    out = {c.name: _value(c.kind, values.get(c.name), f"{where}.{c.name}") for c in f.children}
    return out if any(v is not None for v in out.values()) else None


def rest_row(
    layout: SilverLayout, infos: Mapping[str, FieldInfo], record: Mapping[str, Any]
) -> dict[str, Any]:
    """One REST record as gold body columns (``Id`` included), typed as silver types them."""
    entity = layout.entity
    record_id = record.get("Id")
    if not isinstance(record_id, str) or not record_id:
        raise RestError(f"REST record of {entity}: expected an Id (got {record_id!r})")
    row: dict[str, Any] = {ID: record_id}
    flat = layout.compounds == "flattened"
    for shape in _shapes(layout, infos):
        f = shape.field
        where = f"{entity}.{f.name} of {record_id}"
        if f.shape == "leaf":
            row[f.name] = _value(f.kind, record.get(f.name), where)
            continue
        if not shape.parts:
            nested = record.get(f.name)
            if nested is not None and not isinstance(nested, Mapping):
                raise RestError(f"REST value of {where}: expected a nested object (got {nested!r})")
            children = {c: (nested or {}).get(_lower_camel(c)) for c in f.child_names()}
        else:
            children = {c: record.get(c) for c in f.child_names()}
        person = f.shape != "switchable" or bool(record.get("IsPersonAccount"))
        struct = _struct(f, children, where) if person else None
        if f.shape == "switchable":
            row[f.name] = None if person else _value(f.kind, record.get(f.name), where)
        if flat:
            for c in f.child_names():
                row[layout.column_for(f"{f.name}.{c}")] = struct.get(c) if struct else None
        else:
            row[f.name if f.shape == "struct" else f.person_column] = struct
    return row


def snapshot_key(order_key: str | None, last_change_type: str | None) -> str:
    """The order key of a snapshot row over a gold row with ``order_key`` (``None``: no row;
    the argument is in the module docstring)."""
    if not order_key:
        return ""
    if last_change_type == SNAPSHOT_CHANGE_TYPE:
        return order_key
    return order_key + SNAPSHOT_MARK


# ------------------------------------------------------------------------------------- refresh


def _chunks(ids: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for start in range(0, len(ids), size):
        yield ids[start : start + size]


def refresh_from_rest(
    engine: LakeEngine,
    conf: Conf,
    obj: ObjectSpec,
    *,
    rest: RecordReader,
    mode: Mode,
    ids: Sequence[str] | None,
    position: Checkpoint | None = None,
    registry_table: TableRef = REGISTRY_TABLE,
    chunk_rows: int = CHUNK_ROWS,
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    clock: Callable[[], float] = time.perf_counter,
) -> SnapshotResult:
    """Steps 3 to 5 of the module docstring for ``obj``: read the whole object (``ids``
    ``None``) or those records, MERGE them into gold as snapshot rows, and resolve the open
    re-sync rows that were detected before the read began.

    Records are written ``chunk_rows`` at a time (one MERGE each), so memory stays bounded
    whatever the object's size; a run that stops half way can simply run again.
    """
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1 (got {chunk_rows})")
    started = clock()
    at = now()
    registry = read_registry(engine, registry_table)
    layout = silver_layout(obj, registry)
    if not layout.fields:
        raise ConfigError(
            f"{mode} of {obj.api_name}: no schema of {obj.topic} is registered, so gold's "
            "columns are unknown; run `sfcdc bootstrap` (which fetches it) or `sfcdc ingest` first"
        )
    infos = _infos(obj, registry)
    gold = gold_table(obj)
    silver = TableRef("silver", obj.tables.silver)
    silver_schema = engine.schema(silver) or layout.silver_schema()
    engine.ensure_table(gold, gold_schema(body_fields(silver_schema)))
    schema = engine.schema(gold)
    assert schema is not None
    open_rows = _open_resync_rows(engine, obj)

    wanted = list(dict.fromkeys(ids)) if ids is not None else None
    write = _SnapshotWriter(
        engine, obj, gold, spark_schema_to_arrow(schema), at=at, mode=mode, position=position
    )
    seen: set[str] = set()
    # A whole-object read does not know its size until the query answers: the bar counts.
    total = len(wanted) if wanted is not None else None
    with progress(total=total, unit="records", label=f"{mode} {obj.api_name}") as bar:
        for batch in _batched(_read(rest, layout, infos, wanted), chunk_rows):
            batch_rows = [rest_row(layout, infos, rec) for rec in batch]
            deleted_ids = {rec["Id"] for rec in batch if rec.get("IsDeleted")}
            batch_ids = [r[ID] for r in batch_rows]
            seen.update(batch_ids)
            current = _gold_rows(engine, gold, batch_ids)
            write(
                [
                    (body, current.get(body[ID]), body[ID] in deleted_ids, False)
                    for body in batch_rows
                ],
                current,
            )
            bar.advance(len(batch))
    # Live gold rows the read did not return: not even in the recycle bin, so Salesforce no
    # longer has the record.
    if wanted is None:
        live = engine.read_arrow(gold, columns=[ID, DELETED]).to_pylist()
        missing = [r[ID] for r in live if not r[DELETED] and r[ID] not in seen]
    else:
        missing = [i for i in wanted if i not in seen]
    vanished: list[str] = []
    for chunk in _chunks(missing, chunk_rows):
        current = _gold_rows(engine, gold, chunk)
        gone = [r for r in current.values() if not r.get(DELETED)]
        vanished.extend(r[ID] for r in gone)
        write([(r, r, True, True) for r in gone], current)
    covered = seen | set(vanished) | set(wanted or ())
    resolved = _resolve(
        engine,
        open_rows,
        lambda r: wanted is None or r["record_id"] in covered,
        at=at,
        by=f"{mode} snapshot {at.isoformat()}",
    )
    result = SnapshotResult(
        object=obj.api_name,
        mode=mode,
        table=gold,
        full=ids is None,
        requested=len(wanted) if wanted is not None else len(seen),
        read=len(seen),
        deleted_read=write.deleted_read,
        marked_deleted=len(vanished),
        resolved=resolved,
        merge=write.metrics,
        position=_describe(position) if position is not None else None,
        duration_s=clock() - started,
    )
    _log.info(
        "%s: %s <- REST %s: %d records read (%d deleted), %d vanished, %d re-sync rows "
        "resolved (%.1f s)",
        mode,
        gold,
        "whole object" if result.full else f"{result.requested} records",
        result.read,
        result.deleted_read,
        result.marked_deleted,
        resolved,
        result.duration_s,
    )
    return result


def _read(
    rest: RecordReader,
    layout: SilverLayout,
    infos: Mapping[str, FieldInfo],
    ids: Sequence[str] | None,
) -> Iterator[dict[str, Any]]:
    if ids is None:
        yield from rest.query_all(snapshot_soql(layout, infos))
        return
    for chunk in _chunks(ids, ID_CHUNK):
        yield from rest.query_all(snapshot_soql(layout, infos, chunk))


def _batched(records: Iterable[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for record in records:
        batch.append(record)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _gold_rows(engine: LakeEngine, gold: TableRef, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    if not ids:
        return {}
    return {r[ID]: r for r in engine.read_arrow(gold, where=[(ID, "in", list(ids))]).to_pylist()}


class _SnapshotWriter:
    """MERGEs snapshot rows into gold (and tombstones, with hard deletes), chunk by chunk."""

    def __init__(
        self,
        engine: LakeEngine,
        obj: ObjectSpec,
        gold: TableRef,
        schema: pa.Schema,
        *,
        at: datetime,
        mode: Mode,
        position: Checkpoint | None,
    ) -> None:
        self.engine = engine
        self.obj = obj
        self.gold = gold
        self.schema = schema
        self.at = at
        self.mode = mode
        self.replay = position.replay_id.value if position and position.replay_id else None
        self.metrics: MergeMetrics | None = None
        self.deleted_read = 0

    def __call__(
        self,
        entries: Sequence[tuple[Mapping[str, Any], Mapping[str, Any] | None, bool, bool]],
        current: Mapping[str, Mapping[str, Any]],
    ) -> None:
        """``entries`` are ``(body, existing gold row, deleted, vanished)``."""
        out = []
        for body, existing, is_deleted, vanished in entries:
            row: dict[str, Any] = dict.fromkeys(self.schema.names)
            row.update(body)
            row.update(_control(existing, is_deleted=is_deleted, at=self.at, replay=self.replay))
            out.append(row)
            self.deleted_read += int(is_deleted and not vanished)
        if self.obj.gold.scd2.enabled:
            self._history(out)
        hard = self.obj.gold.deletes == "hard"
        if hard:
            # Tombstones first, as the gold job writes them: a crash before the gold MERGE
            # leaves a tombstone newer than its gold row, which the fold takes as the truth.
            _write_tombstones(self.engine, self.obj, out)
            out = [r for r in out if not r[DELETED] or r[ID] in current]
        if not out:
            return
        metrics = self.engine.merge(
            self.gold,
            pa.Table.from_pylist(out, schema=self.schema),
            on=[ID],
            delete_condition=f"source.{DELETED} = true" if hard else None,
            metadata={"sfcdc.snapshot": f"{self.mode} {self.at.isoformat()}"},
        )
        self.metrics = metrics if self.metrics is None else _add(self.metrics, metrics)

    def _history(self, rows: Sequence[dict[str, Any]]) -> None:
        """SCD2: a snapshot that changes a tracked column or the deleted flag starts a version
        (``_scd_change_type = 'SNAPSHOT'``, keyed by the snapshot's order key, so it sorts
        after the versions of the changes it reflects) and closes the current one."""
        engine, obj = self.engine, self.obj
        table = history_table(obj)
        gold_fields = {f.name: f for f in _arrow_fields(self.schema)}
        track = obj.gold.scd2.track
        names = [
            n
            for n in (track if track != "all" else gold_fields)
            if n in gold_fields and n != ID and not n.startswith(RESERVED_PREFIX)
        ]
        schema = history_schema([gold_fields[n] for n in names])
        engine.ensure_table(table, schema)
        ids = [r[ID] for r in rows]
        current = (
            {
                r[ID]: r
                for r in engine.read_arrow(
                    table, where=[(ID, "in", ids), (SCD_IS_CURRENT, "=", True)]
                ).to_pylist()
            }
            if ids
            else {}
        )
        changes = []
        for row in rows:
            state = (*(row.get(n) for n in names), row[DELETED])
            now = current.get(row[ID])
            if now is not None and (*(now.get(n) for n in names), now[SCD_IS_DELETED]) == state:
                continue
            version = {ID: row[ID], **{n: row.get(n) for n in names}}
            version.update(
                {
                    SCD_VALID_FROM: self.at,
                    SCD_VALID_TO: None,
                    SCD_IS_CURRENT: True,
                    SCD_IS_DELETED: row[DELETED],
                    SCD_CHANGE_TYPE: SNAPSHOT_CHANGE_TYPE,
                    SCD_ORDER_KEY: row[ORDER_KEY],
                    SCD_EVENT_ID: None,
                }
            )
            changes.append(version)
            # A snapshot over a snapshot with no change in between shares its key: the
            # version is corrected in place rather than closed.
            if now is not None and now[SCD_ORDER_KEY] != row[ORDER_KEY]:
                changes.append({**now, SCD_VALID_TO: self.at, SCD_IS_CURRENT: False})
        if changes:
            engine.merge(
                table,
                pa.Table.from_pylist(changes, schema=spark_schema_to_arrow(schema)),
                on=list(HISTORY_KEYS),
            )


def _arrow_fields(schema: pa.Schema) -> list[T.StructField]:
    from pipelines.engines.arrow import arrow_schema_to_spark

    return list(arrow_schema_to_spark(schema).fields)


def _add(a: MergeMetrics, b: MergeMetrics) -> MergeMetrics:
    return dataclasses.replace(
        b,
        inserted=a.inserted + b.inserted,
        updated=a.updated + b.updated,
        deleted=a.deleted + b.deleted,
        source_rows=a.source_rows + b.source_rows,
        duration_s=a.duration_s + b.duration_s,
    )


def _control(
    existing: Mapping[str, Any] | None, *, is_deleted: bool, at: datetime, replay: bytes | None
) -> dict[str, Any]:
    deleted_at = None
    if is_deleted:
        deleted_at = (existing or {}).get(DELETED_AT) or at
    return {
        DELETED: is_deleted,
        DELETED_AT: deleted_at,
        NEEDS_RESYNC: False,
        RESYNC_REASON: None,
        LAST_CHANGE_TYPE: SNAPSHOT_CHANGE_TYPE,
        LAST_COMMIT_TS: at,
        LAST_COMMIT_NUMBER: None,
        LAST_REPLAY_ID: replay,
        # Kept, so that the event applied last, delivered again in a later bronze batch (its
        # key is then greater), is still recognised as already reflected.
        LAST_EVENT_ID: (existing or {}).get(LAST_EVENT_ID),
        ORDER_KEY: snapshot_key(
            (existing or {}).get(ORDER_KEY), (existing or {}).get(LAST_CHANGE_TYPE)
        ),
        UPDATED_AT: at,
    }


def _write_tombstones(engine: LakeEngine, obj: ObjectSpec, rows: Sequence[dict[str, Any]]) -> None:
    """Hard deletes: a deleted record's snapshot becomes its tombstone (so a late change
    cannot bring it back), and a record the snapshot found live loses its tombstone."""
    table = tombstone_table(obj)
    schema = tombstone_schema()
    arrow = spark_schema_to_arrow(schema)
    names = schema.fieldNames()
    deleted = [{n: r.get(n) for n in names} for r in rows if r[DELETED]]
    live = [{n: r.get(n) for n in names} for r in rows if not r[DELETED]]
    if deleted:
        engine.ensure_table(table, schema)
        engine.merge(table, pa.Table.from_pylist(deleted, schema=arrow), on=[ID])
    if live and engine.exists(table):
        engine.merge(
            table,
            pa.Table.from_pylist(live, schema=arrow),
            on=[ID],
            delete_condition="true",
            insert=False,
        )


def _open_resync_rows(engine: LakeEngine, obj: ObjectSpec) -> list[dict[str, Any]]:
    if not engine.exists(RESYNC_TABLE):
        return []
    rows = engine.read_arrow(RESYNC_TABLE, where=[("object", "=", obj.api_name)]).to_pylist()
    return [r for r in rows if r["resolved_at"] is None]


def _resolve(
    engine: LakeEngine,
    open_rows: Sequence[dict[str, Any]],
    covered: Callable[[Mapping[str, Any]], bool],
    *,
    at: datetime,
    by: str,
) -> int:
    done = [{**r, "resolved_at": at, "resolved_by": by} for r in open_rows if covered(r)]
    if not done:
        return 0
    table = pa.Table.from_pylist(done, schema=spark_schema_to_arrow(RESYNC_SCHEMA))
    metrics = engine.merge(
        RESYNC_TABLE,
        table,
        on=["resync_id"],
        update_condition="source.resolved_at IS NOT NULL AND target.resolved_at IS NULL",
        insert=False,
    )
    return metrics.updated


# ------------------------------------------------------------------------------------ commands


def _change_event_object(conf: Conf, name: str, what: str) -> ObjectSpec:
    by_name = {o.api_name: o for o in conf.objects}
    obj = by_name.get(name)
    if obj is None:
        known = ", ".join(sorted(by_name)) or "none"
        raise ConfigError(
            f"{what}: no object {name!r} in {conf.conf_dir} (configured: {known}; names are "
            "case-sensitive)"
        )
    if not obj.enabled:
        raise ConfigError(f"{what}: {name} is disabled (enabled: false in its file)")
    if obj.kind != "change_events":
        raise ConfigError(
            f"{what}: {name} is a platform event; only change event objects have records to load"
        )
    return obj


def _catch_up(engine: LakeEngine, conf: Conf, obj: ObjectSpec) -> None:
    run_silver(engine, conf, objects=[obj.api_name])
    run_gold(engine, conf, objects=[obj.api_name])


def bootstrap_object(
    engine: LakeEngine,
    conf: Conf,
    name: str,
    *,
    rest: RecordReader,
    land: Callable[[], object],
    fetch_schema: Callable[[str], EventSchema] | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
) -> SnapshotResult:
    """``sfcdc bootstrap <name>``: record the stream position (``land()`` writes one when
    the topic has none), catch silver and gold up, read the whole object over REST into gold
    and resolve the object's open re-sync rows. ``fetch_schema(topic)`` supplies the topic's
    current schema when no event registered one."""
    obj = _change_event_object(conf, name, "bootstrap")
    position = record_position(engine, conf, obj, land=land)
    _log.info("bootstrap: %s continues from %s", obj.api_name, _describe(position))
    _ensure_schema(engine, conf, obj, fetch_schema)
    _catch_up(engine, conf, obj)
    return refresh_from_rest(
        engine, conf, obj, rest=rest, mode="bootstrap", ids=None, position=position, now=now
    )


def resync_objects(
    engine: LakeEngine,
    conf: Conf,
    names: Sequence[str] | None = None,
    *,
    rest: RecordReader,
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
) -> list[SnapshotResult]:
    """``sfcdc resync [<name>]``: for each object (default: every enabled change event
    object), catch silver and gold up, then re-read what its open re-sync rows list: the
    whole object when one of them has no record id (overflow, replay gap), else those
    records. Objects with nothing open are skipped."""
    if names:
        objs = [_change_event_object(conf, n, "resync") for n in names]
    else:
        objs = [o for o in conf.enabled_objects() if o.kind == "change_events"]
    results = []
    for obj in objs:
        _catch_up(engine, conf, obj)
        if not engine.exists(gold_table(obj)):
            _log.info("resync: %s has no gold table yet; skipped", obj.api_name)
            continue
        open_rows = _open_resync_rows(engine, obj)
        if not open_rows:
            _log.info("resync: %s has no open re-sync rows", obj.api_name)
            continue
        whole = any(r["record_id"] is None for r in open_rows)
        ids = None if whole else sorted({r["record_id"] for r in open_rows})
        results.append(
            refresh_from_rest(engine, conf, obj, rest=rest, mode="resync", ids=ids, now=now)
        )
    return results
