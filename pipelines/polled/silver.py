"""Silver of a polled object: its bronze table's new record rows -> its silver table, exactly once.

As for a topic (:mod:`pipelines.silver.job`): the silver table's app transaction
``sfcdc.silver:<Object>`` records the last bronze version it took; the rows appended after it
are turned into silver rows by :class:`~pipelines.polled.rows.PolledRows` with the layout of
every describe the bronze table holds (read after the rows, so it covers them); rows that do
not fit go to ``silver.sfcdc_quarantine`` first (``sfcdc.silver.quarantine:<Object>``), then the
silver rows are appended with the bronze version as the transaction version. A run that dies in
between writes the same range again and its quarantine write is skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timezone

from pipelines.engines.base import LakeEngine, Txn
from pipelines.ops.newest import newest_time
from pipelines.ops.table import CommitRecord
from pipelines.polled.layout import polled_layout
from pipelines.polled.rows import BRONZE_COLUMNS, PolledRows, decoded_schema
from pipelines.polled.tables import polled_table
from pipelines.silver.quarantine import QUARANTINE_SCHEMA, QuarantinePart, SilverPart
from pipelines.silver.tables import (
    QUARANTINE_APP_PREFIX,
    QUARANTINE_TABLE,
    app_id,
    silver_table,
)
from pipelines.silver.topic_run import ObjectResult, TopicResult, maintain_on_schedule
from pipelines.spec import ObjectSpec

__all__ = ["run_polled_silver"]

_log = logging.getLogger("pipelines.silver.job")
_COMMIT_TIME = "_cdc_commit_timestamp"


def run_polled_silver(
    engine: LakeEngine,
    obj: ObjectSpec,
    *,
    maintain_every: int = 0,
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    clock: Callable[[], float] = time.perf_counter,
    on_commit: Callable[[CommitRecord], object] | None = None,
) -> TopicResult | None:
    """Bring ``obj``'s silver table up to date with its polls (``None``: never polled)."""
    started = clock()
    bronze = polled_table(obj)
    silver = silver_table(obj)
    if not engine.exists(bronze):
        _log.info("silver: %s has no polled table %s yet; nothing to do", obj.api_name, bronze)
        return None
    after = engine.txn_version(silver, app_id(obj))
    current = engine.version(bronze)
    assert current is not None

    def result(
        reached: int | None = after,
        *,
        rows: int = 0,
        quarantined: int = 0,
        commits: int = 0,
        silver_version: int | None = None,
    ) -> TopicResult:
        done = ObjectResult(
            obj.api_name,
            silver,
            bronze,
            after,
            reached,
            events=rows + quarantined,
            rows=rows,
            commits=commits,
            silver_version=silver_version,
            duration_s=clock() - started,
        )
        return TopicResult(
            obj.topic, bronze, after, reached, rows + quarantined, quarantined, (done,)
        )

    if after is not None and after >= current:
        _log.info("silver: %s is up to date with %s v%s", silver, bronze, current)
        return result()
    changes = engine.read_appends(
        bronze, after_version=after, until_version=current, columns=list(BRONZE_COLUMNS)
    )
    if changes.full_read:
        _log.warning(
            "silver: %s could not be read incrementally; taking all of it up to version %d "
            "(records gold has applied are recognised there)",
            bronze,
            current,
        )
    found = polled_layout(engine, obj)
    if found is None or changes.start_version is None:
        return result()
    layout, infos = found
    at = now()
    rows = engine.persist(changes.rows)
    held = [rows]
    try:
        decoded = engine.persist(
            engine.map_batches(rows, PolledRows(layout, infos), decoded_schema(layout))
        )
        held.append(decoded)
        bad = engine.persist(
            engine.map_batches(
                decoded,
                QuarantinePart(
                    bronze_table=bronze.name, topic=obj.topic, at=at, entity=obj.api_name
                ),
                QUARANTINE_SCHEMA,
            )
        )
        held.append(bad)
        quarantined = engine.count(bad)
        if quarantined:
            engine.ensure_table(QUARANTINE_TABLE, QUARANTINE_SCHEMA)
            engine.append(
                QUARANTINE_TABLE,
                bad,
                txn=Txn(f"{QUARANTINE_APP_PREFIX}{obj.api_name}", current),
                metadata={"sfcdc.silver.object": obj.api_name},
            )
        schema = layout.silver_schema()
        good = engine.persist(engine.map_batches(decoded, SilverPart(schema.names), schema))
        held.append(good)
        engine.ensure_table(silver, schema)
        newest = newest_time(engine, good, _COMMIT_TIME) if on_commit is not None else None
        written = engine.append(
            silver,
            good,
            txn=Txn(app_id(obj), current),
            metadata={"sfcdc.silver.bronze_versions": f"{changes.start_version}-{current}"},
        )
        if not written.skipped:
            maintain_on_schedule(engine, silver, written.version, maintain_every)
        if on_commit is not None and not written.skipped:
            on_commit(
                CommitRecord(
                    layer="silver",
                    kind="commit",
                    visible_at=now(),
                    topic=obj.topic,
                    object=obj.api_name,
                    table=str(silver),
                    version=written.version,
                    events=written.rows + quarantined,
                    rows=written.rows,
                    quarantined=quarantined,
                    newest_commit_at=newest,
                )
            )
    finally:
        for kept in held:
            engine.release(kept)
    rows_written = 0 if written.skipped else written.rows
    _log.info(
        "silver: %s <- %s versions %s..%s: %d polled records, %d quarantined",
        silver,
        bronze,
        changes.start_version,
        current,
        rows_written,
        quarantined,
    )
    return result(
        current,
        rows=rows_written,
        quarantined=quarantined,
        commits=0 if written.skipped else 1,
        silver_version=written.version,
    )
