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
merges them with :func:`history_changes`, which also closes the version that was current
before (its ``_scd_valid_to`` becomes the first new version's ``_scd_valid_from``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyspark.sql import types as T

from pipelines.gold.columns import ID

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "HISTORY_KEYS",
    "SCD_CHANGE_TYPE",
    "SCD_COLUMNS",
    "SCD_EVENT_ID",
    "SCD_IS_CURRENT",
    "SCD_IS_DELETED",
    "SCD_ORDER_KEY",
    "SCD_VALID_FROM",
    "SCD_VALID_TO",
    "history_changes",
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


def history_changes(new_versions: DataFrame, current: DataFrame) -> DataFrame:
    """The rows to merge into the history table on :data:`HISTORY_KEYS`.

    ``new_versions`` are the versions a fold started (history schema, each record's versions
    chained: only its last one is current). ``current`` is the history table's current
    versions (any records; only those with new versions matter). Each such current version
    comes back closed at its record's first new version; the new versions come back as they
    are. A current version that is itself among the new versions (a re-run) is left alone.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    columns = new_versions.columns
    first = Window.partitionBy(ID).orderBy(F.col(SCD_ORDER_KEY))
    firsts = new_versions.select(
        ID,
        F.first(SCD_VALID_FROM).over(first).alias("_first_valid_from"),
        F.first(SCD_ORDER_KEY).over(first).alias("_first_order_key"),
    ).dropDuplicates([ID])
    closing = (
        current.where(F.col(SCD_IS_CURRENT))
        .join(firsts, on=ID)
        .where(F.col(SCD_ORDER_KEY) < F.col("_first_order_key"))
    )
    closed = closing.select(
        *[
            F.col("_first_valid_from").alias(c)
            if c == SCD_VALID_TO
            else F.lit(False).alias(c)
            if c == SCD_IS_CURRENT
            else F.col(c)
            for c in columns
        ]
    )
    return new_versions.select(*columns).unionByName(closed)
