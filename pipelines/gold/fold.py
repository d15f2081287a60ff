"""The fold: silver changes + current gold rows -> complete post-image rows, with Salesforce's
semantics.

:func:`fold_record` replays one record's changes in order onto its gold row (and tombstone),
exactly as described below; :mod:`pipelines.gold.folding` applies it to tables of rows, as
the pure functions both engines run.

Order. Each change has an order key: the values of ``sequence_by`` (by default commit
timestamp, commit number, transaction key, sequence number) followed by the stream order
(bronze batch id, batch position) as the final tie-break, encoded by :func:`encode_order_key`
into one string that sorts like the tuple. Gold stores the key of the last change applied to a
record (``_cdc_order_key``); a change whose key is not greater, or that repeats the event id
of the last change applied, is ignored (late, replayed or duplicated delivery), so running a
batch again, or replaying events, never moves a record backwards.

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
guarded by the order key (:func:`merge_conditions`).

What the fold returns (:func:`fold_output_schema`): one row per record the batch touched
(and one per GAP_OVERFLOW, with a null ``Id``): the record's gold row after the batch, plus
``_fold_*`` columns saying what to do with it (:mod:`pipelines.gold.folding` takes it apart).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

from pyspark.sql import types as T

from ingest.decoding import apply_diff
from ingest.errors import DiffError
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
    gold_schema,
)
from pipelines.gold.resync import RESYNC_SCHEMA, Reason, resync_row
from pipelines.gold.scd2 import (
    SCD_CHANGE_TYPE,
    SCD_EVENT_ID,
    SCD_IS_CURRENT,
    SCD_IS_DELETED,
    SCD_ORDER_KEY,
    SCD_VALID_FROM,
    SCD_VALID_TO,
    history_schema,
)
from pipelines.silver.columns import POLLED, POLLED_DELETED
from pipelines.spec.sections import DEFAULT_SEQUENCE_BY

if TYPE_CHECKING:
    from pipelines.silver.columns import SilverLayout

__all__ = [
    "DEFAULT_SEQUENCE_BY",
    "FOLD_COLUMNS",
    "STREAM_ORDER",
    "DeleteMode",
    "FoldPlan",
    "FoldedRecord",
    "Target",
    "absent_columns",
    "encode_order_key",
    "fold_output_schema",
    "fold_plan",
    "fold_record",
    "merge_conditions",
    "order_columns",
]

DeleteMode = Literal["soft", "hard"]
GoldAction = Literal["upsert", "delete"]

STREAM_ORDER: tuple[str, ...] = ("_cdc_bronze_batch_id", "_cdc_bronze_batch_seq")

# Silver header columns the fold reads.
_CHANGE_TYPE = "_cdc_change_type"
_COMMIT_TS = "_cdc_commit_timestamp"
_COMMIT_NUMBER = "_cdc_commit_number"
_EVENT_ID = "_cdc_event_id"
_REPLAY_ID = "_cdc_replay_id"
_CHANGED = "_cdc_changed_fields"
_NULLED = "_cdc_nulled_fields"
_DIFF = "_cdc_diff_fields"
_WILDCARD = "_cdc_is_wildcard"
_BATCH_ID = "_cdc_bronze_batch_id"
_SCHEMA_ID = "_cdc_schema_id"
_HEADER = (
    _SCHEMA_ID,
    _CHANGE_TYPE,
    _COMMIT_TS,
    _COMMIT_NUMBER,
    _EVENT_ID,
    _REPLAY_ID,
    _CHANGED,
    _NULLED,
    _DIFF,
    _WILDCARD,
    _BATCH_ID,
)

_ROLE = "_fold_role"
_ROLE_CHANGE, _ROLE_GOLD, _ROLE_TOMBSTONE = "c", "g", "t"
# A change's order key, computed column-wise per Arrow batch before the rows become dicts.
_KEY = "_fold_key"

FOLD_GOLD = "_fold_gold"
FOLD_TOMBSTONE = "_fold_tombstone"
FOLD_RESYNC = "_fold_resync"
FOLD_VERSIONS = "_fold_versions"
FOLD_RESOLVED_BY = "_fold_resolved_by"
FOLD_CHANGES = "_fold_changes"
FOLD_APPLIED = "_fold_applied"
FOLD_IGNORED = "_fold_ignored"
FOLD_COLUMNS: tuple[str, ...] = (
    FOLD_GOLD,
    FOLD_TOMBSTONE,
    FOLD_RESYNC,
    FOLD_VERSIONS,
    FOLD_RESOLVED_BY,
    FOLD_CHANGES,
    FOLD_APPLIED,
    FOLD_IGNORED,
)

_FULL_IMAGE = frozenset({"CREATE", "UNDELETE"})
_POLLED = frozenset({POLLED, POLLED_DELETED})
_GAPS = frozenset({"GAP_CREATE", "GAP_UPDATE", "GAP_DELETE", "GAP_UNDELETE"})
_OVERFLOW = "GAP_OVERFLOW"
_CONTROL_NAMES = tuple(n for n, _ in CONTROL_COLUMNS)


def order_columns(sequence_by: Sequence[str]) -> tuple[str, ...]:
    """``sequence_by`` followed by the stream order columns it does not already name: the
    columns a change's order key is made of."""
    return (*sequence_by, *(c for c in STREAM_ORDER if c not in sequence_by))


# ------------------------------------------------------------------------------- order key

_I64 = 1 << 63
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_EPOCH_DAY = date(1970, 1, 1)


def _int_part(value: int) -> str:
    if not -_I64 <= value < _I64:
        raise ValueError(f"order key values must fit in 64 bits (got {value})")
    return f"1{value + _I64:016x}"


def _text_part(text: str) -> str:
    # Characters up to '!' are escaped as '!' + two hex digits and the part ends with ' ',
    # which sorts below every character the escaped text can hold: the encoding is prefix-free
    # and sorts like the text (UTF-8 byte order = code point order, in Python, Spark and
    # DataFusion alike).
    if text and min(text) > "!":
        return f"1{text} "
    escaped = "".join(f"!{ord(c):02x}" if c <= "!" else c for c in text)
    return f"1{escaped} "


def _component(value: object) -> str:
    if value is None:
        return "0"
    if isinstance(value, bool):
        return "11" if value else "10"
    if isinstance(value, int):
        return _int_part(value)
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
        delta = aware - _EPOCH
        micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
        return _int_part(micros)
    if isinstance(value, date):
        return _int_part((value - _EPOCH_DAY).days)
    if isinstance(value, float):
        if math.isnan(value):
            raise ValueError("an order key value cannot be NaN")
        # -0.0 == 0.0, so both get the key of 0.0.
        (bits,) = struct.unpack(">Q", struct.pack(">d", value + 0.0))
        bits = bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | (1 << 63)
        return f"1{bits:016x}"
    if isinstance(value, str):
        return _text_part(value)
    if isinstance(value, bytes | bytearray):
        return _text_part(bytes(value).hex())
    raise TypeError(
        "order key columns must be integers, timestamps, dates, booleans, doubles, strings or "
        f"binary (got a {type(value).__name__})"
    )


def encode_order_key(values: Iterable[object]) -> str:
    """One string that sorts like the tuple ``values`` (nulls first), for any mix of
    integers, timestamps, dates, booleans, doubles, strings and bytes."""
    return "".join(_component(v) for v in values)


# ----------------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class Target:
    """Where (part of) a changed field lands: a column, or a child of a struct column."""

    column: str
    child: str | None = None


@dataclass(frozen=True)
class FoldPlan:
    """What the fold of one object needs; small and picklable (it travels to Spark tasks).

    ``targets`` maps each field name of ``changedFields`` / ``nulledFields`` / ``diffFields``
    (``Phone``, ``BillingAddress.City``, ``Name``) to where it lands, from silver's
    :meth:`~pipelines.silver.columns.SilverLayout.columns_for`; ``clears`` lists columns a
    change of a field empties besides (the string branch of Account's ``Name`` when a person
    name child changes); ``structs`` gives the children of each struct column. ``sequence_by``
    is the ordering (:func:`order_columns` adds the stream order). ``track`` lists the
    columns SCD2 history tracks (``None``: no history). ``processed_at`` stamps
    ``_cdc_updated_at`` and re-sync rows: one value per run keeps the transform
    deterministic. ``partitions`` is the fold's parallelism (``None``: the session default).
    ``absent`` maps a schema id to the body columns of fields that schema version does not
    have: a full image written with it leaves them as they were (:func:`absent_columns`).
    """

    object_name: str
    targets: Mapping[str, tuple[Target, ...]]
    processed_at: datetime
    structs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    clears: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    sequence_by: tuple[str, ...] = DEFAULT_SEQUENCE_BY
    deletes: DeleteMode = "soft"
    track: tuple[str, ...] | None = None
    partitions: int | None = None
    absent: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.deletes not in ("soft", "hard"):
            raise ValueError(f"deletes must be 'soft' or 'hard' (got {self.deletes!r})")
        if not self.sequence_by or len(set(self.sequence_by)) != len(self.sequence_by):
            raise ValueError(
                f"sequence_by must be a non-empty list of distinct columns (got "
                f"{list(self.sequence_by)!r})"
            )
        if self.processed_at.tzinfo is None:
            raise ValueError("processed_at must be timezone-aware (UTC)")

    @property
    def order_by(self) -> tuple[str, ...]:
        return order_columns(self.sequence_by)


def _target(column: str) -> Target:
    # Silver names a struct member "Parent.Child"; Salesforce field names hold no dots.
    parent, dot, child = column.partition(".")
    return Target(parent, child) if dot else Target(column)


def fold_plan(
    layout: SilverLayout,
    *,
    processed_at: datetime,
    sequence_by: Sequence[str] = DEFAULT_SEQUENCE_BY,
    deletes: DeleteMode = "soft",
    track: Sequence[str] | Literal["all"] | None = None,
    partitions: int | None = None,
    versions: Mapping[str, Iterable[str]] | None = None,
) -> FoldPlan:
    """The :class:`FoldPlan` of an object from its silver layout: every field name a change
    can carry (top-level and ``Parent.Child``) mapped with silver's own
    :meth:`~pipelines.silver.columns.SilverLayout.columns_for`, in struct or flattened mode.

    ``track`` is SCD2's tracked columns: ``"all"`` body columns, a list, or ``None`` (no
    history). ``versions`` maps each schema id of the object to its top-level field names
    (see :func:`absent_columns`).
    """
    targets: dict[str, tuple[Target, ...]] = {}
    clears: dict[str, tuple[str, ...]] = {}
    structs: dict[str, tuple[str, ...]] = {}
    flat = layout.compounds == "flattened"
    for f in layout.fields:
        targets[f.name] = tuple(_target(c) for c in layout.columns_for(f.name))
        if f.shape == "leaf":
            continue
        if not flat:
            structs[f.name if f.shape == "struct" else f.person_column] = f.child_names()
        for child in f.child_names():
            path = f"{f.name}.{child}"
            targets[path] = (_target(layout.column_for(path)),)
            if f.shape == "switchable":
                # A person name child means the record branch is in use: the string branch
                # (a business account's name) no longer applies.
                clears[path] = (f.name,)
    body = [name for name, _ in layout.field_columns()]
    tracked: tuple[str, ...] | None
    if track is None:
        tracked = None
    elif track == "all":
        tracked = tuple(body)
    else:
        unknown = [c for c in track if c not in body]
        if unknown:
            raise ValueError(
                f"{layout.entity}: scd2.track names {unknown}, which are not columns of its "
                f"silver table (columns: {', '.join(body)})"
            )
        tracked = tuple(track)
    return FoldPlan(
        object_name=layout.entity,
        targets=targets,
        processed_at=processed_at,
        structs=structs,
        clears=clears,
        sequence_by=tuple(sequence_by),
        deletes=deletes,
        track=tracked,
        partitions=partitions,
        absent=absent_columns(layout, versions or {}),
    )


def absent_columns(
    layout: SilverLayout, versions: Mapping[str, Iterable[str]]
) -> dict[str, tuple[str, ...]]:
    """For each schema id (``versions``: id -> the version's top-level field names), the
    body columns of the layout's fields that version does not have; ids lacking none are left
    out."""
    columns_of: dict[str, tuple[str, ...]] = {}
    for f in layout.fields:
        paths = [f.name, *(f"{f.name}.{child}" for child in f.child_names())]
        names = [_target(c).column for p in paths for c in layout.columns_for(p)]
        columns_of[f.name] = tuple(dict.fromkeys(names))
    absent: dict[str, tuple[str, ...]] = {}
    for sid, fields in versions.items():
        present = set(fields)
        missing = [c for f in layout.fields if f.name not in present for c in columns_of[f.name]]
        if missing:
            absent[sid] = tuple(dict.fromkeys(missing))
    return absent


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
                change_type=change.get(_CHANGE_TYPE),
                detail=detail,
                commit_timestamp=change.get(_COMMIT_TS),
                replay_id=change.get(_REPLAY_ID),
                event_id=change.get(_EVENT_ID),
                bronze_batch_id=change.get(_BATCH_ID),
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
        self.row[LAST_CHANGE_TYPE] = change.get(_CHANGE_TYPE)
        self.row[LAST_COMMIT_TS] = change.get(_COMMIT_TS)
        self.row[LAST_COMMIT_NUMBER] = change.get(_COMMIT_NUMBER)
        self.row[LAST_REPLAY_ID] = change.get(_REPLAY_ID)
        self.row[LAST_EVENT_ID] = change.get(_EVENT_ID)
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
                    SCD_VALID_FROM: change.get(_COMMIT_TS),
                    SCD_VALID_TO: None,
                    SCD_IS_CURRENT: True,
                    SCD_IS_DELETED: self.row[DELETED],
                    SCD_CHANGE_TYPE: change.get(_CHANGE_TYPE),
                    SCD_ORDER_KEY: key,
                    SCD_EVENT_ID: change.get(_EVENT_ID),
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
            or (change.get(_EVENT_ID) is not None and change.get(_EVENT_ID) == row[LAST_EVENT_ID])
        ):
            self.ignored += 1
            return
        change_type = change.get(_CHANGE_TYPE)
        if change.get(_WILDCARD):
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
        absent = self.plan.absent.get(change.get(_SCHEMA_ID) or "", ())
        for column in self.body:
            if column in absent:
                continue  # not a field of the change's schema version: kept as it was
            value = change.get(column)
            row[column] = _normal(value) if column in structs else value
        row[DELETED] = False
        row[DELETED_AT] = None
        row[NEEDS_RESYNC] = False
        row[RESYNC_REASON] = None
        event_id = change.get(_EVENT_ID)
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
        self.row[DELETED_AT] = change.get(_COMMIT_TS)

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
        changed = change.get(_CHANGED) or ()
        nulled = set(change.get(_NULLED) or ())
        diffed = set(change.get(_DIFF) or ())
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


def _in_order(
    changes: Iterable[Mapping[str, Any]], key_of: Callable[[Mapping[str, Any]], str]
) -> list[tuple[str, Mapping[str, Any]]]:
    """``(order key, change)`` pairs sorted by key, each event once: the same event delivered
    twice lands in two bronze positions, and the first one is kept."""
    seen: set[Any] = set()
    keyed = []
    for change in changes:
        event_id = change.get(_EVENT_ID)
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
    keyed = _in_order(
        changes, lambda c: c.get(_KEY) or encode_order_key(c.get(col) for col in order_by)
    )
    fold = _Fold(plan, body, record_id)
    if record_id is None:
        for _, change in keyed:
            if change.get(_CHANGE_TYPE) == _OVERFLOW:
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
                    f"a {change.get(_CHANGE_TYPE)} change without a record id",
                    mark=False,
                )
        return fold.finish(None, None)
    fold.start(gold, tombstone)
    for key, change in keyed:
        if change.get(_CHANGE_TYPE) == _OVERFLOW:
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


# ------------------------------------------------------------------------------ Spark side


def _version_type(tracked: Sequence[T.StructField]) -> T.StructType:
    return history_schema(tracked)


def fold_output_schema(
    body: Sequence[T.StructField], track: Sequence[str] | None = None
) -> T.StructType:
    """The schema the fold returns for ``body`` columns (and SCD2 ``track``):
    the gold schema, then the ``_fold_*`` columns."""
    gold = gold_schema(body)
    by_name = {f.name: f for f in body}
    tracked = [by_name[c] for c in (track or ())]
    return T.StructType(
        [
            *gold.fields,
            T.StructField(FOLD_GOLD, T.StringType()),
            T.StructField(FOLD_TOMBSTONE, T.StringType()),
            T.StructField(FOLD_RESYNC, T.ArrayType(RESYNC_SCHEMA)),
            T.StructField(FOLD_VERSIONS, T.ArrayType(_version_type(tracked))),
            T.StructField(FOLD_RESOLVED_BY, T.StringType()),
            T.StructField(FOLD_CHANGES, T.IntegerType()),
            T.StructField(FOLD_APPLIED, T.IntegerType()),
            T.StructField(FOLD_IGNORED, T.IntegerType()),
        ]
    )


def _check_plan(plan: FoldPlan, body: Sequence[T.StructField], silver: T.StructType) -> None:
    names = {f.name for f in silver.fields}
    body_names = {f.name for f in body}
    missing = [c for c in plan.order_by if c not in names]
    if missing:
        raise ValueError(
            f"{plan.object_name}: sequence_by columns {missing} are not silver columns "
            f"(silver columns: {', '.join(sorted(names))})"
        )
    absent = [c for c in (*_HEADER, ID) if c not in names]
    if absent:
        raise ValueError(f"{plan.object_name}: the changes lack silver columns {absent}")
    untracked = [c for c in plan.track or () if c not in body_names]
    if untracked:
        raise ValueError(
            f"{plan.object_name}: scd2.track names {untracked}, which are not body columns "
            f"(body columns: {', '.join(f.name for f in body)})"
        )


def merge_conditions(deletes: DeleteMode) -> tuple[str, str | None]:
    """``(update_condition, delete_condition)`` of the gold MERGE on ``Id``: a row is updated
    only by a newer order key, and (hard deletes) deleted by a newer delete."""
    newer = f"(target.{ORDER_KEY} IS NULL OR source.{ORDER_KEY} > target.{ORDER_KEY})"
    if deletes == "hard":
        return newer, f"source.{DELETED} = true AND {newer}"
    return newer, None
