"""Polls: an object without change events read by incremental queries, landed in bronze.

For each polled object that is due (its ``poll.every`` has passed since its last poll, or
always with ``force``), :func:`poll_objects`

1. reads where the object stands (:func:`~pipelines.polled.tables.poll_state`: the last
   committed poll and the newest ``SystemModstamp`` it read, the *watermark*);
2. asks for the object's describe (one REST request) and keeps it in the poll's commit when
   its fields changed;
3. reads, with ``queryAll`` (records in the Recycle Bin come back with ``IsDeleted``),
   ``SELECT Id, IsDeleted, SystemModstamp, <fields> FROM <Object> WHERE SystemModstamp >=
   <watermark - lookback>`` (the whole object on the first poll, and when the describe's fields
   differ from the last describe stored: a custom field's type conversion can empty the field
   on every record without moving a ``SystemModstamp``, a new field can start with values),
   over REST or a Bulk API 2.0 query job as ``poll.api`` says (``auto``: a ``COUNT()`` of the
   same condition first, Bulk from ``poll.bulk_threshold`` records on);
4. appends the records, the describe and a watermark row (the newest ``SystemModstamp`` read so
   far) to the object's bronze table in one commit with the application transaction
   ``(sfcdc.poll:<Object>, batch id)``.

Why the look-back: a transaction that saved a record before the last poll's query began but
committed after it has a ``SystemModstamp`` older than what that query saw; an app server whose
clock lags stamps records late. Reading from the watermark minus ``poll.lookback`` reads such a
record on the next poll. A record read twice under one describe has the same ``SystemModstamp``
and values, and gold recognises it as applied (:mod:`pipelines.gold.fold`). The watermark is a
``SystemModstamp``, Salesforce's own clock, never this machine's.

Exactly once: the records of a poll and the watermark past them are one Delta commit (see
:mod:`pipelines.polled.tables`). One poller per object at a time: ``sfcdc run``'s passes, ``sfcdc
poll`` and the bundle's ``sfcdc_poll`` job (one run at a time) do not overlap.

What a poll cannot see: a record hard-deleted from the Recycle Bin (``queryAll`` no longer
returns it) stays as gold last saw it; ``sfcdc reconcile`` finds and repairs it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from ingest.errors import ConfigError, RestError
from pipelines.engines.base import LakeEngine, TableRef, Txn
from pipelines.ops.table import CommitRecord
from pipelines.polled.layout import (
    MODSTAMP,
    describe_fingerprint,
    layout_of_describes,
    record_infos_of,
)
from pipelines.polled.tables import (
    POLLED_LAYOUT,
    POLLED_SCHEMA,
    TIMESTAMP,
    PollState,
    poll_app_id,
    poll_state,
    polled_table,
    stored_describes,
)
from pipelines.snapshot_read import PAYLOAD_SCHEMA, RecordReader, SnapshotSource
from pipelines.snapshot_rows import snapshot_soql
from pipelines.spec import Conf, ObjectSpec

__all__ = ["DescribingReader", "PollResult", "due", "poll_objects", "poll_soql", "select_polled"]

_log = logging.getLogger(__name__)
_UTC = timezone.utc


class DescribingReader(RecordReader, Protocol):
    """What a poll reads with: ``describe(object)`` and ``query_all(soql)`` (and, for
    ``poll.api: auto``, ``count(soql)``), as :class:`ingest.rest.RestClient` has them."""

    def describe(self, sobject: str) -> dict[str, Any]:
        """``sobjects/<Object>/describe``."""
        ...


@dataclass(frozen=True)
class PollResult:
    """One object's poll: the batch it committed (``None``: not due, nothing committed), the
    records it read (``deleted`` of them in the Recycle Bin), over ``api``, from ``since``
    (``None``: the whole object), the watermark after it, and whether it stored a new
    describe."""

    object: str
    table: TableRef
    due: bool
    batch_id: int | None = None
    version: int | None = None
    records: int = 0
    deleted: int = 0
    api: str | None = None
    since: datetime | None = None
    watermark: datetime | None = None
    described: bool = False
    duration_s: float = 0.0


def select_polled(conf: Conf, names: Sequence[str] | None) -> list[ObjectSpec]:
    """The enabled polled objects (of ``names``, if given; other names are skipped, so a list
    naming change event objects too can be passed)."""
    polled = conf.polled_objects()
    if names:
        wanted = set(names)
        return [o for o in polled if o.api_name in wanted]
    return list(polled)


def due(state: PollState, obj: ObjectSpec, now: datetime) -> bool:
    """Whether ``obj``'s next poll is due at ``now`` (never polled: it is)."""
    if state.batch_id is None or state.polled_at is None:
        return True
    last = state.polled_at if state.polled_at.tzinfo else state.polled_at.replace(tzinfo=_UTC)
    return now >= last + timedelta(seconds=obj.poll.every)


def _literal(moment: datetime) -> str:
    # SOQL dateTime literals have whole seconds: rounding down reads a little more, never less.
    return moment.astimezone(_UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def poll_soql(
    obj: ObjectSpec, describe: Mapping[str, Any], since: datetime | None
) -> tuple[str, str | None]:
    """The query of a poll of ``obj`` with ``describe`` reading from ``since`` (``None``: the
    whole object), and its condition."""
    layout = layout_of_describes(obj, [describe])
    infos = record_infos_of([describe])
    where = f"{MODSTAMP} >= {_literal(since)}" if since is not None else None
    return snapshot_soql(layout, infos, extra=[MODSTAMP], where=where), where


def _stamp(value: Any, where: str) -> datetime:
    text = str(value or "")
    try:
        # REST writes 2025-01-01T00:00:01.000+0000, Bulk 2025-01-01T00:00:01.000Z.
        return datetime.fromisoformat(text[:23]).replace(tzinfo=_UTC)
    except ValueError:
        raise RestError(
            f"{where}: expected a SystemModstamp such as 2025-01-01T00:00:01.000Z (got {value!r})"
        ) from None


def _stamps(texts: pa.Array, ids: pa.Array, entity: str) -> pa.Array:
    """The records' SystemModstamps (as :func:`_stamp` reads each) as UTC timestamps."""
    try:
        if texts.null_count == 0:
            moments = pc.utf8_slice_codeunits(texts, 0, 23).cast(pa.timestamp("us"))
            return moments.cast(TIMESTAMP)
    except pa.ArrowInvalid:
        pass
    # One does not read (or is missing): name the first such record.
    return pa.array(
        [
            _stamp(text, f"poll of {entity}, record {record_id}")
            for text, record_id in zip(texts.to_pylist(), ids.to_pylist(), strict=True)
        ],
        TIMESTAMP,
    )


def poll_objects(
    engine: LakeEngine,
    conf: Conf,
    names: Sequence[str] | None = None,
    *,
    rest: DescribingReader,
    bulk: RecordReader | None = None,
    force: bool = False,
    on_commit: Callable[[CommitRecord], object] | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(_UTC),
    clock: Callable[[], float] = time.perf_counter,
) -> list[PollResult]:
    """Poll the polled objects (of ``names``) that are due, or all of them with ``force``
    (steps 1 to 4 of the module docstring). ``rest`` describes and reads over REST (and
    counts, for ``poll.api: auto``), ``bulk`` reads with Bulk API 2.0 jobs (needed unless
    every object polls with ``api: rest``). ``on_commit`` receives each poll's commit
    record."""
    results = []
    for obj in select_polled(conf, names):
        state = poll_state(engine, obj)
        if not force and not due(state, obj, now()):
            results.append(PollResult(obj.api_name, polled_table(obj), due=False))
            continue
        results.append(
            _poll(
                engine, obj, state, rest=rest, bulk=bulk, on_commit=on_commit, now=now, clock=clock
            )
        )
    return results


def _poll(
    engine: LakeEngine,
    obj: ObjectSpec,
    state: PollState,
    *,
    rest: DescribingReader,
    bulk: RecordReader | None,
    on_commit: Callable[[CommitRecord], object] | None,
    now: Callable[[], datetime],
    clock: Callable[[], float],
) -> PollResult:
    started = clock()
    polled_at = now()
    entity = obj.api_name
    table = polled_table(obj)
    if obj.poll.api != "rest" and bulk is None:
        raise ConfigError(
            f"poll of {entity}: poll.api is {obj.poll.api} but no Bulk API reader was given"
        )
    describe = rest.describe(entity)
    fingerprint = describe_fingerprint(describe)
    stored = stored_describes(engine, obj)
    described = not stored or stored[-1].fingerprint != fingerprint
    since = None
    if state.watermark is not None and not described:
        mark = state.watermark if state.watermark.tzinfo else state.watermark.replace(tzinfo=_UTC)
        since = mark - timedelta(seconds=obj.poll.lookback)
    soql, where = poll_soql(obj, describe, since)
    source = SnapshotSource(
        rest, bulk=bulk, api=obj.poll.api, bulk_threshold=obj.poll.bulk_threshold, logger=_log
    )
    read = source.whole(soql, entity, where=where)
    batch = (state.batch_id or 0) + 1
    tables = list(read.payloads())
    records = pa.concat_tables(tables) if tables else PAYLOAD_SCHEMA.empty_table()
    ids = records.column("id").combine_chunks()
    without_id = pc.fill_null(pc.equal(ids, ""), True)
    if pc.any(without_id).as_py():
        first = pc.index(without_id, True).as_py()
        payload = records.column("payload")[first].as_py()
        raise RestError(f"poll of {entity}: a record without an Id ({payload[:200]})")
    stamps = _stamps(records.column("modstamp").combine_chunks(), ids, entity)
    deleted = records.column("is_deleted").combine_chunks()
    newest = pc.max(stamps).as_py()
    watermark = state.watermark
    if watermark is not None and watermark.tzinfo is None:
        watermark = watermark.replace(tzinfo=_UTC)
    if newest is not None and (watermark is None or newest > watermark):
        watermark = newest
    data = _commit_rows(
        describe=(fingerprint, describe) if described else None,
        ids=ids,
        stamps=stamps,
        deleted=deleted,
        payloads=records.column("payload"),
        fingerprint=fingerprint,
        api=read.api,
        polled_at=polled_at,
        batch=batch,
        watermark=watermark,
        since=since,
    )
    result = engine.append(
        table,
        data,
        txn=Txn(poll_app_id(obj), batch),
        metadata={"sfcdc.poll": f"{entity} batch {batch}: {len(ids)} records over {read.api}"},
        layout=POLLED_LAYOUT,
    )
    seconds = clock() - started
    if on_commit is not None and not result.skipped:
        on_commit(
            CommitRecord(
                layer="bronze",
                kind="commit",
                visible_at=now(),
                topic=obj.topic,
                object=entity,
                table=str(table),
                version=result.version,
                events=len(ids),
                rows=result.rows,
                newest_commit_at=newest,
                duration_seconds=seconds,
            )
        )
    count_deleted = pc.sum(deleted).as_py() or 0
    _log.info(
        "poll: %s <- %s batch %d: %d records (%d in the Recycle Bin) %s over %s, watermark %s "
        "(%.1f s)",
        table,
        entity,
        batch,
        len(ids),
        count_deleted,
        (
            f"saved since {_literal(since)}"
            if since is not None
            else "(whole object: its describe changed)"
            if stored and described
            else "(whole object)"
        ),
        "the Bulk API" if read.api == "bulk" else "REST",
        _literal(watermark) if watermark is not None else "none",
        seconds,
    )
    return PollResult(
        entity,
        table,
        due=True,
        batch_id=batch,
        version=result.version,
        records=len(ids),
        deleted=count_deleted,
        api=read.api,
        since=since,
        watermark=watermark,
        described=described,
        duration_s=seconds,
    )


def _commit_rows(
    *,
    describe: tuple[str, Mapping[str, Any]] | None,
    ids: pa.Array,
    stamps: pa.Array,
    deleted: pa.Array,
    payloads: pa.ChunkedArray,
    fingerprint: str,
    api: str,
    polled_at: datetime,
    batch: int,
    watermark: datetime | None,
    since: datetime | None,
) -> pa.Table:
    """One poll's rows (describe, records, watermark) as :data:`POLLED_SCHEMA`: the records'
    columns as they came (not copied), each other value repeated at C speed."""
    every_row = {"fingerprint": fingerprint, "api": api, "polled_at": polled_at, "batch_id": batch}
    pieces: list[tuple[str, int, dict[str, Any]]] = []
    if describe is not None:
        described = json.dumps(describe[1], separators=(",", ":"), ensure_ascii=False)
        pieces.append(("describe", 1, {"payload": described}))
    records = {"record_id": ids, "system_modstamp": stamps, "is_deleted": deleted}
    pieces.append(("record", len(ids), {**records, "payload": payloads}))
    pieces.append(("watermark", 1, {"watermark": watermark, "since": since, "records": len(ids)}))
    tables = []
    first = 0
    for kind, count, values in pieces:
        given = {"kind": kind, **every_row, **values}
        columns = []
        for f in POLLED_SCHEMA:
            value = given.get(f.name)
            if f.name == "batch_seq":
                value = pa.array(range(first, first + count), f.type)
            elif not isinstance(value, (pa.Array, pa.ChunkedArray)):
                value = pa.repeat(pa.scalar(value, f.type), count)
            columns.append(value)
        tables.append(pa.Table.from_arrays(columns, schema=POLLED_SCHEMA))
        first += count
    return pa.concat_tables(tables)
