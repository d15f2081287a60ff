"""One group's silver run: the objects of a topic that stand at one bronze version, brought
up to date in steps.

:class:`TopicRun` carries out, for one such group, the protocol of :mod:`pipelines.silver.job`:
plan the steps from bronze's history (and landing's checkpoints), and for each step read the
appended bronze rows, count them per schema id, decode them with each object's batch
function, and write the quarantine first and then each object's silver rows, every write under
the txn of the step's last bronze version. Its :class:`TopicResult` sums the steps, with an
:class:`ObjectResult` per object.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T

from ingest.errors import LakeError
from pipelines.bronze.tables import CHECKPOINT_TABLE
from pipelines.chunking import plan_chunks, rows_between, version_sizes
from pipelines.engines.arrow import same_type, spark_schema_to_arrow
from pipelines.engines.base import LakeEngine, Rows, TableRef, Txn
from pipelines.ops.newest import newest_time, time_column
from pipelines.ops.table import CommitRecord
from pipelines.progress import progress
from pipelines.silver.columns import SilverLayout
from pipelines.silver.decode import BRONZE_COLUMNS, DecodePlan, SilverRows
from pipelines.silver.quarantine import (
    COUNTS_SCHEMA,
    FAILURES_SCHEMA,
    QUARANTINE_KEYS,
    QUARANTINE_SCHEMA,
    AfterBatch,
    Failures,
    QuarantinePart,
    SchemaCounts,
    SilverPart,
    Undecodable,
    WithoutKeys,
)
from pipelines.silver.registry import (
    RegistryEntry,
    object_schemas,
    read_registry,
    read_schema_failures,
    silver_layout,
)
from pipelines.silver.shape import shaped_struct
from pipelines.silver.tables import QUARANTINE_APP_PREFIX, QUARANTINE_TABLE, app_id, silver_table
from pipelines.spec.models import ObjectSpec, parse_topic

__all__ = [
    "BRONZE_READ_SCHEMA",
    "ObjectResult",
    "TopicResult",
    "TopicRun",
    "check_types",
    "maintain_on_schedule",
]

# Silver's log lines stay under the job's logger, whichever module writes them.
_log = logging.getLogger("pipelines.silver.job")

_META_BRONZE_TABLE = "sfcdc.silver.bronze_table"
_META_VERSIONS = "sfcdc.silver.bronze_versions"
_META_MAX_BATCH = "sfcdc.silver.bronze_max_batch_id"

# The bronze columns silver reads.
BRONZE_READ_SCHEMA = T.StructType(
    [
        T.StructField("batch_id", T.LongType()),
        T.StructField("batch_seq", T.IntegerType()),
        T.StructField("event_id", T.StringType()),
        T.StructField("replay_id", T.BinaryType()),
        T.StructField("schema_id", T.StringType()),
        T.StructField("payload", T.BinaryType()),
    ]
)


@dataclass(frozen=True)
class ObjectResult:
    """What one run did for one object.

    ``events``: bronze rows written with the object's schemas in the range read (decoded,
    or quarantined when they could not be); ``rows``: silver rows written (events fanned out
    per record id); ``commits``: silver commits made. ``bronze_version`` is where the
    object's table stands afterwards.
    """

    object: str
    table: TableRef
    bronze_table: TableRef
    after_version: int | None
    bronze_version: int | None
    events: int = 0
    rows: int = 0
    commits: int = 0
    silver_version: int | None = None
    duration_s: float = 0.0

    @property
    def up_to_date(self) -> bool:
        """Nothing was new in bronze for this object."""
        return self.commits == 0 and self.after_version == self.bronze_version


@dataclass(frozen=True)
class TopicResult:
    """What one run did with one bronze table (for one group of objects at one version).

    ``other_entities`` counts rows of objects that have no silver table here (on a channel).
    """

    topic: str
    bronze_table: TableRef
    after_version: int | None
    bronze_version: int | None
    bronze_rows: int
    quarantined: int
    objects: tuple[ObjectResult, ...]
    other_entities: Mapping[str, int] = field(default_factory=dict)
    full_read: bool = False


def maintain_on_schedule(
    engine: LakeEngine, table: TableRef, version: int | None, every: int
) -> None:
    """Compact ``table`` and checkpoint its log when commit ``version`` is a multiple of
    ``every`` (``ingest.maintain_every_commits``; 0: never), so a silver table that grows by
    small appends for months keeps a bounded number of files and a short log to replay. By
    version, so it holds across passes and processes. A failure is logged: silver goes on."""
    if every <= 0 or version is None or version == 0 or version % every:
        return
    try:
        engine.maintain(table)
    except LakeError as exc:
        _log.warning("silver: maintenance of %s failed (left for later): %s", table, exc)


@dataclass
class _Progress:
    events: int = 0
    rows: int = 0
    commits: int = 0
    version: int | None = None
    seconds: float = 0.0


class TopicRun:
    """The objects of one topic that stand at the same bronze version, brought up to date
    together by :meth:`run` (a group of :func:`~pipelines.silver.job.run_silver`)."""

    def __init__(
        self,
        engine: LakeEngine,
        topic: str,
        bronze: TableRef,
        objs: list[ObjectSpec],
        *,
        registry_table: TableRef,
        clock: Callable[[], float],
        now: Callable[[], datetime],
        on_commit: Callable[[CommitRecord], object] | None = None,
        maintain_every: int = 0,
        before_write: Callable[[], object] = lambda: None,
    ) -> None:
        self.engine = engine
        self.before_write = before_write
        self.now = now
        self.on_commit = on_commit
        self.maintain_every = maintain_every

        self.topic = topic
        self.bronze = bronze
        self.objs = objs
        self.registry_table = registry_table
        self.clock = clock
        self.at = now()
        self.topic_entity = parse_topic(topic).entity
        self.max_rows = min(o.silver.max_rows_per_commit for o in objs)
        self.max_bytes = min(o.silver.max_bytes_per_commit for o in objs)
        self.progress = {o.api_name: _Progress() for o in objs}
        self.others: dict[str, int] = {}
        self.quarantined = 0
        self.bronze_rows = 0
        self.full_read = False
        self._registry_version: int | None = None
        self._registry: dict[str, RegistryEntry] = {}
        # Silver tables being created while their rows are decoded (see _decode).
        self._creating: dict[TableRef, Future[None]] = {}
        self._ahead: ThreadPoolExecutor | None = None

    def run(self, after: int | None) -> TopicResult:
        started = self.clock()
        current = self.engine.version(self.bronze)
        assert current is not None
        if after is not None and after > current:
            names = ", ".join(o.api_name for o in self.objs)
            raise LakeError(
                f"the silver tables of {names} processed {self.bronze} up to version {after}, "
                f"but it is at version {current}: was it dropped and re-created? Drop those "
                "silver tables to rebuild them from the new bronze table"
            )
        start = after
        first = 0 if after is None else after + 1
        # Bronze's history, landing's checkpoints and the schema registry (when there is
        # something to decode) are small reads that do not depend on each other: read at once,
        # their latencies (a few Spark jobs each on the spark engine) overlap.
        with ThreadPoolExecutor(2, thread_name_prefix="sfcdc-silver-read") as reads:
            checkpoints = reads.submit(self._checkpoints, first)
            if current >= first:
                reads.submit(self._registry_ahead)
            history = self.engine.history(self.bronze, limit=max(current - first + 1, 1))
            sizes = version_sizes(history, checkpoints.result())
        chunks = plan_chunks(
            sizes, after, current, max_rows=self.max_rows, max_bytes=self.max_bytes
        )
        self._ahead = ThreadPoolExecutor(1, thread_name_prefix="sfcdc-silver-create")
        try:
            with progress(
                total=rows_between(sizes, after, current),
                unit="events",
                label=f"silver {self.bronze}",
            ) as bar:
                for end in chunks:
                    self._chunk(after, end)
                    bar.advance(rows_between(sizes, after, end))
                    after = end
        finally:
            for creating in self._creating.values():
                creating.cancel()
            self._creating.clear()
            self._ahead.shutdown()
            self._ahead = None
        if start == after:
            _log.info("silver: %s has nothing new after version %s", self.bronze, start)
        else:
            _log.info(
                "silver: %s versions %s..%s done: %d bronze rows, %d quarantined (%.1f s)",
                self.bronze,
                first,
                after,
                self.bronze_rows,
                self.quarantined,
                self.clock() - started,
            )
        objects = []
        for obj in self.objs:
            p = self.progress[obj.api_name]
            table = silver_table(obj)
            version = p.version if p.version is not None else self.engine.version(table)
            objects.append(
                ObjectResult(
                    obj.api_name,
                    table,
                    self.bronze,
                    start,
                    after,
                    p.events,
                    p.rows,
                    p.commits,
                    version,
                    p.seconds,
                )
            )
        return TopicResult(
            self.topic,
            self.bronze,
            start,
            after,
            self.bronze_rows,
            self.quarantined,
            tuple(objects),
            dict(self.others),
            self.full_read,
        )

    def _checkpoints(self, first: int) -> list[dict[str, Any]]:
        """Landing's checkpoint rows of this topic from bronze version ``first`` on (their
        payload bytes size the steps); none when landing keeps no checkpoints here."""
        table = TableRef("bronze", CHECKPOINT_TABLE)
        if not self.engine.exists(table):
            return []
        rows = self.engine.read_arrow(
            table,
            columns=["bronze_version", "event_count", "payload_bytes"],
            where=[("topic", "=", self.topic), ("bronze_version", ">=", first)],
        )
        return list(rows.to_pylist())

    def _registry_ahead(self) -> None:
        """The registry read before a step needs it; a failure is left to that step's read,
        which raises it where it always has."""
        try:
            self.registry()
        except Exception:
            _log.debug("silver: reading the schema registry ahead failed", exc_info=True)

    def registry(self) -> dict[str, RegistryEntry]:
        version = self.engine.version(self.registry_table)
        if version != self._registry_version or not self._registry:
            self._registry = read_registry(self.engine, self.registry_table)
            self._registry_version = version
        return self._registry

    def _chunk(self, after: int | None, end: int) -> None:
        engine = self.engine
        changes = engine.read_appends(
            self.bronze, after_version=after, until_version=end, columns=BRONZE_COLUMNS
        )
        if changes.start_version is None:
            return
        rows = changes.rows
        held: list[Rows] = []
        if changes.full_read and after is not None:
            self.full_read = True
            rows = engine.map_batches(
                rows,
                AfterBatch(_last_processed(engine, self.bronze, self.objs, after)),
                BRONZE_READ_SCHEMA,
            )
            # Filtered once (a pass over the whole table), then counted, decoded and searched.
            rows = engine.persist(rows)
            held.append(rows)
        # Otherwise read where they are, for each use: the range's versions are fixed, so every
        # read gives the same rows, and the count per schema id reads two small columns only.
        # Each object's decode reads them once and keeps its output.
        try:
            started = self.clock()
            stats = _schema_counts(
                engine.to_arrow(engine.map_batches(rows, SchemaCounts(), COUNTS_SCHEMA))
            )
            total = sum(n for n, _ in stats.values())
            _log.debug(
                "silver: %s versions %s..%s: %d rows counted per schema id in %.2f s",
                self.bronze,
                changes.start_version,
                end,
                total,
                self.clock() - started,
            )
            if total == 0:
                return
            self.bronze_rows += total
            registry = self.registry()
            max_batch = max((b for _, b in stats.values() if b is not None), default=None)
            metadata = {
                _META_BRONZE_TABLE: self.bronze.name,
                _META_VERSIONS: f"{changes.start_version}-{end}",
            }
            if max_batch is not None:
                metadata[_META_MAX_BATCH] = str(max_batch)
            passes = []
            decodable: set[str] = set()
            for obj in self.objs:
                ids = [s.schema_id for s in object_schemas(obj, registry)]
                decodable.update(ids)
                events = sum(stats[sid][0] for sid in ids if sid in stats)
                passes.append(
                    self._decode(obj, rows, registry=registry, ids=ids, events=events, held=held)
                )
            undecodable = self._undecodable(rows, stats, registry, decodable)
            self.before_write()
            self._commit_step(passes, undecodable, after=after, end=end, metadata=metadata)
        finally:
            for kept in held:
                engine.release(kept)

    def _commit_step(
        self,
        decoded: Sequence[tuple[ObjectSpec, SilverLayout, Rows, Rows | None, int]],
        undecodable: Rows | None,
        *,
        after: int | None,
        end: int,
        metadata: Mapping[str, str],
    ) -> None:
        """Commit a decoded step: quarantine first, then each object's silver rows."""
        # The quarantine first: a run that dies before the silver writes decodes this
        # range again and finds the quarantine already holding it.
        quarantined: dict[str, int] = {}
        for obj, _, _, bad, _ in decoded:
            if bad is not None:
                quarantined[obj.api_name] = self._quarantine(
                    bad, app_for=obj.api_name, after=after, end=end, metadata=metadata
                )
        if undecodable is not None:
            self._quarantine(
                undecodable, app_for=self.bronze.name, after=after, end=end, metadata=metadata
            )
        for obj, layout, data, _, events in decoded:
            self._write(
                obj,
                layout,
                data,
                events=events,
                end=end,
                metadata=metadata,
                quarantined=quarantined.get(obj.api_name, 0),
            )

    def _undecodable(
        self,
        rows: Rows,
        stats: Mapping[str, tuple[int, Any]],
        registry: Mapping[str, RegistryEntry],
        decodable: set[str],
    ) -> Rows | None:
        """Rows no configured object decodes: counted when they belong to another object on a
        channel, quarantined otherwise (unknown or unusable schema id, another object's
        schema on a single-object topic)."""
        split = self._split_undecodable(stats, registry, decodable)
        if split is None:
            return None
        skipped, reasons = split
        function = Undecodable(
            decodable=skipped,
            reasons=reasons,
            registry=str(self.registry_table),
            bronze_table=self.bronze.name,
            topic=self.topic,
            at=self.at,
        )
        return self.engine.map_batches(rows, function, QUARANTINE_SCHEMA)

    def _split_undecodable(
        self,
        stats: Mapping[str, tuple[int, Any]],
        registry: Mapping[str, RegistryEntry],
        decodable: set[str],
    ) -> tuple[set[str], dict[str, tuple[str, str]]] | None:
        """The schema ids to leave out of the quarantine (decoded, or another object's on a
        channel, whose rows are counted in ``others``) and the quarantine reasons of the
        rest; None when no row needs quarantining."""
        if all(sid in decodable for sid in stats):
            # Every row is an object's to decode (a decodable schema id has no reason): the
            # reasons of other schema ids, which take reading the schema failures, are not needed.
            return None
        reasons = self._reasons(registry, decodable)
        skipped = set(decodable)
        for sid, (n, _) in stats.items():
            entry = registry.get(sid) if sid else None
            if sid in skipped or entry is None or entry.schema is None or sid in reasons:
                continue
            skipped.add(sid)
            entity = entry.schema.entity_name
            self.others[entity] = self.others.get(entity, 0) + n
        if all(sid in skipped and sid not in reasons for sid in stats):
            return None
        return skipped, reasons

    def _reasons(
        self, registry: Mapping[str, RegistryEntry], decodable: set[str]
    ) -> dict[str, tuple[str, str]]:
        reasons: dict[str, tuple[str, str]] = {}
        for sid, text in read_schema_failures(self.engine).items():
            if sid not in registry:
                reasons[sid] = ("schema_unavailable", text)
        for sid, entry in registry.items():
            if entry.problem is not None:
                reasons[sid] = ("invalid_schema", entry.problem)
            elif (
                entry.schema is not None
                and sid not in decodable
                and self.topic_entity is not None
                and entry.schema.entity_name != self.topic_entity
            ):
                reasons[sid] = (
                    "wrong_entity",
                    f"schema {sid} is a {entry.schema.entity_name} schema, but {self.topic} "
                    f"carries {self.topic_entity} events",
                )
        return reasons

    def _decode(
        self,
        obj: ObjectSpec,
        rows: Rows,
        *,
        registry: Mapping[str, RegistryEntry],
        ids: list[str],
        events: int,
        held: list[Rows],
    ) -> tuple[ObjectSpec, SilverLayout, Rows, Rows | None, int]:
        """One pass over the object's rows: its silver rows and its quarantine rows (``None``
        when every row decoded). What must be kept for the writes is added to ``held``."""
        started = self.clock()
        engine = self.engine
        layout = silver_layout(obj, registry)
        table = silver_table(obj)
        check_types(engine, table, layout)
        ahead = self._ahead
        new = events > 0 and table not in self._creating and not engine.exists(table)
        if new and ahead is not None:
            # Created while the rows are decoded (a few small Spark jobs on the spark engine,
            # off the decode's way); _write waits for it, and raises its failure.
            self._creating[table] = ahead.submit(self._create, table, layout)
        if not events:
            # Nothing for this object in the range: an empty commit still records the bronze
            # version (and creates the table the first time).
            empty = spark_schema_to_arrow(layout.silver_schema()).empty_table()
            return obj, layout, empty, None, 0
        plan = DecodePlan(
            layout=layout,
            schemas={sid: registry[sid].schema_json for sid in ids},
            registry=str(self.registry_table),
        )
        decoded = engine.persist(engine.map_batches(rows, SilverRows(plan), shaped_struct(layout)))
        held.append(decoded)
        schema = layout.silver_schema()
        silver = engine.map_batches(decoded, SilverPart(schema.names), schema)
        bad = None
        if engine.count(engine.map_batches(decoded, Failures(), FAILURES_SCHEMA)):
            function = QuarantinePart(
                bronze_table=self.bronze.name, topic=self.topic, at=self.at, entity=obj.api_name
            )
            bad = engine.persist(engine.map_batches(decoded, function, QUARANTINE_SCHEMA))
            held.append(bad)
        seconds = self.clock() - started
        _log.debug("silver: %s decoded in %.2f s", obj.api_name, seconds)
        self.progress[obj.api_name].seconds += seconds
        return obj, layout, silver, bad, events

    def _write(
        self,
        obj: ObjectSpec,
        layout: SilverLayout,
        data: Rows,
        *,
        events: int,
        end: int,
        metadata: Mapping[str, str],
        quarantined: int = 0,
    ) -> None:
        started = self.clock()
        table = silver_table(obj)
        creating = self._creating.pop(table, None)
        if creating is not None:
            creating.result()
        elif not self.engine.exists(table):
            self._create(table, layout)
        newest = None
        if self.on_commit is not None and events:
            column = time_column(layout.silver_schema().names, change_events=layout.change_events)
            newest = newest_time(self.engine, data, column)
        result = self.engine.append(table, data, txn=Txn(app_id(obj), end), metadata=metadata)
        _log.debug("silver: %s written in %.2f s", table, self.clock() - started)
        if not result.skipped:
            maintain_on_schedule(self.engine, table, result.version, self.maintain_every)
        p = self.progress[obj.api_name]
        p.events += events
        p.rows += result.rows
        p.commits += 0 if result.skipped else 1
        p.version = result.version
        p.seconds += self.clock() - started
        if self.on_commit is not None and not result.skipped:
            self.on_commit(
                CommitRecord(
                    layer="silver",
                    kind="commit",
                    visible_at=self.now(),
                    topic=self.topic,
                    object=obj.api_name,
                    table=str(table),
                    version=result.version,
                    events=events,
                    rows=result.rows,
                    quarantined=quarantined,
                    newest_commit_at=newest,
                    duration_seconds=self.clock() - started,
                )
            )
        _log.info(
            "silver: %s <- %s up to version %d: %d events, %d rows, version %s%s",
            table,
            self.bronze,
            end,
            events,
            result.rows,
            result.version,
            " (already committed)" if result.skipped else "",
        )

    def _create(self, table: TableRef, layout: SilverLayout) -> None:
        # Created from the layout, so every column is nullable whatever the first rows hold
        # (Spark marks literal and coalesced columns NOT NULL).
        self.engine.ensure_table(table, layout.silver_schema())

    def _quarantine(
        self,
        rows: Rows,
        *,
        app_for: str,
        after: int | None,
        end: int,
        metadata: Mapping[str, str],
    ) -> int:
        """Append quarantine rows of the bronze range ``(after, end]`` under the txn
        ``sfcdc.silver.quarantine:<app_for>`` (an object's undecodable rows, or the bronze
        table's rows no object decodes); the rows appended."""
        engine = self.engine
        app = f"{QUARANTINE_APP_PREFIX}{app_for}"
        done = engine.txn_version(QUARANTINE_TABLE, app)
        if done is not None and done >= end:
            _log.info("silver: quarantine %s up to version %d already committed", app, end)
            return 0
        if engine.count(rows) == 0:
            return 0
        if done is not None and (after is None or done > after):
            # An earlier run quarantined part of this range (it stopped at another version).
            rows = _without_quarantined(engine, rows, self.bronze)
        if not engine.exists(QUARANTINE_TABLE):
            engine.ensure_table(QUARANTINE_TABLE, QUARANTINE_SCHEMA)
        result = engine.append(QUARANTINE_TABLE, rows, txn=Txn(app, end), metadata=metadata)
        self.quarantined += result.rows
        _log.warning(
            "silver: %d rows of %s could not be decoded (%s); quarantined in %s (version %s)",
            result.rows,
            self.bronze,
            app_for,
            QUARANTINE_TABLE,
            result.version,
        )
        return result.rows


def _schema_counts(counts: pa.Table) -> dict[str, tuple[int, int | None]]:
    """Rows and highest batch id per schema id, from :class:`SchemaCounts` rows."""
    grouped = counts.group_by("schema_id").aggregate([("rows", "sum"), ("max_batch_id", "max")])
    return {
        sid: (int(n), None if top is None else int(top))
        for sid, n, top in zip(
            grouped.column("schema_id").to_pylist(),
            grouped.column("rows_sum").to_pylist(),
            grouped.column("max_batch_id_max").to_pylist(),
            strict=True,
        )
    }


def _without_quarantined(engine: LakeEngine, rows: Rows, bronze: TableRef) -> Rows:
    existing = engine.read_arrow(
        QUARANTINE_TABLE, columns=list(QUARANTINE_KEYS), where=[("bronze_table", "=", bronze.name)]
    )
    seen = set(zip(*(existing.column(k).to_pylist() for k in QUARANTINE_KEYS), strict=True))
    return engine.map_batches(rows, WithoutKeys(seen), QUARANTINE_SCHEMA)


def _last_processed(
    engine: LakeEngine, bronze: TableRef, objs: Iterable[ObjectSpec], after: int
) -> int:
    """Bronze could not be read incrementally (its change data feed no longer covers the
    range) and the whole table is read instead: the last batch processed, which every silver
    commit records, says which rows are new."""
    processed: list[int] = []
    for obj in objs:
        for entry in engine.history(silver_table(obj), limit=100):
            if entry.txn is not None and entry.txn.app_id == app_id(obj):
                value = entry.metadata.get(_META_MAX_BATCH)
                if value is not None and value.isdigit():
                    processed.append(int(value))
                break
    if not processed:
        raise LakeError(
            f"{bronze} cannot be read incrementally after version {after} and the silver "
            "commits do not say which bronze batches they processed; rebuild the silver "
            f"tables of {', '.join(o.api_name for o in objs)} (drop them and run again)"
        )
    last = min(processed)
    _log.warning(
        "silver: reading all of %s and keeping the batches after %d, the last processed",
        bronze,
        last,
    )
    return last


def check_types(engine: LakeEngine, table: TableRef, layout: SilverLayout) -> None:
    """Refuse ``layout`` when a column of ``table`` cannot take its type (a field changed
    type in Salesforce); a struct column that only gains fields is fine."""
    current = engine.schema(table)
    if current is None:
        return
    have = {f.name.lower(): f for f in current.fields}
    for f in layout.silver_schema().fields:
        old = have.get(f.name.lower())
        if old is None or same_type(old.dataType, f.dataType) or _grows(old.dataType, f.dataType):
            continue
        raise LakeError(
            f"{table}: column {f.name!r} is {old.dataType.simpleString()} but the schema "
            f"versions of {layout.entity} now make it {f.dataType.simpleString()} (a field "
            "changed type in Salesforce); rebuild the silver table (drop it and run again) so "
            "the column takes a type that holds every version's values"
        )


def _grows(old: Any, new: Any) -> bool:
    """Whether ``new`` only adds struct fields to ``old`` (appends evolve the table)."""
    from pyspark.sql import types as T

    if isinstance(old, T.StructType) and isinstance(new, T.StructType):
        theirs = {f.name.lower(): f for f in new.fields}
        return all(
            f.name.lower() in theirs
            and (
                same_type(f.dataType, theirs[f.name.lower()].dataType)
                or _grows(f.dataType, theirs[f.name.lower()].dataType)
            )
            for f in old.fields
        )
    return False
