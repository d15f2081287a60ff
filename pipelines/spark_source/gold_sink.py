"""Gold from a Structured Streaming query of the ``salesforce`` source, in ``foreachBatch``.

::

    changes = spark.readStream.format("salesforce").option("pipeline", "conf/pipeline.yml") \\
        .option("topic", "/data/AccountChangeEvent").option("decode", "silver").load()
    query = changes.writeStream.foreachBatch(GoldSink(spark, conf_dir="conf", object="Account")) \\
        .option("checkpointLocation", "/checkpoints/account").start()

For each micro-batch, :class:`GoldSink`

1. appends the rows that decoded to the object's silver table (``tables.silver`` of its
   ``conf/objects`` file, in the conf's lake) and the rows that did not to the quarantine
   (``silver.sfcdc_quarantine``), each under the Delta app transaction ``(app id, batch id)``:
   a micro-batch that Spark runs again after a crash is not appended twice; its ``replay_gap``
   rows (the source's stream resumed elsewhere after a rejected replay id) become whole-object
   ``replay_gap`` re-sync rows for the next gold run instead;
2. brings the object's gold table up to date with silver through sfcdc's own gold job
   (:func:`~pipelines.gold.job.run_gold_object`: the fold, the MERGE, tombstones, SCD2
   history and re-sync rows), which records the silver version it reached in the gold table's
   own app transaction, so running it again changes nothing.

Order. Gold orders a record's changes by ``gold.sequence_by`` (Salesforce's commit time,
commit number, transaction and sequence by default), then by the stream order
``(_cdc_bronze_batch_id, _cdc_bronze_batch_seq)``. The source numbers events within their
micro-batch and sets the batch id to 0; the sink stores the micro-batch's id there instead, so
the stream order runs across micro-batches as bronze's batch ids do for sfcdc's own jobs.

The app id is ``sfcdc.spark_source:<query id>``. A query started again from its checkpoint
keeps its id (and re-runs an unfinished micro-batch under the same batch id); a query started
from a new checkpoint gets a new id, so its batch ids, counted from 0 again, are not taken for
batches already written. Where the query's id cannot be read (a Spark Connect session), name
the app id yourself (``app_id=``), and change it along with the checkpoint.

The tables are written through the spark lake engine (delta-spark) at the conf's
``lake.catalog`` or ``lake.location``, whatever ``lake.engine`` says: the micro-batch is a Spark
DataFrame. The columns come from the writer schemas of the topic, fetched with GetSchema over
the conf's connection when the sink meets columns it has no schema for (its first micro-batch,
and after a schema change restarted the query).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import types as T

from ingest.client import SchemaCache
from ingest.errors import ConfigError
from ingest.schema import EventSchema
from pipelines.connect import connect, secret_resolver
from pipelines.engines import SparkEngine
from pipelines.engines.base import CommitResult, TableRef, Txn
from pipelines.gold.job import run_gold_object
from pipelines.gold.object_run import ObjectResult
from pipelines.gold.resync import resync_row
from pipelines.silver.columns import SilverLayout, build_layout
from pipelines.silver.quarantine import (
    ERROR_COLUMNS,
    QUARANTINE_SCHEMA,
    QuarantinePart,
    SilverPart,
)
from pipelines.silver.shape import shaped_struct
from pipelines.silver.tables import QUARANTINE_TABLE
from pipelines.spec.conf import Conf
from pipelines.spec.load import load_conf
from pipelines.spec.models import ObjectSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from ingest.auth import SecretResolver

__all__ = ["APP_PREFIX", "BatchResult", "GoldSink"]

_log = logging.getLogger(__name__)

APP_PREFIX = "sfcdc.spark_source:"
_QUARANTINE_PREFIX = "sfcdc.spark_source.quarantine:"
# Spark sets it on the thread that runs a streaming query's micro-batches, foreachBatch included.
_QUERY_ID = "sql.streaming.queryId"
_BATCH_ID = "_cdc_bronze_batch_id"
_GAP = "replay_gap"


@dataclass(frozen=True)
class BatchResult:
    """What the sink did with one micro-batch.

    ``rows`` are the micro-batch's rows (0: a keepalive moved the offset; nothing is written
    and gold is not run); ``silver`` is the append to the silver table (``skipped``: the batch
    had been appended before), ``quarantined`` the rows appended to the quarantine, ``gold``
    the gold run (``None`` when it was not run, or when there is no silver table yet),
    ``replay_gaps`` the replay gaps the micro-batch reported (each becomes a whole-object
    ``replay_gap`` row of the re-sync table at the next gold run).
    """

    batch_id: int
    app_id: str
    rows: int
    silver: CommitResult
    quarantined: int
    gold: ObjectResult | None
    replay_gaps: int = 0


class GoldSink:
    """A ``foreachBatch`` function for a ``decode=silver`` query of one object's topic:
    silver appended exactly once, then gold brought up to date (see the module docstring).

    ``conf_dir`` is a ``conf/`` directory (``pipeline.yml``: connection and lake; the
    object's file: its tables and gold settings); ``object`` the API name of one of its
    change event objects. ``secrets`` resolves the connection's secret references (default:
    environment variables). ``app_id``: see the module docstring.

    Calling it runs :meth:`append_silver`, then :meth:`update_gold`; a function of your own
    can call them separately (to update gold every few micro-batches, say).
    """

    def __init__(
        self,
        spark: SparkSession,
        *,
        conf_dir: str | Path,
        object: str,
        secrets: SecretResolver | None = None,
        app_id: str | None = None,
    ) -> None:
        conf = load_conf(Path(conf_dir))
        self.conf: Conf = conf
        self.object: ObjectSpec = _object(conf, object)
        self._engine: SparkEngine | None = SparkEngine.from_spec(conf.pipeline.lake, spark)
        self.silver_table = TableRef("silver", self.object.tables.silver)
        self.app_id = app_id
        self._secrets = secrets
        self._schemas: dict[str, EventSchema] = {}
        self._layout: SilverLayout | None = None
        self._created = False
        # Re-sync rows of replay gaps seen since the last gold run, by resync_id.
        self._gaps: dict[str, dict[str, Any]] = {}

    def __repr__(self) -> str:
        return f"GoldSink({self.object.api_name!r}, {self._engine!r})"

    def __getstate__(self) -> dict[str, Any]:
        # Spark Connect pickles a foreachBatch function and runs it in a Python process of
        # its server: the client's session stays behind, and the engine is made again there
        # from the first micro-batch's session.
        return {**self.__dict__, "_engine": None}

    @property
    def engine(self) -> SparkEngine:
        """The spark lake engine the sink writes with."""
        if self._engine is None:
            raise ConfigError(
                f"GoldSink({self.object.api_name}) has no session yet: it gets one with its "
                "first micro-batch"
            )
        return self._engine

    def __call__(self, batch: DataFrame, batch_id: int) -> BatchResult:
        result = self.append_silver(batch, batch_id)
        if not result.rows:
            return result
        return replace(result, gold=self.update_gold())

    # ------------------------------------------------------------------------------- silver

    def append_silver(self, batch: DataFrame, batch_id: int) -> BatchResult:
        """Append the micro-batch ``batch_id`` to the silver table (rows that decoded) and
        the quarantine (rows that did not), each once."""
        if self._engine is None:
            self._engine = SparkEngine.from_spec(self.conf.pipeline.lake, batch.sparkSession)
        engine = self.engine
        app = self._app_id(batch)
        layout = self._layout_for(batch.schema)
        delivered = batch.schema
        rows = engine.persist(engine.map_batches(batch, _Delivered(batch_id), delivered))
        try:
            count = engine.count(rows)
            if count == 0:
                # A keepalive moved the offset: nothing to write.
                empty = CommitResult(self.silver_table, None, skipped=False, rows=0)
                return BatchResult(batch_id, app, 0, empty, 0, None)
            gaps = self._replay_gaps(rows, app, batch_id)
            # The quarantine first, as the silver job does: either write may be the last
            # before a crash, and each is skipped when its batch comes again.
            quarantined = self._quarantine(
                rows.filter(f"_cdc_error_kind IS NULL OR _cdc_error_kind <> '{_GAP}'"),
                app,
                batch_id,
            )
            silver = T.StructType([f for f in delivered.fields if f.name not in ERROR_COLUMNS])
            self._ensure_silver(layout)
            written = engine.append(
                self.silver_table,
                engine.map_batches(rows, SilverPart(silver.names), silver),
                txn=Txn(app, batch_id),
                metadata={"sfcdc.spark_source.batch_id": str(batch_id)},
            )
        finally:
            engine.release(rows)
        _log.info(
            "spark source: micro-batch %d -> %s: %d rows%s, %d quarantined",
            batch_id,
            self.silver_table,
            written.rows,
            " (already appended)" if written.skipped else "",
            quarantined,
        )
        return BatchResult(batch_id, app, count, written, quarantined, None, gaps)

    def _replay_gaps(self, rows: DataFrame, app: str, batch_id: int) -> int:
        """Keep the micro-batch's replay gap rows as re-sync rows for the next gold run."""
        found = (
            rows.filter(f"_cdc_error_kind = '{_GAP}'")
            .select("_cdc_bronze_batch_seq", "_cdc_error")
            .collect()
        )
        at = datetime.now(timezone.utc)
        for row in found:
            seq, detail = row["_cdc_bronze_batch_seq"], row["_cdc_error"]
            gap = resync_row(
                object_name=self.object.api_name,
                record_id=None,
                reason="replay_gap",
                change_type=None,
                detail=f"{detail} (spark source {app}, micro-batch {batch_id})",
                commit_timestamp=None,
                replay_id=None,
                event_id=None,
                bronze_batch_id=batch_id,
                detected_at=at,
                cause=(app, batch_id, seq),
            )
            self._gaps.setdefault(gap["resync_id"], gap)
        if found:
            _log.warning(
                "spark source: micro-batch %d reports %d replay gap(s) on %s; %s gets a "
                "re-sync row for the whole object",
                batch_id,
                len(found),
                self.object.topic,
                self.object.api_name,
            )
        return len(found)

    def _app_id(self, batch: DataFrame) -> str:
        if self.app_id is not None:
            return self.app_id
        query = _query_id(batch)
        if not query:
            raise ConfigError(
                f"GoldSink({self.object.api_name}): the micro-batch does not say which streaming "
                "query it belongs to (no Spark context: a Spark Connect session, or the sink "
                "called outside foreachBatch), so its appends have no stable Delta app id; "
                "pass app_id= (a name unique to this query, changed whenever it starts from a "
                "new checkpoint)"
            )
        return f"{APP_PREFIX}{query}"

    def _ensure_silver(self, layout: SilverLayout) -> None:
        if self._created:
            return
        # Created from the layout, so every column is nullable whatever the first rows hold;
        # an existing table gets the columns a schema change added.
        self.engine.ensure_table(self.silver_table, layout.silver_schema())
        self._created = True

    def _quarantine(self, rows: Any, app: str, batch_id: int) -> int:
        engine = self.engine
        obj = self.object
        function = QuarantinePart(
            bronze_table=f"spark_source:{app.removeprefix(APP_PREFIX)}",
            topic=obj.topic,
            at=datetime.now(timezone.utc),
            entity=obj.api_name,
        )
        bad = engine.persist(engine.map_batches(rows, function, QUARANTINE_SCHEMA))
        try:
            if engine.count(bad) == 0:
                return 0
            engine.ensure_table(QUARANTINE_TABLE, QUARANTINE_SCHEMA)
            result = engine.append(
                QUARANTINE_TABLE,
                bad,
                txn=Txn(f"{_QUARANTINE_PREFIX}{app.removeprefix(APP_PREFIX)}", batch_id),
            )
        finally:
            engine.release(bad)
        if result.rows:
            _log.warning(
                "spark source: %d events of micro-batch %d could not be decoded; quarantined in %s",
                result.rows,
                batch_id,
                QUARANTINE_TABLE,
            )
        return result.rows

    # --------------------------------------------------------------------------------- gold

    def update_gold(self) -> ObjectResult | None:
        """Bring the object's gold table up to date with its silver table (``None``: no
        silver table yet)."""
        if self._layout is None:
            if not self.engine.exists(self.silver_table):
                return None
            # A sink that has not seen a micro-batch yet folds with the topic's current columns.
            self._refresh()
        assert self._layout is not None
        result = run_gold_object(
            self.engine, self.object, layout=self._layout, replay_gaps=list(self._gaps.values())
        )
        if result is not None:
            # Written (the re-sync table is merged on resync_id: a gap seen again, in a
            # micro-batch Spark runs again, adds nothing).
            self._gaps.clear()
        return result

    # ------------------------------------------------------------------------------ columns

    def _layout_for(self, schema: T.StructType) -> SilverLayout:
        """The layout whose columns hold the rows of ``schema``: the schemas known so far, or
        with the topic's current one fetched when they do not."""
        if self._layout is None or not _holds(self._layout, schema):
            self._refresh()
            assert self._layout is not None
            if not _holds(self._layout, schema):
                extra = sorted(set(schema.names) - set(shaped_struct(self._layout).names))
                raise ConfigError(
                    f"GoldSink({self.object.api_name}): the micro-batch has columns {extra} "
                    f"that {self.object.api_name}'s schemas ({', '.join(self._schemas)}) do "
                    f"not have; the query must read {self.object.topic} with decode=silver"
                )
            self._created = False
        return self._layout

    def _refresh(self) -> None:
        obj = self.object
        secrets = self._secrets or secret_resolver()
        with connect(self.conf.pipeline.connection, secrets=secrets, logger=_log) as source:
            cache = SchemaCache(source.channel, tokens=source.tokens)
            info = cache.topic_info(obj.topic, refresh=True)
            if not info.schema_id:
                raise ConfigError(
                    f"GoldSink({obj.api_name}): {obj.topic} carries several objects; the "
                    "salesforce source decodes one object's topic (decode=silver)"
                )
            schema = cache.schema(info.schema_id)
        if schema.entity_name != obj.api_name:
            raise ConfigError(
                f"GoldSink({obj.api_name}): {obj.topic} carries {schema.entity_name} events, "
                f"not {obj.api_name}'s; check the topic of its conf/objects file"
            )
        self._schemas.setdefault(schema.schema_id, schema)
        # The columns the source makes (compound fields as structs), from every schema seen.
        self._layout = build_layout(obj.api_name, list(self._schemas.values()))


class _Delivered:
    """A micro-batch's rows with its batch id as ``_cdc_bronze_batch_id`` (the source sets
    0): with the place in the batch, the order in which the stream delivered them."""

    def __init__(self, batch_id: int) -> None:
        self.batch_id = batch_id

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            index = batch.schema.get_field_index(_BATCH_ID)
            field = batch.schema.field(index)
            ids = pa.array([self.batch_id] * batch.num_rows, field.type)
            yield batch.set_column(index, field, ids)


def _holds(layout: SilverLayout, schema: T.StructType) -> bool:
    return set(schema.names) <= set(shaped_struct(layout).names)


def _object(conf: Conf, name: str) -> ObjectSpec:
    try:
        obj = conf.object(name)
    except KeyError as exc:
        raise ConfigError(f"GoldSink: {exc.args[0]}") from None
    if obj.kind != "change_events":
        raise ConfigError(
            f"GoldSink: {name} is a platform event; gold holds the current state of change "
            "event objects (kind: change_events)"
        )
    if obj.silver.compound_fields != "struct":
        raise ConfigError(
            f"GoldSink: {name} has silver.compound_fields: {obj.silver.compound_fields}, but the "
            "salesforce source's silver rows keep compound fields as structs; use struct (the "
            "default) for the object this sink writes"
        )
    return obj


def _query_id(batch: DataFrame) -> str | None:
    try:
        context = batch.sparkSession.sparkContext
    except Exception:  # a Spark Connect session has no SparkContext
        return None
    value = context.getLocalProperty(_QUERY_ID)
    return str(value) if value else None
