"""Initial load and re-sync: gold rows read from Salesforce (REST or Bulk API) instead of events.

:func:`bootstrap_object` (``sfcdc bootstrap <object>``) and :func:`resync_objects`
(``sfcdc resync [<object>]``) share one path, :func:`refresh_from_rest`:

1. (bootstrap only) the stream position is recorded first: the object's topic must have a
   bronze checkpoint, and when it has none a landing is run until the topic is drained, which
   writes one. From then on every event committed later, including those committed while
   the snapshot is read, is after that position and will be landed;
2. silver and gold are brought up to date with what bronze holds, so gold has applied every
   landed event and the re-sync table lists every gap, overflow and replay gap found so far;
3. the records are read with SOQL, records in the recycle bin included (``queryAll``, so they
   come back with their values and ``IsDeleted``): the whole object for a bootstrap, after a
   ``GAP_OVERFLOW`` or a replay gap, over REST or a Bulk API 2.0 query job as the
   :class:`~pipelines.snapshot_read.SnapshotSource` decides (by size with ``auto``);
   otherwise, over REST, only the records the open re-sync rows name (gap events, diffs that
   could not be rebuilt, changes of records gold never saw), in ``WHERE Id IN (...)`` chunks;
4. the records become gold's typed columns (:mod:`pipelines.snapshot_rows`: dates,
   timestamps, time-of-day text, compound structs or flattened columns, Account's ``Name`` /
   ``Name_PersonName``), and the rows are MERGEd into gold flagged as a snapshot
   (:mod:`pipelines.snapshot_write`: ``_cdc_last_change_type = 'SNAPSHOT'``), with
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

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T

from ingest.errors import CheckpointError, ConfigError
from ingest.schema import EventSchema, FieldInfo
from pipelines.bronze.checkpoint import Checkpoint, CheckpointStore
from pipelines.bronze.cometd_setup import read_describes
from pipelines.bronze.tables import bronze_tables
from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.engines.base import LakeEngine, MergeMetrics, TableRef
from pipelines.formulas import formula_columns
from pipelines.gold.columns import DELETED, FORMULAS_REFRESHED_AT, ID, body_fields, gold_schema
from pipelines.gold.cometd import gold_object, run_cometd_gold
from pipelines.gold.job import run_gold
from pipelines.gold.resync import RESYNC_SCHEMA, RESYNC_TABLE
from pipelines.gold.tables import gold_table
from pipelines.polled.layout import polled_layout
from pipelines.progress import progress
from pipelines.silver.columns import LeafKind, SilverLayout, leaf_kind_of
from pipelines.silver.cometd_job import cometd_plan, run_cometd_silver
from pipelines.silver.job import run_silver
from pipelines.silver.registry import REGISTRY_TABLE, read_registry, silver_layout
from pipelines.snapshot_read import RecordReader, SnapshotSource
from pipelines.snapshot_rows import record_infos, rest_row, rest_value, snapshot_soql
from pipelines.snapshot_write import (
    SNAPSHOT_CHANGE_TYPE,
    SNAPSHOT_MARK,
    Mode,
    SnapshotWriter,
    snapshot_key,
)
from pipelines.spec.cometd import CometdObjectSpec
from pipelines.spec.conf import Conf
from pipelines.spec.models import ObjectSpec

__all__ = [
    "CHUNK_ROWS",
    "ID_CHUNK",
    "SNAPSHOT_CHANGE_TYPE",
    "SNAPSHOT_MARK",
    "Mode",
    "RecordReader",
    "SnapshotResult",
    "SnapshotSource",
    "bootstrap_object",
    "rebootstrap_due",
    "record_position",
    "refresh_from_rest",
    "rest_row",
    "resync_objects",
    "snapshot_key",
    "snapshot_soql",
]

_log = logging.getLogger(__name__)

# Records per snapshot MERGE: bounds the memory a bootstrap of a large object needs.
CHUNK_ROWS = 50_000
# Ids per WHERE Id IN (...) query: keeps the GET URL far below Salesforce's 16,384 characters.
ID_CHUNK = 200


@dataclass(frozen=True)
class SnapshotResult:
    """What one bootstrap or re-sync did for one object.

    ``full`` says the whole object was read (else ``requested`` record ids); ``read`` counts
    the records Salesforce returned, over ``api`` (``rest`` or ``bulk``); ``marked_deleted``
    the gold rows it no longer has, ``resolved`` the re-sync rows closed. ``position`` is the
    bronze checkpoint the stream continues from (bootstrap). ``merge`` is ``None`` when nothing
    was written.
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
    api: str = "rest"


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


# ------------------------------------------------------------------------------------- refresh


def _chunks(ids: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for start in range(0, len(ids), size):
        yield ids[start : start + size]


def refresh_from_rest(
    engine: LakeEngine,
    conf: Conf,
    obj: ObjectSpec,
    *,
    rest: RecordReader | SnapshotSource,
    mode: Mode,
    ids: Sequence[str] | None,
    position: Checkpoint | None = None,
    registry_table: TableRef = REGISTRY_TABLE,
    layout: SilverLayout | None = None,
    chunk_rows: int = CHUNK_ROWS,
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    clock: Callable[[], float] = time.perf_counter,
) -> SnapshotResult:
    """Steps 3 to 5 of the module docstring for ``obj``: read the whole object (``ids``
    ``None``) or those records, MERGE them into gold as snapshot rows, and resolve the open
    re-sync rows that were detected before the read began.

    ``layout`` gives gold's fields when they do not come from the registered event schemas
    (a Streaming API channel's, from its stored describes; its ``entity`` is the object
    read).

    ``rest`` is where records come from: a :class:`SnapshotSource` (REST for named records;
    REST, Bulk API or a choice by size for a whole object) or a plain reader used for both.
    Records are written ``chunk_rows`` at a time (one MERGE each), so memory stays bounded
    whatever the object's size; a run that stops half way can simply run again.
    """
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1 (got {chunk_rows})")
    started = clock()
    at = now()
    if layout is None:
        layout, infos = _layout(engine, obj, registry_table)
        if not layout.fields:
            raise ConfigError(
                f"{mode} of {obj.api_name}: no schema of {obj.topic} is registered, so gold's "
                "columns are unknown; run `sfcdc bootstrap` (which fetches it) or `sfcdc "
                "ingest` first"
            )
    else:
        infos = {}
    gold = gold_table(obj)
    silver = TableRef("silver", obj.tables.silver)
    silver_schema = engine.schema(silver) or layout.silver_schema()
    engine.ensure_table(gold, gold_schema(body_fields(silver_schema)))
    table_schema = engine.schema(gold)
    assert table_schema is not None
    # What a snapshot writes: the object's columns and gold's control columns, and the formula
    # fields the last refresh read (a whole record is read, formulas included). Any other
    # column of the table keeps its value: the MERGE does not name it.
    formulas = _formula_fields(table_schema, formula_columns(engine, obj))
    written = set(gold_schema(body_fields(silver_schema)).names) | set(formulas)
    if formulas:
        written.add(FORMULAS_REFRESHED_AT)
    schema = T.StructType([f for f in table_schema.fields if f.name in written])
    open_rows = _open_resync_rows(engine, obj)

    wanted = list(dict.fromkeys(ids)) if ids is not None else None
    source = rest if isinstance(rest, SnapshotSource) else SnapshotSource(rest)
    write = SnapshotWriter(
        engine,
        obj,
        gold,
        spark_schema_to_arrow(schema),
        at=at,
        mode=mode,
        position=position,
        untracked=frozenset(formulas),
    )
    records, api, total = _read(source, layout, infos, wanted, extra=list(formulas))
    seen: set[str] = set()
    # A whole-object read may not know its size until the query answers: the bar counts.
    with progress(total=total, unit="records", label=f"{mode} {obj.api_name}") as bar:
        for batch in _batched(records, chunk_rows):
            batch_rows = [
                _with_formulas(rest_row(layout, infos, rec), rec, formulas, at) for rec in batch
            ]
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
        api=api,
    )
    _log.info(
        "%s: %s <- %s %s: %d records read (%d deleted), %d vanished, %d re-sync rows "
        "resolved (%.1f s)",
        mode,
        gold,
        "Bulk API" if api == "bulk" else "REST",
        "whole object" if result.full else f"{result.requested} records",
        result.read,
        result.deleted_read,
        result.marked_deleted,
        resolved,
        result.duration_s,
    )
    return result


def _layout(
    engine: LakeEngine, obj: ObjectSpec, registry_table: TableRef
) -> tuple[SilverLayout, Mapping[str, FieldInfo]]:
    """The object's columns: from its event schemas, or from the describes its polls stored
    (a polled object)."""
    if obj.kind == "polled":
        found = polled_layout(engine, obj)
        if found is None:
            return SilverLayout(obj.api_name, True, ()), {}
        return found
    registry = read_registry(engine, registry_table)
    return silver_layout(obj, registry), record_infos(obj, registry)


def _formula_fields(schema: T.StructType, fields: Sequence[str]) -> dict[str, LeafKind]:
    """The formula ``fields`` gold has columns for, with the kind each column is read as."""
    kinds: dict[str, LeafKind] = {}
    by_name = {f.name: f for f in schema.fields}
    for name in fields:
        column = by_name.get(name)
        if column is not None:
            kinds[name] = leaf_kind_of(column.dataType)
    return kinds


def _with_formulas(
    row: dict[str, Any], record: Mapping[str, Any], kinds: Mapping[str, LeafKind], at: datetime
) -> dict[str, Any]:
    if not kinds:
        return row
    for name, kind in kinds.items():
        row[name] = rest_value(kind, record.get(name), f"{name} of {row[ID]}")
    row[FORMULAS_REFRESHED_AT] = at
    return row


def _read(
    source: SnapshotSource,
    layout: SilverLayout,
    infos: Mapping[str, FieldInfo],
    ids: Sequence[str] | None,
    *,
    extra: Sequence[str] = (),
) -> tuple[Iterator[dict[str, Any]], str, int | None]:
    """The records to write, the API reading them, and their number when known."""
    if ids is None:
        whole = source.whole(snapshot_soql(layout, infos, extra=extra), layout.entity)
        return whole.records, whole.api, whole.total

    def named() -> Iterator[dict[str, Any]]:
        for chunk in _chunks(ids, ID_CHUNK):
            yield from source.named(snapshot_soql(layout, infos, chunk, extra=extra))

    return named(), "rest", len(ids)


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


def _change_event_object(conf: Conf, name: str, what: str, *, polled: bool = False) -> ObjectSpec:
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
    if obj.kind == "polled" and not polled:
        raise ConfigError(
            f"{what}: {name} is polled (kind polled): its first poll reads every record, and "
            "sfcdc resync re-reads what its re-sync rows name"
        )
    if obj.kind == "platform_event":
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
    rest: RecordReader | SnapshotSource,
    land: Callable[[], object],
    fetch_schema: Callable[[str], EventSchema] | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
) -> SnapshotResult:
    """``sfcdc bootstrap <name>``: record the stream position (``land()`` writes one when
    the topic has none), catch silver and gold up, read the whole object (over REST or the
    Bulk API, as ``rest`` decides) into gold and resolve the object's open re-sync rows.
    ``fetch_schema(topic)`` supplies the topic's current schema when no event registered
    one."""
    obj = _change_event_object(conf, name, "bootstrap")
    position = record_position(engine, conf, obj, land=land)
    _log.info("bootstrap: %s continues from %s", obj.api_name, _describe(position))
    _ensure_schema(engine, conf, obj, fetch_schema)
    _catch_up(engine, conf, obj)
    return refresh_from_rest(
        engine,
        conf,
        obj,
        rest=rest,
        mode="bootstrap",
        ids=None,
        position=position,
        now=now,
    )


def _stream(conf: Conf, name: str) -> CometdObjectSpec | None:
    """The Streaming API channel ``name`` names (its key ``streaming:/topic/X`` or its
    channel ``/topic/X``), or ``None`` when it names an object."""
    if not name.startswith(("streaming:", "/")):
        return None
    known = {s.key: s for s in conf.streams} | {s.channel: s for s in conf.streams}
    spec = known.get(name)
    if spec is None:
        listed = ", ".join(sorted(s.key for s in conf.streams)) or "none"
        raise ConfigError(
            f"resync: no Streaming API channel {name!r} in {conf.conf_dir} (configured: {listed})"
        )
    if not spec.enabled:
        raise ConfigError(f"resync: {spec.key} is disabled (enabled: false in its file)")
    if not spec.has_gold:
        raise ConfigError(
            f"resync: {spec.key} has no gold table to re-read records into: only PushTopic "
            "(/topic/...) and change event (/data/...) channels have records"
        )
    return spec


def rebootstrap_due(
    engine: LakeEngine, conf: Conf, names: Sequence[str] | None = None
) -> list[ObjectSpec]:
    """The objects (of ``names``, default every enabled one) whose ``replay.on_expired`` is
    ``rebootstrap`` and whose topic's stored position expired: an open ``replay_gap`` row in the
    re-sync table, and a checkpoint of the topic after that gap, so the stream has resumed at a
    position taken before the snapshot that is about to be read (the bootstrap hand-off)."""
    if not engine.exists(RESYNC_TABLE):
        return []
    candidates = [
        o
        for o in conf.enabled_objects()
        if o.kind == "change_events"
        and o.replay.on_expired == "rebootstrap"
        and (not names or o.api_name in names)
    ]
    if not candidates:
        return []
    open_gaps = [
        r
        for r in engine.read_arrow(RESYNC_TABLE, where=[("reason", "=", "replay_gap")]).to_pylist()
        if r["resolved_at"] is None
    ]
    if not open_gaps:
        return []
    store = CheckpointStore(engine, bronze_tables(conf.topics()))
    due = []
    for obj in candidates:
        gaps = [r["bronze_batch_id"] or 0 for r in open_gaps if r["object"] == obj.api_name]
        if not gaps:
            continue
        latest = store.latest(obj.topic)
        if latest is not None and latest.batch_id > max(gaps):
            due.append(obj)
        else:
            _log.info(
                "rebootstrap of %s waits until the stream has resumed after its replay gap",
                obj.api_name,
            )
    return due


def resync_objects(
    engine: LakeEngine,
    conf: Conf,
    names: Sequence[str] | None = None,
    *,
    rest: RecordReader | SnapshotSource,
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
) -> list[SnapshotResult]:
    """``sfcdc resync [<name>]``: for each object (default: every enabled change event and polled
    object, and every PushTopic and change event channel of the Streaming API, named
    ``streaming:<channel>``), catch silver and gold up, then re-read what its open re-sync
    rows list: the whole object when one of them has no record id (overflow, replay gap),
    else those records. A channel's records are read with its gold's fields (a PushTopic's:
    its query's, over every record of the object: the query's WHERE clause is not applied).
    Objects with nothing open are skipped."""
    targets: list[tuple[ObjectSpec, CometdObjectSpec | None]] = []
    if names:
        for name in names:
            stream = _stream(conf, name)
            if stream is None:
                targets.append((_change_event_object(conf, name, "resync", polled=True), None))
            else:
                targets.append((gold_object(stream), stream))
    else:
        targets = [
            (o, None) for o in conf.enabled_objects() if o.kind in ("change_events", "polled")
        ]
        targets += [(gold_object(s), s) for s in conf.enabled_streams() if s.has_gold]
    results = []
    for obj, stream in targets:
        layout: SilverLayout | None = None
        if stream is None:
            _catch_up(engine, conf, obj)
        else:
            run_cometd_silver(engine, conf, streams=[stream.key])
            run_cometd_gold(engine, conf, streams=[stream.key])
            plan = cometd_plan(stream, read_describes(engine).get(stream.key, []))
            if plan.layout is None or stream.api_name is None:
                _log.info("resync: %s has no stored describe yet; skipped", stream.key)
                continue
            layout = replace(plan.layout, entity=stream.api_name)
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
            refresh_from_rest(
                engine,
                conf,
                obj,
                rest=rest,
                mode="resync",
                ids=ids,
                layout=layout,
                now=now,
            )
        )
    return results
