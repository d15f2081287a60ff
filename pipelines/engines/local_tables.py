"""Table access shared by the local engine's roles: where each table lives, the cache of
opened tables, error translation, the rewrite lock, whether the engine may commit writes
itself, and the hook that runs after every write.

:class:`LocalTables` is held by :class:`~pipelines.engines.local.LocalEngine` and handed to
its roles (:mod:`~pipelines.engines.local_reads`, :mod:`~pipelines.engines.local_writes`,
:mod:`~pipelines.engines.local_maintenance`, :mod:`~pipelines.engines.local_sql`), which reach
the tables only through it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from ingest.errors import LakeError
from pipelines.engines.arrow import arrow_schema_from_delta_json, dataframe_to_arrow
from pipelines.engines.base import LAYERS, TableRef
from pipelines.engines.deltalog import links_work
from pipelines.engines.lake_location import LakeLocation
from pipelines.engines.rewrite_lock import rewrite_lock
from pipelines.spec.models import is_identifier

__all__ = ["LocalTables", "as_arrow", "schema_of"]

# The engine's log lines stay under its module's logger, whichever module writes them.
_log = logging.getLogger("pipelines.engines.local")


def as_arrow(data: Any) -> pa.Table:
    """``data`` (a pyarrow Table or RecordBatch, or a Spark DataFrame) as an Arrow table."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if hasattr(data, "schema") and hasattr(data, "sparkSession"):
        return dataframe_to_arrow(data)
    raise LakeError(
        f"data must be a pyarrow.Table or a Spark DataFrame (got a {type(data).__name__})"
    )


def schema_of(dt: DeltaTable) -> pa.Schema:
    """The Arrow schema of the Delta table ``dt``: the Arrow types Delta stores for its
    columns (:func:`~pipelines.engines.arrow.arrow_schema_from_delta_json`)."""
    return arrow_schema_from_delta_json(dt.schema().to_json())


class LocalTables:
    """The Delta tables of one lake ``where``: ``<location>/<layer>/<prefix><name>``.

    ``owner`` names the engine in log lines; ``direct_writes`` lets the engine commit appends
    and MERGEs itself where hard links work.
    """

    def __init__(
        self, where: LakeLocation, *, table_prefix: str, direct_writes: bool, owner: str
    ) -> None:
        self.where = where
        self.table_prefix = table_prefix
        self._owner = owner
        # None: not probed yet (on the first direct write).
        self._direct_ok: bool | None = None if direct_writes and where.local is not None else False
        self._tables: dict[str, DeltaTable] = {}
        self._files: pafs.FileSystem | None = None
        self._written: list[Callable[[TableRef], None]] = []

    def __repr__(self) -> str:
        return f"LocalTables({self.where.uri!r})"

    # ------------------------------------------------------------------------- naming

    def physical_name(self, table: TableRef) -> str:
        return f"{self.table_prefix}{table.name}"

    def path(self, table: TableRef) -> Path:
        """Directory of ``table`` on a local disk: ``<location>/<layer>/<prefix><name>``."""
        if self.where.local is None:
            raise LakeError(f"{table} is on object storage ({self.uri(table)}): no local path")
        return self.where.local / table.layer / self.physical_name(table)

    def uri(self, table: TableRef) -> str:
        """Where delta-rs finds ``table``: its directory, or its URI on object storage."""
        return self.where.join(table.layer, self.physical_name(table))

    @property
    def storage_options(self) -> dict[str, str] | None:
        """What delta-rs is given to reach the lake (credentials included)."""
        return dict(self.where.options) or None

    def tables(self) -> list[TableRef]:
        """Every Delta table under the location that carries the prefix."""
        from pyarrow.fs import FileSelector, FileType

        found = []
        filesystem = self.where.filesystem()
        for layer in LAYERS:
            try:
                children = filesystem.get_file_info(FileSelector(layer, allow_not_found=True))
            except (OSError, DeltaError):
                continue
            for child in sorted(children, key=lambda c: c.base_name):
                name = child.base_name.removeprefix(self.table_prefix)
                if (
                    child.type == FileType.Directory
                    and child.base_name.startswith(self.table_prefix)
                    and is_identifier(name)
                    and DeltaTable.is_deltatable(
                        self.where.join(layer, child.base_name), self.storage_options
                    )
                ):
                    found.append(TableRef(layer, name))
        return found

    # -------------------------------------------------------------------------- files

    def open(self, table: TableRef, version: int | None = None) -> DeltaTable:
        """``table`` opened afresh (not from the cache), at ``version`` or its latest."""
        return DeltaTable(self.uri(table), version=version, storage_options=self.storage_options)

    def object_files(self) -> tuple[str, pafs.FileSystem] | None:
        """For a lake on object storage: the root its file URIs start with, and a file
        system over it (opened once)."""
        if self.where.local is not None:
            return None
        if self._files is None:
            self._files = self.where.filesystem()
        return f"{self.where.uri}/", self._files

    def load(self, table: TableRef) -> DeltaTable | None:
        """``table`` at its latest version (cached and brought up to date), or None when it
        does not exist."""
        uri = self.uri(table)
        cached = self._tables.get(uri)
        if cached is not None:
            held = cached.version()
            try:
                # delta-rs lists the log from the version it holds and applies what is new.
                cached.update_incremental()
            except (DeltaError, OSError):
                pass
            else:
                if self._commit_exists(uri, held):
                    return cached
            # The log was cleaned up past the cached version, or the table was removed or
            # replaced behind our back: start afresh.
            del self._tables[uri]
        if not DeltaTable.is_deltatable(uri, self.storage_options):
            return None
        with self.errors("open", table):
            loaded = self.open(table)
        self._tables[uri] = loaded
        return loaded

    def _commit_exists(self, uri: str, version: int) -> bool:
        """Whether the commit file of ``version`` is still in the table's log at ``uri``."""
        name = f"_delta_log/{version:020d}.json"
        files = self.object_files()
        if files is None:
            return (Path(uri) / name).exists()
        root, fs = files
        info = fs.get_file_info(f"{uri.removeprefix(root)}/{name}")
        return bool(info.type != pafs.FileType.NotFound)

    def require(self, table: TableRef, version: int | None = None) -> DeltaTable:
        """``table`` at ``version`` (None: its latest); a :class:`LakeError` when it does not
        exist or has no such version."""
        current = self.load(table)
        if current is None:
            raise LakeError(f"table {table} does not exist (no Delta table at {self.uri(table)})")
        if version is None or version == current.version():
            return current
        if version < 0 or version > current.version():
            raise LakeError(
                f"table {table} has versions 0..{current.version()}; cannot read version {version}"
            )
        with self.errors(f"open version {version} of", table):
            return self.open(table, version)

    def rewriting(self, table: TableRef, action: str) -> contextlib.AbstractContextManager[None]:
        """The table's rewrite lock (:mod:`pipelines.engines.rewrite_lock`): held by every
        commit that removes files, since delta-rs lets two such commits of one file through."""
        return rewrite_lock(
            self.where.lock_dir(), f"{table.layer}.{self.physical_name(table)}", action=action
        )

    @contextlib.contextmanager
    def errors(self, action: str, table: TableRef) -> Iterator[None]:
        """Delta, Arrow and OS errors inside as a :class:`LakeError` naming ``action``."""
        try:
            yield
        except LakeError:
            raise
        except (DeltaError, pa.ArrowException, OSError) as exc:
            raise LakeError(f"{action} {table} ({self.uri(table)}) failed: {exc}") from exc

    # ------------------------------------------------------------------ direct writes

    def direct_allowed(self) -> bool:
        """Whether the engine may commit appends and MERGEs itself: a local lake where hard
        links and put-if-absent work (probed once), and no link has failed since."""
        if self._direct_ok is None:
            assert self.where.local is not None
            self.where.local.mkdir(parents=True, exist_ok=True)
            self._direct_ok = links_work(self.where.local)
        return self._direct_ok

    def direct_failed(self, exc: Exception) -> None:
        """A direct commit failed with ``exc``: delta-rs commits everything from now on."""
        if self._direct_ok:
            _log.warning("%s: committing through delta-rs from now on: %s", self._owner, exc)
        self._direct_ok = False

    # -------------------------------------------------------------------------- hooks

    def on_write(self, hook: Callable[[TableRef], None]) -> None:
        """Have ``hook`` called with each table after every write to it."""
        self._written.append(hook)

    def after_write(self, table: TableRef) -> None:
        """Run the write hooks for ``table`` (a write to it has just committed)."""
        for hook in self._written:
            hook(table)
