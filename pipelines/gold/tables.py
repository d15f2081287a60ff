"""Where gold writes: its tables' names and the Delta app ids its MERGEs record.

An object's gold table is ``gold.<tables.gold>``; hard deletes are remembered in
``<gold table>_tombstones`` and the SCD2 history is ``<gold table>_history``. Each of the three
MERGEs carries a Delta transaction (app id + silver version) so a step retried after a crash
applies once.

:data:`BOOKKEEPING`: the tables every gold run creates, empty, before it merges anything
(:mod:`pipelines.bookkeeping`): the re-sync table, the commits table, and the records of the
jobs that keep gold equal to the org, so that queries and dashboards find them from the start:
``gold.sfcdc_reconcile`` (one row per object and reconcile, :mod:`pipelines.reconcile`) and
``gold.sfcdc_formulas`` (one row per object and formula refresh, :mod:`pipelines.formulas`).
"""

from __future__ import annotations

from pyspark.sql import types as T

from ingest.errors import ConcurrentWriteError
from pipelines.bookkeeping import BookkeepingTable
from pipelines.engines.base import TableRef
from pipelines.gold.resync import RESYNC_SCHEMA, RESYNC_TABLE
from pipelines.ops.table import COMMITS_BOOKKEEPING
from pipelines.spec.models import ObjectSpec

__all__ = [
    "BOOKKEEPING",
    "FORMULA_SCHEMA",
    "FORMULA_TABLE",
    "GOLD_APP_PREFIX",
    "HISTORY_APP_PREFIX",
    "RECONCILE_SCHEMA",
    "RECONCILE_TABLE",
    "TOMBSTONE_APP_PREFIX",
    "app_id",
    "conflict_error",
    "gold_table",
    "history_table",
    "tombstone_table",
]

GOLD_APP_PREFIX = "sfcdc.gold:"
TOMBSTONE_APP_PREFIX = "sfcdc.gold.tombstones:"
HISTORY_APP_PREFIX = "sfcdc.gold.history:"
RECONCILE_TABLE = TableRef("gold", "sfcdc_reconcile")
RECONCILE_SCHEMA = T.StructType(
    [
        T.StructField("run_id", T.StringType()),
        T.StructField("object", T.StringType()),
        T.StructField("started_at", T.TimestampType()),
        T.StructField("finished_at", T.TimestampType()),
        T.StructField("api", T.StringType()),
        T.StructField("salesforce_records", T.LongType()),
        T.StructField("salesforce_deleted", T.LongType()),
        T.StructField("gold_records", T.LongType()),
        T.StructField("in_flight", T.LongType()),
        T.StructField("drift_missing", T.LongType()),
        T.StructField("drift_extra", T.LongType()),
        T.StructField("drift_stale", T.LongType()),
        T.StructField("repaired", T.LongType()),
        T.StructField("duration_s", T.DoubleType()),
    ]
)
FORMULA_TABLE = TableRef("gold", "sfcdc_formulas")
FORMULA_SCHEMA = T.StructType(
    [
        T.StructField("run_id", T.StringType()),
        T.StructField("object", T.StringType()),
        T.StructField("started_at", T.TimestampType()),
        T.StructField("finished_at", T.TimestampType()),
        T.StructField("api", T.StringType()),
        T.StructField("fields", T.ArrayType(T.StringType())),
        T.StructField("records", T.LongType()),
        T.StructField("updated", T.LongType()),
        T.StructField("duration_s", T.DoubleType()),
    ]
)

BOOKKEEPING: tuple[BookkeepingTable, ...] = (
    BookkeepingTable(RESYNC_TABLE, RESYNC_SCHEMA),
    COMMITS_BOOKKEEPING,
    BookkeepingTable(RECONCILE_TABLE, RECONCILE_SCHEMA),
    BookkeepingTable(FORMULA_TABLE, FORMULA_SCHEMA),
)


def app_id(obj: ObjectSpec) -> str:
    """The Delta app id under which ``obj``'s gold table records the silver version."""
    return f"{GOLD_APP_PREFIX}{obj.api_name}"


def gold_table(obj: ObjectSpec) -> TableRef:
    return TableRef("gold", obj.tables.gold)


def tombstone_table(obj: ObjectSpec) -> TableRef:
    """Where hard deletes are remembered: ``<gold table>_tombstones``."""
    return TableRef("gold", f"{obj.tables.gold}_tombstones")


def history_table(obj: ObjectSpec) -> TableRef:
    """The SCD2 history: ``<gold table>_history``."""
    return TableRef("gold", f"{obj.tables.gold}_history")


def conflict_error(table: TableRef, name: str, start: int, version: int) -> ConcurrentWriteError:
    """What a gold MERGE that lost to another writer of ``table`` says."""
    return ConcurrentWriteError(
        f"gold: another writer committed to {table} while {name}'s changes from silver "
        f"versions {start}..{version} were being merged into it (a second `sfcdc gold` or "
        "`sfcdc run` on this lake, a resync, or a change made by hand), so Delta refused this "
        "MERGE and nothing of it was committed. Run one gold job per lake at a time, then run "
        "`sfcdc gold` again: it resumes from the silver version gold last recorded."
    )
