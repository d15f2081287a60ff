"""SCD2 history: one row per version of a record, a new version when a tracked column changes.

Enabled per object (``gold.scd2.enabled``), the history table ``<gold table>_history`` holds,
for every record, each state it has been in:

=====================  ==========  ==========================================================
column                 type        meaning
=====================  ==========  ==========================================================
``Id``                 string      the record
tracked columns        as in gold  their values in this version (``gold.scd2.track``: a list
                                   of columns, or ``all`` body columns)
``_scd_valid_from``    timestamp   commit time of the change that started the version
``_scd_valid_to``      timestamp   commit time of the change that ended it; null while current
``_scd_is_current``    boolean     this is the record's current version
``_scd_is_deleted``    boolean     the record was deleted in this version
``_scd_change_type``   string      the change that started the version
``_scd_order_key``     string      that change's order key (versions sort by it; unique per
                                   record)
``_scd_event_id``      string      that change's event id
=====================  ==========  ==========================================================

A change starts a version only when it changes a tracked column or the deleted flag; other
changes (``LastModifiedDate`` alone, when it is not tracked) leave the current version as it
is. Commit timestamps have one-second resolution, so two versions can share a
``_scd_valid_from``; ``_scd_order_key`` orders them. "As of" queries::

    SELECT * FROM gold.account_history
    WHERE _scd_valid_from <= TIMESTAMP '2025-01-01 12:00:00'
      AND (_scd_valid_to IS NULL OR _scd_valid_to > TIMESTAMP '2025-01-01 12:00:00')
      AND NOT _scd_is_deleted

The fold (:mod:`pipelines.gold.fold`) produces each record's new versions in order; the job
merges them with what :class:`HistoryChanges` makes of them, which also closes the version
that was current before (its ``_scd_valid_to`` becomes the first new version's
``_scd_valid_from``).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.gold.columns import ID

__all__ = [
    "CURRENT_VERSION",
    "HISTORY_KEYS",
    "HISTORY_ROLE",
    "NEW_VERSION",
    "SCD_CHANGE_TYPE",
    "SCD_COLUMNS",
    "SCD_EVENT_ID",
    "SCD_IS_CURRENT",
    "SCD_IS_DELETED",
    "SCD_ORDER_KEY",
    "SCD_VALID_FROM",
    "SCD_VALID_TO",
    "HistoryChanges",
    "history_input_schema",
    "history_schema",
]

SCD_VALID_FROM = "_scd_valid_from"
SCD_VALID_TO = "_scd_valid_to"
SCD_IS_CURRENT = "_scd_is_current"
SCD_IS_DELETED = "_scd_is_deleted"
SCD_CHANGE_TYPE = "_scd_change_type"
SCD_ORDER_KEY = "_scd_order_key"
SCD_EVENT_ID = "_scd_event_id"

SCD_COLUMNS: tuple[tuple[str, T.DataType], ...] = (
    (SCD_VALID_FROM, T.TimestampType()),
    (SCD_VALID_TO, T.TimestampType()),
    (SCD_IS_CURRENT, T.BooleanType()),
    (SCD_IS_DELETED, T.BooleanType()),
    (SCD_CHANGE_TYPE, T.StringType()),
    (SCD_ORDER_KEY, T.StringType()),
    (SCD_EVENT_ID, T.StringType()),
)
# A version is identified by its record and the order key of the change that started it.
HISTORY_KEYS: tuple[str, ...] = (ID, SCD_ORDER_KEY)


def history_schema(tracked: Sequence[T.StructField]) -> T.StructType:
    """The history table's schema: ``Id``, the tracked columns, the ``_scd_*`` columns."""
    return T.StructType(
        [
            T.StructField(ID, T.StringType()),
            *(T.StructField(f.name, f.dataType) for f in tracked),
            *(T.StructField(n, t) for n, t in SCD_COLUMNS),
        ]
    )


HISTORY_ROLE = "_scd_role"
NEW_VERSION, CURRENT_VERSION = "n", "c"


def history_input_schema(history: T.StructType) -> T.StructType:
    """The rows :class:`HistoryChanges` reads: history rows and their role."""
    return T.StructType([*history.fields, T.StructField(HISTORY_ROLE, T.StringType())])


class HistoryChanges:
    """The rows to merge into the history table on :data:`HISTORY_KEYS`, from a table
    holding, for each record it sees, its new versions (role :data:`NEW_VERSION`: the
    versions a fold started, chained: only the last one is current) and its versions in the
    history table (role :data:`CURRENT_VERSION`; only current ones matter).

    Each such current version comes back closed at its record's first new version; the new
    versions come back as they are. A current version that is itself among the new versions
    (a re-run) is left alone.
    """

    def __init__(self, history: T.StructType) -> None:
        self.history = history

    def __call__(self, rows: pa.Table) -> pa.Table:
        target = spark_schema_to_arrow(self.history)
        role = rows.column(HISTORY_ROLE)
        new = rows.filter(pc.equal(role, NEW_VERSION)).select(target.names)
        current = rows.filter(
            pc.and_(
                pc.equal(role, CURRENT_VERSION), pc.fill_null(rows.column(SCD_IS_CURRENT), False)
            )
        ).select(target.names)
        if not new.num_rows or not current.num_rows:
            return new.cast(target)
        ordered = new.sort_by([(ID, "ascending"), (SCD_ORDER_KEY, "ascending")])
        ids = ordered.column(ID).combine_chunks()
        first = _starts(ids)
        firsts = ordered.filter(first)
        # Each current version's record among the firsts (a join would not carry the
        # tracked columns' structs along).
        index = pc.index_in(current.column(ID), value_set=firsts.column(ID))
        found = current.filter(pc.is_valid(index))
        index = pc.drop_null(index)
        first_from = firsts.column(SCD_VALID_FROM).take(index)
        first_key = firsts.column(SCD_ORDER_KEY).take(index)
        earlier = pc.fill_null(pc.less(found.column(SCD_ORDER_KEY), first_key), False)
        closing = found.filter(earlier)
        closing_from = first_from.filter(earlier)
        n = closing.num_rows
        columns = []
        for f in target:
            if f.name == SCD_VALID_TO:
                columns.append(closing_from.cast(f.type))
            elif f.name == SCD_IS_CURRENT:
                columns.append(pa.repeat(pa.scalar(False), n))
            else:
                columns.append(closing.column(f.name).cast(f.type))
        closed = pa.Table.from_arrays(columns, schema=target)
        return pa.concat_tables([new.cast(target), closed])


def _starts(ids: pa.Array) -> pa.Array:
    """True where a sorted column's value differs from the one before (a group starts)."""
    if len(ids) == 0:
        return pa.array([], pa.bool_())
    previous = pa.concat_arrays([pa.array([None], ids.type), ids.slice(0, len(ids) - 1)])
    return pc.fill_null(pc.not_equal(ids, previous), True)
