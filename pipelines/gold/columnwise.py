"""The fold of the common records column by column: the same rows :func:`fold_record` makes,
without folding each record in Python.

Most records of a batch change in the plainest ways: UPDATEs of a few known fields, a CREATE
followed by UPDATEs, a last DELETE. For those the result of the sequential fold is, for every
column, the value the last applied change set (a nulled field: null; an untouched one keeps
gold's value), with the record's stamps taken from its last applied change. This module finds
such records, computes their rows with Arrow ``take`` over the columns (the Python work is one
pass over the changes' field lists), and leaves every other record to the per-record fold:

- a record is taken when the batch has no wildcard changes and the object keeps no SCD2
  history, it has no tombstone, its gold row (if any) is live, and its changes are only CREATE
  (first, and only when gold has no row), UPDATE and DELETE (last; soft deletes need a gold
  row or a CREATE before it), each event once, with distinct order keys;
- an UPDATE is taken when every changed or nulled field maps to one column (or one child of a
  struct column), clears nothing else, and no two of its fields land in the same place; a
  diff-encoded field is left to the per-record fold (it needs the previous value).

Changes gold already reflects (an order key not above gold's, or gold's last event again) are
ignored here as there. The output rows have :func:`~pipelines.gold.plan.fold_output_schema`'s
columns, like the per-record fold's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
from pipelines.gold.plan import (
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
    FOLD_TOMBSTONE,
    FOLD_VERSIONS,
    NULLED_FIELDS,
    REPLAY_ID,
    FoldPlan,
)

__all__ = ["fold_columnwise", "null_if_empty"]

# Where a change's value lands: (column, struct child or None).
_Place = tuple[str, str | None]

# Separators of field names, and of a change's field lists, in one string (names hold neither).
_NAME_SEP, _PART_SEP = "\x1f", "\x1e"


_Fields = tuple[tuple[str, ...], tuple[str, ...], bool]


def _places(plan: FoldPlan, fields: _Fields) -> list[tuple[_Place, bool]] | None:
    """Where an UPDATE's fields land (``fields``: changed, nulled, whether any is diffed),
    with whether each is nulled; ``None`` when the change is not one the column-wise fold
    takes."""
    changed, nulled_fields, diffed = fields
    if diffed:
        return None
    nulled = set(nulled_fields)
    paths = list(dict.fromkeys([*changed, *sorted(nulled)]))
    seen: set[_Place] = set()
    whole: set[str] = set()
    out: list[tuple[_Place, bool]] = []
    for path in paths:
        targets = plan.targets.get(path)
        if targets is None or len(targets) != 1 or path in plan.clears:
            return None
        place = (targets[0].column, targets[0].child)
        if place in seen:
            return None
        seen.add(place)
        if place[1] is None:
            whole.add(place[0])
        out.append((place, path in nulled))
    # A struct set whole and by child in one change: leave the ordering to the record fold.
    if any(child is not None and column in whole for (column, child), _ in out):
        return None
    return out


@dataclass
class _Selection:
    """The records the column-wise fold takes, one slot each in ascending ``Id`` order.

    Positions index the changes sorted by record and order key (``order`` maps a position to
    its row of the changes); every per-slot position is -1 where there is none."""

    order: np.ndarray
    ids: pa.Array
    gold: np.ndarray  # the slot's gold row, or -1
    changes: np.ndarray  # how many changes the record has in the batch
    applied: np.ndarray  # how many of them apply (the rest gold already reflects)
    create: np.ndarray  # position of the record's CREATE
    last: np.ndarray  # position of its last applied change
    # Per place a change's value lands: per slot, the position of the last change setting it
    # and whether that change nulls it.
    setters: dict[_Place, tuple[np.ndarray, np.ndarray]]

    def rows(self, positions: np.ndarray) -> np.ndarray:
        """The rows of the changes at ``positions`` (-1 stays -1)."""
        return np.where(positions >= 0, self.order[np.maximum(positions, 0)], -1)


def _chunk(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _flags(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean Arrow result as NumPy, null meaning false."""
    return np.asarray(pc.fill_null(values, False).to_numpy(zero_copy_only=False), dtype=bool)


def _masked(index: np.ndarray) -> pa.Array:
    """Take indices with -1 as null (a take that yields null there)."""
    return pa.array(index, pa.int64(), mask=index < 0)


def _last_of_each(positions: np.ndarray, record: np.ndarray) -> np.ndarray:
    """Which of the ascending ``positions`` is the last of its record."""
    last = np.ones(len(positions), dtype=bool)
    if len(positions):
        owners = record[positions]
        last[:-1] = owners[1:] != owners[:-1]
    return last


def _field_sets(lists: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Each list of field names as one string (``""`` for none), and which lists hold a null
    name (they cannot be told apart by their string)."""
    joined = pc.binary_join(lists, _NAME_SEP)
    broken = _flags(pc.and_(pc.is_valid(lists), pc.is_null(joined)))
    return pc.fill_null(joined, ""), broken


def _combinations(changes: pa.Table, rows: np.ndarray) -> tuple[list[_Fields], np.ndarray]:
    """The distinct (changed, nulled, diffed) field combinations of the changes' ``rows`` and
    each row's code into them (-1: a list holding a null name)."""
    picked = pa.array(rows, pa.int64())
    changed, broken = _field_sets(_chunk(changes.column(CHANGED_FIELDS)).take(picked))
    nulled, also_broken = _field_sets(_chunk(changes.column(NULLED_FIELDS)).take(picked))
    diffs = _chunk(changes.column(DIFF_FIELDS)).take(picked)
    diffed = pc.if_else(_flags(pc.greater(pc.list_value_length(diffs), 0)), "1", "0")
    encoded = pc.dictionary_encode(pc.binary_join_element_wise(changed, nulled, diffed, _PART_SEP))
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    codes[broken | also_broken] = -1
    combos: list[_Fields] = []
    for text in encoded.dictionary.to_pylist():
        changed_text, nulled_text, diff_flag = text.split(_PART_SEP)
        combos.append(
            (
                tuple(changed_text.split(_NAME_SEP)) if changed_text else (),
                tuple(nulled_text.split(_NAME_SEP)) if nulled_text else (),
                diff_flag == "1",
            )
        )
    return combos, codes


def _select(
    changes: pa.Table, keys: pa.Array, gold: pa.Table, stones: pa.Table, plan: FoldPlan
) -> _Selection | None:
    """The records to take (module notes), found with array work over the whole batch."""
    n = changes.num_rows
    ids = _chunk(changes.column(ID))
    with_id = n - ids.null_count
    if with_id == 0:
        return None
    # Each record's changes next to each other, in order; changes without an id sort last
    # and are left to the record fold.
    by_key = pa.table({"id": ids, "key": keys})
    order = pc.sort_indices(by_key, sort_keys=[("id", "ascending"), ("key", "ascending")])
    order = order.to_numpy()[:with_id].astype(np.int64)
    in_order = pa.array(order)
    sorted_ids = ids.take(in_order)
    first = np.ones(with_id, dtype=bool)
    first[1:] = ~_flags(pc.equal(sorted_ids[1:], sorted_ids[:-1]))
    record = np.cumsum(first) - 1
    starts = np.flatnonzero(first)
    count = len(starts)
    rejected = np.zeros(count, dtype=bool)

    # Distinct order keys, and each event once (the record fold keeps a first delivery).
    sorted_keys = keys.take(in_order)
    rejected[record[1:][~first[1:] & _flags(pc.equal(sorted_keys[1:], sorted_keys[:-1]))]] = True
    events = _chunk(changes.column(EVENT_ID))
    pairs = pa.table({"id": ids, "event": events})
    by_event = pc.sort_indices(
        pairs, sort_keys=[("id", "ascending"), ("event", "ascending")]
    ).to_numpy()[:with_id]
    pairs = pairs.take(pa.array(by_event))
    twice = _flags(pc.equal(pairs["id"][1:], pairs["id"][:-1])) & _flags(
        pc.equal(pairs["event"][1:], pairs["event"][:-1])
    )
    record_of = np.full(n, -1, dtype=np.int64)
    record_of[order] = record
    rejected[record_of[by_event[1:][twice]]] = True

    record_ids = sorted_ids.take(pa.array(starts))
    rejected |= _flags(pc.is_in(record_ids, value_set=_chunk(stones.column(ID))))
    at = pc.index_in(record_ids, value_set=_chunk(gold.column(ID)))
    base = np.asarray(pc.fill_null(at, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
    has_gold = base >= 0
    rejected |= _flags(_chunk(gold.column(DELETED)).take(_masked(base)))

    # Changes gold already reflects: an order key not above gold's, or gold's last event.
    state = _masked(base[record])
    floor = _chunk(gold.column(ORDER_KEY)).take(state).cast(keys.type)
    reflected = _flags(pc.less_equal(sorted_keys, floor)) | _flags(
        pc.equal(events.take(in_order), _chunk(gold.column(LAST_EVENT_ID)).take(state))
    )
    applied = ~reflected

    kinds = _chunk(changes.column(CHANGE_TYPE)).take(in_order)
    create, update, delete = (_flags(pc.equal(kinds, k)) for k in ("CREATE", "UPDATE", "DELETE"))
    rejected[record[applied & ~(create | update | delete)]] = True
    before = np.cumsum(applied) - applied  # applied changes before each position
    rank = before - before[starts][record]
    applied_count = np.bincount(record[applied], minlength=count)
    creates = np.bincount(record[applied & create], minlength=count)
    deletes = np.bincount(record[applied & delete], minlength=count)
    # One CREATE, first and only without a gold row; one DELETE, last.
    rejected |= (creates > 1) | (has_gold & (creates > 0)) | (deletes > 1)
    rejected |= ~has_gold & ~create[starts]
    rejected[record[applied & create & (rank != 0)]] = True
    rejected[record[applied & delete & (rank != applied_count[record] - 1)]] = True

    # UPDATEs whose fields each land in one place of their own.
    updates = np.flatnonzero(applied & update & ~rejected[record])
    combos, codes = _combinations(changes, order[updates])
    planned = [_places(plan, fields) for fields in combos]
    unplaced = np.array([p is None for p in planned] + [True], dtype=bool)  # code -1: last
    rejected[record[updates[unplaced[codes]]]] = True

    taken = ~rejected
    m = int(taken.sum())
    if m == 0:
        return None
    slot = np.cumsum(taken) - 1
    in_taken = taken[record]

    def per_slot(positions: np.ndarray) -> np.ndarray:
        out = np.full(m, -1, dtype=np.int64)
        out[slot[record[positions]]] = positions
        return out

    kept = in_taken[updates]
    positions, kept_codes = updates[kept], codes[kept]
    lands: dict[_Place, list[tuple[int, bool]]] = {}
    for code, places in enumerate(planned):
        for place, nulled in places or ():
            lands.setdefault(place, []).append((code, nulled))
    setters: dict[_Place, tuple[np.ndarray, np.ndarray]] = {}
    for place, entries in lands.items():
        hits = np.zeros(len(combos), dtype=bool)
        nulls = np.zeros(len(combos), dtype=bool)
        for code, nulled in entries:
            hits[code], nulls[code] = True, nulled
        chosen = hits[kept_codes]
        setting, setting_codes = positions[chosen], kept_codes[chosen]
        last = _last_of_each(setting, record)
        if not last.any():
            continue
        setting, setting_codes = setting[last], setting_codes[last]
        nulled_slots = np.zeros(m, dtype=bool)
        nulled_slots[slot[record[setting]]] = nulls[setting_codes]
        setters[place] = (per_slot(setting), nulled_slots)

    applied_taken = np.flatnonzero(applied & in_taken)
    return _Selection(
        order=order,
        ids=record_ids.filter(pa.array(taken)),
        gold=base[taken],
        changes=np.diff(np.append(starts, with_id))[taken],
        applied=applied_count[taken],
        create=per_slot(np.flatnonzero(applied & create & in_taken)),
        last=per_slot(applied_taken[_last_of_each(applied_taken, record)]),
        setters=setters,
    )


def fold_columnwise(
    changes: pa.Table,
    keys: pa.Array | pa.ChunkedArray,
    gold: pa.Table,
    stones: pa.Table,
    *,
    plan: FoldPlan,
    body: Sequence[str],
    schema: pa.Schema,
) -> tuple[pa.Table, pa.Table, pa.Table | None]:
    """``(changes left, gold rows left, folded rows)``: the records this fold takes (see the
    module notes) folded, and the rows of the others for the per-record fold. ``keys`` are
    the changes' order keys (a string array); ``gold`` and ``stones`` hold the state rows of
    the records the changes touch."""
    if plan.track is not None or changes.num_rows == 0:
        return changes, gold, None
    keys = _chunk(keys)
    chosen = _select(changes, keys, gold, stones, plan)
    if chosen is None:
        return changes, gold, None
    folded = _build(changes, gold, chosen, keys=keys, plan=plan, body=body, schema=schema)
    keep_changes = ~_flags(pc.is_in(changes.column(ID), value_set=chosen.ids))
    keep_gold = ~_flags(pc.is_in(gold.column(ID), value_set=chosen.ids))
    return changes.filter(keep_changes), gold.filter(keep_gold), folded


def _build(
    changes: pa.Table,
    gold: pa.Table,
    chosen: _Selection,
    *,
    keys: pa.Array,
    plan: FoldPlan,
    body: Sequence[str],
    schema: pa.Schema,
) -> pa.Table:
    m = len(chosen.gold)
    total = changes.num_rows
    base = chosen.gold
    base_index = _masked(base)
    arrays: dict[str, pa.Array] = {ID: chosen.ids}
    created = chosen.rows(chosen.create)
    nowhere = (np.full(m, -1, dtype=np.int64), np.zeros(m, dtype=bool))

    def gold_column(name: str, t: pa.DataType) -> pa.Array:
        if name not in gold.column_names:
            return pa.nulls(m, t)
        return _chunk(gold.column(name)).cast(t).take(base_index)

    def last_set(setter: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Per slot: the row of the change whose value stands (its last setter, else its
        CREATE; -1: gold's) and whether that change nulls it."""
        positions, nulled = setter
        return np.where(positions >= 0, chosen.rows(positions), created), nulled & (positions >= 0)

    def merged(
        base_values: pa.Array, new_values: pa.Array, index: np.ndarray, nulled: np.ndarray
    ) -> pa.Array:
        pool = pa.concat_arrays([base_values, new_values, pa.nulls(1, base_values.type)])
        picks = np.where(index >= 0, m + index, np.arange(m))
        picks = np.where(nulled, m + total, picks)
        return pool.take(pa.array(picks, pa.int64()))

    by_name = {f.name: f for f in schema}
    for column in body:
        t = by_name[column].type
        base_values = gold_column(column, t)
        new_values = _chunk(changes.column(column)).cast(t)
        children = plan.structs.get(column)
        own = chosen.setters.get((column, None), nowhere)
        if not any((column, c) in chosen.setters for c in children or ()):
            value = merged(base_values, new_values, *last_set(own))
            arrays[column] = null_if_empty(value) if children else value
            continue
        assert children is not None
        parts = []
        for child in children:
            # The child's last setter: the struct set whole, or the child itself.
            child_positions, child_nulled = chosen.setters.get((column, child), nowhere)
            later = child_positions > own[0]
            setter = (
                np.where(later, child_positions, own[0]),
                np.where(later, child_nulled, own[1]),
            )
            base_child = pc.struct_field(base_values, child)
            new_child = pc.struct_field(new_values, child)
            parts.append(merged(base_child, new_child, *last_set(setter)))
        arrays[column] = null_if_empty(
            pa.StructArray.from_arrays(parts, names=list(children)).cast(t)
        )

    last_index = chosen.rows(chosen.last)
    applied_any = last_index >= 0
    last_kinds = _chunk(changes.column(CHANGE_TYPE)).take(_masked(last_index))
    deleted = _flags(pc.equal(last_kinds, "DELETE"))
    unset = np.zeros(m, dtype=bool)

    def stamp(name: str, source: str, t: pa.DataType) -> pa.Array:
        new_values = _chunk(changes.column(source)).cast(t)
        return merged(gold_column(name, t), new_values, last_index, unset)

    for name, source in (
        (LAST_CHANGE_TYPE, CHANGE_TYPE),
        (LAST_COMMIT_TS, COMMIT_TS),
        (LAST_COMMIT_NUMBER, COMMIT_NUMBER),
        (LAST_REPLAY_ID, REPLAY_ID),
        (LAST_EVENT_ID, EVENT_ID),
    ):
        arrays[name] = stamp(name, source, by_name[name].type)
    arrays[ORDER_KEY] = merged(
        gold_column(ORDER_KEY, pa.string()), keys.cast(pa.string()), last_index, unset
    ).cast(by_name[ORDER_KEY].type)
    arrays[UPDATED_AT] = pc.if_else(
        pa.array(applied_any),
        pa.scalar(plan.processed_at, by_name[UPDATED_AT].type),
        gold_column(UPDATED_AT, by_name[UPDATED_AT].type),
    )
    arrays[DELETED] = pa.array(deleted)
    commit_ts = stamp(DELETED_AT, COMMIT_TS, by_name[DELETED_AT].type)
    arrays[DELETED_AT] = pc.if_else(
        pa.array(deleted), commit_ts, gold_column(DELETED_AT, by_name[DELETED_AT].type)
    )
    arrays[NEEDS_RESYNC] = pc.fill_null(gold_column(NEEDS_RESYNC, pa.bool_()), False)
    arrays[RESYNC_REASON] = gold_column(RESYNC_REASON, by_name[RESYNC_REASON].type)

    none = pa.scalar(None, pa.string())
    actions = pc.if_else(pa.array(applied_any), "upsert", none)
    stones = pa.nulls(m, pa.string())
    if plan.deletes == "hard":
        deleting = pa.array(deleted)
        actions = pc.if_else(deleting, pc.if_else(pa.array(base >= 0), "delete", none), actions)
        stones = pc.if_else(deleting, "upsert", none)
    arrays[FOLD_GOLD] = actions
    arrays[FOLD_TOMBSTONE] = stones
    arrays[FOLD_RESYNC] = _empty_lists(m, by_name[FOLD_RESYNC].type)
    arrays[FOLD_VERSIONS] = _empty_lists(m, by_name[FOLD_VERSIONS].type)
    arrays[FOLD_RESOLVED_BY] = pa.nulls(m, pa.string())
    arrays[FOLD_CHANGES] = pa.array(chosen.changes, pa.int32())
    arrays[FOLD_APPLIED] = pa.array(chosen.applied, pa.int32())
    arrays[FOLD_IGNORED] = pa.array(chosen.changes - chosen.applied, pa.int32())
    return pa.Table.from_arrays([arrays[f.name].cast(f.type) for f in schema], schema=schema)


def _empty_lists(m: int, t: pa.DataType) -> pa.Array:
    offsets = pa.array(np.zeros(m + 1, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array([], t.value_type)).cast(t)


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
