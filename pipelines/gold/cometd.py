"""Gold of the Streaming API source: a PushTopic's (or a change event channel's) silver rows
MERGEd by ``Id`` into a current-state table, with the gold job's own fold.

A PushTopic notification is mapped by silver to the change it is equivalent to
(:mod:`pipelines.silver.cometd`): ``created`` / ``undeleted`` to a CREATE / UNDELETE (a
full image of the query's fields), ``updated`` to an UPDATE whose changed fields are every
field the notification carries (a PushTopic sends their full current values, so exactly
those are set and any other column is left as it was), ``deleted`` to a DELETE (the row is
flagged or removed as ``gold.deletes`` says). So the fold, the MERGE guarded by the order key,
tombstones, SCD2 history and the re-sync table are those of :mod:`pipelines.gold.job`,
run through :func:`~pipelines.gold.job.run_gold_object` with the layout built from the
channel's stored describes.

Order. Notifications of a channel are not guaranteed to arrive in order; a PushTopic's are
ordered by replay id (``_cdc_replay_number``, increasing per channel), then by stream order, so
an older notification never overwrites a newer one (the gold row keeps the key of the last
change applied, ``_cdc_order_key``). A change event channel orders by its header (commit time,
commit number, transaction, sequence), as the Pub/Sub gold does.

Replay gaps of the channel (``replay_gap`` checkpoint rows) become whole-object re-sync rows,
under the object name ``streaming:<channel>``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

from pipelines.bookkeeping import ensure_bookkeeping
from pipelines.bronze.cometd_setup import read_describes
from pipelines.engines.base import LakeEngine, TableRef
from pipelines.gold.job import CHECKPOINT_TABLE, GoldResult, run_gold_object
from pipelines.gold.object_run import ObjectResult
from pipelines.gold.resync import RESYNC_TABLE, replay_gap_rows
from pipelines.gold.tables import BOOKKEEPING
from pipelines.ops.table import CommitRecord
from pipelines.silver.cometd_job import cometd_plan, select_streams
from pipelines.spec.cometd import CometdObjectSpec
from pipelines.spec.conf import Conf
from pipelines.spec.models import ObjectSpec, TablesSpec
from pipelines.spec.sections import DEFAULT_SEQUENCE_BY, GoldSpec

__all__ = ["PUSHTOPIC_SEQUENCE_BY", "gold_object", "run_cometd_gold", "stream_replay_gaps"]

_log = logging.getLogger(__name__)

# The order of a PushTopic's notifications: replay id (the stream order follows as the
# final tie-break).
PUSHTOPIC_SEQUENCE_BY: tuple[str, ...] = ("_cdc_replay_number",)


def gold_object(spec: CometdObjectSpec) -> ObjectSpec:
    """The gold job's view of a channel: an object named ``streaming:<channel>`` (the name
    of its app transactions and re-sync rows) with the channel's tables and gold settings."""
    sequence = PUSHTOPIC_SEQUENCE_BY if spec.channel_kind == "pushtopic" else DEFAULT_SEQUENCE_BY
    return ObjectSpec(
        api_name=spec.key,
        kind="change_events",
        topic=spec.key,
        enabled=spec.enabled,
        silver=spec.silver,
        gold=GoldSpec(
            deletes=spec.gold.deletes,
            sequence_by=sequence,
            scd2=spec.gold.scd2,
            max_rows_per_commit=spec.gold.max_rows_per_commit,
        ),
        tables=TablesSpec(
            bronze=spec.tables.bronze, silver=spec.tables.silver, gold=spec.tables.gold
        ),
    )


def stream_replay_gaps(
    engine: LakeEngine,
    specs: Sequence[CometdObjectSpec],
    at: datetime,
    *,
    checkpoint_table: TableRef = CHECKPOINT_TABLE,
) -> list[dict[str, Any]]:
    """Re-sync rows for the channels' replay gaps that the re-sync table does not hold."""
    keys = sorted(s.key for s in specs)
    if not keys or not engine.exists(checkpoint_table):
        return []
    gaps = engine.read_arrow(
        checkpoint_table, where=[("kind", "=", "replay_gap"), ("topic", "in", keys)]
    ).to_pylist()
    rows = replay_gap_rows(gaps, objects={k: [k] for k in keys}, detected_at=at)
    if not rows or not engine.exists(RESYNC_TABLE):
        return rows
    known = set(
        engine.read_arrow(
            RESYNC_TABLE, columns=["resync_id"], where=[("reason", "=", "replay_gap")]
        )
        .column("resync_id")
        .to_pylist()
    )
    return [r for r in rows if r["resync_id"] not in known]


def run_cometd_gold(
    engine: LakeEngine,
    conf: Conf,
    *,
    streams: Sequence[str] | None = None,
    partitions: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    on_commit: Callable[[CommitRecord], object] | None = None,
) -> GoldResult:
    """Bring the gold tables of the PushTopic and change event channels up to date with
    silver; generic and platform event channels have no gold. ``on_commit`` receives a
    commit record per gold MERGE (the commits table)."""
    chosen = select_streams(conf, streams)
    ensure_bookkeeping(engine, BOOKKEEPING, logger=_log)
    records = [s for s in chosen if s.has_gold]
    events = tuple(s.key for s in chosen if not s.has_gold)
    at = now()
    gaps = stream_replay_gaps(engine, records, at)
    registry = read_describes(engine) if records else {}
    results: list[ObjectResult] = []
    for spec in records:
        plan = cometd_plan(spec, registry.get(spec.key, []))
        if plan.layout is None:
            _log.info("gold: %s has no stored describe yet; nothing to do", spec.channel)
            continue
        result = run_gold_object(
            engine,
            gold_object(spec),
            layout=plan.layout,
            replay_gaps=[g for g in gaps if g["object"] == spec.key],
            partitions=partitions,
            clock=clock,
            processed_at=at,
            on_commit=on_commit,
        )
        if result is not None:
            results.append(result)
    return GoldResult(tuple(results), len(gaps), events)
