"""The reference model of the gold fold: the sequential replay of one record's changes in
Python (:func:`fold_record`), exactly as :mod:`pipelines.gold.fold`'s docstring defines the
semantics, and :func:`reference_fold`, which folds a table of fold input rows one record at a
time with it. The production fold (:func:`pipelines.gold.fold.fold_table`) must give the same
rows."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa
from pyspark.sql import types as T

from ingest.decoding import apply_diff
from ingest.errors import DiffError
from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.gold.columns import (
    CONTROL_COLUMNS,
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
    body_fields,
)
from pipelines.gold.fold import OVERFLOW
from pipelines.gold.folding import ChangeRows, StateRows
from pipelines.gold.order_keys import encode_order_key, order_keys
from pipelines.gold.plan import (
    BATCH_ID,
    CHANGE_KEY,
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
    ROLE,
    ROLE_GOLD,
    ROLE_TOMBSTONE,
    SCHEMA_ID,
    FoldPlan,
    Target,
    fold_input_schema,
    fold_output_schema,
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

__all__ = ["OVERFLOW", "FoldedRecord", "fold_record", "in_order", "reference_fold"]

GoldAction = Literal["upsert", "delete"]

_FULL_IMAGE = frozenset({"CREATE", "UNDELETE"})
_POLLED = frozenset({POLLED, POLLED_DELETED})
_GAPS = frozenset({"GAP_CREATE", "GAP_UPDATE", "GAP_DELETE", "GAP_UNDELETE"})
_CONTROL_NAMES = tuple(n for n, _ in CONTROL_COLUMNS)


# ----------------------------------------------------------------------- one record (Python)


@dataclass(frozen=True)
class FoldedRecord:
    """What folding one record's changes produced.

    ``row`` is the record's gold row afterwards (``None``: the record is unknown to gold and
    stays so); ``gold`` / ``tombstone`` say what the MERGE into each table does with it
    (``None``: nothing). ``resync`` are re-sync rows, ``versions`` SCD2 versions (chained;
    the last is current), ``resolved_by`` the event id of a full image that cleared an
    earlier re-sync flag.
    """

    record_id: str | None
    row: dict[str, Any] | None
    gold: GoldAction | None = None
    tombstone: GoldAction | None = None
    resync: list[dict[str, Any]] = field(default_factory=list)
    versions: list[dict[str, Any]] = field(default_factory=list)
    resolved_by: str | None = None
    applied: int = 0
    ignored: int = 0


class _Fold:
    """The sequential replay of one record's changes (see the module docstring)."""

    def __init__(self, plan: FoldPlan, body: Sequence[str], record_id: str | None) -> None:
        self.plan = plan
        self.body = body
        self.record_id = record_id
        self.row: dict[str, Any] | None = None
        self.resync: list[dict[str, Any]] = []
        self.versions: list[dict[str, Any]] = []
        self.resolved_by: str | None = None
        self.applied = 0
        self.ignored = 0
        self._tracked: tuple[Any, ...] | None = None
        # The gold (or tombstone) row came flagged: the re-sync table has open rows for it.
        self._open_in_table = False

    # -- state -----------------------------------------------------------------------------

    def _placeholder(self) -> dict[str, Any]:
        row: dict[str, Any] = dict.fromkeys(self.body)
        row.update(dict.fromkeys(_CONTROL_NAMES))
        row[ID] = self.record_id
        row[DELETED] = False
        row[NEEDS_RESYNC] = False
        return row

    def start(self, gold: Mapping[str, Any] | None, tombstone: Mapping[str, Any] | None) -> None:
        candidates = []
        if gold is not None:
            row = self._placeholder()
            row.update({k: gold.get(k) for k in (*self.body, *_CONTROL_NAMES)})
            candidates.append(row)
        if tombstone is not None:
            row = self._placeholder()
            row.update({k: tombstone.get(k) for k in _CONTROL_NAMES})
            row[DELETED] = True
            candidates.append(row)
        if candidates:
            # A tombstone newer than the gold row is a hard delete whose gold MERGE did not
            # commit (a crash between the two writes): the tombstone is the truth.
            self.row = max(candidates, key=lambda r: r.get(ORDER_KEY) or "")
            self.row[DELETED] = bool(self.row.get(DELETED))
            self.row[NEEDS_RESYNC] = bool(self.row.get(NEEDS_RESYNC))
            self._open_in_table = self.row[NEEDS_RESYNC]
        self._tracked = self._tracked_state()

    def _tracked_state(self) -> tuple[Any, ...] | None:
        if self.row is None or self.plan.track is None:
            return None
        return (*(self.row.get(c) for c in self.plan.track), self.row[DELETED])

    # -- flags and bookkeeping -------------------------------------------------------------

    def _flag(
        self,
        change: Mapping[str, Any],
        reason: Reason,
        detail: str | None,
        *,
        cause: Sequence[object] = (),
        mark: bool = True,
    ) -> None:
        self.resync.append(
            resync_row(
                object_name=self.plan.object_name,
                record_id=self.record_id,
                reason=reason,
                change_type=change.get(CHANGE_TYPE),
                detail=detail,
                commit_timestamp=change.get(COMMIT_TS),
                replay_id=change.get(REPLAY_ID),
                event_id=change.get(EVENT_ID),
                bronze_batch_id=change.get(BATCH_ID),
                detected_at=self.plan.processed_at,
                cause=cause,
            )
        )
        if mark and self.row is not None:
            self.row[NEEDS_RESYNC] = True
            reasons = [r for r in (self.row.get(RESYNC_REASON) or "").split(",") if r]
            if reason not in reasons:
                reasons.append(reason)
            self.row[RESYNC_REASON] = ",".join(reasons)

    def _stamp(self, change: Mapping[str, Any], key: str) -> None:
        assert self.row is not None
        self.row[LAST_CHANGE_TYPE] = change.get(CHANGE_TYPE)
        self.row[LAST_COMMIT_TS] = change.get(COMMIT_TS)
        self.row[LAST_COMMIT_NUMBER] = change.get(COMMIT_NUMBER)
        self.row[LAST_REPLAY_ID] = change.get(REPLAY_ID)
        self.row[LAST_EVENT_ID] = change.get(EVENT_ID)
        self.row[ORDER_KEY] = key
        self.row[UPDATED_AT] = self.plan.processed_at
        self.applied += 1
        tracked = self._tracked_state()
        if tracked is not None and tracked != self._tracked:
            assert self.plan.track is not None
            version: dict[str, Any] = {ID: self.record_id}
            version.update({c: self.row.get(c) for c in self.plan.track})
            version.update(
                {
                    SCD_VALID_FROM: change.get(COMMIT_TS),
                    SCD_VALID_TO: None,
                    SCD_IS_CURRENT: True,
                    SCD_IS_DELETED: self.row[DELETED],
                    SCD_CHANGE_TYPE: change.get(CHANGE_TYPE),
                    SCD_ORDER_KEY: key,
                    SCD_EVENT_ID: change.get(EVENT_ID),
                }
            )
            if self.versions:
                self.versions[-1][SCD_VALID_TO] = version[SCD_VALID_FROM]
                self.versions[-1][SCD_IS_CURRENT] = False
            self.versions.append(version)
        self._tracked = tracked

    # -- applying one change -----------------------------------------------------------------

    def apply(self, change: Mapping[str, Any], key: str) -> None:
        row = self.row
        if row is not None and (
            (row.get(ORDER_KEY) is not None and key <= row[ORDER_KEY])
            or (change.get(EVENT_ID) is not None and change.get(EVENT_ID) == row[LAST_EVENT_ID])
        ):
            self.ignored += 1
            return
        change_type = change.get(CHANGE_TYPE)
        if change.get(IS_WILDCARD):
            if row is None:
                # The record does not exist at this point of the order: nothing to change.
                self.ignored += 1
                return
            self._update(change)
        elif change_type in _FULL_IMAGE:
            self._full_image(change)
        elif change_type in _POLLED:
            self._full_image(change)
            if change_type == POLLED_DELETED:
                self._delete(change)
        elif change_type == "UPDATE":
            if row is None:
                self.row = self._placeholder()
                self._flag(change, "missing_base", "an UPDATE of a record gold has never seen")
            elif row[DELETED]:
                self._flag(change, "update_of_deleted", "an UPDATE of a deleted record")
            self._update(change)
        elif change_type == "DELETE":
            if self.row is None:
                self.row = self._placeholder()
                if self.plan.deletes == "soft":
                    self._flag(change, "missing_base", "a DELETE of a record gold has never seen")
            self._delete(change)
        elif change_type in _GAPS:
            self._gap(change, str(change_type))
        else:
            if self.row is None:
                self.row = self._placeholder()
            self._flag(
                change,
                "unsupported_change_type",
                f"change type {change_type!r} is not one gold applies; the record is kept as it "
                "was",
            )
        self._stamp(change, key)

    def _full_image(self, change: Mapping[str, Any]) -> None:
        if self.row is None:
            self.row = self._placeholder()
        row = self.row
        structs = self.plan.structs
        absent = self.plan.absent.get(change.get(SCHEMA_ID) or "", ())
        for column in self.body:
            if column in absent:
                continue  # not a field of the change's schema version: kept as it was
            value = change.get(column)
            row[column] = _normal(value) if column in structs else value
        row[DELETED] = False
        row[DELETED_AT] = None
        row[NEEDS_RESYNC] = False
        row[RESYNC_REASON] = None
        event_id = change.get(EVENT_ID)
        if self._open_in_table:
            self.resolved_by = event_id
            self._open_in_table = False
        for entry in self.resync:
            if entry["resolved_at"] is None:
                entry["resolved_at"] = self.plan.processed_at
                entry["resolved_by"] = event_id

    def _delete(self, change: Mapping[str, Any]) -> None:
        assert self.row is not None
        self.row[DELETED] = True
        self.row[DELETED_AT] = change.get(COMMIT_TS)

    def _gap(self, change: Mapping[str, Any], change_type: str) -> None:
        if self.row is None:
            self.row = self._placeholder()
        if change_type == "GAP_DELETE":
            self._delete(change)
        elif change_type in ("GAP_CREATE", "GAP_UNDELETE"):
            self.row[DELETED] = False
            self.row[DELETED_AT] = None
        self._flag(
            change,
            "gap",
            f"{change_type}: Salesforce sent the change without its values; re-read the record",
        )

    def _update(self, change: Mapping[str, Any]) -> None:
        row = self.row
        assert row is not None
        changed = change.get(CHANGED_FIELDS) or ()
        nulled = set(change.get(NULLED_FIELDS) or ())
        diffed = set(change.get(DIFF_FIELDS) or ())
        paths = list(dict.fromkeys([*changed, *sorted(nulled), *sorted(diffed)]))
        targets_of = self.plan.targets
        for path in paths:
            targets = targets_of.get(path)
            if targets is None:
                self._flag(
                    change,
                    "unknown_field",
                    f"changed field {path!r} has no column in the object's silver table",
                    cause=(path,),
                )
                continue
            if path in diffed:
                self._diff(change, path, targets)
            elif path in nulled:
                for t in targets:
                    self._set(t, None)
            else:
                for t in targets:
                    value = change.get(t.column)
                    if t.child is not None:
                        value = value.get(t.child) if isinstance(value, Mapping) else None
                    self._set(t, value)
            for column in self.plan.clears.get(path, ()):
                row[column] = None

    def _diff(self, change: Mapping[str, Any], path: str, targets: tuple[Target, ...]) -> None:
        assert self.row is not None
        if len(targets) != 1 or targets[0].child is not None:
            self._flag(
                change,
                "diff_failed",
                f"{path}: a diff-encoded value must be a plain text field",
                cause=(path,),
            )
            return
        column = targets[0].column
        previous = self.row.get(column)
        try:
            self.row[column] = apply_diff(previous, str(change.get(column) or ""))
        except DiffError as exc:
            reason: Reason = "diff_missing_base" if previous is None else "diff_failed"
            self._flag(change, reason, f"{path}: {exc}", cause=(path,))

    def _set(self, target: Target, value: Any) -> None:
        row = self.row
        assert row is not None
        if target.child is None:
            row[target.column] = _normal(value) if target.column in self.plan.structs else value
            return
        current = row.get(target.column)
        merged = (
            dict(current)
            if isinstance(current, Mapping)
            else dict.fromkeys(self.plan.structs.get(target.column, ()))
        )
        merged[target.child] = value
        row[target.column] = _normal(merged)

    # -- outcome ---------------------------------------------------------------------------------

    def finish(
        self, gold: Mapping[str, Any] | None, tombstone: Mapping[str, Any] | None
    ) -> FoldedRecord:
        row = self.row
        gold_action: GoldAction | None = None
        tombstone_action: GoldAction | None = None
        if row is not None and self.record_id is not None:
            key = row.get(ORDER_KEY)
            differs = gold is None or key != gold.get(ORDER_KEY)
            if self.plan.deletes == "soft" or not row[DELETED]:
                gold_action = "upsert" if differs else None
            else:
                gold_action = "delete" if gold is not None else None
            if self.plan.deletes == "hard" and row[DELETED]:
                if tombstone is None or tombstone.get(ORDER_KEY) != key:
                    tombstone_action = "upsert"
            elif tombstone is not None:
                # Live again (UNDELETE), or soft deletes after a switch from hard ones: the
                # tombstone goes.
                tombstone_action = "delete"
        return FoldedRecord(
            self.record_id,
            row,
            gold=gold_action,
            tombstone=tombstone_action,
            resync=self.resync,
            versions=self.versions,
            resolved_by=self.resolved_by,
            applied=self.applied,
            ignored=self.ignored,
        )


def _normal(value: Any) -> Any:
    # An empty compound is null, never a struct of nulls (as Salesforce sends it).
    if isinstance(value, Mapping):
        if all(v is None for v in value.values()):
            return None
        return dict(value)
    return value


def in_order(
    changes: Iterable[Mapping[str, Any]], key_of: Callable[[Mapping[str, Any]], str]
) -> list[tuple[str, Mapping[str, Any]]]:
    """``(order key, change)`` pairs sorted by key, each event once: the same event delivered
    twice lands in two bronze positions, and the first one is kept."""
    seen: set[Any] = set()
    keyed = []
    for change in changes:
        event_id = change.get(EVENT_ID)
        if event_id is not None:
            if event_id in seen:
                continue
            seen.add(event_id)
        keyed.append((key_of(change), change))
    keyed.sort(key=lambda kc: kc[0])
    return keyed


def fold_record(
    plan: FoldPlan,
    body: Sequence[str],
    record_id: str | None,
    *,
    gold: Mapping[str, Any] | None,
    tombstone: Mapping[str, Any] | None,
    changes: Iterable[Mapping[str, Any]],
) -> FoldedRecord:
    """Fold one record's ``changes`` (silver rows as dicts, any order) onto its ``gold`` row
    and ``tombstone`` (either may be ``None``). ``body`` names the body columns.

    A GAP_OVERFLOW (or any change without a record, ``record_id`` ``None``) only yields its
    whole-object re-sync row.
    """
    order_by = plan.order_by
    keyed = in_order(
        changes, lambda c: c.get(CHANGE_KEY) or encode_order_key(c.get(col) for col in order_by)
    )
    fold = _Fold(plan, body, record_id)
    if record_id is None:
        for _, change in keyed:
            if change.get(CHANGE_TYPE) == OVERFLOW:
                fold._flag(
                    change,
                    "overflow",
                    "GAP_OVERFLOW: a transaction changed more records than Salesforce reports; "
                    "re-sync the whole object",
                    mark=False,
                )
            else:
                fold._flag(
                    change,
                    "unknown_field",
                    f"a {change.get(CHANGE_TYPE)} change without a record id",
                    mark=False,
                )
        return fold.finish(None, None)
    fold.start(gold, tombstone)
    for key, change in keyed:
        if change.get(CHANGE_TYPE) == OVERFLOW:
            fold._flag(
                change,
                "overflow",
                "GAP_OVERFLOW: a transaction changed more records than Salesforce reports; "
                "re-sync the whole object",
                mark=False,
            )
            continue
        fold.apply(change, key)
    return fold.finish(gold, tombstone)


class ReferenceFold:
    """The fold of a table of fold input rows one record at a time with :func:`fold_record`:
    groups the rows sorted by ``Id`` and folds each group (what the production fold must
    equal)."""

    def __init__(
        self,
        plan: FoldPlan,
        body: tuple[str, ...],
        schema: pa.Schema,
        wildcards: Sequence[Mapping[str, Any]],
    ) -> None:
        self.plan = plan
        self.body = body
        self.schema = schema
        self.wildcards = [
            {**w, CHANGE_KEY: encode_order_key(w.get(c) for c in plan.order_by)} for w in wildcards
        ]

    def _keys(self, batch: pa.RecordBatch) -> list[str]:
        keys: list[str] = order_keys(pa.Table.from_batches([batch]), self.plan.order_by).to_pylist()
        return keys

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        out: list[dict[str, Any]] = []
        group: list[dict[str, Any]] = []
        current: object = _NO_GROUP
        for batch in batches:
            keys = self._keys(batch)
            for row, key in zip(batch.to_pylist(), keys, strict=True):
                row[CHANGE_KEY] = key
                rid = row.get(ID)
                if rid != current and group:
                    self._emit(current, group, out)
                    group = []
                current = rid
                group.append(row)
            if len(out) >= 10_000:
                yield pa.RecordBatch.from_pylist(out, schema=self.schema)
                out = []
        if group:
            self._emit(current, group, out)
        if out:
            yield pa.RecordBatch.from_pylist(out, schema=self.schema)

    def _emit(
        self, record_id: object, group: list[dict[str, Any]], out: list[dict[str, Any]]
    ) -> None:
        gold = tombstone = None
        changes = []
        for row in group:
            role = row[ROLE]
            if role == ROLE_GOLD:
                gold = row
            elif role == ROLE_TOMBSTONE:
                tombstone = row
            else:
                if row.get(IS_WILDCARD):
                    raise ValueError(
                        f"{self.plan.object_name}: wildcard change {row.get(EVENT_ID)} reached "
                        "the per-record fold; pass the batch's wildcard changes with "
                        "fold_rows(wildcards=...)"
                    )
                changes.append(row)
        count = len(changes)
        if self.wildcards and record_id is not None:
            changes.extend(self.wildcards)
        if not changes:
            return
        rid = None if record_id is None else str(record_id)
        folded = fold_record(
            self.plan, self.body, rid, gold=gold, tombstone=tombstone, changes=changes
        )
        if folded.row is None and not folded.resync:
            return
        if folded.applied == 0 and not folded.resync and count == 0:
            return  # only wildcards, none of which changed this record
        row_out: dict[str, Any] = dict(folded.row) if folded.row is not None else {ID: rid}
        row_out[FOLD_GOLD] = folded.gold
        row_out[FOLD_TOMBSTONE] = folded.tombstone
        row_out[FOLD_RESYNC] = folded.resync
        row_out[FOLD_VERSIONS] = folded.versions
        row_out[FOLD_RESOLVED_BY] = folded.resolved_by
        row_out[FOLD_CHANGES] = count
        row_out[FOLD_APPLIED] = folded.applied
        row_out[FOLD_IGNORED] = folded.ignored
        out.append(row_out)


_NO_GROUP = object()


def reference_fold(
    plan: FoldPlan,
    body: Sequence[str],
    schema: pa.Schema,
    combined: pa.Table,
    wildcards: Sequence[Mapping[str, Any]] = (),
) -> pa.Table:
    """What :func:`fold_record` makes of a table of fold input rows (as
    :class:`~pipelines.gold.folding.FoldTable` gets them)."""
    combined = combined.sort_by([(ID, "ascending")])
    function = ReferenceFold(plan, tuple(body), schema, wildcards)
    batches = list(function(iter(combined.to_batches(max_chunksize=10_000))))
    return pa.Table.from_batches(batches, schema=schema)


def reference_fold_rows(
    plan: FoldPlan,
    silver: T.StructType,
    changes: pa.Table,
    *,
    gold: pa.Table | None = None,
    tombstones: pa.Table | None = None,
    wildcards: Sequence[Mapping[str, Any]] = (),
) -> pa.Table:
    """What :func:`~pipelines.gold.dataflow.fold_rows` must make of silver ``changes`` (and
    the ``gold`` rows and ``tombstones``, Arrow tables), folded one record at a time."""
    inputs = fold_input_schema(plan, silver)
    parts = [ChangeRows(inputs, without_wildcards=bool(wildcards))(iter(changes.to_batches()))]
    for state, role in ((gold, ROLE_GOLD), (tombstones, ROLE_TOMBSTONE)):
        if state is not None:
            parts.append(StateRows(inputs, role=role)(iter(state.to_batches())))
    combined = pa.Table.from_batches(
        [b for part in parts for b in part], schema=spark_schema_to_arrow(inputs)
    )
    body = body_fields(silver)
    output = spark_schema_to_arrow(fold_output_schema(body, plan.track))
    return reference_fold(plan, [f.name for f in body], output, combined, wildcards)


def kept_by_merge(folded: pa.Table, gold: pa.Table, body: Sequence[str]) -> pa.Table:
    """What the gold MERGE makes of fold output rows (``engine.merge(keep=...)``): each body
    column whose ``FOLD_SET`` flag is "0" takes the value of the record's ``gold`` row."""
    by_id = {row[ID]: row for row in gold.to_pylist()}
    rows = []
    for row in folded.to_pylist():
        flags, start = row[FOLD_SET], by_id.get(row[ID])
        if flags is not None and start is not None:
            assert len(flags) == len(body)
            for flag, column in zip(flags, body, strict=True):
                if flag == "0":
                    row[column] = start[column]
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=folded.schema)


def without_set_flags(table: pa.Table) -> pa.Table:
    """Fold output without ``FOLD_SET`` (the reference model leaves it null)."""
    return table.drop_columns([FOLD_SET]) if FOLD_SET in table.column_names else table
