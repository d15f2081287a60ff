"""The one place sfcdc writes Delta log entries itself: one-file blind appends to local tables,
and the commits of the MERGE the local engine runs itself.

delta-rs' ``write_deltalake`` lists a table's whole ``_delta_log`` directory on every commit
on a local disk, so the cost of a commit grows with the number of commits a table has had
(7 ms at 200 commits, 58 ms at 3,000 on this project's benchmark machine). Bronze landing
commits several times a second for as long as it runs, so the local engine appends to tables
of the plain protocol sfcdc uses (see :func:`plain_protocol`) by writing the commit itself, as
the Delta protocol defines it:

- the rows are one Parquet file written with pyarrow (which releases the GIL while it encodes,
  so the stream keeps being received meanwhile), laid out as a
  :class:`~pipelines.engines.base.WriteLayout` asks;
- the actions of version ``N`` (``commitInfo``, ``add`` with file statistics, one ``txn`` per
  application transaction) are written to a temporary file that is then hard-linked to
  ``_delta_log/<N>.json``, which fails when the version exists (put-if-absent);
- the table's transactions and version are read once (and after a failed commit); later
  appends follow from this writer's own commits. A version taken meanwhile is followed when
  the writer that took it recorded none of this commit's transactions (maintenance compacting
  the table); otherwise the append fails as a concurrent write.

The MERGE the local engine runs itself (:mod:`pipelines.engines.direct_merge` matches the
rows in Arrow; delta-rs' MERGE takes twice as long) commits through :func:`commit_rewrite`:
``remove`` actions for the files it replaces, ``add`` actions with statistics for the files
it writes (:func:`write_data_file`), ``cdc`` actions for its change data files
(:func:`write_change_file`), its ``txn`` and ``commitInfo``, as the version after the one it
read, put-if-absent, under the table's rewrite lock.

Log cleanup with a retention shorter than a table's ``delta.logRetentionDuration`` is the other
hand-written part (:func:`expire_log`, used by both engines on tables on a local disk): delta-rs'
``cleanup_metadata`` only honours that table property, and setting it would be a commit of its
own on every maintenance run, which the appenders here would have to re-read.

Everything else -- creating tables, schema changes, the merges the local engine does not run
itself, overwrites, reads, the change data feed, compaction, checkpoints -- goes through
delta-rs' public API, and VACUUM through it as far as it reaches
(:mod:`pipelines.engines.vacuum` does the rest). Tests check that delta-rs and delta-spark
read these commits (rows, statistics, transactions, history, change data feed;
``tests/spark/test_deltalog.py`` for appends, ``tests/spark/test_direct_merge.py`` for the
MERGE).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from ingest.errors import LakeError
from pipelines.engines.base import (
    CommitResult,
    TableRef,
    Txn,
    WriteLayout,
    encode_user_metadata,
    txn_applied,
)

__all__ = [
    "DirectAppender",
    "Rewrite",
    "StaleTable",
    "commit_rewrite",
    "expire_log",
    "file_stats",
    "last_checkpoint",
    "log_entries",
    "plain_protocol",
    "put_if_absent",
    "remove_action",
    "write_change_file",
    "write_data_file",
    "write_parquet",
]

_log = logging.getLogger(__name__)

# Writer protocol versions whose appends need nothing beyond the actions written here when
# the table has no constraints, invariants or generated columns (checked by plain_protocol):
# 2 adds NOT NULL columns (checked before writing) and append-only tables (these are appends),
# 3 check constraints, 4 the change data feed (appends write no change files) and generated
# columns.
_MAX_WRITER_VERSION = 4
_COMMIT_ATTEMPTS = 10
_FIELD_RULES = ("delta.invariants", "delta.generationExpression", "delta.identity")


class StaleTable(LakeError):
    """Another writer changed the table's schema or protocol since this writer read it:
    nothing was committed; write through delta-rs instead."""


def plain_protocol(dt: DeltaTable) -> bool:
    """Whether appends to ``dt`` need only the actions :class:`DirectAppender` writes: no
    table features, writer version 4 or lower, no partitions, no CHECK constraints, no column
    invariants, generated or identity columns."""
    protocol = dt.protocol()
    metadata = dt.metadata()
    if protocol.min_writer_version > _MAX_WRITER_VERSION or protocol.min_reader_version > 1:
        return False
    if protocol.writer_features or protocol.reader_features or metadata.partition_columns:
        return False
    if any(key.startswith("delta.constraints.") for key in metadata.configuration):
        return False
    schema = json.loads(dt.schema().to_json())
    return not any(rule in json.dumps(schema) for rule in _FIELD_RULES)


def _stats_value(value: object) -> object:
    # Delta file statistics write timestamps as ISO text at millisecond precision (readers
    # widen a bound by that precision when they skip files) and dates as ISO dates.
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + (
            f"{value.microsecond // 1000:03d}Z"
        )
    if isinstance(value, date):
        return value.isoformat()
    return value


def _ranged(t: pa.DataType) -> bool:
    """Types whose min/max Delta records (and readers use to skip files)."""
    return bool(
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_string(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_date(t)
    )


def file_stats(table: pa.Table, *, unindexed: Sequence[str] = ()) -> str:
    """The Delta ``stats`` JSON of a file holding ``table``: the row count, min/max of the
    top-level columns readers can skip files by (numbers, text, dates, timestamps; not
    ``unindexed`` ones) and null counts of the top-level non-binary columns."""
    minimum: dict[str, object] = {}
    maximum: dict[str, object] = {}
    nulls: dict[str, int] = {}
    for f in table.schema:
        column = table.column(f.name)
        if not pa.types.is_binary(f.type) and not pa.types.is_nested(f.type):
            nulls[f.name] = column.null_count
        if not table.num_rows or f.name in unindexed or not _ranged(f.type):
            continue
        if column.null_count == table.num_rows or (
            pa.types.is_floating(f.type) and pc.any(pc.is_nan(column)).as_py()
        ):
            continue
        bounds = pc.min_max(column)
        minimum[f.name] = _stats_value(bounds["min"].as_py())
        maximum[f.name] = _stats_value(bounds["max"].as_py())
    return json.dumps(
        {
            "numRecords": table.num_rows,
            "minValues": minimum,
            "maxValues": maximum,
            "nullCount": nulls,
        },
        separators=(",", ":"),
    )


def write_parquet(data: pa.Table, path: Path, layout: WriteLayout | None) -> None:
    if layout is None:
        pq.write_table(data, str(path))
        return
    names = data.schema.names
    pq.write_table(
        data,
        str(path),
        row_group_size=layout.row_group_rows or max(data.num_rows, 1),
        compression={n: "none" if n in layout.uncompressed else "snappy" for n in names},
        use_dictionary=[n for n in names if n not in layout.distinct],
        write_statistics=[n for n in names if n not in layout.unindexed],
    )


def write_data_file(
    root: Path,
    data: pa.Table,
    now_ms: int,
    *,
    layout: WriteLayout | None = None,
    written: list[Path] | None = None,
) -> dict[str, object]:
    """Write ``data`` as a new data file of the table at ``root``; its ``add`` action (with
    statistics). ``written`` gets the file's path before it is written."""
    name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    if written is not None:
        written.append(root / name)
    write_parquet(data, root / name, layout)
    return {
        "path": name,
        "partitionValues": {},
        "size": (root / name).stat().st_size,
        "modificationTime": now_ms,
        "dataChange": True,
        "stats": file_stats(data, unindexed=layout.unindexed if layout is not None else ()),
    }


def write_change_file(
    root: Path, changes: pa.Table, *, written: list[Path] | None = None
) -> dict[str, object]:
    """Write ``changes`` (the table's columns and ``_change_type``) as a change data file of
    the table at ``root``; its ``cdc`` action. ``written`` as for :func:`write_data_file`."""
    name = f"_change_data/cdc-00000-{uuid.uuid4()}.c000.snappy.parquet"
    (root / "_change_data").mkdir(exist_ok=True)
    if written is not None:
        written.append(root / name)
    write_parquet(changes, root / name, None)
    return {
        "path": name,
        "partitionValues": {},
        "size": (root / name).stat().st_size,
        "dataChange": False,
    }


def remove_action(path: str, size: int, now_ms: int) -> dict[str, object]:
    """The ``remove`` action of a data file (``path`` as the log spells it) a commit
    replaces."""
    return {
        "path": path,
        "deletionTimestamp": now_ms,
        "dataChange": True,
        "extendedFileMetadata": True,
        "partitionValues": {},
        "size": size,
    }


@dataclass(frozen=True)
class Rewrite:
    """The actions of a commit that replaces data files (the local engine's own MERGE)."""

    operation: str
    parameters: Mapping[str, str]
    read_version: int
    metrics: Mapping[str, int]
    removes: Sequence[Mapping[str, object]] = ()
    adds: Sequence[Mapping[str, object]] = ()
    changes: Sequence[Mapping[str, object]] = ()


def commit_rewrite(
    root: Path,
    rewrite: Rewrite,
    now_ms: int,
    *,
    txn: Txn | None,
    metadata: Mapping[str, str] | None,
) -> bool:
    """Write ``rewrite`` as the version after its ``read_version`` of the table at ``root``,
    put-if-absent; False when that version is taken (then nothing was written). The caller
    holds the table's rewrite lock, so only blind appends can commit meanwhile."""
    info: dict[str, object] = {
        "timestamp": now_ms,
        "operation": rewrite.operation,
        "operationParameters": dict(rewrite.parameters),
        "readVersion": rewrite.read_version,
        "isBlindAppend": False,
        "operationMetrics": dict(rewrite.metrics),
        "engineInfo": "sfcdc",
    }
    text = encode_user_metadata(metadata, txn)
    if text:
        info["userMetadata"] = text
    actions: list[dict[str, object]] = [{"commitInfo": info}]
    actions.extend({"remove": dict(r)} for r in rewrite.removes)
    actions.extend({"add": dict(a)} for a in rewrite.adds)
    actions.extend({"cdc": dict(c)} for c in rewrite.changes)
    if txn is not None:
        actions.append(
            {"txn": {"appId": txn.app_id, "version": txn.version, "lastUpdated": now_ms}}
        )
    log = root / "_delta_log"
    version = rewrite.read_version + 1
    if version <= last_checkpoint(log):
        return False  # taken, and its entry expired after a checkpoint already
    text_lines = "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions)
    return put_if_absent(log / f"{version:020d}.json", text_lines)


@dataclass
class _State:
    """What this writer knows of one table: its schema (when it accepts appends), version
    and the transactions committed on that version (absent: read them first)."""

    schema: pa.Schema | None
    version: int | None = None
    applied: dict[str, int] | None = None


class DirectAppender:
    """Appends to local Delta tables by writing their log entries (see the module notes).

    ``path_of`` maps a table to its directory; ``clock`` (epoch seconds) stamps the actions.
    """

    def __init__(
        self, path_of: Callable[[TableRef], Path], *, clock: Callable[[], float] = time.time
    ) -> None:
        self._path_of = path_of
        self._clock = clock
        self._state: dict[TableRef, _State] = {}
        # One append per table at a time: threads sharing this writer would otherwise read
        # and reset one table's state under each other. Appends to other tables go on.
        self._locks: dict[TableRef, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def _lock(self, table: TableRef) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(table, threading.Lock())

    def forget(self, table: TableRef) -> None:
        """Drop what is known of ``table`` (another write path changed it)."""
        self._state.pop(table, None)

    def _open(self, table: TableRef) -> DeltaTable:
        path = self._path_of(table)
        try:
            return DeltaTable(str(path))
        except (DeltaError, OSError) as exc:
            raise LakeError(f"open {table} ({path}) failed: {exc}") from exc

    def accepts(self, table: TableRef, schema: pa.Schema) -> bool:
        """Whether appends of rows of ``schema`` to ``table`` can be committed here: the
        table exists with exactly that schema (names and types) and a plain protocol."""
        state = self._state.get(table)
        if state is None:
            if not (self._path_of(table) / "_delta_log").is_dir():
                return False
            try:
                dt = self._open(table)
            except LakeError:
                return False
            current = pa.schema(dt.schema().to_arrow())
            state = _State(current if plain_protocol(dt) else None)
            self._state[table] = state
        if state.schema is None:
            return False
        return [(f.name, f.type) for f in state.schema] == [(f.name, f.type) for f in schema]

    def _recorded(self, table: TableRef, state: _State, app_ids: Sequence[str]) -> dict[str, int]:
        if state.applied is None or state.version is None:
            dt = self._open(table)
            state.applied = {}
            state.version = dt.version()
            for app_id in app_ids:
                recorded = dt.transaction_version(app_id)
                if recorded is not None:
                    state.applied[app_id] = int(recorded)
        missing = [a for a in app_ids if a not in state.applied]
        if missing:
            dt = self._open(table)
            if dt.version() != state.version:
                # Someone else committed: start over from what the log says now.
                state.applied, state.version = None, None
                return self._recorded(table, state, app_ids)
            for app_id in missing:
                recorded = dt.transaction_version(app_id)
                state.applied[app_id] = -1 if recorded is None else int(recorded)
        return {a: v for a, v in state.applied.items() if v >= 0}

    def append_parts(
        self,
        table: TableRef,
        parts: Sequence[tuple[pa.Table, Txn | None]],
        *,
        metadata: Mapping[str, str] | None = None,
        layout: WriteLayout | None = None,
    ) -> list[CommitResult]:
        """Commit the parts (rows of the accepted schema, each under its own txn or none)
        as one file in one commit; a part whose txn is applied already is left out and
        reported ``skipped``. Nothing is committed when every part is skipped, or when there
        are neither rows nor transactions."""
        with self._lock(table):
            return self._append_parts(table, parts, metadata=metadata, layout=layout)

    def _append_parts(
        self,
        table: TableRef,
        parts: Sequence[tuple[pa.Table, Txn | None]],
        *,
        metadata: Mapping[str, str] | None,
        layout: WriteLayout | None,
    ) -> list[CommitResult]:
        state = self._state.get(table)
        if state is None or state.schema is None:
            raise LakeError(f"{table}: a direct append needs an accepted table")
        app_ids = [txn.app_id for _, txn in parts if txn is not None]
        if len(set(app_ids)) != len(app_ids):
            raise LakeError(f"{table}: one commit cannot record one app id twice ({app_ids})")
        recorded = self._recorded(table, state, app_ids)
        results: list[CommitResult] = []
        keep: list[tuple[int, pa.Table, Txn | None]] = []
        for data, txn in parts:
            if txn is not None and txn_applied(table, txn, recorded.get(txn.app_id), _log):
                results.append(CommitResult(table, state.version, skipped=True, rows=0))
            else:
                keep.append((len(results), data, txn))
                results.append(CommitResult(table, None, skipped=False, rows=0))
        txns = [txn for _, _, txn in keep if txn is not None]
        rows = sum(data.num_rows for _, data, _ in keep)
        if not keep or (rows == 0 and not txns):
            return results
        nulls = sorted(
            {
                f.name
                for _, part, _ in keep
                for f in state.schema
                if not f.nullable and part.column(f.name).null_count
            }
        )
        if nulls:
            raise LakeError(f"{table}: nulls in NOT NULL columns {nulls}; nothing was written")
        data = pa.concat_tables([d.cast(state.schema) for _, d, _ in keep])
        version = self._commit(table, state, data, txns=txns, metadata=metadata, layout=layout)
        assert state.applied is not None
        for txn in txns:
            state.applied[txn.app_id] = txn.version
        state.version = version
        _log.debug("%s: appended %d rows as version %d", table, rows, version)
        for index, part, _ in keep:
            results[index] = CommitResult(table, version, skipped=False, rows=part.num_rows)
        return results

    def _commit(
        self,
        table: TableRef,
        state: _State,
        data: pa.Table,
        *,
        txns: Sequence[Txn],
        metadata: Mapping[str, str] | None,
        layout: WriteLayout | None,
    ) -> int:
        root = self._path_of(table)
        now_ms = int(self._clock() * 1000)
        text = encode_user_metadata(metadata, txns[0] if len(txns) == 1 else None)
        add: dict[str, object] | None = None
        try:
            if data.num_rows:
                add = write_data_file(root, data, now_ms, layout=layout)
            actions = _actions(now_ms, add, data.num_rows, text=text, txns=txns)
            return self._put(table, state, actions, txns)
        except StaleTable:
            raise
        except (DeltaError, pa.ArrowException, OSError) as exc:
            state.applied, state.version = None, None
            raise LakeError(f"append to {table} ({root}) failed: {exc}") from exc

    def _checkpointed(self, table: TableRef, txns: Sequence[Txn]) -> bool:
        """Whether the table's state records every one of ``txns`` (so a checkpoint at the
        version just written was made from that commit)."""
        if not txns:
            return False
        dt = self._open(table)
        recorded = [dt.transaction_version(t.app_id) for t in txns]
        return all(
            r is not None and int(r) == t.version for r, t in zip(recorded, txns, strict=True)
        )

    def _put(self, table: TableRef, state: _State, actions: str, txns: Sequence[Txn]) -> int:
        """Write ``actions`` as the table's next version; its number."""
        log = self._path_of(table) / "_delta_log"
        assert state.version is not None and state.applied is not None
        version = state.version + 1
        for _attempt in range(_COMMIT_ATTEMPTS):
            path = log / f"{version:020d}.json"
            if put_if_absent(path, actions):
                last = last_checkpoint(log)
                if version > last or (version == last and self._checkpointed(table, txns)):
                    # (A checkpoint at this very version may have been made from this commit
                    # by maintenance on another thread: its transactions say so.)
                    return version
                # A hole, not a free version: it was taken, then its entry expired after a
                # checkpoint past it (expire_log). Readers start at that checkpoint and would
                # never see this commit: take it back and follow the table.
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            # Version taken: who took it decides whether this commit may follow it.
            dt = self._open(table)
            for txn in txns:
                recorded = dt.transaction_version(txn.app_id)
                known = state.applied.get(txn.app_id, -1)
                if recorded is not None and int(recorded) != known:
                    state.applied, state.version = None, None
                    raise LakeError(
                        f"append to {table} failed: another writer committed transaction "
                        f"{txn.app_id} (now at version {recorded}) meanwhile; two writers of "
                        "one transaction cannot run at once"
                    )
            if [(f.name, f.type) for f in pa.schema(dt.schema().to_arrow())] != [
                (f.name, f.type) for f in state.schema or ()
            ] or not plain_protocol(dt):
                self.forget(table)
                raise StaleTable(f"{table}: the schema or protocol changed since it was read")
            version = dt.version() + 1
        raise LakeError(f"append to {table}: no free version after {_COMMIT_ATTEMPTS} attempts")


def _actions(
    now_ms: int,
    add: Mapping[str, object] | None,
    rows: int,
    *,
    text: str | None,
    txns: Sequence[Txn],
) -> str:
    """The newline-delimited JSON actions of a blind append of at most one file."""
    info: dict[str, object] = {
        "timestamp": now_ms,
        "operation": "WRITE",
        "operationParameters": {"mode": "Append"},
        "isBlindAppend": True,
        "operationMetrics": {
            "numFiles": "1" if add else "0",
            "numOutputRows": str(rows),
            "numOutputBytes": str(add["size"]) if add else "0",
        },
        "engineInfo": "sfcdc",
    }
    if text:
        info["userMetadata"] = text
    actions: list[dict[str, object]] = [{"commitInfo": info}]
    if add is not None:
        actions.append({"add": dict(add)})
    actions.extend(
        {"txn": {"appId": t.app_id, "version": t.version, "lastUpdated": now_ms}} for t in txns
    )
    return "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions)


def last_checkpoint(log: Path) -> float:
    """The version ``_last_checkpoint`` names (-1: none yet; infinite when it cannot be read
    (being rewritten), so the caller re-reads the table rather than trust its commit)."""
    try:
        return int(json.loads((log / "_last_checkpoint").read_text(encoding="utf-8"))["version"])
    except FileNotFoundError:
        return -1
    except (ValueError, KeyError, TypeError):
        return math.inf


def put_if_absent(path: Path, text: str) -> bool:
    """Create ``path`` holding ``text`` in one step, unless it exists (then False)."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    temporary.write_text(text, encoding="utf-8")
    try:
        os.link(temporary, path)
    except FileExistsError:
        return False
    finally:
        temporary.unlink()
    return True


# Log files named by a version: commits (N.json), their checksums (N.crc, and Hadoop's hidden
# .N.json.crc), classic, multi-part and V2 checkpoints (N.checkpoint[.*].parquet|json) and
# log compactions (N.M.compacted.json, named by their first and last version).
_LOG_FILE = re.compile(r"^\.?(\d{20})(?:\.(\d{20}))?\.(json|crc|checkpoint|compacted)")


def log_entries(log_dir: Path) -> int:
    """How many commit and checkpoint files ``log_dir`` holds (no checksums, no
    ``_last_checkpoint``)."""
    count = 0
    for entry in os.scandir(log_dir):
        match = _LOG_FILE.match(entry.name)
        if match and not entry.name.startswith(".") and not entry.name.endswith(".crc"):
            count += 1
    return count


def commit_times(log_dir: Path) -> dict[int, float]:
    """The commits ``log_dir`` holds: version -> the commit file's modification time (seconds
    since the epoch), which Delta takes for a commit's time when it cleans up."""
    times: dict[int, float] = {}
    for entry in os.scandir(log_dir):
        match = _LOG_FILE.match(entry.name)
        if (
            match is not None
            and not entry.name.startswith(".")
            and match.group(2) is None
            and match.group(3) == "json"
        ):
            times[int(match.group(1))] = entry.stat().st_mtime
    return times


def expire_log(log_dir: Path, *, older_than: float, keep_version: int | None = None) -> int:
    """Delete the log files of ``log_dir`` no reader of a kept version needs; how many
    commit and checkpoint files went.

    A version stays readable when a checkpoint at or before it and every commit after that
    checkpoint remain. The oldest version to keep is the first committed at or after
    ``older_than`` (seconds since the epoch; the commit file's modification time, as Delta's
    own cleanup uses), but no later than the newest checkpoint, nor than ``keep_version`` (a
    version a reader will start from, which may not exist yet); every file of a version
    before the newest checkpoint at or before that one goes, as Delta Spark's log cleanup
    does."""
    versions: dict[int, float] = {}
    checkpoints: set[int] = set()
    files: list[tuple[int, Path, bool]] = []
    for entry in os.scandir(log_dir):
        match = _LOG_FILE.match(entry.name)
        if match is None:
            continue
        version = int(match.group(2) or match.group(1))
        kind = match.group(3)
        if entry.name.startswith("."):
            # Hadoop's checksums go with their file; a writer's temporary file stays.
            if entry.name.endswith(".crc"):
                files.append((version, Path(entry.path), False))
            continue
        files.append((version, Path(entry.path), kind != "crc"))
        if kind == "json" and match.group(2) is None:
            versions[version] = entry.stat().st_mtime
        elif kind == "checkpoint" and entry.name.endswith((".parquet", ".json")):
            checkpoints.add(version)
    if not checkpoints or not versions:
        return 0
    newest = max(checkpoints)
    recent = [v for v, mtime in versions.items() if mtime >= older_than]
    keep_from = min([newest, *recent, *([] if keep_version is None else [keep_version])])
    usable = [c for c in checkpoints if c <= keep_from]
    if not usable:
        return 0
    cut = max(usable)
    removed = 0
    for version, path, counted in files:
        if version < cut:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed += counted
    if removed:
        _log.debug("%s: removed %d log entries before version %d", log_dir, removed, cut)
    return removed
