"""The fold: silver changes + current gold rows -> complete post-image rows, with Salesforce's
semantics.

:func:`fold_table` folds a table of changes onto the gold rows (and tombstones) of their
records, exactly as described below, column by column (see "How" at the end);
:mod:`pipelines.gold.folding` runs it as the pure function both engines run.

Order. Each change has an order key: the values of ``sequence_by`` (by default commit
timestamp, commit number, transaction key, sequence number) followed by the stream order
(bronze batch id, batch position) as the final tie-break (the plan's
:attr:`~pipelines.gold.plan.FoldPlan.order_by`), encoded by
:func:`~pipelines.gold.order_keys.encode_order_key` into one string that sorts like the
tuple. Gold stores the key of the last change applied to a record (``_cdc_order_key``); a
change whose key is not greater, or that repeats the event id of the last change applied, is
ignored (late, replayed or duplicated delivery), so running a batch again, or replaying
events, never moves a record backwards.

Changes (see :mod:`pipelines.gold.resync` for the reasons a record is flagged):

- CREATE / UNDELETE: the full row (every body column its schema version has, nulls
  included); live; a re-sync flag is cleared, because the whole record is known again. A
  column whose field the change's schema version does not have (a field a later version
  dropped, or one an earlier version lacked) keeps the value the record held: a full image
  under the newer schema says nothing about a field it no longer carries, so every record
  keeps its last known value there (null for a record first seen under such a version), and
  the column is no longer maintained for records changed only after the drop.
- UPDATE: only the fields in ``changedFields``. A field also in ``nulledFields`` becomes null;
  a field in ``diffFields`` is rebuilt from the previous value (gold's, or the one an earlier
  change of the batch set) with :func:`ingest.decoding.apply_diff`, which checks the SHA-256;
  when that fails the previous value stays and the record is flagged. Any other changed field
  takes the event's value; a null in the event means "unchanged" for a field not in
  ``changedFields``. Compound children (``BillingAddress.City``) change one by one inside their
  struct (or flattened column); a struct whose children are all null is null. A change of a
  child of Account's person name (``Name.FirstName``) empties the string branch (``Name``).
  An UPDATE of a record gold has never seen writes what it carries and flags the record
  (``missing_base``); an UPDATE of a deleted record applies its values, keeps it deleted and
  flags it.
- Wildcard UPDATE (``001*``): applied to every record that exists at that point of the order
  (gold rows and records the batch created earlier), live or deleted; the job passes the whole
  gold table when a batch has one.
- DELETE: soft (``_cdc_is_deleted``, ``_cdc_deleted_at``; values kept) or hard (the row leaves
  gold, a tombstone keeps the delete so that a late change cannot bring the record back). An
  UPDATE never resurrects a deleted record; UNDELETE does.
- GAP_CREATE / GAP_UPDATE / GAP_DELETE / GAP_UNDELETE: the same change happened without
  values: a placeholder row (GAP_CREATE, or any gap of an unknown record), the deleted flag
  set or cleared (GAP_DELETE / GAP_UNDELETE), the record flagged, a re-sync row.
- GAP_OVERFLOW: a whole-object re-sync row; records are not touched.
- POLLED / POLLED_DELETED (rows of objects without change events, read by a poll: sfcdc's
  own change types, see :mod:`pipelines.polled`): the full row as for CREATE, and for a record
  the poll found in the Recycle Bin the delete as for DELETE (its values are kept, as
  Salesforce keeps them). Their commit timestamp is the record's ``SystemModstamp`` and their
  event id names the record, that time and the describe it was read with, so a record read
  again unchanged (the look-back window reads some records twice) is recognised as already
  applied, and one read again after its object's describe changed is applied.

Several changes of one record in a batch fold into one row: the MERGE then is a plain upsert
guarded by the order key (:func:`~pipelines.gold.object_run.merge_conditions`).

What the fold returns (:func:`~pipelines.gold.plan.fold_output_schema`): one row per record
the batch touched (and one per GAP_OVERFLOW, with a null ``Id``): the record's gold row after
the batch, plus ``_fold_*`` columns saying what to do with it (:mod:`pipelines.gold.folding`
takes it apart).

How. The changes are put in each record's order (a wildcard change becomes one change per
record the table holds), and which of them apply is found one position of every record at a
time. The state after each change is then, for every place a value lands (a column, or one
child of a struct column), the value of the last applied change at or before it that set that
place, else the start row's: the record's gold row, or its tombstone when that is newer. The
rows are built with Arrow ``take`` over those positions; only diffs (each needs the value
before it), flagged changes (their re-sync rows) and SCD2 versions (their tracked values) are
handled value by value, and only for the changes that need it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ingest.decoding import apply_diff
from ingest.errors import DiffError
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
    RESYNC_REASON,
    UPDATED_AT,
)
from pipelines.gold.order_keys import order_keys
from pipelines.gold.plan import (
    BATCH_ID,
    CHANGE_TYPE,
    CHANGED_FIELDS,
    COMMIT_NUMBER,
    COMMIT_TS,
    DIFF_FIELDS,
    EVENT_ID,
    FOLD_APPLIED,
    FOLD_CHANGES,
    FOLD_GOLD,
    FOLD_IGNORED,
    FOLD_RESOLVED_BY,
    FOLD_RESYNC,
    FOLD_SET,
    FOLD_TOMBSTONE,
    FOLD_VERSIONS,
    IS_WILDCARD,
    NULLED_FIELDS,
    REPLAY_ID,
    SCHEMA_ID,
    FoldPlan,
    Target,
)
from pipelines.gold.resync import Reason, resync_row
from pipelines.gold.scd2 import (
    SCD_CHANGE_TYPE,
    SCD_EVENT_ID,
    SCD_IS_CURRENT,
    SCD_IS_DELETED,
    SCD_ORDER_KEY,
    SCD_VALID_FROM,
    SCD_VALID_TO,
)
from pipelines.silver.columns import POLLED, POLLED_DELETED

__all__ = ["OVERFLOW", "fold_table", "null_if_empty"]

# A transaction changed more records than Salesforce reports: no record of its own.
OVERFLOW = "GAP_OVERFLOW"
_OVERFLOW_DETAIL = (
    "GAP_OVERFLOW: a transaction changed more records than Salesforce reports; re-sync the "
    "whole object"
)

# What a change is (its kind decides what it sets and flags).
(
    _UPDATE,  # an UPDATE of the record's own
    _WILD,  # a wildcard change (any change type): its fields, no flag of a missing base
    _FULL,  # CREATE, UNDELETE, POLLED
    _FULL_DELETED,  # POLLED_DELETED: the full image, then the delete
    _DELETE,
    _GAP_DELETE,
    _GAP_LIVE,  # GAP_CREATE, GAP_UNDELETE
    _GAP_UPDATE,
    _OTHER,  # a change type gold does not apply
    _OVERFLOWED,  # GAP_OVERFLOW: a re-sync row, nothing else
) = range(10)
_KIND_OF = {
    "UPDATE": _UPDATE,
    "CREATE": _FULL,
    "UNDELETE": _FULL,
    POLLED: _FULL,
    POLLED_DELETED: _FULL_DELETED,
    "DELETE": _DELETE,
    "GAP_DELETE": _GAP_DELETE,
    "GAP_CREATE": _GAP_LIVE,
    "GAP_UNDELETE": _GAP_LIVE,
    "GAP_UPDATE": _GAP_UPDATE,
    OVERFLOW: _OVERFLOWED,
}

# Where a value lands: (column, struct child or None).
_Place = tuple[str, str | None]
# Where a place's value comes from in one change: the change's value, null, or the result of
# the change's k-th diff.
_Source = tuple[str, int]
_EVENT: _Source = ("event", 0)
_NULL: _Source = ("null", 0)

# Separators of field names, and of a change's field lists, in one string (names hold neither).
_NAME_SEP, _PART_SEP = "\x1f", "\x1e"


# ------------------------------------------------------------------------------ helpers


def _chunk(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    return values


def _flags(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean Arrow result as NumPy, null meaning false."""
    return np.asarray(pc.fill_null(values, False).to_numpy(zero_copy_only=False), dtype=bool)


def _index(values: np.ndarray) -> pa.Array:
    return pa.array(values, pa.int64())


def _children(values: pa.Array) -> dict[str, pa.Array]:
    """A struct array's children, null where the struct is."""
    return {f.name: c for f, c in zip(values.type, values.flatten(), strict=True)}


def null_if_empty(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A struct array with every all-null struct made null (gold never holds a struct of
    nulls)."""
    values = _chunk(values)
    if values.type.num_fields == 0:
        return values
    children = values.flatten()  # a null struct's children read as null
    empty = pc.is_null(children[0])
    for child in children[1:]:
        empty = pc.and_(empty, pc.is_null(child))
    return pa.StructArray.from_arrays(children, fields=list(values.type), mask=empty)


def _column(table: pa.Table, name: str, t: pa.DataType) -> pa.Array:
    if name not in table.column_names:
        return pa.nulls(table.num_rows, t)
    return _chunk(table.column(name)).cast(t)


def _set_flags(kept: np.ndarray) -> pa.Array:
    """The FOLD_SET strings of a (records x body columns) matrix of kept values."""
    rows, width = kept.shape
    text = np.where(kept, ord("0"), ord("1")).astype(np.uint8)
    offsets = np.arange(rows + 1, dtype=np.int32) * np.int32(width)
    return pa.StringArray.from_buffers(
        rows, pa.py_buffer(offsets.tobytes()), pa.py_buffer(text.tobytes())
    )


def _pool(parts: Sequence[pa.Array], t: pa.DataType) -> pa.Array:
    """``parts`` one after the other, then one null."""
    return pa.concat_arrays([*(p.cast(t) for p in parts), pa.nulls(1, t)])


def _equal(a: pa.Array, b: pa.Array) -> np.ndarray:
    """Value equality, null equal to null."""
    both_null = _flags(pc.and_(pc.is_null(a), pc.is_null(b)))
    try:
        same = _flags(pc.equal(a, b))
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        same = np.array([x == y for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)])
    equal: np.ndarray = both_null | same
    return equal


# ---------------------------------------------------------------------- an UPDATE's fields


class _Fields:
    """What an UPDATE with one combination of field lists does (the same for every change
    with those lists): the source of each place it sets, in the end, and its steps in order
    -- ``("unknown", path)``, ``("shape", path)`` (a diff of a field that is not plain text)
    and ``("diff", path, column, k, before)`` (``before``: the source the change itself set
    the column to earlier, else ``None``)."""

    def __init__(
        self,
        plan: FoldPlan,
        changed: Sequence[str],
        nulled: Sequence[str],
        diffed: Sequence[str],
        known: dict[tuple[str, bool], dict[_Place, _Source] | None],
    ) -> None:
        null_set, diff_set = set(nulled), set(diffed)
        paths = [*changed]
        if null_set or diff_set:
            paths = list(dict.fromkeys([*changed, *sorted(null_set), *sorted(diff_set)]))
        self.writes: dict[_Place, _Source] = {}
        self.steps: list[tuple[Any, ...]] = []
        self.diffs = 0
        for path in paths:
            if path in diff_set:
                self._diff(plan, path)
                continue
            key = (path, path in null_set)
            if key not in known:
                known[key] = _writes(plan, path, _NULL if key[1] else _EVENT)
            writes = known[key]
            if writes is None:
                self.steps.append(("unknown", path))
            else:
                self.writes.update(writes)

    def _diff(self, plan: FoldPlan, path: str) -> None:
        targets = plan.targets.get(path)
        if targets is None:
            self.steps.append(("unknown", path))
            return
        if len(targets) != 1 or targets[0].child is not None:
            self.steps.append(("shape", path))
        else:
            column = targets[0].column
            before = self.writes.get((column, None))
            self.steps.append(("diff", path, column, self.diffs, before))
            self.writes[(column, None)] = ("diff", self.diffs)
            self.diffs += 1
        for column in plan.clears.get(path, ()):
            self.writes.update(_target_writes(plan, Target(column), _NULL))


def _target_writes(plan: FoldPlan, target: Target, source: _Source) -> dict[_Place, _Source]:
    children = plan.structs.get(target.column) if target.child is None else None
    if children:
        return {(target.column, child): source for child in children}
    return {(target.column, target.child): source}


def _writes(plan: FoldPlan, path: str, source: _Source) -> dict[_Place, _Source] | None:
    """Where an UPDATE's field (not a diff) lands, and what it sets there; ``None``: the
    field has no column."""
    targets = plan.targets.get(path)
    if targets is None:
        return None
    out: dict[_Place, _Source] = {}
    for t in targets:
        out.update(_target_writes(plan, t, source))
    for column in plan.clears.get(path, ()):
        out.update(_target_writes(plan, Target(column), _NULL))
    return out


def _field_sets(lists: pa.Array) -> tuple[pa.Array, np.ndarray]:
    joined = pc.binary_join(lists, _NAME_SEP)
    broken = _flags(pc.and_(pc.is_valid(lists), pc.is_null(joined)))
    return pc.fill_null(joined, ""), broken


def _field_lists(
    plan: FoldPlan, src: pa.Table, rows: np.ndarray
) -> tuple[list[_Fields], np.ndarray]:
    """The distinct field lists of the changes ``rows`` of ``src`` and each row's code into
    them."""
    picked = _index(rows)
    columns = [
        _chunk(src.column(c)).take(picked) for c in (CHANGED_FIELDS, NULLED_FIELDS, DIFF_FIELDS)
    ]
    joined = []
    broken = np.zeros(len(rows), dtype=bool)
    for lists in columns:
        text, bad = _field_sets(lists)
        joined.append(text)
        broken |= bad
    encoded = pc.dictionary_encode(pc.binary_join_element_wise(*joined, _PART_SEP))
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    out: list[_Fields] = []
    known: dict[tuple[str, bool], dict[_Place, _Source] | None] = {}
    for text in encoded.dictionary.to_pylist():
        changed, nulled, diffed = text.split(_PART_SEP)
        out.append(
            _Fields(
                plan,
                changed.split(_NAME_SEP) if changed else (),
                nulled.split(_NAME_SEP) if nulled else (),
                diffed.split(_NAME_SEP) if diffed else (),
                known,
            )
        )
    for i in np.flatnonzero(broken):  # a list holding a null name
        lists = [c[int(i)].as_py() or () for c in columns]
        codes[i] = len(out)
        out.append(_Fields(plan, lists[0], lists[1], lists[2], known))
    return out, codes


# ------------------------------------------------------------------------------ the fold


class _Changes:
    """The changes of the records in order: ``src`` rows (the batch's changes with a record
    id, then the wildcard changes), each record's changes next to each other, by order key,
    each event once."""

    def __init__(
        self,
        changes: pa.Table,
        keys: pa.Array,
        wildcards: pa.Table | None,
        wildcard_keys: pa.Array | None,
        *,
        state: Sequence[pa.Array],
    ) -> None:
        n_own = changes.num_rows
        own_ids = _chunk(changes.column(ID))
        if wildcards is not None and wildcards.num_rows:
            w = wildcards.num_rows
            self.src = pa.concat_tables(
                [changes, wildcards.select(changes.column_names).cast(changes.schema)]
            )
            src_keys = pa.concat_arrays([keys, _chunk(wildcard_keys).cast(keys.type)])
            everyone = pc.unique(
                pa.concat_arrays([own_ids, *(_chunk(i).cast(pa.string()) for i in state)])
            ).drop_null()
            r = len(everyone)
            ids = pa.concat_arrays([own_ids, pc.take(everyone, _index(np.repeat(np.arange(r), w)))])
            src_rows = np.concatenate([np.arange(n_own), n_own + np.tile(np.arange(w), r)]).astype(
                np.int64
            )
            seq = np.concatenate([np.arange(n_own), n_own + np.arange(r * w)]).astype(np.int64)
        else:
            self.src = changes
            src_keys = keys
            ids = own_ids
            src_rows = np.arange(n_own, dtype=np.int64)
            seq = src_rows
        self.src_keys = src_keys
        events = _chunk(self.src.column(EVENT_ID)).take(_index(src_rows))
        table = pa.table({"id": ids, "event": events, "seq": seq})
        # The same event twice for a record: the first delivery is kept.
        valid = len(events) - events.null_count
        if (valid and pc.count_distinct(events).as_py() < valid) or wildcards is not None:
            firsts = (
                table.filter(pc.is_valid(events))
                .group_by(["id", "event"])
                .aggregate([("seq", "min"), ("seq", "count")])
            )
            if len(firsts) and pc.max(firsts.column("seq_count")).as_py() > 1:
                keep = pc.or_(
                    pc.is_null(events), pc.is_in(table.column("seq"), firsts.column("seq_min"))
                )
                table = table.filter(keep)
                src_rows = src_rows[_flags(keep)]
        sort_keys = src_keys.take(_index(src_rows))
        order = pc.sort_indices(
            pa.table({"id": table.column("id"), "key": sort_keys, "seq": table.column("seq")}),
            sort_keys=[("id", "ascending"), ("key", "ascending"), ("seq", "ascending")],
        ).to_numpy()
        self.src_of = src_rows[order]  # per change: its src row
        self.keys = sort_keys.take(_index(order))
        sorted_ids = _chunk(table.column("id")).take(_index(order))
        n = len(order)
        first = np.ones(n, dtype=bool)
        if n > 1:
            first[1:] = ~_flags(pc.equal(sorted_ids[1:], sorted_ids[:-1]))
        self.n = n
        self.record = np.cumsum(first) - 1  # per change: its record
        self.starts = np.flatnonzero(first)
        self.ends = np.append(self.starts[1:], n)
        self.record_start = self.starts[self.record]  # per change: its record's first
        self.ids = sorted_ids.take(_index(self.starts))
        self.own = n_own
        self.own_ids = own_ids

    def before(self, changes: np.ndarray) -> np.ndarray:
        """Per change, how many of the marked ``changes`` (a mask) its record has before
        it."""
        counts: np.ndarray = np.cumsum(changes) - changes
        within: np.ndarray = counts - counts[self.record_start]
        return within

    def last_marked(self, marked: np.ndarray) -> np.ndarray:
        """Per change, the last marked change of its record at or before it (-1: none)."""
        at = np.maximum.accumulate(np.where(marked, np.arange(self.n), -1))
        at[at < self.record_start] = -1
        return at

    def last_of_record(self, marked: np.ndarray) -> np.ndarray:
        """Per record, its last marked change (-1: none)."""
        return self.last_marked(marked)[self.ends - 1] if self.n else np.zeros(0, np.int64)

    def first_of_record(self, marked: np.ndarray) -> np.ndarray:
        """Per record, its first marked change (-1: none)."""
        out = np.full(len(self.starts), -1, dtype=np.int64)
        at = np.flatnonzero(marked)
        if len(at):
            rec = self.record[at]
            firsts = np.ones(len(at), dtype=bool)
            firsts[1:] = rec[1:] != rec[:-1]
            out[rec[firsts]] = at[firsts]
        return out


def _actions(codes: np.ndarray) -> pa.Array:
    """MERGE actions from their codes (0: none, 1: upsert, 2: delete)."""
    index = codes.astype(np.int64) - 1
    return pa.array(["upsert", "delete"]).take(pa.array(index, pa.int64(), mask=index < 0))


def fold_table(
    changes: pa.Table,
    gold: pa.Table,
    stones: pa.Table,
    *,
    plan: FoldPlan,
    body: Sequence[str],
    schema: pa.Schema,
    wildcards: pa.Table | None = None,
    wildcard_keys: pa.Array | None = None,
) -> pa.Table:
    """The fold of a batch's ``changes`` (fold input rows of the change role, in stream
    order, no wildcard among them) onto the ``gold`` rows and ``stones`` (tombstones) of their
    records: one row of ``schema`` (:func:`~pipelines.gold.plan.fold_output_schema`) per
    record, by ``Id``, and one for the changes without a record id. ``wildcards`` (rows like
    ``changes``, with their order keys ``wildcard_keys``) apply to every record of the three
    tables; ``gold`` must then hold the whole table."""
    wild = _flags(_chunk(changes.column(IS_WILDCARD))) if changes.num_rows else np.zeros(0, bool)
    if wild.any():
        raise ValueError(
            f"{plan.object_name}: wildcard change "
            f"{changes.column(EVENT_ID)[int(np.flatnonzero(wild)[0])].as_py()} reached "
            "fold_table among the changes; pass the batch's wildcard changes with "
            "fold_rows(wildcards=...)"
        )
    ids = changes.column(ID)
    without = changes.filter(pc.is_null(ids)) if ids.null_count else None
    if without is not None:
        changes = changes.filter(pc.is_valid(ids))
    if wildcards is not None and wildcards.num_rows == 0:
        wildcards = None
    parts = []
    if changes.num_rows or wildcards is not None:
        keys = _chunk(order_keys(changes, plan.order_by)).cast(pa.string())
        state = [gold.column(ID), stones.column(ID)]
        folded = _Fold(
            plan,
            body,
            schema,
            _Changes(changes, keys, wildcards, wildcard_keys, state=state),
            gold=gold,
            stones=stones,
        ).table()
        if folded.num_rows:
            parts.append(folded)
    if without is not None:
        parts.append(_without_id(plan, without, schema))
    if not parts:
        return schema.empty_table()
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts)


def _without_id(plan: FoldPlan, changes: pa.Table, schema: pa.Schema) -> pa.Table:
    """The row of the changes without a record id (a GAP_OVERFLOW, or a change that names no
    record): their whole-object re-sync rows."""
    keys = order_keys(changes, plan.order_by).to_pylist()
    rows = changes.select([CHANGE_TYPE, COMMIT_TS, REPLAY_ID, EVENT_ID, BATCH_ID]).to_pylist()
    seen: set[Any] = set()
    keyed = []
    for key, row in zip(keys, rows, strict=True):
        event = row[EVENT_ID]
        if event is not None:
            if event in seen:
                continue
            seen.add(event)
        keyed.append((key, row))
    keyed.sort(key=lambda kc: kc[0])
    resync = []
    for _, row in keyed:
        change_type = row[CHANGE_TYPE]
        if change_type == OVERFLOW:
            reason: Reason = "overflow"
            detail = _OVERFLOW_DETAIL
        else:
            reason, detail = "unknown_field", f"a {change_type} change without a record id"
        resync.append(_resync(plan, None, row, reason, detail))
    out: dict[str, Any] = dict.fromkeys(schema.names)
    out.update({FOLD_RESYNC: resync, FOLD_VERSIONS: [], FOLD_CHANGES: changes.num_rows})
    out.update({FOLD_APPLIED: 0, FOLD_IGNORED: 0})
    return pa.Table.from_pylist([out], schema=schema)


def _resync(
    plan: FoldPlan,
    record_id: str | None,
    change: Mapping[str, Any],
    reason: Reason,
    detail: str,
    *,
    cause: Sequence[object] = (),
) -> dict[str, Any]:
    return resync_row(
        object_name=plan.object_name,
        record_id=record_id,
        reason=reason,
        change_type=change.get(CHANGE_TYPE),
        detail=detail,
        commit_timestamp=change.get(COMMIT_TS),
        replay_id=change.get(REPLAY_ID),
        event_id=change.get(EVENT_ID),
        bronze_batch_id=change.get(BATCH_ID),
        detected_at=plan.processed_at,
        cause=cause,
    )


_DELETE_SETTERS = (_FULL, _FULL_DELETED, _DELETE, _GAP_DELETE, _GAP_LIVE)
_DELETING = (_FULL_DELETED, _DELETE, _GAP_DELETE)
_GAP_DETAIL = "{}: Salesforce sent the change without its values; re-read the record"


class _Fold:
    """One fold of :func:`fold_table` (the records of ``changes``)."""

    def __init__(
        self,
        plan: FoldPlan,
        body: Sequence[str],
        schema: pa.Schema,
        changes: _Changes,
        *,
        gold: pa.Table,
        stones: pa.Table,
    ) -> None:
        self.plan = plan
        self.body = body
        self.schema = schema
        self.ch = changes
        self.gold = gold
        self.stones = stones
        self.by_name = {f.name: f for f in schema}
        self._cast: dict[str, tuple[pa.Array, pa.Array]] = {}
        self._split: dict[_Place, tuple[dict[str, pa.Array], dict[str, pa.Array]]] = {}

    # -- the start rows ----------------------------------------------------------------------

    def _start(self) -> None:
        ch, gold, stones = self.ch, self.gold, self.stones
        self.n_g, self.n_s = gold.num_rows, stones.num_rows

        def at(table: pa.Table) -> np.ndarray:
            if table.num_rows == 0:
                return np.full(len(ch.ids), -1, dtype=np.int64)
            found = pc.index_in(ch.ids, value_set=_chunk(table.column(ID)).cast(pa.string()))
            return np.asarray(pc.fill_null(found, -1).to_numpy(zero_copy_only=False), np.int64)

        gi, si = at(gold), at(stones)
        gold_key = self._take_state(_column(gold, ORDER_KEY, pa.string()), gi)
        stone_key = self._take_state(_column(stones, ORDER_KEY, pa.string()), si)
        newer = _flags(pc.greater(pc.fill_null(stone_key, ""), pc.fill_null(gold_key, "")))
        use_stone = (si >= 0) & ((gi < 0) | newer)
        self.gi, self.si = gi, si
        self.gold_key, self.stone_key = gold_key, stone_key
        self.start_gold = (gi >= 0) & ~use_stone
        self.start_exists = (gi >= 0) | (si >= 0)
        # Per record: its start row in [gold rows | tombstones] (-1: none).
        self.start_row = np.where(self.start_gold, gi, np.where(use_stone, self.n_g + si, -1))
        self.start_deleted = (
            np.where(use_stone, True, _flags(self._start_control(DELETED, pa.bool_())))
            & self.start_exists
        )
        self.start_needs = _flags(self._start_control(NEEDS_RESYNC, pa.bool_()))

    @staticmethod
    def _take_state(values: pa.Array, index: np.ndarray) -> pa.Array:
        pool = pa.concat_arrays([values, pa.nulls(1, values.type)])
        return pool.take(_index(np.where(index >= 0, index, len(values))))

    def _control_pool(self, name: str, t: pa.DataType) -> pa.Array:
        """[gold rows | tombstones | null] of a control column."""
        return _pool([_column(self.gold, name, t), _column(self.stones, name, t)], t)

    def _start_control(self, name: str, t: pa.DataType) -> pa.Array:
        pool = self._control_pool(name, t)
        return pool.take(_index(np.where(self.start_row >= 0, self.start_row, len(pool) - 1)))

    # -- which changes apply -----------------------------------------------------------------

    def _kinds(self) -> None:
        ch = self.ch
        src = ch.src
        encoded = pc.dictionary_encode(_chunk(src.column(CHANGE_TYPE)))
        table = np.array(
            [_KIND_OF.get(t, _OTHER) for t in encoded.dictionary.to_pylist()] + [_OTHER],
            dtype=np.int64,
        )
        codes = np.asarray(
            pc.fill_null(encoded.indices, len(table) - 1).to_numpy(zero_copy_only=False),
            np.int64,
        )
        kind_src = table[codes]
        wild = np.arange(src.num_rows) >= ch.own
        kind_src[wild & (kind_src != _OVERFLOWED)] = _WILD
        self.kind_src = kind_src
        self.kind = kind_src[ch.src_of]

    def _applied(self) -> None:
        ch = self.ch
        n, r = ch.n, len(ch.ids)
        # A change is ignored when its key is not above the record's (the start row's, or
        # the last applied change's) or it repeats the start row's last event (the changes of
        # a record hold each event once). Keys ascend within a record: one is above an earlier
        # change's when they differ.
        record = ch.record
        start_key = self._start_control(ORDER_KEY, pa.string()).take(_index(record))
        under_start = _flags(pc.less_equal(ch.keys, start_key))
        events = _chunk(ch.src.column(EVENT_ID)).take(_index(ch.src_of))
        start_event = self._start_control(LAST_EVENT_ID, pa.string()).take(_index(record))
        under_start |= _flags(pc.equal(events, start_event))
        step = np.ones(n, dtype=bool)
        if n > 1:
            step[1:] = ~_flags(pc.equal(ch.keys[1:], ch.keys[:-1]))
        rank = np.cumsum(step)
        cur = np.full(r, -1, dtype=np.int64)  # the rank of the last applied key (-1: start's)
        exists = self.start_exists.copy()
        applied = np.zeros(n, dtype=bool)
        counted = self.kind != _OVERFLOWED
        wild = self.kind == _WILD
        lengths = ch.ends - ch.starts
        active = np.arange(r)
        for j in range(int(lengths.max()) if r else 0):
            active = active[lengths[active] > j]
            at = ch.starts[active] + j
            k, ex, last = rank[at], exists[active], cur[active]
            ignored = ex & np.where(last < 0, under_start[at], k == last)
            ok = counted[at] & ~ignored & (~wild[at] | ex)
            applied[at] = ok
            taken = active[ok]
            cur[taken] = k[ok]
            exists[taken] = True
        self.applied = applied
        self.n_applied = np.bincount(ch.record[applied], minlength=r)
        self.n_ignored = np.bincount(ch.record[counted & ~applied], minlength=r)
        self.exists_before = self.start_exists[ch.record] | (ch.before(applied) > 0)
        # The deleted flag: after each change, and before it.
        setting = applied & np.isin(self.kind, _DELETE_SETTERS)
        self.deleting = np.isin(self.kind, _DELETING)
        last = ch.last_marked(setting)
        after = np.where(
            last >= 0, self.deleting[np.maximum(last, 0)], self.start_deleted[ch.record]
        )
        before = np.empty(n, dtype=bool)
        if n:
            before[1:] = after[:-1]
            before[ch.starts] = self.start_deleted
        self.deleted_after, self.deleted_before = after, before
        self.deleted_setter = setting
        self.full = applied & np.isin(self.kind, (_FULL, _FULL_DELETED))

    # -- what each change sets ---------------------------------------------------------------

    def _places(self) -> None:
        """Per place: what each change sets it to (0 nothing, 1 the change's value, 2 null,
        3 a diff's result)."""
        ch, plan = self.ch, self.plan
        updates = np.flatnonzero(np.isin(self.kind_src, (_UPDATE, _WILD)))
        fields, codes = _field_lists(plan, ch.src, updates)
        code_src = np.full(ch.src.num_rows, len(fields), dtype=np.int64)
        code_src[updates] = codes
        self.fields = fields
        self.code = code_src[ch.src_of]
        updating = self.applied & np.isin(self.kind, (_UPDATE, _WILD))
        self.updating = updating
        absent_by_schema: dict[str, set[str]] = {k: set(v) for k, v in plan.absent.items()}
        schema_ids = _chunk(ch.src.column(SCHEMA_ID))
        full_src = np.isin(self.kind_src, (_FULL, _FULL_DELETED))
        # Per place, what each field-list code sets it to (the last code: none).
        how = {"event": 1, "null": 2, "diff": 3}
        lookups: dict[_Place, np.ndarray] = {}
        for c, f in enumerate(fields):
            for place, source in f.writes.items():
                if place not in lookups:
                    lookups[place] = np.zeros(len(fields) + 1, dtype=np.int8)
                lookups[place][c] = how[source[0]]
        code = np.where(updating, self.code, len(fields))
        nothing = np.zeros(ch.n, dtype=np.int8)
        self.places: dict[_Place, np.ndarray] = {}
        for column in self.body:
            lacking = [sid for sid, cols in absent_by_schema.items() if column in cols]
            full_sets = full_src
            if lacking:
                full_sets = full_src & ~_flags(pc.is_in(schema_ids, value_set=pa.array(lacking)))
            full_e = self.full & full_sets[ch.src_of]
            children = plan.structs.get(column)
            for child in children or (None,):
                place = (column, child)
                lookup = lookups.get(place)
                sets = nothing if lookup is None else lookup[code]
                self.places[place] = np.where(full_e, np.int8(1), sets)

    # -- flags and diffs, change by change ---------------------------------------------------

    def _value(self, column: str, row: int) -> Any:
        return self.ch.src.column(column)[row].as_py()

    def _flagged(self) -> None:
        """The re-sync rows, and the diffs' results, for the changes that have them."""
        ch, plan, kind, applied = self.ch, self.plan, self.kind, self.applied
        fields = self.fields
        steps = np.array([bool(f.steps) for f in fields] + [False])
        missing = applied & (kind == _UPDATE) & ~self.exists_before
        of_deleted = applied & (kind == _UPDATE) & self.exists_before & self.deleted_before
        missing_delete = applied & (kind == _DELETE) & ~self.exists_before
        if plan.deletes != "soft":
            missing_delete[:] = False
        special = (
            missing
            | of_deleted
            | missing_delete
            | (applied & np.isin(kind, (_GAP_DELETE, _GAP_LIVE, _GAP_UPDATE, _OTHER)))
            | (self.updating & steps[self.code])
            | (kind == _OVERFLOWED)
        )
        self.entries: list[tuple[int, dict[str, Any]]] = []  # (change, re-sync row)
        self.marks: list[tuple[int, str]] = []  # (change, reason) of the flags that mark
        self.diff_results: dict[_Place, list[Any]] = {}
        self.diff_at: dict[_Place, dict[int, int]] = {}
        at = np.flatnonzero(special)
        if not len(at):
            return
        header = ch.src.select([CHANGE_TYPE, COMMIT_TS, REPLAY_ID, EVENT_ID, BATCH_ID])
        rows = header.take(_index(ch.src_of[at])).to_pylist()
        setters: dict[_Place, np.ndarray] = {}
        for i, change in zip(at.tolist(), rows, strict=True):
            rid = ch.ids[int(ch.record[i])].as_py()

            def flag(
                reason: Reason,
                detail: str,
                cause: Sequence[object] = (),
                *,
                mark: bool = True,
                at: int = i,
                record_id: str | None = rid,
                header: Mapping[str, Any] = change,
            ) -> None:
                self.entries.append(
                    (at, _resync(plan, record_id, header, reason, detail, cause=cause))
                )
                if mark:
                    self.marks.append((at, reason))

            k = kind[i]
            if k == _OVERFLOWED:
                flag("overflow", _OVERFLOW_DETAIL, mark=False)
                continue
            if missing[i]:
                flag("missing_base", "an UPDATE of a record gold has never seen")
            elif of_deleted[i]:
                flag("update_of_deleted", "an UPDATE of a deleted record")
            elif missing_delete[i]:
                flag("missing_base", "a DELETE of a record gold has never seen")
            elif k in (_GAP_DELETE, _GAP_LIVE, _GAP_UPDATE):
                flag("gap", _GAP_DETAIL.format(change[CHANGE_TYPE]))
            elif k == _OTHER:
                flag(
                    "unsupported_change_type",
                    f"change type {change[CHANGE_TYPE]!r} is not one gold applies; the record "
                    "is kept as it was",
                )
            if not self.updating[i]:
                continue
            own: dict[int, Any] = {}  # this change's diff results
            for step in fields[self.code[i]].steps:
                if step[0] == "unknown":
                    path = step[1]
                    flag(
                        "unknown_field",
                        f"changed field {path!r} has no column in the object's silver table",
                        (path,),
                    )
                elif step[0] == "shape":
                    path = step[1]
                    flag(
                        "diff_failed",
                        f"{path}: a diff-encoded value must be a plain text field",
                        (path,),
                    )
                else:
                    _, path, column, number, before = step
                    place = (column, None)
                    if before is not None:
                        previous = self._source_value(before, column, i, own)
                    else:
                        if place not in setters:
                            setters[place] = np.flatnonzero(self.places[place])
                        previous = self._before(place, setters[place], i)
                    try:
                        result = apply_diff(previous, str(self._value(column, ch.src_of[i]) or ""))
                    except DiffError as exc:
                        reason: Reason = "diff_missing_base" if previous is None else "diff_failed"
                        flag(reason, f"{path}: {exc}", (path,))
                        result = previous  # the value stays as it was
                    own[number] = result
                    if fields[self.code[i]].writes.get(place) == ("diff", number):
                        results = self.diff_results.setdefault(place, [])
                        self.diff_at.setdefault(place, {})[i] = len(results)
                        results.append(result)

    def _source_value(self, source: _Source, column: str, i: int, own: Mapping[int, Any]) -> Any:
        if source[0] == "event":
            return self._value(column, self.ch.src_of[i])
        if source[0] == "diff":
            return own[source[1]]
        return None

    def _before(self, place: _Place, setters: np.ndarray, i: int) -> Any:
        """The value of a plain column just before change ``i``."""
        ch = self.ch
        pos = int(np.searchsorted(setters, i)) - 1
        record = int(ch.record[i])
        column = place[0]
        if pos >= 0 and setters[pos] >= ch.starts[record]:
            j = int(setters[pos])
            how = self.places[place][j]
            if how == 1:
                return self._value(column, ch.src_of[j])
            if how == 3:
                return self.diff_results[place][self.diff_at[place][j]]
            return None
        if self.start_gold[record]:
            return self.gold.column(column)[int(self.gi[record])].as_py()
        return None

    # -- the rows ----------------------------------------------------------------------------

    def _sources(self, place: _Place, at: np.ndarray, record: np.ndarray) -> np.ndarray:
        """Indices into the place's pool ([gold rows | changes | null | diff results]) of its
        value after the changes ``at`` (-1: none of the record's changes set it) of
        ``record``."""
        n_g, n_src = self.n_g, self.ch.src.num_rows
        null = n_g + n_src
        how = self.places[place][np.maximum(at, 0)]
        out = np.where(how == 1, n_g + self.ch.src_of[np.maximum(at, 0)], null)
        if how.any() and place in self.diff_at:
            diff_at = self.diff_at[place]
            for n, j in enumerate(at.tolist()):
                if j >= 0 and how[n] == 3:
                    out[n] = null + 1 + diff_at[j]
        start = np.where(self.start_gold[record], self.gi[record], null)
        sources: np.ndarray = np.where(at >= 0, out, start)
        return sources

    def _columns(self, column: str) -> tuple[pa.Array, pa.Array]:
        """A body column of the gold rows and of the changes, in the output's type."""
        if column not in self._cast:
            t = self.by_name[column].type
            self._cast[column] = (_column(self.gold, column, t), _column(self.ch.src, column, t))
        return self._cast[column]

    def _place_pool(self, place: _Place, t: pa.DataType) -> pa.Array:
        column, child = place
        gold, src = self._columns(column)
        if child is not None:
            key = (column, "")
            if key not in self._split:
                self._split[key] = (_children(gold), _children(src))
            gold_children, src_children = self._split[key]
            gold, src = gold_children[child], src_children[child]
        diffs = pa.array(self.diff_results.get(place, []), t)
        return pa.concat_arrays([gold.cast(t), src.cast(t), pa.nulls(1, t), diffs])

    def _body(self, records: np.ndarray) -> dict[str, pa.Array]:
        """The body columns of ``records`` after their changes."""
        ch = self.ch
        out: dict[str, pa.Array] = {}
        ends = ch.ends[records] - 1
        from_gold = self.start_gold[records]
        # Per record and column: the record keeps its gold row's value (FOLD_SET "0").
        self.kept = np.zeros((len(records), len(self.body)), dtype=bool)
        for number, column in enumerate(self.body):
            t = self.by_name[column].type
            children = self.plan.structs.get(column)
            first = (column, children[0] if children else None)
            if not children or all(
                np.array_equal(self.places[(column, c)], self.places[first]) for c in children
            ):
                # Set whole by every change that sets it: one place.
                sets = self.places[first]
                at = ch.last_marked(sets != 0)[ends]
                self.kept[:, number] = from_gold & (at < 0)
                if not children:
                    pool = self._place_pool(first, t)
                    out[column] = pool.take(_index(self._sources(first, at, records)))
                    continue
                gold, src = self._columns(column)
                pool = pa.concat_arrays([gold, src, pa.nulls(1, t)])
                value = pool.take(_index(self._sources(first, at, records)))
                if (at >= 0).any():
                    # A struct a change set: null when all its children are.
                    value = pc.if_else(pa.array(at >= 0), null_if_empty(value), value)
                out[column] = value
                continue
            parts = []
            untouched = np.ones(len(records), dtype=bool)
            for child in children:
                place = (column, child)
                at = ch.last_marked(self.places[place] != 0)[ends]
                untouched &= at < 0
                child_type = t.field(child).type
                pool = self._place_pool(place, child_type)
                parts.append(pool.take(_index(self._sources(place, at, records))))
            self.kept[:, number] = from_gold & untouched
            value = null_if_empty(pa.StructArray.from_arrays(parts, fields=list(t)))
            if untouched.any():
                # A column no change of the record set keeps its start value as it was.
                start = self._take_state(
                    self._columns(column)[0],
                    np.where(self.start_gold[records], self.gi[records], -1),
                )
                value = pc.if_else(pa.array(untouched), start, value)
            out[column] = value
        return out

    def table(self) -> pa.Table:
        self._start()
        self._kinds()
        self._applied()
        self._places()
        self._flagged()
        ch, plan, schema, by_name = self.ch, self.plan, self.schema, self.by_name
        r = len(ch.ids)
        full, applied = self.full, self.applied
        # Re-sync state after the last full image.
        last_full = ch.last_of_record(full)
        resync_count = np.zeros(r, dtype=np.int64)
        for i, _ in self.entries:
            resync_count[ch.record[i]] += 1
        exists = self.start_exists | (self.n_applied > 0)
        own = np.zeros(r, dtype=np.int64)
        if len(ch.own_ids):
            of = pc.index_in(ch.own_ids, value_set=ch.ids).to_numpy(zero_copy_only=False)
            own = np.bincount(np.asarray(of, np.int64), minlength=r)
        emit = (exists | (resync_count > 0)) & ~(
            (self.n_applied == 0) & (resync_count == 0) & (own == 0)
        )
        records = np.flatnonzero(emit)
        m = len(records)
        arrays: dict[str, pa.Array] = {ID: ch.ids.take(_index(records))}
        arrays.update(self._body(records))
        # Stamps of the last applied change.
        last = ch.last_of_record(applied)[records]
        n_g, n_s = self.n_g, self.n_s
        start = self.start_row[records]
        start_or_null = np.where(start >= 0, start, n_g + n_s + ch.src.num_rows)
        stamp_index = _index(
            np.where(last >= 0, n_g + n_s + ch.src_of[np.maximum(last, 0)], start_or_null)
        )
        for name, source in (
            (LAST_CHANGE_TYPE, CHANGE_TYPE),
            (LAST_COMMIT_TS, COMMIT_TS),
            (LAST_COMMIT_NUMBER, COMMIT_NUMBER),
            (LAST_REPLAY_ID, REPLAY_ID),
            (LAST_EVENT_ID, EVENT_ID),
        ):
            t = by_name[name].type
            pool = _pool(
                [
                    _column(self.gold, name, t),
                    _column(self.stones, name, t),
                    _column(ch.src, source, t),
                ],
                t,
            )
            arrays[name] = pool.take(stamp_index)
        t = by_name[ORDER_KEY].type
        pool = _pool(
            [_column(self.gold, ORDER_KEY, t), _column(self.stones, ORDER_KEY, t), ch.keys.cast(t)],
            t,
        )
        key_index = np.where(
            last >= 0, n_g + n_s + last, np.where(start >= 0, start, n_g + n_s + ch.n)
        )
        arrays[ORDER_KEY] = pool.take(_index(key_index))
        t = by_name[UPDATED_AT].type
        arrays[UPDATED_AT] = pc.if_else(
            pa.array(last >= 0),
            pa.scalar(plan.processed_at, t),
            self._control_pool(UPDATED_AT, t).take(
                _index(start_or_null - ch.src.num_rows * (start < 0))
            ),
        )
        ends = ch.ends[records] - 1
        deleted = self.deleted_after[ends]
        arrays[DELETED] = pa.array(deleted)
        t = by_name[DELETED_AT].type
        set_at = ch.last_marked(self.deleted_setter)[ends]
        pool = _pool(
            [
                _column(self.gold, DELETED_AT, t),
                _column(self.stones, DELETED_AT, t),
                _column(ch.src, COMMIT_TS, t),
            ],
            t,
        )
        null = n_g + n_s + ch.src.num_rows
        set_index = np.where(
            self.deleting[np.maximum(set_at, 0)], n_g + n_s + ch.src_of[np.maximum(set_at, 0)], null
        )
        arrays[DELETED_AT] = pool.take(_index(np.where(set_at >= 0, set_index, start_or_null)))
        # Flags: set by a flag after the last full image, cleared by a full image.
        lf = last_full[records]
        flagged_after = np.zeros(r, dtype=bool)
        reasons: dict[int, list[str]] = {}
        for i, reason in self.marks:
            rec = int(ch.record[i])
            if i > last_full[rec]:
                flagged_after[rec] = True
                reasons.setdefault(rec, []).append(reason)
        start_needs = self.start_needs & self.start_exists
        arrays[NEEDS_RESYNC] = pa.array(
            np.where(flagged_after[records], True, np.where(lf >= 0, False, start_needs[records]))
        )
        start_reason = self._start_control(RESYNC_REASON, by_name[RESYNC_REASON].type)
        reason_values = pc.if_else(
            pa.array(lf >= 0), pa.scalar(None, pa.string()), start_reason.take(_index(records))
        )
        if reasons:
            texts = reason_values.to_pylist()
            slot = np.full(r, -1, dtype=np.int64)
            slot[records] = np.arange(m)
            for rec, found in reasons.items():
                if slot[rec] < 0:
                    continue
                base = texts[slot[rec]] if last_full[rec] < 0 else None
                listed = [x for x in (base or "").split(",") if x]
                for x in found:
                    if x not in listed:
                        listed.append(x)
                texts[slot[rec]] = ",".join(listed)
            reason_values = pa.array(texts, pa.string())
        arrays[RESYNC_REASON] = reason_values
        self._actions(arrays, records, deleted)
        arrays[FOLD_RESYNC] = self._resync_lists(records, full)
        arrays[FOLD_VERSIONS] = self._versions(records)
        first_full = ch.first_of_record(full)[records]
        events = _chunk(ch.src.column(EVENT_ID))
        resolving = start_needs[records] & (first_full >= 0)
        arrays[FOLD_RESOLVED_BY] = self._take_state(
            events, np.where(resolving, ch.src_of[np.maximum(first_full, 0)], -1)
        )
        arrays[FOLD_CHANGES] = pa.array(own[records], pa.int32())
        arrays[FOLD_APPLIED] = pa.array(self.n_applied[records], pa.int32())
        arrays[FOLD_IGNORED] = pa.array(self.n_ignored[records], pa.int32())
        arrays[FOLD_SET] = _set_flags(self.kept)
        missing = ~exists[records]
        columns = []
        for f in schema:
            values = arrays[f.name].cast(f.type)
            if missing.any() and f.name != ID and not f.name.startswith("_fold_"):
                values = pc.if_else(pa.array(missing), pa.scalar(None, f.type), values)
            columns.append(values)
        return pa.Table.from_arrays(columns, schema=schema)

    def _actions(
        self, arrays: dict[str, pa.Array], records: np.ndarray, deleted: np.ndarray
    ) -> None:
        """What the MERGEs into gold and the tombstones do with each row."""
        gi, si = self.gi[records], self.si[records]
        key = arrays[ORDER_KEY].cast(pa.string())
        gold_key = self.gold_key.take(_index(records))
        stone_key = self.stone_key.take(_index(records))
        exists = (self.start_exists | (self.n_applied > 0))[records]

        def differ(a: pa.Array, b: pa.Array) -> np.ndarray:
            return ~_equal(a, b)

        differs = (gi < 0) | differ(key, gold_key)
        # 0: nothing, 1: upsert, 2: delete.
        upsert, delete = np.int8(1), np.int8(2)
        none = np.int8(0)
        gold = np.where(differs, upsert, none)
        stones = np.where(si >= 0, delete, none)
        if self.plan.deletes == "hard":
            gold = np.where(deleted, np.where(gi >= 0, delete, none), gold)
            stone_new = (si < 0) | differ(stone_key, key)
            stones = np.where(deleted, np.where(stone_new, upsert, none), stones)
        arrays[FOLD_GOLD] = _actions(np.where(exists, gold, none))
        arrays[FOLD_TOMBSTONE] = _actions(np.where(exists, stones, none))

    def _resync_lists(self, records: np.ndarray, full: np.ndarray) -> pa.Array:
        t = self.by_name[FOLD_RESYNC].type
        m = len(records)
        if not self.entries:
            return pa.ListArray.from_arrays(
                pa.array(np.zeros(m + 1, dtype=np.int32)), pa.array([], t.value_type)
            ).cast(t)
        ch = self.ch
        n = ch.n
        # The first full image after each change resolves the re-sync rows flagged before it.
        after = np.where(full, np.arange(n), n)
        next_full = np.minimum.accumulate(after[::-1])[::-1]
        events = _chunk(ch.src.column(EVENT_ID))
        slot = np.full(len(ch.ids), -1, dtype=np.int64)
        slot[records] = np.arange(m)
        by_slot: list[list[dict[str, Any]]] = [[] for _ in range(m)]
        for i, entry in self.entries:
            rec = int(ch.record[i])
            if slot[rec] < 0:
                continue
            j = int(next_full[i + 1]) if i + 1 < n else n
            if j < ch.ends[rec]:
                entry["resolved_at"] = self.plan.processed_at
                entry["resolved_by"] = events[int(ch.src_of[j])].as_py()
            by_slot[slot[rec]].append(entry)
        return pa.array(by_slot, t)

    def _versions(self, records: np.ndarray) -> pa.Array:
        """The SCD2 versions the changes start: one per applied change after which the
        tracked columns (or the deleted flag) differ from before it."""
        t = self.by_name[FOLD_VERSIONS].type
        m = len(records)
        track = self.plan.track
        ch = self.ch
        if track is None or m == 0:
            return pa.ListArray.from_arrays(
                pa.array(np.zeros(m + 1, dtype=np.int32)), pa.array([], t.value_type)
            ).cast(t)
        n = ch.n
        every = np.arange(n)
        record = ch.record
        first = np.zeros(n, dtype=bool)
        first[ch.starts] = True
        previous = np.maximum(every - 1, 0)
        changed = self.deleted_after != self.deleted_before
        values: dict[str, pa.Array] = {}
        for column in track:
            t_col = self.by_name[column].type
            children = self.plan.structs.get(column)
            parts = []
            for child in children or (None,):
                place = (column, child)
                pt = t_col if child is None else t_col.field(child).type
                pool = self._place_pool(place, pt)
                at = ch.last_marked(self.places[place] != 0)
                after = self._sources(place, at, record)
                start = np.where(
                    self.start_gold[record], self.gi[record], self.n_g + ch.src.num_rows
                )
                before = np.where(first, start, after[previous])
                moved = after != before
                if moved.any():
                    a = pool.take(_index(after[moved]))
                    b = pool.take(_index(before[moved]))
                    differs = np.zeros(n, dtype=bool)
                    differs[moved] = ~_equal(a, b)
                    changed |= differs
                parts.append(pool.take(_index(after)))
            if children:
                values[column] = null_if_empty(
                    pa.StructArray.from_arrays(parts, fields=list(t_col))
                )
            else:
                values[column] = parts[0]
        # A record without a start row: its first applied change starts its history.
        starting = ~self.start_exists[record] & (ch.before(self.applied) == 0)
        version = self.applied & (changed | starting)
        at = np.flatnonzero(version & np.isin(record, records))
        kept = np.zeros(len(ch.ids), dtype=bool)
        kept[records] = True
        at = at[kept[record[at]]]
        rec = record[at]
        src = ch.src_of[at]
        index = _index(at)
        fields = list(t.value_type)
        by_field = {f.name: f.type for f in fields}
        commit = _column(ch.src, COMMIT_TS, by_field[SCD_VALID_FROM]).take(_index(src))
        last = np.ones(len(at), dtype=bool)
        if len(at):
            last[:-1] = rec[1:] != rec[:-1]
        following = np.where(last, len(at), np.arange(len(at)) + 1)
        valid_to = pa.concat_arrays([commit, pa.nulls(1, commit.type)]).take(_index(following))
        columns = {
            ID: ch.ids.take(_index(rec)),
            **{c: values[c].take(index) for c in track},
            SCD_VALID_FROM: commit,
            SCD_VALID_TO: valid_to,
            SCD_IS_CURRENT: pa.array(last),
            SCD_IS_DELETED: pa.array(self.deleted_after[at]),
            SCD_CHANGE_TYPE: _chunk(ch.src.column(CHANGE_TYPE)).take(_index(src)),
            SCD_ORDER_KEY: ch.keys.take(index),
            SCD_EVENT_ID: _chunk(ch.src.column(EVENT_ID)).take(_index(src)),
        }
        items = pa.StructArray.from_arrays(
            [columns[f.name].cast(f.type) for f in fields], fields=fields
        )
        slot = np.full(len(ch.ids), -1, dtype=np.int64)
        slot[records] = np.arange(m)
        counts = np.bincount(slot[rec], minlength=m)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets), items).cast(t)
