"""The commit side of bronze landing: what the committer thread does with the batches the
consuming thread seals (:class:`~pipelines.bronze.landing.BronzeLanding`), and the maintenance
thread beside it.

:class:`~pipelines.bronze.commit_thread.CommitThread` takes sealed batches in rounds (the
oldest waiting batch of each topic) and :class:`BatchCommitter` lands each round: it builds the
Arrow columns, registers new schema ids, and commits bronze, then the checkpoint, then
(ManagedSubscribe) the server position, topic after topic in hand-over order (the protocol,
and why a kill at any instant neither loses nor duplicates an event, are in
:mod:`pipelines.bronze.checkpoint`). It logs one INFO line per landing commit (topic, batch,
events, bytes, replay id, duration).

Lag. Each events batch records its newest commit time (a change event batch: its last
event's, commit order being stream order; a platform event batch: the latest ``CreatedDate``
of all its events; decoded in the committer thread), and a keepalive whose position is
committed marks the topic caught up at the keepalive's time. Both go to the ``ops`` recorder
(the commits table, :mod:`pipelines.ops`), one record per commit, and into the snapshots with
the stream's flow-control figures; the recorder's rows are written beside the commits, by the
maintenance thread. Every ``ingest.maintain_every_commits`` commits a bronze table
(and the checkpoint table) is compacted and its Delta log checkpointed by :class:`Maintainer`,
on a thread of its own, so the commits never wait for it.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from ingest.client import ManagedSubscription, SchemaCache
from ingest.decoding import event_time_ms
from ingest.errors import CheckpointError, PermanentError
from ingest.replay import After, StartPosition
from pipelines.bronze.batches import OpenBatch, SealedBatch, bronze_rows
from pipelines.bronze.checkpoint import CheckpointRow, CheckpointStore, describe_position
from pipelines.bronze.landing_state import TopicState
from pipelines.bronze.tables import BRONZE_LAYOUT, CheckpointKind, bronze_app_id
from pipelines.engines.base import CommitResult, TableRef, Txn
from pipelines.ops.table import CommitRecord, utc

if TYPE_CHECKING:
    from pipelines.engines.base import LakeEngine
    from pipelines.ops.recorder import OpsRecorder
    from pipelines.progress import Progress

__all__ = ["BatchCommitter", "Maintainer"]

_REMEMBERED_POSITIONS = 10_000


class Maintainer:
    """Runs table maintenance (compaction, a log checkpoint) on a thread of its own, one table at
    a time, so a round's commits never wait for it: landing's commits follow a version that
    maintenance took meanwhile (see :class:`~pipelines.bronze.files.LocalBronzeWriter`). A table
    asked for while it waits is maintained once. A failure is logged and leaves the table as it
    was, only slower to read; the next request tries again. :meth:`close` lets the maintenance
    under way and the waiting ones finish (as when maintenance ran between commits), then
    ignores further requests. The same thread writes the commit records (:meth:`request_call`),
    which must not wait in the committer either."""

    def __init__(self, maintain: Callable[[TableRef], object], *, logger: logging.Logger) -> None:
        self._maintain = maintain
        self._log = logger
        self._cond = threading.Condition()
        self._waiting: list[tuple[object, Callable[[], object]]] = []
        self._closing = False
        self._thread: threading.Thread | None = None

    def request(self, table: TableRef) -> None:
        self.request_call(table, functools.partial(self._maintain, table))

    def request_call(self, key: object, call: Callable[[], object]) -> None:
        """Run ``call`` on the thread (once, however often ``key`` is asked for meanwhile)."""
        with self._cond:
            if self._closing:
                return
            if all(k != key for k, _ in self._waiting):
                self._waiting.append((key, call))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="sfcdc-maintainer", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closing:
                    self._cond.wait()
                if not self._waiting:
                    return
                key, call = self._waiting.pop(0)
            try:
                call()
            except Exception as exc:  # maintenance must not stop landing
                self._log.error("maintenance of %s failed (landing goes on): %s", key, exc)


class BatchCommitter:
    """Lands the rounds :class:`~pipelines.bronze.commit_thread.CommitThread` takes
    (:meth:`commit`, in the committer thread)
    through ``engine`` and ``store``: bronze rows, schemas (fetched through ``schemas``) and
    checkpoint rows; then it updates the topic's committed state in ``topics`` under ``lock``
    (both shared with the consuming thread), commits ManagedSubscribe positions, logs the
    commit, records it with ``ops``, advances ``bar`` and asks ``maintainer`` for maintenance
    every ``maintain_every`` commits of a table (0: never; ``checkpoints`` is the checkpoint
    table). ``clock`` (epoch seconds) stamps the records; ``monotonic`` times the commits.
    """

    def __init__(
        self,
        engine: LakeEngine,
        store: CheckpointStore,
        schemas: SchemaCache,
        *,
        topics: Mapping[str, TopicState],
        lock: threading.Lock,
        checkpoints: TableRef,
        maintainer: Maintainer,
        maintain_every: int,
        ops: OpsRecorder | None,
        logger: logging.Logger,
        clock: Callable[[], float],
        monotonic: Callable[[], float],
    ) -> None:
        self._engine = engine
        self._store = store
        self._schemas = schemas
        self._topics = topics
        self._lock = lock
        self._checkpoints = checkpoints
        self._maintainer = maintainer
        self._maintain_every = maintain_every
        self._ops = ops
        self._log = logger
        self._clock = clock
        self._monotonic = monotonic
        # Set while a run shows a progress bar (the consuming thread sets and clears it).
        self.bar: Progress | None = None
        self._known_schemas: set[str] = set()
        # Schema ids GetSchema refused in this run (asked again by the next run).
        self._unavailable_schemas: set[str] = set()
        self._checkpoint_commits = 0

    @staticmethod
    def stream(sealed: SealedBatch) -> str:
        """The stream of a batch, for the committer thread's rounds: its topic."""
        return sealed.topic

    @staticmethod
    def describe(round_: list[SealedBatch]) -> str:
        """What a round commits, as the committer thread's failure line says it."""
        return "committing " + ", ".join(f"{s.topic} batch {s.batch_id}" for s in round_)

    def load_schemas(self) -> None:
        """Read the schema ids already registered (before the first commit)."""
        self._known_schemas = self._store.registered_schemas()

    def commit(self, round_: list[SealedBatch]) -> None:
        """Land a round (at most one batch per topic): each batch's schemas and events (steps
        0 and 1 of the protocol, topic by topic), then every batch's checkpoint row in one
        commit (step 2), then the ManagedSubscribe commits (step 3). Each topic's protocol is
        unchanged; the rows of a round share a commit so that a landing of many topics makes
        one checkpoint commit per round instead of one per batch."""
        started = self._monotonic()
        landed = [self._land_events(sealed) for sealed in round_]
        rows = [
            self._checkpoint_row(sealed, version)
            for sealed, (version, _) in zip(round_, landed, strict=True)
        ]
        results = self._store.write_all(rows)
        seconds = self._monotonic() - started
        for sealed, (version, new_schemas) in zip(round_, landed, strict=True):
            self._committed(sealed, new_schemas, seconds, version)
        self._maintain_checkpoints(len({r.version for r in results}))

    def _land_events(self, sealed: SealedBatch) -> tuple[int | None, list[str]]:
        """Steps 0 and 1 for an events batch: (bronze version, schema ids registered)."""
        if sealed.kind != "events":
            return None, []
        t = self._topics[sealed.topic]
        batch = sealed.batch
        unseen = set(batch.schema_ids) - self._known_schemas - self._unavailable_schemas
        fetched = {}
        for sid in sorted(unseen):
            text = self._fetch_schema(sealed.topic, sid)
            if text is not None:
                fetched[sid] = text
        new_schemas = sorted(fetched)
        if new_schemas:
            self._store.register_schemas(sealed.topic, fetched)
            self._known_schemas.update(new_schemas)
        # Before the columns are built (that releases the batch's lists).
        sealed.newest_ms = self._newest_ms(batch, every=t.spec.kind.startswith("platform_event"))
        result = self._append(t.table, sealed)
        if result.skipped:
            raise CheckpointError(
                f"{sealed.topic}: bronze batch {sealed.batch_id} was already committed by "
                f"another writer; two landings of the same topic into {t.table} cannot run "
                "at once"
            )
        return result.version, new_schemas

    def _fetch_schema(self, topic: str, schema_id: str) -> str | None:
        """The schema's JSON, or None when the server refuses it for good (unknown id, no
        permission): the events still land, and the refusal is recorded for silver, which
        quarantines them with the server's message until the schema can be fetched."""
        try:
            return self._schemas.schema_json(schema_id)
        except PermanentError as exc:
            self._log.error(
                "%s: GetSchema %s failed (%s); its events land in bronze all the same and "
                "silver quarantines them as schema_unavailable until `sfcdc silver "
                "--retry-quarantine` can fetch it",
                topic,
                schema_id,
                exc,
            )
            self._store.record_schema_failure(
                topic,
                schema_id,
                status=exc.status or "UNKNOWN",
                error_code=exc.error_code,
                error=str(exc),
            )
            self._unavailable_schemas.add(schema_id)
            return None

    def _checkpoint_row(self, sealed: SealedBatch, bronze_version: int | None) -> CheckpointRow:
        t = self._topics[sealed.topic]
        with self._lock:
            if t.managed:
                t.note_acks()
            acked = t.acked_batch if t.managed else None
        gap = sealed.gap
        return CheckpointRow(
            topic=sealed.topic,
            batch_id=sealed.batch_id,
            kind=sealed.kind,
            replay_id=sealed.position,
            event_count=len(sealed.batch.replay_ids),
            payload_bytes=sealed.batch.nbytes,
            bronze_version=bronze_version,
            gap_requested=describe_position(gap.requested) if gap else None,
            gap_resumed=gap.resumed.kind if gap else None,
            detail=gap.reason if gap else None,
            server_acked_batch_id=acked,
        )

    def _committed(
        self, sealed: SealedBatch, new_schemas: list[str], seconds: float, version: int | None
    ) -> None:
        """After the checkpoint commit: the topic's durable position and counters, step 3,
        the commit's log line and record, and maintenance."""
        t = self._topics[sealed.topic]
        batch = sealed.batch
        count = len(batch.replay_ids)
        gap = sealed.gap
        position: StartPosition
        if gap is not None:
            position = gap.resumed
        else:
            assert sealed.position is not None
            position = After(sealed.position)
        with self._lock:
            t.position = position
            t.commits += 1
            t.events += count
            t.payload_bytes += batch.nbytes
            t.keepalive_commits += sealed.kind == "keepalive"
            t.gaps += sealed.kind == "replay_gap"
            if sealed.position is not None:
                t.last_replay_id = sealed.position
            if t.managed and sealed.position is not None:
                t.positions[sealed.position.value] = sealed.batch_id
                if len(t.positions) > _REMEMBERED_POSITIONS:
                    t.positions.popitem(last=False)
            if sealed.newest_ms is not None:
                t.newest_ms = max(t.newest_ms or sealed.newest_ms, sealed.newest_ms)
        if isinstance(t.sub, ManagedSubscription) and sealed.position is not None:
            t.sub.commit(sealed.position)
        self._log_commit(sealed, count, batch.nbytes, new_schemas, seconds)
        if sealed.kind == "events":
            t.durations.observe(seconds)
            if self.bar is not None:
                self.bar.advance(count)
        self._record(
            t, sealed=sealed, count=count, nbytes=batch.nbytes, seconds=seconds, version=version
        )
        self.caught_up(t)
        self._maintain(t, sealed.kind)

    def _newest_ms(self, batch: OpenBatch, *, every: bool) -> int | None:
        """The newest commit time of the batch: its last event's (change events arrive in
        commit order), or, with ``every`` (platform events, whose ``CreatedDate`` the
        publisher sets and which one publish call may not order), the latest of all."""
        if not batch.payloads:
            return None
        indexes = range(len(batch.payloads)) if every else (len(batch.payloads) - 1,)
        newest: int | None = None
        for i in indexes:
            try:
                schema = self._schemas.schema(batch.schema_ids[i])
            except Exception as exc:  # measuring lag must never fail a commit
                self._log.debug("no commit time for the batch: %s", exc)
                return newest
            found = event_time_ms(schema, batch.payloads[i])
            if found is not None and (newest is None or found > newest):
                newest = found
        return newest

    def _record(
        self,
        t: TopicState,
        *,
        sealed: SealedBatch,
        count: int,
        nbytes: int,
        seconds: float,
        version: int | None,
    ) -> None:
        if self._ops is None or sealed.kind == "keepalive":
            return
        gap = sealed.gap
        self._ops.record(
            CommitRecord(
                layer="bronze",
                kind="commit" if sealed.kind == "events" else "replay_gap",
                visible_at=datetime.fromtimestamp(self._clock(), tz=timezone.utc),
                topic=t.spec.topic,
                table=str(t.table),
                version=version,
                events=count,
                rows=count,
                payload_bytes=nbytes,
                newest_commit_at=utc(sealed.newest_ms / 1000) if sealed.newest_ms else None,
                duration_seconds=seconds,
                message=(
                    f"replay gap: {describe_position(gap.requested)} -> {gap.resumed.kind} "
                    f"({gap.reason})"
                    if gap is not None
                    else None
                ),
            )
        )

    def caught_up(self, t: TopicState) -> None:
        """Record the topic caught up once the position of its last keepalive is committed:
        at the keepalive's time nothing was pending beyond it."""
        with self._lock:
            mark = t.idle_mark
            last = t.last_replay_id
            if mark is None or last is None or last.value != mark[1]:
                return
            t.idle_mark = None
            t.caught_up_at = mark[0]
        if self._ops is not None:
            self._ops.record(
                CommitRecord(
                    layer="bronze",
                    kind="caught_up",
                    visible_at=datetime.fromtimestamp(mark[0], tz=timezone.utc),
                    topic=t.spec.topic,
                    table=str(t.table),
                )
            )

    def _append(self, table: TableRef, sealed: SealedBatch) -> CommitResult:
        rows = bronze_rows(sealed)
        txn = Txn(bronze_app_id(sealed.topic), sealed.batch_id)
        metadata = {"sfcdc.topic": sealed.topic, "sfcdc.kind": "events"}
        return self._engine.append(
            table, rows, txn=txn, metadata=metadata, evolve_schema=False, layout=BRONZE_LAYOUT
        )

    def _log_commit(
        self, sealed: SealedBatch, count: int, nbytes: int, new_schemas: list[str], seconds: float
    ) -> None:
        if sealed.kind == "events":
            assert sealed.position is not None
            self._log.info(
                "landed %s batch %d: %d events, %.2f MB, replay id %s, %.3f s%s",
                sealed.topic,
                sealed.batch_id,
                count,
                nbytes / 1e6,
                sealed.position.hex(),
                seconds,
                f", new schemas {', '.join(new_schemas)}" if new_schemas else "",
            )
        elif sealed.kind == "keepalive":
            assert sealed.position is not None
            self._log.info(
                "landed %s batch %d: keepalive, replay id %s, %.3f s",
                sealed.topic,
                sealed.batch_id,
                sealed.position.hex(),
                seconds,
            )
        else:
            assert sealed.gap is not None
            self._log.info(
                "landed %s batch %d: replay gap recorded (%s -> %s), %.3f s",
                sealed.topic,
                sealed.batch_id,
                describe_position(sealed.gap.requested),
                sealed.gap.resumed.kind,
                seconds,
            )

    def _maintain(self, t: TopicState, kind: CheckpointKind) -> None:
        every = self._maintain_every
        if every <= 0 or kind != "events":
            return
        t.since_maintenance += 1
        if t.since_maintenance >= every:
            t.since_maintenance = 0
            self._run_maintenance(t.table)

    def _maintain_checkpoints(self, commits: int) -> None:
        every = self._maintain_every
        if every <= 0:
            return
        self._checkpoint_commits += commits
        if self._checkpoint_commits >= every:
            self._checkpoint_commits = 0
            self._run_maintenance(self._checkpoints)

    def _run_maintenance(self, table: TableRef) -> None:
        self._maintainer.request(table)
