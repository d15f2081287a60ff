"""The gold job: new silver rows -> current-state gold tables, through the engine's MERGE.

For every configured change event object (and polled object, whose silver rows are full
records read by its polls, :mod:`pipelines.polled`), :func:`run_gold`

1. finds how far the gold table got: the version of its Delta app transaction
   ``sfcdc.gold:<object>`` is the last silver version it applied;
2. reads only the silver rows appended after that version (``engine.read_appends``), as many
   silver versions at a time as ``gold.max_rows_per_commit`` allows (sizes from silver's
   history, planned by :mod:`pipelines.chunking` as the silver job plans its steps; one
   version is never split), so a backlog is folded in several steps whose memory follows that
   setting, not the backlog; and, from the gold table (and the tombstone table, with hard
   deletes), the rows of the records a step touches (every row when the step has a wildcard
   change);
3. folds them (:func:`fold_rows`): one complete row per record, computed by the pure
   functions of :mod:`pipelines.gold.folding` wherever the engine runs them (in this process
   for the local engine, on executors for the spark engine);
4. writes, in this order: the re-sync table (new rows, and rows a full image resolved), the
   tombstones (hard deletes), the SCD2 history, and last the gold table with
   ``engine.merge(on=["Id"], update_condition=<newer order key>,
   delete_condition=<hard delete>)`` under the txn ``(sfcdc.gold:<object>, silver version)``,
   the last silver version of the step; then the next step starts from there.

Exactly once. Each step is complete on its own, and its gold MERGE is last and records the
silver version it reached: a run that dies before it leaves the step's range unapplied, and
the next run folds it again (steps committed before it stay done). That is safe because every
write is idempotent: the re-sync table is keyed by a stable id, the tombstone and history
MERGEs carry their own txns (the step's silver version), and the fold ignores any change a
record already reflects (order keys) while a tombstone newer than its gold row wins. Steps
fold a backlog as successive runs would have folded it as it arrived: the same tables as one
step whenever silver's versions hold the changes in their order (a change delivered a version
after a newer change of its record is ignored by a later step, as by a later run). A retried
run with nothing new in silver reads nothing and writes nothing.

Replay gaps (``replay_gap`` rows of the bronze checkpoint table: events lost because a
rejected replay id was skipped by policy) are recorded in the re-sync table as whole-object
re-syncs of every object on the topic.

Each gold MERGE (one per step) is reported to ``on_commit`` (the commits table,
:mod:`pipelines.ops`) with the newest Salesforce commit time among the changes it folded; a
run's :class:`ObjectResult` sums its steps, and a run reports its progress
(:mod:`pipelines.progress`) in objects.

One gold run per lake at a time: runs do not coordinate with each other.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ingest.errors import ConfigError
from pipelines.bookkeeping import ensure_bookkeeping
from pipelines.engines.base import LakeEngine, TableRef
from pipelines.gold.dataflow import batch_wildcards, fold_rows, history_changes
from pipelines.gold.object_run import (
    RESYNC_COMPACT_EVERY,
    ObjectResult,
    ObjectRun,
    tombstone_condition,
)
from pipelines.gold.resync import RESYNC_TABLE, replay_gap_rows
from pipelines.gold.tables import (
    BOOKKEEPING,
    FORMULA_TABLE,
    GOLD_APP_PREFIX,
    HISTORY_APP_PREFIX,
    RECONCILE_TABLE,
    TOMBSTONE_APP_PREFIX,
    app_id,
    conflict_error,
    gold_table,
    history_table,
    tombstone_table,
)
from pipelines.ops.table import CommitRecord
from pipelines.polled.layout import polled_layout
from pipelines.progress import progress
from pipelines.silver.columns import SilverLayout
from pipelines.silver.registry import REGISTRY_TABLE, read_registry
from pipelines.spec.conf import Conf
from pipelines.spec.models import ObjectSpec

__all__ = [
    "CHECKPOINT_TABLE",
    "GOLD_APP_PREFIX",
    "HISTORY_APP_PREFIX",
    "RESYNC_COMPACT_EVERY",
    "TOMBSTONE_APP_PREFIX",
    "GoldResult",
    "ObjectResult",
    "app_id",
    "batch_wildcards",
    "conflict_error",
    "fold_rows",
    "gold_table",
    "history_changes",
    "history_table",
    "run_gold",
    "run_gold_object",
    "tombstone_condition",
    "tombstone_table",
]

_log = logging.getLogger(__name__)

CHECKPOINT_TABLE = TableRef("bronze", "sfcdc_checkpoints")


@dataclass(frozen=True)
class GoldResult:
    """What :func:`run_gold` did, per object; ``replay_gaps`` counts the whole-object
    re-sync rows recorded for replay gaps in this run."""

    objects: tuple[ObjectResult, ...]
    replay_gaps: int = 0
    not_applicable: tuple[str, ...] = ()


def _select(conf: Conf, names: Sequence[str] | None) -> tuple[list[ObjectSpec], list[str]]:
    by_name = {o.api_name: o for o in conf.objects}
    problems = []
    for name in names or ():
        obj = by_name.get(name)
        if obj is None:
            known = ", ".join(o.api_name for o in conf.objects) or "none"
            problems.append(
                f"--objects: no object {name!r} in {conf.conf_dir} (configured: {known})"
            )
        elif not obj.enabled:
            problems.append(f"--objects: {name} is disabled (enabled: false in its file)")
    if problems:
        raise ConfigError("cannot select the objects to process", problems)
    wanted = set(names or ())
    chosen = [o for o in conf.enabled_objects() if not wanted or o.api_name in wanted]
    # A platform event is an immutable event, not a record with a current state.
    events = [o.api_name for o in chosen if o.kind == "platform_event"]
    reserved = {RESYNC_TABLE.name, RECONCILE_TABLE.name, FORMULA_TABLE.name}
    clashes = [o.api_name for o in chosen if o.tables.gold in reserved]
    if clashes:
        raise ConfigError(
            f"gold table names {', '.join(sorted(map(repr, reserved)))} are reserved for "
            "sfcdc's own tables (re-sync, reconcile, formula refresh)",
            [f"{name}: set tables.gold to another name" for name in clashes],
        )
    return [o for o in chosen if o.kind in ("change_events", "polled")], events


def run_gold(
    engine: LakeEngine,
    conf: Conf,
    *,
    objects: Sequence[str] | None = None,
    registry_table: TableRef = REGISTRY_TABLE,
    checkpoint_table: TableRef = CHECKPOINT_TABLE,
    partitions: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
    now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
    on_commit: Callable[[CommitRecord], object] | None = None,
) -> GoldResult:
    """Bring the gold tables of ``objects`` (default: every enabled change event object) up
    to date with silver. See the module docstring for the protocol. ``partitions`` is the
    fold's parallelism (default: the session's shuffle partitions); ``clock`` times the work
    and ``now`` stamps ``_cdc_updated_at`` and re-sync rows (one value per run) and the
    records ``on_commit`` receives, one per gold MERGE."""
    selected, events = _select(conf, objects)
    ensure_bookkeeping(engine, BOOKKEEPING, logger=_log)
    if events:
        _log.info("gold: platform events have no current-state table: %s", ", ".join(events))
    processed_at = now()
    registry: Mapping[str, Any] | None = None
    results = []
    gaps = _replay_gaps(engine, conf, selected, checkpoint_table, processed_at)
    with progress(total=len(selected), unit="objects", label="gold") as bar:
        for obj in selected:
            silver = TableRef("silver", obj.tables.silver)
            if not engine.exists(silver):
                _log.info(
                    "gold: %s has no silver table %s yet; nothing to do", obj.api_name, silver
                )
                bar.advance()
                continue
            if registry is None:
                registry = read_registry(engine, registry_table)
            layout = None
            if obj.kind == "polled":
                # Its columns come from the describes its polls stored, not from event schemas.
                found = polled_layout(engine, obj)
                if found is None:
                    bar.advance()
                    continue
                layout = found[0]
            runner = ObjectRun(
                engine,
                obj,
                silver,
                registry=registry,
                processed_at=processed_at,
                partitions=partitions,
                replay_gaps=[g for g in gaps if g["object"] == obj.api_name],
                clock=clock,
                now=now,
                on_commit=on_commit,
                layout=layout,
            )
            results.append(runner.run())
            bar.advance()
    return GoldResult(tuple(results), len(gaps), tuple(events))


def run_gold_object(
    engine: LakeEngine,
    obj: ObjectSpec,
    *,
    layout: SilverLayout,
    replay_gaps: Sequence[Mapping[str, Any]] = (),
    partitions: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
    processed_at: datetime | None = None,
    on_commit: Callable[[CommitRecord], object] | None = None,
) -> ObjectResult | None:
    """Bring one object's gold table up to date with its silver table (``obj.tables``),
    folding with ``layout`` instead of a layout built from the schema registry: for a source
    whose columns come from elsewhere (the Streaming API's describes). ``replay_gaps`` are
    re-sync rows to record (as :func:`~pipelines.gold.resync.replay_gap_rows` makes them, not
    yet in the re-sync table). ``on_commit`` receives the MERGE's commit record. ``None`` when
    the silver table does not exist yet."""
    silver = TableRef("silver", obj.tables.silver)
    if not engine.exists(silver):
        return None
    runner = ObjectRun(
        engine,
        obj,
        silver,
        registry={},
        processed_at=processed_at or datetime.now(timezone.utc),
        partitions=partitions,
        replay_gaps=list(map(dict, replay_gaps)),
        clock=clock,
        layout=layout,
        on_commit=on_commit,
    )
    return runner.run()


def _replay_gaps(
    engine: LakeEngine,
    conf: Conf,
    objs: Sequence[ObjectSpec],
    checkpoint_table: TableRef,
    at: datetime,
) -> list[dict[str, Any]]:
    """Re-sync rows for replay gaps not yet recorded."""
    if not objs or not engine.exists(checkpoint_table):
        return []
    topics: dict[str, list[str]] = {}
    for obj in objs:
        topics.setdefault(obj.topic, []).append(obj.api_name)
    # Every pass asks, and the checkpoint table grows with every landing batch: a filtered
    # Arrow read skips the files whose statistics rule gaps out, and needs no Spark job.
    gap_rows = engine.read_arrow(
        checkpoint_table,
        where=[("kind", "=", "replay_gap"), ("topic", "in", sorted(topics))],
    ).to_pylist()
    rows = replay_gap_rows(gap_rows, objects=topics, detected_at=at)
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
