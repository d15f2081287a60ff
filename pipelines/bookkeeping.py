"""sfcdc's own tables exist, empty, from the first run of the layer that owns them.

The documents, the dashboard, the alerts and people's own queries name sfcdc's bookkeeping
tables (``gold.sfcdc_resync``, ``silver.sfcdc_quarantine``, ``bronze.sfcdc_commits``, ...).
Left to their writers, which add rows only when there is something to record, they would appear
with their first row: a lake that has never had a gap event would have no re-sync table, and a
query on it would fail with "table not found" instead of returning no rows. So each layer
declares its bookkeeping tables, and its run creates the missing ones before anything else
(:func:`ensure_bookkeeping`, through the engine seam, so on both engines alike):

=======  ===================================================  ===============================
layer    declared in                                          created by the start of
=======  ===================================================  ===============================
bronze   :data:`pipelines.bronze.bookkeeping.BOOKKEEPING`     every landing (Pub/Sub API and
                                                              Streaming API)
silver   :data:`pipelines.silver.tables.BOOKKEEPING`          every silver run
gold     :data:`pipelines.gold.tables.BOOKKEEPING`            every gold run
=======  ===================================================  ===============================

To add a bookkeeping table: define its :class:`~pipelines.engines.base.TableRef` and schema
once, beside the code that writes it, and add ``BookkeepingTable(ref, schema)`` to the
``BOOKKEEPING`` of the layer whose run writes it (a table several layers write, such as the
commits table, goes in each). Tests check that every declared table exists after its layer's
first run on both engines (``tests/integration/cli/test_first_run_tables.py`` for silver and
gold, ``tests/integration/bronze/test_landing.py`` for a landing), and that every ``sfcdc_*``
table the documents, the dashboard and the alerts name is declared.

The writers still make sure of their table's columns before they write (an existing lake
gains the columns a newer sfcdc adds); this only creates what is missing, so a second run
commits nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from ingest.errors import LakeError
from pipelines.engines.arrow import arrow_schema_to_spark
from pipelines.engines.base import TableRef

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from pipelines.engines.base import LakeEngine

__all__ = ["BookkeepingTable", "ensure_bookkeeping"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BookkeepingTable:
    """One of sfcdc's own tables: where it is and its columns (an Arrow schema, or a Spark
    schema, as its writer defines it)."""

    table: TableRef
    schema: pa.Schema | StructType

    def spark_schema(self) -> StructType:
        """The columns as the engines' :meth:`~pipelines.engines.base.LakeEngine.ensure_table`
        takes them."""
        if isinstance(self.schema, pa.Schema):
            return arrow_schema_to_spark(self.schema)
        return self.schema


def ensure_bookkeeping(
    engine: LakeEngine,
    tables: Iterable[BookkeepingTable],
    *,
    logger: logging.Logger | None = None,
) -> list[TableRef]:
    """Create each of ``tables`` that does not exist yet, empty; the tables created. One that
    another process (a landing beside the passes) created meanwhile counts as there."""
    log = logger or _log
    created: list[TableRef] = []
    seen: set[TableRef] = set()
    for entry in tables:
        if entry.table in seen:
            continue
        seen.add(entry.table)
        if engine.exists(entry.table):
            continue
        try:
            engine.ensure_table(entry.table, entry.spark_schema())
        except LakeError:
            # Two runs creating the same table at once: Delta lets one create commit through.
            if not engine.exists(entry.table):
                raise
            continue
        log.debug("bookkeeping table %s created (empty)", entry.table)
        created.append(entry.table)
    return created
