"""The application transactions of the ``spark`` engine's tables: which version of each app id a
table has committed, so a write Delta has applied already is skipped before any work.

What a table under a location has recorded is read from its Delta log with the DataFrame API
(the newest checkpoint's transactions and those of the commits after it); a catalog table's,
from the ``userMetadata`` in which every commit sfcdc writes records its transaction
(``DESCRIBE HISTORY``). What was read is kept per table and brought up to date with the commits
since: those the engine makes itself without reading anything again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ingest.errors import LakeError
from pipelines.engines.base import TableRef, Txn, decode_user_metadata, txn_applied
from pipelines.engines.spark_access import SparkTableAccess

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["SparkTransactions"]

# The engine's log lines stay under its module's logger, whichever module writes them.
_log = logging.getLogger("pipelines.engines.spark")

# A catalog table's newest commits are read first when looking an app id up in its history:
# most lookups find it there.
_RECENT_COMMITS = 32
# What a Delta log file (a commit, a checkpoint) holds of an application transaction.
_TXN_ACTION = "txn STRUCT<appId: STRING, version: BIGINT>"


@dataclass
class _TxnIndex:
    """The application transactions of a table (app id -> version) as of its commit
    ``version``; ``complete``: every transaction the table records is in it (else only those
    of its newest commits)."""

    version: int
    txns: dict[str, int] = field(default_factory=dict)
    complete: bool = True


def _history_txns(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """The transactions the ``userMetadata`` of history rows records (any order of rows: a
    newer commit's version of an app id wins)."""
    found: dict[str, int] = {}
    for row in sorted(rows, key=lambda r: int(r["version"])):
        _metadata, txn = decode_user_metadata(row.get("userMetadata"))
        if txn is not None:
            found[txn.app_id] = txn.version
    return found


def _missing_path(exc: Exception) -> bool:
    """Whether Spark refused a read because a path (or every file of a pattern) is missing."""
    return "PATH_NOT_FOUND" in str(exc)


def _txn_rows(frame: DataFrame) -> dict[str, int]:
    """The transactions of Delta log files read into ``frame`` (columns ``file``, the file's
    name, and ``txn``): a newer file's version of an app id wins."""
    rows = frame.where("txn IS NOT NULL").selectExpr("file", "txn.appId", "txn.version")
    found: dict[str, int] = {}
    for row in sorted(rows.collect(), key=lambda r: str(r["file"])):
        found[str(row["appId"])] = int(row["version"])
    return found


class SparkTransactions:
    """The transactions of the tables of one engine (``access``), per table as of a version."""

    def __init__(self, access: SparkTableAccess) -> None:
        self._access = access
        self._indexes: dict[TableRef, _TxnIndex] = {}

    def txn_version(self, table: TableRef, app_id: str) -> int | None:
        """Latest txn version for ``app_id``. A table under ``location``: from its Delta log,
        read with the DataFrame API (the newest checkpoint's transactions, then those of the
        commits after it), as Delta reads them. A catalog table, whose files SQL does not
        reach (Unity Catalog): from the ``userMetadata`` that records the transaction of each
        commit sfcdc writes (``DESCRIBE HISTORY``, newest commits first), as far back as the
        table keeps its log. What was read is kept per table and brought up to date with the
        commits since."""
        if not self._access.exists(table):
            return None
        index = self._txn_index(table, complete=False)
        if app_id not in index.txns and not index.complete:
            index = self._txn_index(table, complete=True)
        return index.txns.get(app_id)

    def _txn_index(self, table: TableRef, *, complete: bool) -> _TxnIndex:
        latest = self._access.require(table)
        index = self._indexes.get(table)
        if index is None or index.version > latest or (complete and not index.complete):
            index = self._read_txns(table, latest, complete=complete)
        elif latest > index.version:
            newer = self._txns_after(table, index.version, latest)
            if newer is None:  # the log no longer has those commits: read it again
                index = self._read_txns(table, latest, complete=complete)
            else:
                index.txns.update(newer)
                index.version = latest
        self._indexes[table] = index
        return index

    def _read_txns(self, table: TableRef, latest: int, *, complete: bool) -> _TxnIndex:
        if self._access.location is None:
            rows = self._access.history_rows(table, None if complete else _RECENT_COMMITS)
            reached_all = complete or len(rows) < _RECENT_COMMITS
            return _TxnIndex(latest, _history_txns(rows), reached_all)
        checkpoint, txns = self.checkpoint_txns(table)
        newer = self._txns_after(table, checkpoint, latest) if latest > checkpoint else {}
        if newer is None:
            raise LakeError(
                f"{table}: the Delta log at {self._access.path(table)} lacks commits after its "
                f"newest checkpoint (version {checkpoint})"
            )
        return _TxnIndex(latest, {**txns, **newer})

    def _txns_after(self, table: TableRef, version: int, latest: int) -> dict[str, int] | None:
        """The transactions of the commits after ``version`` up to ``latest`` (``None``: some
        of those commits are gone from the log)."""
        if self._access.location is None:
            rows = self._access.history_rows(table, latest - version)
            return _history_txns([r for r in rows if int(r["version"]) > version])
        log = f"{self._access.path(table)}/_delta_log"
        commits = [f"{log}/{v:020d}.json" for v in range(version + 1, latest + 1)]
        with self._access.errors("read the Delta log of", table):
            try:
                frame = self._access.spark.read.schema(_TXN_ACTION).json(commits)
                return _txn_rows(frame.selectExpr("_metadata.file_name AS file", "txn"))
            except Exception as exc:
                if _missing_path(exc):
                    return None  # Delta's log cleanup removed some of them
                raise

    def checkpoint_txns(self, table: TableRef) -> tuple[int, dict[str, int]]:
        """``(version, transactions)`` of the table's newest log checkpoint; ``(-1, {})``
        when it has none (then its log holds every commit from version 0)."""
        log = f"{self._access.path(table)}/_delta_log"
        with self._access.errors("read the log checkpoints of", table):
            try:
                frame = self._access.spark.read.parquet(f"{log}/*.checkpoint*.parquet").selectExpr(
                    "_metadata.file_name AS file", "txn"
                )
                (newest,) = frame.selectExpr("max(file)").collect()[0]
            except Exception as exc:
                if _missing_path(exc):
                    return -1, {}
                raise
            version = int(newest[:20])
            # Each part of a multi-part checkpoint is named after its version.
            of_newest = frame.where(f"file LIKE '{version:020d}.%'")
            return version, _txn_rows(of_newest)

    def note_commit(
        self, table: TableRef, before: int, latest: Mapping[str, Any], txn: Txn
    ) -> None:
        """Bring the table's transaction index up to the commit a write with ``txn`` just made
        (``latest``, the history row of the table's newest commit; ``before``, its version
        before the write), so the next write reads no log: only when that commit directly
        follows the version the index is current at and records exactly ``txn``. Anything
        else (another writer's commit in between, a write Delta skipped) leaves the index to
        be brought up to date from the log."""
        index = self._indexes.get(table)
        if (
            index is not None
            and index.version == before
            and int(latest["version"]) == before + 1
            and _history_txns([latest]) == {txn.app_id: txn.version}
        ):
            index.txns[txn.app_id] = txn.version
            index.version = before + 1

    def already_applied(self, table: TableRef, txn: Txn | None) -> bool:
        if txn is None:
            return False
        return txn_applied(table, txn, self.txn_version(table, txn.app_id), _log)
