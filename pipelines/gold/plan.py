"""The fold's plan and the row types it reads and returns.

:class:`FoldPlan` is what the fold of one object needs (:func:`fold_plan` makes it from the
object's silver layout); :func:`fold_input_schema` is the row type the fold reads (silver's
change rows, gold rows and tombstones, each tagged with its role) and
:func:`fold_output_schema` the one it returns (the gold row after the batch, and ``_fold_*``
columns saying what to do with it). The names here are the columns those rows have: the
fold (:mod:`pipelines.gold.fold`) and the Arrow functions over tables
(:mod:`pipelines.gold.folding`) read and write them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from pyspark.sql import types as T

from pipelines.gold.columns import ID, body_fields, gold_schema, tombstone_schema
from pipelines.gold.resync import RESYNC_SCHEMA
from pipelines.gold.scd2 import history_schema
from pipelines.spec.sections import DEFAULT_SEQUENCE_BY, DeleteMode

if TYPE_CHECKING:
    from pipelines.silver.columns import SilverLayout

__all__ = [
    "BATCH_ID",
    "CHANGED_FIELDS",
    "CHANGE_KEY",
    "CHANGE_TYPE",
    "COMMIT_NUMBER",
    "COMMIT_TS",
    "DIFF_FIELDS",
    "EVENT_ID",
    "FOLD_APPLIED",
    "FOLD_CHANGES",
    "FOLD_COLUMNS",
    "FOLD_GOLD",
    "FOLD_IGNORED",
    "FOLD_RESOLVED_BY",
    "FOLD_RESYNC",
    "FOLD_SET",
    "FOLD_TOMBSTONE",
    "FOLD_VERSIONS",
    "IS_WILDCARD",
    "NULLED_FIELDS",
    "REPLAY_ID",
    "ROLE",
    "ROLE_CHANGE",
    "ROLE_GOLD",
    "ROLE_TOMBSTONE",
    "SCHEMA_ID",
    "STREAM_ORDER",
    "FoldPlan",
    "Target",
    "absent_columns",
    "change_columns",
    "check_plan",
    "fold_input_schema",
    "fold_output_schema",
    "fold_plan",
    "kept_columns",
    "order_columns",
    "versions_schema",
]

# The position in the stream: the last tie-break of every order key.
STREAM_ORDER: tuple[str, ...] = ("_cdc_bronze_batch_id", "_cdc_bronze_batch_seq")

# Silver header columns the fold reads.
CHANGE_TYPE = "_cdc_change_type"
COMMIT_TS = "_cdc_commit_timestamp"
COMMIT_NUMBER = "_cdc_commit_number"
EVENT_ID = "_cdc_event_id"
REPLAY_ID = "_cdc_replay_id"
CHANGED_FIELDS = "_cdc_changed_fields"
NULLED_FIELDS = "_cdc_nulled_fields"
DIFF_FIELDS = "_cdc_diff_fields"
IS_WILDCARD = "_cdc_is_wildcard"
BATCH_ID = "_cdc_bronze_batch_id"
SCHEMA_ID = "_cdc_schema_id"
_HEADER = (
    SCHEMA_ID,
    CHANGE_TYPE,
    COMMIT_TS,
    COMMIT_NUMBER,
    EVENT_ID,
    REPLAY_ID,
    CHANGED_FIELDS,
    NULLED_FIELDS,
    DIFF_FIELDS,
    IS_WILDCARD,
    BATCH_ID,
)

# The fold input rows' role: a silver change, a gold row or a tombstone.
ROLE = "_fold_role"
ROLE_CHANGE, ROLE_GOLD, ROLE_TOMBSTONE = "c", "g", "t"
# A change's order key, computed column-wise per Arrow batch before the rows become dicts.
CHANGE_KEY = "_fold_key"

# What the fold returns after the gold row: what to do with it, and what the fold found.
FOLD_GOLD = "_fold_gold"
FOLD_TOMBSTONE = "_fold_tombstone"
FOLD_RESYNC = "_fold_resync"
FOLD_VERSIONS = "_fold_versions"
FOLD_RESOLVED_BY = "_fold_resolved_by"
FOLD_CHANGES = "_fold_changes"
FOLD_APPLIED = "_fold_applied"
FOLD_IGNORED = "_fold_ignored"
# Per body column, in order: "0" where the record keeps its gold row's value (no applied change
# set it, and the fold started from that row), "1" where the fold's value replaces it. The
# gold MERGE then needs from the fold only the values that change (``engine.merge(keep=...)``).
FOLD_SET = "_fold_set"
FOLD_COLUMNS: tuple[str, ...] = (
    FOLD_GOLD,
    FOLD_TOMBSTONE,
    FOLD_RESYNC,
    FOLD_VERSIONS,
    FOLD_RESOLVED_BY,
    FOLD_CHANGES,
    FOLD_APPLIED,
    FOLD_IGNORED,
    FOLD_SET,
)


def order_columns(sequence_by: Sequence[str]) -> tuple[str, ...]:
    """``sequence_by`` followed by the stream order columns it does not already name: the
    columns a change's order key is made of."""
    return (*sequence_by, *(c for c in STREAM_ORDER if c not in sequence_by))


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


# ---------------------------------------------------------------------------- row types


def check_plan(plan: FoldPlan, body: Sequence[T.StructField], silver: T.StructType) -> None:
    """Raise :class:`ValueError` when the changes (``silver``, whose body columns are
    ``body``) lack a column the fold reads or orders by, or the plan tracks a column that is
    not a body column."""
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


def change_columns(plan: FoldPlan, silver: T.StructType) -> list[str]:
    """The silver columns the fold reads of a change: ``Id``, the header, the order
    columns, the body columns."""
    body = [f.name for f in body_fields(silver)]
    return list(dict.fromkeys([ID, *_HEADER, *plan.order_by, *body]))


def kept_columns(
    plan: FoldPlan, body: Sequence[str], diffed: Iterable[str] = ()
) -> tuple[str, ...]:
    """The ``body`` columns the fold need not read from gold when the gold MERGE keeps the
    values no change set (``FOLD_SET``): all but the struct columns (a change may set one child
    of them), SCD2's tracked columns (versions compare them) and the columns the batch's
    ``diffed`` field paths land in (a diff applies to the value before it)."""
    needed = set(plan.structs) | set(plan.track or ())
    for path in diffed:
        needed.update(t.column for t in plan.targets.get(path, ()))
    return tuple(c for c in body if c not in needed)


def fold_input_schema(plan: FoldPlan, silver: T.StructType) -> T.StructType:
    """The row type the fold reads: the silver columns it uses (in silver's types), the gold
    and tombstone columns (a column both have takes the change's type), then the role."""
    body = body_fields(silver)
    check_plan(plan, body, silver)
    by_name = {f.name: f for f in silver.fields}
    fields = [by_name[c] for c in change_columns(plan, silver)]
    seen = {f.name.lower() for f in fields}
    for f in (*gold_schema(body).fields, *tombstone_schema().fields):
        if f.name.lower() not in seen:
            fields.append(T.StructField(f.name, f.dataType))
            seen.add(f.name.lower())
    return T.StructType(
        [T.StructField(f.name, f.dataType) for f in fields] + [T.StructField(ROLE, T.StringType())]
    )


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
            T.StructField(FOLD_VERSIONS, T.ArrayType(history_schema(tracked))),
            T.StructField(FOLD_RESOLVED_BY, T.StringType()),
            T.StructField(FOLD_CHANGES, T.IntegerType()),
            T.StructField(FOLD_APPLIED, T.IntegerType()),
            T.StructField(FOLD_IGNORED, T.IntegerType()),
            T.StructField(FOLD_SET, T.StringType()),
        ]
    )


def versions_schema(output: T.StructType) -> T.StructType:
    """The SCD2 version rows of a fold output schema."""
    element = output[FOLD_VERSIONS].dataType
    assert isinstance(element, T.ArrayType) and isinstance(element.elementType, T.StructType)
    return element.elementType
