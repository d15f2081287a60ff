"""The columns of a gold table: silver's body columns plus sfcdc's control columns.

A gold table holds one row per record id: ``Id``, then every body column of the object's
silver table (same names, same types, structs or flattened compounds alike, Account's
``Name`` / ``Name_PersonName`` pair included), then the control columns below. Gold follows
silver's schema evolution: a column silver gains (a field a new schema version adds) is added
to gold on the next run, null for the rows written before.

=========================  ==========  ======================================================
control column             type        meaning
=========================  ==========  ======================================================
``_cdc_is_deleted``        boolean     the record is deleted (soft delete); its values are kept
``_cdc_deleted_at``        timestamp   commit time of the delete (null while live)
``_cdc_needs_resync``      boolean     gold cannot vouch for the row's values (gap event, diff
                                       that could not be rebuilt, change of a record never
                                       seen): re-read it from Salesforce
``_cdc_resync_reason``     string      why, as a comma-separated list of reasons (the
                                       re-sync table has the details)
``_cdc_last_change_type``  string      change type of the last change applied
``_cdc_last_commit_ts``    timestamp   its commit timestamp
``_cdc_last_commit_number``bigint      its commit number
``_cdc_last_replay_id``    binary      its replay id (opaque bytes)
``_cdc_last_event_id``     string      its event id
``_cdc_order_key``         string      its order key (see :mod:`pipelines.gold.fold`): a
                                       change whose key is not greater is ignored
``_cdc_updated_at``        timestamp   when sfcdc wrote the row (processing time)
=========================  ==========  ======================================================

An object whose formula fields are refreshed (``formulas.refresh_every``,
:mod:`pipelines.formulas`) also has a column per formula field and
``_cdc_formulas_refreshed_at`` (timestamp: when the row's formula values were read). Change
events never carry formula fields, so only the refresh and snapshots (which read whole records)
write these columns: every other writer's MERGE leaves columns it does not name as they are.

With hard deletes, a deleted record's row leaves the gold table and a row in its tombstone
table (``<gold table>_tombstones``: ``Id`` and the control columns) remembers the delete, so
a late change cannot bring the record back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pyspark.sql import types as T

__all__ = [
    "CONTROL_COLUMNS",
    "DELETED",
    "DELETED_AT",
    "FORMULAS_REFRESHED_AT",
    "ID",
    "LAST_CHANGE_TYPE",
    "LAST_COMMIT_NUMBER",
    "LAST_COMMIT_TS",
    "LAST_EVENT_ID",
    "LAST_REPLAY_ID",
    "NEEDS_RESYNC",
    "ORDER_KEY",
    "RESERVED_PREFIX",
    "RESYNC_REASON",
    "UPDATED_AT",
    "body_fields",
    "gold_schema",
    "tombstone_schema",
]

ID = "Id"
RESERVED_PREFIX = "_cdc_"

DELETED = "_cdc_is_deleted"
DELETED_AT = "_cdc_deleted_at"
NEEDS_RESYNC = "_cdc_needs_resync"
RESYNC_REASON = "_cdc_resync_reason"
LAST_CHANGE_TYPE = "_cdc_last_change_type"
LAST_COMMIT_TS = "_cdc_last_commit_ts"
LAST_COMMIT_NUMBER = "_cdc_last_commit_number"
LAST_REPLAY_ID = "_cdc_last_replay_id"
LAST_EVENT_ID = "_cdc_last_event_id"
ORDER_KEY = "_cdc_order_key"
UPDATED_AT = "_cdc_updated_at"
# Only in the gold tables of objects whose formula fields are refreshed.
FORMULAS_REFRESHED_AT = "_cdc_formulas_refreshed_at"

CONTROL_COLUMNS: tuple[tuple[str, T.DataType], ...] = (
    (DELETED, T.BooleanType()),
    (DELETED_AT, T.TimestampType()),
    (NEEDS_RESYNC, T.BooleanType()),
    (RESYNC_REASON, T.StringType()),
    (LAST_CHANGE_TYPE, T.StringType()),
    (LAST_COMMIT_TS, T.TimestampType()),
    (LAST_COMMIT_NUMBER, T.LongType()),
    (LAST_REPLAY_ID, T.BinaryType()),
    (LAST_EVENT_ID, T.StringType()),
    (ORDER_KEY, T.StringType()),
    (UPDATED_AT, T.TimestampType()),
)


def body_fields(silver: T.StructType) -> tuple[T.StructField, ...]:
    """The body columns of a silver table (its schema): every column but ``Id`` and sfcdc's
    own ``_cdc_*`` columns, in table order."""
    return tuple(
        f for f in silver.fields if f.name != ID and not f.name.lower().startswith(RESERVED_PREFIX)
    )


def _field(name: str, dt: T.DataType) -> T.StructField:
    return T.StructField(name, dt, nullable=True)


def gold_schema(body: Iterable[T.StructField]) -> T.StructType:
    """The gold table's schema for ``body`` columns: ``Id``, the body, the control columns."""
    fields = [_field(ID, T.StringType())]
    fields.extend(_field(f.name, f.dataType) for f in body)
    fields.extend(_field(n, t) for n, t in CONTROL_COLUMNS)
    _check_unique(fields)
    return T.StructType(fields)


def tombstone_schema() -> T.StructType:
    """The tombstone table's schema (hard deletes): ``Id`` and the control columns."""
    return T.StructType([_field(ID, T.StringType()), *(_field(n, t) for n, t in CONTROL_COLUMNS)])


def _check_unique(fields: Sequence[T.StructField]) -> None:
    seen: dict[str, str] = {}
    for f in fields:
        lower = f.name.lower()
        if lower in seen:
            raise ValueError(
                f"gold columns {seen[lower]!r} and {f.name!r} collide (Delta column names are "
                "case-insensitive)"
            )
        seen[lower] = f.name
