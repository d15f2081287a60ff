"""The bronze layer's bookkeeping tables: every landing, of the Pub/Sub API or of the Streaming
API, creates the missing ones, empty, before it lands anything (:mod:`pipelines.bookkeeping`
says how, and how to add one).

Each table's name and schema are defined beside its writer: the checkpoints, the schema
registry and the schema and topic failures in :mod:`pipelines.bronze.tables`, the leases in
:mod:`pipelines.bronze.lease`, the Streaming API's describes in
:mod:`pipelines.bronze.cometd_tables`, the commits table (written by every layer) in
:mod:`pipelines.ops.table`.
"""

from __future__ import annotations

from pipelines.bookkeeping import BookkeepingTable
from pipelines.bronze.cometd_tables import DESCRIBES_SCHEMA, DESCRIBES_TABLE
from pipelines.bronze.lease import LEASE_SCHEMA
from pipelines.bronze.tables import (
    CHECKPOINT_SCHEMA,
    CHECKPOINT_TABLE,
    LEASE_TABLE,
    SCHEMA_FAILURES_SCHEMA,
    SCHEMA_FAILURES_TABLE,
    SCHEMA_REGISTRY_SCHEMA,
    SCHEMA_REGISTRY_TABLE,
    TOPIC_FAILURES_SCHEMA,
    TOPIC_FAILURES_TABLE,
)
from pipelines.engines.base import TableRef
from pipelines.ops.table import COMMITS_BOOKKEEPING

__all__ = ["BOOKKEEPING"]

BOOKKEEPING: tuple[BookkeepingTable, ...] = (
    BookkeepingTable(TableRef("bronze", CHECKPOINT_TABLE), CHECKPOINT_SCHEMA),
    BookkeepingTable(TableRef("bronze", SCHEMA_REGISTRY_TABLE), SCHEMA_REGISTRY_SCHEMA),
    BookkeepingTable(TableRef("bronze", SCHEMA_FAILURES_TABLE), SCHEMA_FAILURES_SCHEMA),
    BookkeepingTable(TableRef("bronze", TOPIC_FAILURES_TABLE), TOPIC_FAILURES_SCHEMA),
    BookkeepingTable(TableRef("bronze", LEASE_TABLE), LEASE_SCHEMA),
    BookkeepingTable(TableRef("bronze", DESCRIBES_TABLE), DESCRIBES_SCHEMA),
    COMMITS_BOOKKEEPING,
)
