"""The one place sfcdc writes Delta log entries itself: one-file blind appends to local tables,
the commits of the MERGE the local engine runs itself, and the log cleanup.

delta-rs lists a table's whole ``_delta_log`` directory on every commit on a local disk, so
the cost of a commit grows with the number of commits a table has had: ``write_deltalake``
took 7 ms at 200 commits and 58 ms at 3,000 on this project's benchmark machine, and a commit
of files pyarrow wrote through ``DeltaTable.create_write_transaction`` (which takes add and
remove actions and application transactions) 22 ms per commit over a table's first 100
commits and 130 ms at 300. Bronze landing commits several times a second for as long as it
runs, so the local engine appends to tables of the plain protocol sfcdc uses (see
:func:`plain_protocol`) by writing the commit itself, as the Delta protocol defines it:

- the rows are one Parquet file written with pyarrow (which releases the GIL while it encodes,
  so the stream keeps being received meanwhile), laid out as a
  :class:`~pipelines.engines.base.WriteLayout` asks, with statistics as Delta writes them
  (:func:`file_stats`: the table's indexed columns only, text bounds cut to 32 characters);
- the actions of version ``N + 1`` (``commitInfo``, ``add``, one ``txn`` per application
  transaction) are written to a temporary file that is then hard-linked to
  ``_delta_log/<N + 1>.json``, which fails when the version exists (put-if-absent). Before the
  link the writer checks that ``N`` is still the latest version the log shows (its commit is
  there, or ``_last_checkpoint`` names it); on any doubt the write goes to delta-rs
  (:class:`StaleTable`). A commit once linked is never taken back: a commit after it may
  already build on it;
- the table's transactions and version are read once (and after a failed commit); later
  appends follow from this writer's own commits. A version taken meanwhile is followed when
  the writer that took it recorded none of this commit's transactions (maintenance compacting
  the table); otherwise the append fails as a concurrent write.

Hard links are how put-if-absent is had on a local disk; where they do not work (FUSE mounts
such as Databricks volumes or gcsfuse: :func:`links_work`), or on object storage, every write
goes to delta-rs (:class:`DirectWritesUnavailable`).

The MERGE the local engine runs itself (:mod:`pipelines.engines.direct_merge` matches the
rows in Arrow; delta-rs' MERGE takes twice as long) commits through :func:`commit_rewrite`:
``remove`` actions for the files it replaces, ``add`` actions with statistics for the files
it writes (:func:`write_data_file`), ``cdc`` actions for its change data files
(:func:`write_change_file`), its ``txn`` and ``commitInfo``, as the version after the one it
read, put-if-absent, under the table's rewrite lock. delta-rs' ``create_write_transaction``
takes no ``cdc`` actions, so a MERGE into a table with the change data feed on (every table
sfcdc creates) cannot hand its commit to delta-rs.

Log cleanup (:func:`expire_log`) is the third hand-written part. delta-rs'
``cleanup_metadata`` cuts the log at the newest file whose name says "checkpoint", whether or
not every part of that checkpoint is there, so one part of a multi-part checkpoint that a
delta-spark writer left behind would make it delete the only complete checkpoint and the
commits the table is read from; it refuses to run at all while such a part is there, and it
never deletes multi-part or V2 checkpoints, their sidecars, checksums or writers' temporary
files. :func:`expire_log` cuts only at a checkpoint that ``_last_checkpoint`` vouches for and
whose every part is present.

Everything else -- creating tables, schema changes, the merges the local engine does not run
itself, overwrites, reads, the change data feed, compaction, checkpoints, VACUUM -- goes
through delta-rs' public API. Tests check that delta-rs and delta-spark read these commits
(rows, statistics, transactions, history, change data feed; ``tests/spark/test_deltalog.py``
for appends, ``tests/spark/test_direct_merge.py`` for the MERGE, and a property-based test of
random interleavings with delta-spark's writers, ``tests/spark/test_interchange.py``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Literal

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
    "STATS_PREFIX",
    "DirectAppender",
    "DirectWritesUnavailable",
    "Rewrite",
    "StaleTable",
    "commit_rewrite",
    "expire_log",
    "file_stats",
    "indexed_columns",
    "links_work",
    "log_entries",
    "nested_nulls",
    "plain_protocol",
    "put_if_absent",
    "remove_action",
    "truncate_max",
    "truncate_min",
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
# Delta's defaults: text statistics keep 32 characters, the first 32 leaf columns are indexed.
STATS_PREFIX = 32
_DEFAULT_INDEXED = 32
NUM_INDEXED_PROPERTY = "delta.dataSkippingNumIndexedCols"
STATS_COLUMNS_PROPERTY = "delta.dataSkippingStatsColumns"
# A writer's temporary file in the log is its own for at least this long (a commit takes
# milliseconds); older ones are a crashed writer's, which log cleanup may delete.
_TEMPORARY_GRACE_S = 3600.0


class StaleTable(LakeError):
    """Another writer changed the table's schema or protocol since this writer read it, or the
    log does not show the version this writer would build on: nothing was committed; write
    through delta-rs instead."""


class DirectWritesUnavailable(LakeError):
    """The file system refuses the hard link that makes a commit put-if-absent (a FUSE mount,
    a file system without links): nothing was committed; write through delta-rs instead."""


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


# ----------------------------------------------------------------------------- statistics


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
        or pa.types.is_large_string(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_date(t)
    )


# Text bounds are compared as Delta Spark compares them, in UTF-16 code units (Java strings).
_ASCII_MAX = "\x7f"
_UTF8_MAX = "\U0010ffff"


def _units(text: str) -> list[str]:
    """``text`` as UTF-16 code units (a character beyond the BMP is two)."""
    raw = text.encode("utf-16-le", "surrogatepass")
    return [raw[i : i + 2].decode("utf-16-le", "surrogatepass") for i in range(0, len(raw), 2)]


def _join(units: Sequence[str]) -> str:
    return "".join(units).encode("utf-16-le", "surrogatepass").decode("utf-16-le")


def _min_length(units: Sequence[str], prefix: int) -> int:
    """How many code units a lower bound of ``prefix`` keeps (a surrogate pair stays whole)."""
    if "\ud800" <= units[prefix - 1] <= "\udbff" and "\udc00" <= units[prefix] <= "\udfff":
        return prefix + 1
    return prefix


def truncate_min(text: str, prefix: int = STATS_PREFIX) -> str:
    """A lower bound of ``text`` no longer than ``prefix`` (UTF-16 code units), as Delta
    writes a text column's minimum."""
    units = _units(text)
    if len(units) <= prefix:
        return text
    return _join(units[: _min_length(units, prefix)])


def truncate_max(text: str, prefix: int = STATS_PREFIX) -> str | None:
    """An upper bound of ``text`` about ``prefix`` code units long, as Delta writes a text
    column's maximum: the prefix and a tie-breaker (U+007F where the next character is below
    it, else U+10FFFF), extended past characters the tie-breaker would not exceed; ``None``
    when no bound within twice the prefix exists (the maximum is then left out)."""
    units = _units(text)
    if len(units) <= prefix:
        return text
    length = _min_length(units, prefix)
    while length <= 2 * prefix:
        if length >= len(units):
            return text
        if length + 1 < len(units) and _join(units[length : length + 2]) == _UTF8_MAX:
            length += 2
        elif units[length] < _ASCII_MAX:
            return _join(units[:length]) + _ASCII_MAX
        else:
            return _join(units[:length]) + _UTF8_MAX
    return None


def _leaf_count(t: pa.DataType) -> int:
    if pa.types.is_struct(t):
        return sum(_leaf_count(t.field(i).type) for i in range(t.num_fields))
    return 1


def _stats_names(text: str) -> set[str]:
    """The top-level columns ``delta.dataSkippingStatsColumns`` names (``a``, ```a b```, and
    ``a.b``, which names a field of ``a``), lower-cased."""
    names = set()
    for raw in re.findall(r"(?:`[^`]*`|[^,`]+)+", text):
        item = raw.strip()
        if not item:
            continue
        first = re.match(r"`([^`]*)`|([^.]+)", item)
        if first is not None:
            names.add((first.group(1) or first.group(2) or "").strip().lower())
    return names


def indexed_columns(schema: pa.Schema, configuration: Mapping[str, str]) -> frozenset[str]:
    """The top-level columns of ``schema`` Delta collects statistics for under the table's
    ``configuration``: those ``delta.dataSkippingStatsColumns`` names when it is set, else
    the columns among the first ``delta.dataSkippingNumIndexedCols`` leaf columns (32; -1:
    all), counted in schema order with a struct's fields each a leaf."""
    listed = configuration.get(STATS_COLUMNS_PROPERTY)
    if listed:
        wanted = _stats_names(listed)
        return frozenset(f.name for f in schema if f.name.lower() in wanted)
    try:
        limit = int(configuration.get(NUM_INDEXED_PROPERTY, _DEFAULT_INDEXED))
    except ValueError:
        limit = _DEFAULT_INDEXED
    if limit < 0:
        return frozenset(schema.names)
    out = []
    seen = 0
    for f in schema:
        if seen < limit:
            out.append(f.name)
        seen += _leaf_count(f.type)
    return frozenset(out)


def file_stats(
    table: pa.Table,
    *,
    unindexed: Sequence[str] = (),
    indexed: Collection[str] | None = None,
) -> str:
    """The Delta ``stats`` JSON of a file holding ``table``, as Delta writes it: the row count,
    and for the ``indexed`` columns (default: all) that are not nested, the null count and
    min/max of those readers can skip files by (numbers, text, dates, timestamps; not
    ``unindexed`` ones), text bounds cut to :data:`STATS_PREFIX` characters."""
    minimum: dict[str, object] = {}
    maximum: dict[str, object] = {}
    nulls: dict[str, int] = {}
    for f in table.schema:
        if (indexed is not None and f.name not in indexed) or pa.types.is_struct(f.type):
            continue
        column = table.column(f.name)
        nulls[f.name] = column.null_count
        if not table.num_rows or f.name in unindexed or not _ranged(f.type):
            continue
        if column.null_count == table.num_rows or (
            pa.types.is_floating(f.type) and pc.any(pc.is_nan(column)).as_py()
        ):
            continue
        bounds = pc.min_max(column)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if isinstance(low, str):
            low, high = truncate_min(low), truncate_max(high)
        minimum[f.name] = _stats_value(low)
        if high is not None:
            maximum[f.name] = _stats_value(high)
    return json.dumps(
        {
            "numRecords": table.num_rows,
            "minValues": minimum,
            "maxValues": maximum,
            "nullCount": nulls,
        },
        separators=(",", ":"),
    )


# ------------------------------------------------------------------------------ NOT NULL


def _nested_violations(array: pa.Array, field: pa.Field, path: str, out: set[str]) -> None:
    """Add to ``out`` the paths of non-nullable fields nested in ``array`` (of ``field``'s
    type) that hold a null where their parent holds a value."""
    t = field.type
    if pa.types.is_struct(t):
        assert isinstance(array, pa.StructArray)
        parent = pc.is_valid(array)
        for i in range(t.num_fields):
            child_field = t.field(i)
            child = array.field(i)
            name = f"{path}.{child_field.name}"
            if not child_field.nullable:
                missing = pc.and_(parent, pc.is_null(child))
                if pc.any(missing).as_py():
                    out.add(name)
            # A child's own nested fields count only where the child itself holds a value.
            _nested_violations(child.filter(parent), child_field, name, out)
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        values = array.flatten()
        element = t.value_field
        if not element.nullable and values.null_count:
            out.add(f"{path}.element")
        _nested_violations(values, element, f"{path}.element", out)
    elif pa.types.is_map(t):
        items = array.items
        if not t.item_field.nullable and items.null_count:
            out.add(f"{path}.value")
        _nested_violations(items, t.item_field, f"{path}.value", out)


def nested_nulls(table: pa.Table, schema: pa.Schema) -> list[str]:
    """The NOT NULL columns and nested fields of ``schema`` that ``table`` (of that schema)
    breaks: a null in a non-nullable column, or in a non-nullable field of a struct, list
    element or map value whose parent holds a value. Dotted paths, sorted."""
    found: set[str] = set()
    for f in schema:
        column = table.column(f.name)
        if not f.nullable and column.null_count:
            found.add(f.name)
        for chunk in column.chunks:
            _nested_violations(chunk, f, f.name, found)
    return sorted(found)


# ------------------------------------------------------------------------------ data files


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
    indexed: Collection[str] | None = None,
) -> dict[str, object]:
    """Write ``data`` as a new data file of the table at ``root``; its ``add`` action (with
    statistics of the ``indexed`` columns). ``written`` gets the file's path before it is
    written."""
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
        "stats": file_stats(
            data, unindexed=layout.unindexed if layout is not None else (), indexed=indexed
        ),
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


# --------------------------------------------------------------------------------- commits


def links_work(directory: Path) -> bool:
    """Whether files in ``directory`` can be hard-linked, and a link onto an existing name
    fails (the put-if-absent commits are made of); a probe file is made and removed."""
    token = uuid.uuid4().hex
    source = directory / f".sfcdc-probe-{token}.tmp"
    target = directory / f".sfcdc-probe-{token}.link"
    try:
        source.write_bytes(b"")
        try:
            os.link(source, target)
            try:
                os.link(source, target)
            except FileExistsError:
                return True
            return False
        except OSError as exc:
            _log.info("%s: no hard links (%s); commits go through delta-rs", directory, exc)
            return False
    except OSError as exc:
        _log.info("%s: cannot probe for hard links (%s)", directory, exc)
        return False
    finally:
        for path in (target, source):
            with contextlib.suppress(OSError):
                path.unlink()


def put_if_absent(path: Path, text: str) -> bool:
    """Create ``path`` holding ``text`` in one step, unless it exists (then False).
    :class:`DirectWritesUnavailable` when the file system refuses the hard link."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    temporary.write_text(text, encoding="utf-8")
    try:
        os.link(temporary, path)
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOSPC, errno.EIO):
            raise
        raise DirectWritesUnavailable(f"{path.parent}: hard links fail here ({exc})") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
    return True


def _last_checkpoint(log: Path) -> int | None:
    """The version ``_last_checkpoint`` names (``None``: absent, or unreadable while it is
    being rewritten)."""
    try:
        found = json.loads((log / "_last_checkpoint").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    version = found.get("version") if isinstance(found, dict) else None
    return version if isinstance(version, int) else None


def _shows(log: Path, version: int) -> bool:
    """Whether the log shows ``version``: its commit is there, or ``_last_checkpoint``
    names it. A writer builds the next version only on a version the log shows, so that it
    never writes a commit that a later checkpoint has already passed over."""
    if (log / f"{version:020d}.json").exists():
        return True
    return _last_checkpoint(log) == version


CommitOutcome = Literal["committed", "taken", "stale", "unconfirmed"]


def _commit_next(log: Path, read_version: int, text: str) -> CommitOutcome:
    """Put ``text`` as version ``read_version + 1`` if the log still shows ``read_version``:
    ``committed``; ``taken`` when that version exists; ``stale`` when the log no longer shows
    ``read_version`` (nothing was written); ``unconfirmed`` when the link succeeded but
    ``read_version`` vanished meanwhile (log cleanup ran), so whether a checkpoint passed over
    the new commit must be asked of delta-rs. A linked commit is never deleted."""
    if read_version >= 0 and not _shows(log, read_version):
        return "stale"
    if not put_if_absent(log / f"{read_version + 1:020d}.json", text):
        return "taken"
    if read_version < 0 or _shows(log, read_version):
        return "committed"
    return "unconfirmed"


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
    put-if-absent; False when that version is taken or the log no longer shows the version
    read (then nothing was written). The caller holds the table's rewrite lock, so only
    blind appends can commit meanwhile."""
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
    lines = "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions)
    outcome = _commit_next(root / "_delta_log", rewrite.read_version, lines)
    if outcome == "unconfirmed":
        # Log cleanup ran while committing. A MERGE's files are read under the rewrite lock,
        # so only appends could have taken the version and had it cleaned up: the commit
        # counts when delta-rs' state records its transaction (a MERGE without one is
        # checked by the files it added).
        dt = DeltaTable(str(root))
        if txn is not None:
            return dt.transaction_version(txn.app_id) == txn.version
        paths = set(pa.table(dt.get_add_actions()).column("path").to_pylist())
        return all(a["path"] in paths for a in rewrite.adds)
    return outcome == "committed"


# -------------------------------------------------------------------------------- appends


@dataclass
class _State:
    """What this writer knows of one table: its schema (when it accepts appends), the columns
    its statistics cover, its version and the transactions committed on that version (absent:
    read them first)."""

    schema: pa.Schema | None
    indexed: frozenset[str] = frozenset()
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
            plain = plain_protocol(dt)
            state = _State(
                current if plain else None,
                indexed_columns(current, dt.metadata().configuration),
            )
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
        are neither rows nor transactions. :class:`StaleTable` or
        :class:`DirectWritesUnavailable` when the write must go to delta-rs instead."""
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
        # Checked before the cast, which cannot hold a null in a non-nullable field.
        nulls = sorted({n for _, d, _ in keep for n in nested_nulls(d, state.schema)})
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
        written: list[Path] = []
        committed = False  # else the data file written goes again
        try:
            if data.num_rows:
                add = write_data_file(
                    root, data, now_ms, layout=layout, written=written, indexed=state.indexed
                )
            actions = _actions(now_ms, add, data.num_rows, text=text, txns=txns)
            version = self._put(table, state, actions, txns, add)
            committed = True
            return version
        except (StaleTable, DirectWritesUnavailable):
            state.applied, state.version = None, None
            raise
        except (DeltaError, pa.ArrowException, OSError) as exc:
            state.applied, state.version = None, None
            raise LakeError(f"append to {table} ({root}) failed: {exc}") from exc
        finally:
            if not committed:
                for path in written:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()

    def _put(
        self,
        table: TableRef,
        state: _State,
        actions: str,
        txns: Sequence[Txn],
        add: Mapping[str, object] | None,
    ) -> int:
        """Write ``actions`` as the table's next version; its number."""
        log = self._path_of(table) / "_delta_log"
        assert state.version is not None and state.applied is not None
        read = state.version
        for _attempt in range(_COMMIT_ATTEMPTS):
            outcome = _commit_next(log, read, actions)
            if outcome == "committed":
                return read + 1
            if outcome == "stale":
                self.forget(table)
                raise StaleTable(f"{table}: the log no longer shows version {read}")
            if outcome == "unconfirmed":
                if self._visible(table, txns, add):
                    return read + 1
                # A checkpoint passed over the version before this commit landed: readers
                # will never see it. It stays (a commit is never deleted); the rows go to
                # delta-rs, which records the transactions anew.
                self.forget(table)
                raise StaleTable(f"{table}: version {read + 1} was passed over by a checkpoint")
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
            read = dt.version()
        raise LakeError(f"append to {table}: no free version after {_COMMIT_ATTEMPTS} attempts")

    def _visible(
        self, table: TableRef, txns: Sequence[Txn], add: Mapping[str, object] | None
    ) -> bool:
        """Whether delta-rs' latest state holds this commit: its transactions, or (without
        any) its data file."""
        dt = self._open(table)
        if txns:
            return all(dt.transaction_version(t.app_id) == t.version for t in txns)
        if add is None:
            return False
        return add["path"] in set(pa.table(dt.get_add_actions()).column("path").to_pylist())


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


# ------------------------------------------------------------------------------ log cleanup

# The log's files named by a version: commits (N.json), checksums (N.crc, and Hadoop's
# hidden .N.json.crc), classic (N.checkpoint.parquet), multi-part
# (N.checkpoint.I.P.parquet) and V2 (N.checkpoint.<uuid>.json|parquet) checkpoints, and log
# compactions (N.M.compacted.json, named by their first and last version).
_COMMIT = re.compile(r"^(\d{20})\.json$")
_CRC = re.compile(r"^\.?(\d{20})\.(?:crc|json\.crc|checkpoint.*\.crc)$")
_CHECKPOINT = re.compile(
    r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10})|\.([0-9a-fA-F-]{36}))?\.(parquet|json)$"
)
_COMPACTED = re.compile(r"^(\d{20})\.(\d{20})\.compacted\.json$")
_SIDECARS = "_sidecars"


@dataclass
class _LogFile:
    path: Path
    version: int  # the version the file belongs to (a compaction: its last)
    mtime: float
    checksum: bool = False  # goes with its version, whatever its age


def _v2_sidecars(path: Path) -> set[str] | None:
    """The sidecar files a V2 checkpoint names (``None`` when it cannot be read)."""
    try:
        if path.suffix == ".json":
            names = set()
            with path.open(encoding="utf-8") as f:
                for line in f:
                    sidecar = json.loads(line).get("sidecar") if line.strip() else None
                    if sidecar is not None:
                        names.add(Path(str(sidecar["path"])).name)
            return names
        table = pq.read_table(path, columns=["sidecar"])
        return {
            Path(str(entry["path"])).name
            for entry in table.column("sidecar").to_pylist()
            if entry is not None
        }
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None


def expire_log(log_dir: Path, *, older_than: float, keep_version: int | None = None) -> int:
    """Delete the log files of ``log_dir`` that no reader of a kept version needs; how many
    commit and checkpoint files went.

    A version stays readable when a complete checkpoint at or before it and every commit
    after that checkpoint remain. The log is cut at the newest complete checkpoint (all its
    parts present) that is no later than the one ``_last_checkpoint`` names, than the first
    version committed at or after ``older_than`` (seconds since the epoch; the commit file's
    modification time, as Delta's own cleanup uses), nor than ``keep_version`` (a version a
    reader will start from, which may not exist yet). Files of versions before the cut that
    were written before ``older_than`` go: commits, checksums, checkpoints of every kind, log
    compactions; so do writers' temporary files and V2 sidecars that no remaining checkpoint
    names, once older than ``older_than`` and an hour. Without a readable
    ``_last_checkpoint`` nothing goes."""
    hint = _last_checkpoint(log_dir)
    if hint is None:
        return 0
    files: list[_LogFile] = []
    temporary: list[_LogFile] = []
    commits: dict[int, float] = {}
    parts: dict[int, dict[int, set[int]]] = {}  # version -> part count -> parts present
    whole: dict[int, list[Path]] = {}  # version -> complete single-file checkpoints
    for entry in os.scandir(log_dir):
        if not entry.is_file():
            continue
        name = entry.name
        mtime = entry.stat().st_mtime
        if name.endswith(".tmp"):
            temporary.append(_LogFile(Path(entry.path), -1, mtime))
            continue
        commit, crc = _COMMIT.match(name), _CRC.match(name)
        checkpoint, compacted = _CHECKPOINT.match(name), _COMPACTED.match(name)
        if commit is not None:
            version = int(commit.group(1))
            commits[version] = mtime
        elif crc is not None:
            files.append(_LogFile(Path(entry.path), int(crc.group(1)), mtime, checksum=True))
            continue
        elif checkpoint is not None:
            version = int(checkpoint.group(1))
            if checkpoint.group(2) is not None:
                count = int(checkpoint.group(3))
                parts.setdefault(version, {}).setdefault(count, set()).add(int(checkpoint.group(2)))
            else:
                whole.setdefault(version, []).append(Path(entry.path))
        elif compacted is not None:
            version = int(compacted.group(2))
        else:
            continue
        files.append(_LogFile(Path(entry.path), version, mtime))
    complete = set(whole) | {
        v
        for v, counts in parts.items()
        if any(got == set(range(1, n + 1)) for n, got in counts.items())
    }
    recent = [v for v, mtime in commits.items() if mtime >= older_than]
    limit = min([hint, *recent, *([] if keep_version is None else [keep_version])])
    usable = [c for c in complete if c <= limit]
    removed = 0
    cut = max(usable) if usable else None
    if cut is not None:
        for item in files:
            if item.version < cut and (item.mtime < older_than or item.checksum):
                with contextlib.suppress(FileNotFoundError):
                    item.path.unlink()
                    removed += not item.checksum
        if removed:
            _log.debug("%s: removed %d log entries before version %d", log_dir, removed, cut)
    stale = min(older_than, time.time() - _TEMPORARY_GRACE_S)
    for item in temporary:
        if item.mtime < stale:
            with contextlib.suppress(FileNotFoundError):
                item.path.unlink()
    _expire_sidecars(log_dir, stale)
    return removed


def _expire_sidecars(log_dir: Path, older_than: float) -> None:
    """Delete the V2 sidecars written before ``older_than`` that no V2 checkpoint left in
    ``log_dir`` names (none when one of those cannot be read)."""
    folder = log_dir / _SIDECARS
    if not folder.is_dir():
        return
    old = [e for e in os.scandir(folder) if e.is_file() and e.stat().st_mtime < older_than]
    if not old:
        return
    named: set[str] = set()
    for entry in os.scandir(log_dir):
        match = _CHECKPOINT.match(entry.name)
        if match is not None and match.group(4) is not None:
            sidecars = _v2_sidecars(Path(entry.path))
            if sidecars is None:
                return
            named |= sidecars
    for entry in old:
        if entry.name not in named:
            with contextlib.suppress(FileNotFoundError):
                Path(entry.path).unlink()


def log_files(log_dir: Path) -> Iterable[str]:
    """The names of the commit and checkpoint files of ``log_dir`` (for counting)."""
    for entry in os.scandir(log_dir):
        if _COMMIT.match(entry.name) or _CHECKPOINT.match(entry.name):
            yield entry.name


def log_entries(log_dir: Path) -> int:
    """How many commit and checkpoint files ``log_dir`` holds (no checksums, no
    ``_last_checkpoint``)."""
    return sum(1 for _ in log_files(log_dir))
