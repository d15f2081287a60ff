"""Where silver writes: its tables' names and the Delta app ids its appends record.

An object's silver table is ``silver.<tables.silver>``; rows that cannot be decoded go to the
one quarantine table ``silver.sfcdc_quarantine``. Each append carries a Delta transaction (app
id + bronze version) so a step retried after a crash is written once: ``sfcdc.silver:<object>``
on the silver table, ``sfcdc.silver.quarantine:<object>`` (an object's undecodable rows) or
``sfcdc.silver.quarantine:<bronze table>`` (rows no object can decode) on the quarantine.
"""

from __future__ import annotations

from pipelines.engines import TableRef
from pipelines.spec import ObjectSpec

__all__ = [
    "QUARANTINE_APP_PREFIX",
    "QUARANTINE_TABLE",
    "SILVER_APP_PREFIX",
    "app_id",
    "silver_table",
]

SILVER_APP_PREFIX = "sfcdc.silver:"
QUARANTINE_APP_PREFIX = "sfcdc.silver.quarantine:"
QUARANTINE_TABLE = TableRef("silver", "sfcdc_quarantine")


def app_id(obj: ObjectSpec) -> str:
    """The Delta app id under which ``obj``'s silver table records the bronze version."""
    return f"{SILVER_APP_PREFIX}{obj.api_name}"


def silver_table(obj: ObjectSpec) -> TableRef:
    return TableRef("silver", obj.tables.silver)
