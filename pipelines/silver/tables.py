"""Where silver writes: its tables' names and the Delta app ids its appends record.

An object's silver table is ``silver.<tables.silver>``; rows that cannot be decoded go to the
one quarantine table ``silver.sfcdc_quarantine``. Each append carries a Delta transaction (app
id + bronze version) so a step retried after a crash is written once: ``sfcdc.silver:<object>``
on the silver table, ``sfcdc.silver.quarantine:<object>`` (an object's undecodable rows) or
``sfcdc.silver.quarantine:<bronze table>`` (rows no object can decode) on the quarantine.

:data:`BOOKKEEPING`: the tables every silver run creates, empty, before it decodes anything
(:mod:`pipelines.bookkeeping`): the quarantine and the commits table.
"""

from __future__ import annotations

from pipelines.bookkeeping import BookkeepingTable
from pipelines.engines.base import TableRef
from pipelines.ops.table import COMMITS_BOOKKEEPING
from pipelines.silver.quarantine import QUARANTINE_SCHEMA
from pipelines.spec.models import ObjectSpec

__all__ = [
    "BOOKKEEPING",
    "QUARANTINE_APP_PREFIX",
    "QUARANTINE_TABLE",
    "SILVER_APP_PREFIX",
    "app_id",
    "silver_table",
]

SILVER_APP_PREFIX = "sfcdc.silver:"
QUARANTINE_APP_PREFIX = "sfcdc.silver.quarantine:"
QUARANTINE_TABLE = TableRef("silver", "sfcdc_quarantine")
BOOKKEEPING: tuple[BookkeepingTable, ...] = (
    BookkeepingTable(QUARANTINE_TABLE, QUARANTINE_SCHEMA),
    COMMITS_BOOKKEEPING,
)


def app_id(obj: ObjectSpec) -> str:
    """The Delta app id under which ``obj``'s silver table records the bronze version."""
    return f"{SILVER_APP_PREFIX}{obj.api_name}"


def silver_table(obj: ObjectSpec) -> TableRef:
    return TableRef("silver", obj.tables.silver)
