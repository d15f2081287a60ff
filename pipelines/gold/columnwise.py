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
ignored here as there. The output rows have :func:`~pipelines.gold.fold.fold_output_schema`'s
columns, like the per-record fold's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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
from pipelines.gold.fold import (
    _CHANGE_TYPE,
    _CHANGED,
    _COMMIT_NUMBER,
    _COMMIT_TS,
    _DIFF,
    _EVENT_ID,
    _NULLED,
    _REPLAY_ID,
    FOLD_APPLIED,
    FOLD_CHANGES,
    FOLD_GOLD,
    FOLD_IGNORED,
    FOLD_RESOLVED_BY,
    FOLD_RESYNC,
    FOLD_TOMBSTONE,
    FOLD_VERSIONS,
    FoldPlan,
)

__all__ = ["fold_columnwise", "null_if_empty"]

# Where a change's value lands: (column, struct child or None).
_Place = tuple[str, str | None]


@dataclass
class _Record:
    """One taken record: its gold row (index, or -1), its applied changes (indices into the
    changes, in order) and what the last applied one was."""

    gold: int
    changes: int
    applied: list[int] = field(default_factory=list)
    ignored: int = 0


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


def fold_columnwise(
    changes: pa.Table,
    keys: Sequence[str],
    gold: pa.Table,
    stones: pa.Table,
    *,
    plan: FoldPlan,
    body: Sequence[str],
    schema: pa.Schema,
) -> tuple[pa.Table, pa.Table, pa.Table | None]:
    """``(changes left, gold rows left, folded rows)``: the records this fold takes (see the
    module notes) folded, and the rows of the others for the per-record fold. ``keys`` are
    the changes' order keys; ``gold`` and ``stones`` hold the state rows of the records the
    changes touch."""
    if plan.track is not None or changes.num_rows == 0:
        return changes, gold, None
    columns = {
        name: changes.column(name).to_pylist()
        for name in (ID, _CHANGE_TYPE, _EVENT_ID, _CHANGED, _NULLED, _DIFF)
    }
    n = changes.num_rows
    gold_ids = gold.column(ID).to_pylist()
    gold_at = {rid: i for i, rid in enumerate(gold_ids) if rid is not None}
    gold_keys = gold.column(ORDER_KEY).to_pylist()
    gold_events = gold.column(LAST_EVENT_ID).to_pylist()
    gold_deleted = pc.fill_null(gold.column(DELETED), False).to_pylist()
    stoned = set(stones.column(ID).to_pylist())

    # Each record's changes next to each other, in order (one sort, not one per record).
    order = pc.sort_indices(
        pa.table({"id": changes.column(ID), "key": pa.array(keys, pa.string())}),
        sort_keys=[("id", "ascending"), ("key", "ascending")],
    ).to_pylist()
    by_record: dict[str, list[int]] = {}
    ids = columns[ID]
    for i in order:
        rid = ids[i]
        if rid is not None:
            by_record.setdefault(rid, []).append(i)
    planned_fields: dict[_Fields, list[tuple[_Place, bool]] | None] = {}

    taken: dict[str, _Record] = {}
    setters: dict[_Place, dict[int, tuple[int, bool]]] = {}
    full_images: dict[int, int] = {}  # record slot -> its CREATE's change index
    last: dict[int, int] = {}  # record slot -> its last applied change
    slots: list[str] = []
    for rid, indices in by_record.items():
        record = _take(
            rid,
            indices,
            keys,
            columns,
            gold_at=gold_at,
            gold_keys=gold_keys,
            gold_events=gold_events,
            gold_deleted=gold_deleted,
            stoned=stoned,
        )
        if record is None:
            continue
        planned = _plan_record(record, columns, plan, planned_fields)
        if planned is None:
            continue
        slot = len(slots)
        slots.append(rid)
        taken[rid] = record
        if record.applied:
            last[slot] = record.applied[-1]
        for change, places in planned:
            if places is None:
                full_images[slot] = change
                continue
            for place, nulled in places:
                setters.setdefault(place, {})[slot] = (change, nulled)
    if not slots:
        return changes, gold, None

    folded = _build(
        changes,
        gold,
        slots,
        taken=taken,
        setters=setters,
        full_images=full_images,
        last=last,
        keys=keys,
        plan=plan,
        body=body,
        schema=schema,
        total=n,
    )
    taken_ids = pa.array(list(taken), pa.string())
    keep_changes = pc.invert(pc.fill_null(pc.is_in(changes.column(ID), value_set=taken_ids), False))
    keep_gold = pc.invert(pc.fill_null(pc.is_in(gold.column(ID), value_set=taken_ids), False))
    return changes.filter(keep_changes), gold.filter(keep_gold), folded


def _take(
    rid: str,
    indices: list[int],
    keys: Sequence[str],
    columns: Mapping[str, list[Any]],
    *,
    gold_at: Mapping[str, int],
    gold_keys: Sequence[Any],
    gold_events: Sequence[Any],
    gold_deleted: Sequence[bool],
    stoned: set[Any],
) -> _Record | None:
    """The record's applied changes in order (``indices`` are in order), or ``None`` when
    it is not one to take."""
    if rid in stoned:
        return None
    ordered = indices
    events = [columns[_EVENT_ID][i] for i in ordered]
    present = [e for e in events if e is not None]
    if len(set(present)) != len(present):
        return None  # an event delivered twice: the record fold keeps its first delivery
    if len({keys[i] for i in ordered}) != len(ordered):
        return None
    g = gold_at.get(rid, -1)
    record = _Record(g, len(ordered))
    if g >= 0:
        if gold_deleted[g]:
            return None
        floor, last_event = gold_keys[g], gold_events[g]
        for i in ordered:
            if (floor is not None and keys[i] <= floor) or (
                columns[_EVENT_ID][i] is not None and columns[_EVENT_ID][i] == last_event
            ):
                record.ignored += 1
            else:
                record.applied.append(i)
    else:
        record.applied = ordered
    types = [columns[_CHANGE_TYPE][i] for i in record.applied]
    if any(t not in ("CREATE", "UPDATE", "DELETE") for t in types):
        return None
    if "CREATE" in types and (g >= 0 or types.index("CREATE") != 0 or types.count("CREATE") > 1):
        return None
    if g < 0 and (not types or types[0] != "CREATE"):
        return None
    if "DELETE" in types and (types.index("DELETE") != len(types) - 1 or types.count("DELETE") > 1):
        return None
    return record


def _plan_record(
    record: _Record,
    columns: Mapping[str, list[Any]],
    plan: FoldPlan,
    memo: dict[_Fields, list[tuple[_Place, bool]] | None],
) -> list[tuple[int, list[tuple[_Place, bool]] | None]] | None:
    """Per applied change: where its values land (``None`` for a CREATE's full image; a
    DELETE lands nowhere); ``None`` when one of its UPDATEs is not one to take. ``memo``
    keeps the places of each combination of fields seen (batches repeat them)."""
    out: list[tuple[int, list[tuple[_Place, bool]] | None]] = []
    changed, nulled, diffed = columns[_CHANGED], columns[_NULLED], columns[_DIFF]
    for i in record.applied:
        kind = columns[_CHANGE_TYPE][i]
        if kind == "CREATE":
            out.append((i, None))
        elif kind == "UPDATE":
            fields = (tuple(changed[i] or ()), tuple(nulled[i] or ()), bool(diffed[i]))
            if fields not in memo:
                memo[fields] = _places(plan, fields)
            places = memo[fields]
            if places is None:
                return None
            out.append((i, places))
    return out


def _build(
    changes: pa.Table,
    gold: pa.Table,
    slots: list[str],
    *,
    taken: Mapping[str, _Record],
    setters: Mapping[_Place, Mapping[int, tuple[int, bool]]],
    full_images: Mapping[int, int],
    last: Mapping[int, int],
    keys: Sequence[str],
    plan: FoldPlan,
    body: Sequence[str],
    schema: pa.Schema,
    total: int,
) -> pa.Table:
    m = len(slots)
    base = np.array([taken[rid].gold for rid in slots], dtype=np.int64)
    base_index = pa.array(base, pa.int64(), mask=base < 0)
    arrays: dict[str, pa.Array] = {ID: pa.array(slots, pa.string())}

    def gold_column(name: str, t: pa.DataType) -> pa.Array:
        if name not in gold.column_names:
            return pa.nulls(m, t)
        return gold.column(name).combine_chunks().cast(t).take(base_index)

    def last_set(sources: Mapping[int, tuple[int, bool]]) -> tuple[np.ndarray, np.ndarray]:
        """Per slot: the change index of the last setter (-1: none) and whether it nulls."""
        index = np.full(m, -1, dtype=np.int64)
        nulled = np.zeros(m, dtype=bool)
        for slot, change in full_images.items():
            index[slot] = change
        for slot, (change, is_null) in sources.items():
            # Setters come in order, after the record's CREATE, so the last one wins.
            index[slot] = change
            nulled[slot] = is_null
        return index, nulled

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
        new_values = changes.column(column).combine_chunks().cast(t)
        children = plan.structs.get(column)
        own = setters.get((column, None), {})
        child_places = [c for c in (children or ()) if (column, c) in setters]
        if not child_places:
            index, nulled = last_set(own)
            value = merged(base_values, new_values, index, nulled)
            if children:
                value = null_if_empty(value)
            arrays[column] = value
            continue
        assert children is not None
        parts = []
        for child in children:
            # The child's last setter: the struct set whole, or the child itself.
            sources = dict(own)
            for slot, setter in setters.get((column, child), {}).items():
                previous = sources.get(slot)
                if previous is None or keys[setter[0]] > keys[previous[0]]:
                    sources[slot] = setter
            index, nulled = last_set(sources)
            base_child = pc.struct_field(base_values, child)
            new_child = pc.struct_field(new_values, child)
            parts.append(merged(base_child, new_child, index, nulled))
        arrays[column] = null_if_empty(
            pa.StructArray.from_arrays(parts, names=list(children)).cast(t)
        )

    deleted = np.zeros(m, dtype=bool)
    applied_any = np.zeros(m, dtype=bool)
    last_index = np.full(m, -1, dtype=np.int64)
    for slot, change in last.items():
        applied_any[slot] = True
        last_index[slot] = change
    change_types = changes.column(_CHANGE_TYPE).to_pylist()
    for slot, change in last.items():
        deleted[slot] = change_types[change] == "DELETE"

    def stamp(name: str, source: str | None, t: pa.DataType) -> pa.Array:
        base_values = gold_column(name, t)
        if source is None:
            return base_values
        new_values = changes.column(source).combine_chunks().cast(t)
        return merged(base_values, new_values, last_index, np.zeros(m, dtype=bool))

    for name, source in (
        (LAST_CHANGE_TYPE, _CHANGE_TYPE),
        (LAST_COMMIT_TS, _COMMIT_TS),
        (LAST_COMMIT_NUMBER, _COMMIT_NUMBER),
        (LAST_REPLAY_ID, _REPLAY_ID),
        (LAST_EVENT_ID, _EVENT_ID),
    ):
        arrays[name] = stamp(name, source, by_name[name].type)
    key_values = pa.array(list(keys), pa.string())
    arrays[ORDER_KEY] = merged(
        gold_column(ORDER_KEY, pa.string()), key_values, last_index, np.zeros(m, dtype=bool)
    ).cast(by_name[ORDER_KEY].type)
    arrays[UPDATED_AT] = pc.if_else(
        pa.array(applied_any),
        pa.scalar(plan.processed_at, by_name[UPDATED_AT].type),
        gold_column(UPDATED_AT, by_name[UPDATED_AT].type),
    )
    has_gold = base >= 0
    arrays[DELETED] = pa.array(deleted)
    commit_ts = stamp(DELETED_AT, _COMMIT_TS, by_name[DELETED_AT].type)
    arrays[DELETED_AT] = pc.if_else(
        pa.array(deleted), commit_ts, gold_column(DELETED_AT, by_name[DELETED_AT].type)
    )
    arrays[NEEDS_RESYNC] = pc.fill_null(gold_column(NEEDS_RESYNC, pa.bool_()), False)
    arrays[RESYNC_REASON] = gold_column(RESYNC_REASON, by_name[RESYNC_REASON].type)

    hard = plan.deletes == "hard"
    actions: list[str | None] = []
    stones: list[str | None] = []
    for slot in range(m):
        if not applied_any[slot]:
            actions.append(None)
        elif hard and deleted[slot]:
            actions.append("delete" if has_gold[slot] else None)
        else:
            actions.append("upsert")
        stones.append("upsert" if hard and deleted[slot] else None)
    arrays[FOLD_GOLD] = pa.array(actions, pa.string())
    arrays[FOLD_TOMBSTONE] = pa.array(stones, pa.string())
    arrays[FOLD_RESYNC] = pa.array([[] for _ in range(m)], by_name[FOLD_RESYNC].type)
    arrays[FOLD_VERSIONS] = pa.array([[] for _ in range(m)], by_name[FOLD_VERSIONS].type)
    arrays[FOLD_RESOLVED_BY] = pa.nulls(m, pa.string())
    arrays[FOLD_CHANGES] = pa.array([taken[rid].changes for rid in slots], pa.int32())
    arrays[FOLD_APPLIED] = pa.array([len(taken[rid].applied) for rid in slots], pa.int32())
    arrays[FOLD_IGNORED] = pa.array([taken[rid].ignored for rid in slots], pa.int32())
    return pa.Table.from_arrays([arrays[f.name].cast(f.type) for f in schema], schema=schema)


def null_if_empty(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A struct array with every all-null struct made null (gold never holds a struct of
    nulls)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if values.type.num_fields == 0:
        return values
    empty = pc.is_null(values.field(0))
    for i in range(1, values.type.num_fields):
        empty = pc.and_(empty, pc.is_null(values.field(i)))
    return pc.if_else(empty, pa.scalar(None, values.type), values)
