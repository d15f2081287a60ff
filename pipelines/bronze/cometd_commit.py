"""The commit side of the Streaming API landing: what the committer thread does with the
batches the consuming thread seals (:class:`~pipelines.bronze.cometd.CometdLanding`).

:class:`~pipelines.bronze.commit_thread.CommitThread` takes sealed batches in rounds (at most
one batch per channel, so each channel's batches stay in order) and :class:`CometdCommitter`
lands each round with the protocol of :mod:`pipelines.bronze.cometd_checkpoints`: each batch's
rows into its channel's bronze table, then every batch's checkpoint row in one commit. It then
updates the channel's committed state (under the landing's state lock), logs one INFO line per
batch, records each commit (and a channel caught up) with the ``ops`` recorder, and maintains a
bronze table every ``ingest.maintain_every_commits`` commits.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from ingest.errors import CheckpointError
from ingest.replay import ReplayId
from pipelines.bronze.checkpoint import CheckpointRow, CheckpointStore
from pipelines.bronze.cometd_batches import (
    CometdSealedBatch,
    cometd_rows,
    newest_created,
    shown_position,
)
from pipelines.bronze.cometd_checkpoints import REPLAY_ALL
from pipelines.bronze.cometd_state import StreamState
from pipelines.bronze.cometd_tables import COMETD_BRONZE_LAYOUT, replay_bytes
from pipelines.bronze.tables import bronze_app_id
from pipelines.engines.base import Txn
from pipelines.ops.table import CommitRecord

if TYPE_CHECKING:
    from pipelines.engines.base import LakeEngine
    from pipelines.ops.recorder import OpsRecorder

__all__ = ["CometdCommitter"]


class CometdCommitter:
    """Lands the rounds :class:`~pipelines.bronze.commit_thread.CommitThread` takes
    (:meth:`commit`, in the committer thread) through ``engine`` and ``store`` (the
    checkpoint table): bronze rows, then the checkpoint rows; then it updates the channel's
    committed state in ``streams`` (keyed by channel key) under ``lock`` (both shared with the
    consuming thread), logs the commit with ``logger``, records it with ``ops`` (flushed when
    due) and maintains a bronze table every ``maintain_every`` commits of it (0: never).
    ``clock`` (epoch seconds) stamps the records; ``monotonic`` times the commits.
    """

    def __init__(
        self,
        engine: LakeEngine,
        store: CheckpointStore,
        *,
        streams: Mapping[str, StreamState],
        lock: threading.Lock,
        maintain_every: int,
        ops: OpsRecorder | None,
        logger: logging.Logger,
        clock: Callable[[], float],
        monotonic: Callable[[], float],
    ) -> None:
        self._engine = engine
        self._store = store
        self._streams = streams
        self._state_lock = lock
        self._maintain_every = maintain_every
        self._ops = ops
        self._log = logger
        self._clock = clock
        self._monotonic = monotonic

    @staticmethod
    def stream(sealed: CometdSealedBatch) -> str:
        """The stream of a batch, for the committer thread's rounds: its channel key."""
        return sealed.key

    @staticmethod
    def describe(round_: list[CometdSealedBatch]) -> str:
        """What a round commits, as the committer thread's failure line says it."""
        return f"streaming: committing {[s.key for s in round_]}"

    def commit(self, round_: list[CometdSealedBatch]) -> None:
        """Land a round (at most one batch per channel): each batch's rows, then every batch's
        checkpoint row in one commit."""
        started = self._monotonic()
        versions = [self._land(sealed) for sealed in round_]
        rows = [self._row(s, v) for s, v in zip(round_, versions, strict=True)]
        self._store.write_all(rows)
        seconds = self._monotonic() - started
        for sealed, version in zip(round_, versions, strict=True):
            self._committed(sealed, seconds)
            self._record(sealed, version, seconds)
        if self._ops is not None and self._ops.due():
            self._ops.flush()

    def record_caught_up(self, stream: StreamState, at: float) -> None:
        """Record with ``ops`` that ``stream`` was caught up at ``at`` (epoch seconds)."""
        if self._ops is not None:
            self._ops.record(
                CommitRecord(
                    layer="bronze",
                    kind="caught_up",
                    visible_at=datetime.fromtimestamp(at, tz=timezone.utc),
                    topic=stream.spec.key,
                    table=str(stream.table),
                )
            )

    def _record(self, sealed: CometdSealedBatch, version: int | None, seconds: float) -> None:
        stream = self._streams[sealed.key]
        with self._state_lock:
            mark = stream.idle_mark
            if mark is not None and stream.position == mark[1]:
                stream.idle_mark = None
            else:
                mark = None
        if self._ops is None:
            return
        batch, gap = sealed.batch, sealed.gap
        self._ops.record(
            CommitRecord(
                layer="bronze",
                kind="commit" if sealed.kind == "events" else "replay_gap",
                visible_at=datetime.fromtimestamp(self._clock(), tz=timezone.utc),
                topic=sealed.key,
                table=str(stream.table),
                version=version,
                events=batch.events,
                rows=len(batch),
                payload_bytes=batch.nbytes,
                newest_commit_at=newest_created(batch.created),
                duration_seconds=seconds,
                message=(
                    f"replay gap: {gap.rejected} -> {shown_position(gap.resumed)} ({gap.reason})"
                    if gap is not None
                    else None
                ),
            )
        )
        if mark is not None:
            self.record_caught_up(stream, mark[0])

    def _land(self, sealed: CometdSealedBatch) -> int | None:
        if sealed.kind != "events":
            return None
        stream = self._streams[sealed.key]
        result = self._engine.append(
            stream.table,
            cometd_rows(sealed),
            txn=Txn(bronze_app_id(sealed.key), sealed.batch_id),
            metadata={"sfcdc.topic": sealed.key, "sfcdc.kind": "events"},
            evolve_schema=False,
            layout=COMETD_BRONZE_LAYOUT,
        )
        if result.skipped:
            raise CheckpointError(
                f"{sealed.key}: bronze batch {sealed.batch_id} was already committed by another "
                f"writer; two landings of the same channel into {stream.table} cannot run at once"
            )
        return result.version

    @staticmethod
    def _row(sealed: CometdSealedBatch, version: int | None) -> CheckpointRow:
        gap = sealed.gap
        if gap is not None:
            return CheckpointRow(
                topic=sealed.key,
                batch_id=sealed.batch_id,
                kind="replay_gap",
                replay_id=None,
                gap_requested=str(gap.rejected),
                gap_resumed="earliest" if gap.resumed == REPLAY_ALL else "latest",
                detail=gap.reason,
            )
        return CheckpointRow(
            topic=sealed.key,
            batch_id=sealed.batch_id,
            kind="events",
            replay_id=ReplayId(replay_bytes(sealed.position)),
            event_count=sealed.batch.events,
            payload_bytes=sealed.batch.nbytes,
            bronze_version=version,
        )

    def _committed(self, sealed: CometdSealedBatch, seconds: float) -> None:
        stream = self._streams[sealed.key]
        batch = sealed.batch
        with self._state_lock:
            stream.position = sealed.position
            stream.commits += 1
            stream.events += batch.events
            stream.malformed += len(batch) - batch.events
            stream.nbytes += batch.nbytes
            stream.gaps += sealed.kind == "replay_gap"
            if sealed.position >= 0:
                stream.last_replay_id = sealed.position
        if sealed.kind == "replay_gap":
            self._log.info(
                "landed %s batch %d: replay gap recorded, resuming at %d, %.3f s",
                sealed.key,
                sealed.batch_id,
                sealed.position,
                seconds,
            )
            return
        self._log.info(
            "landed %s batch %d: %d notifications%s, %.2f MB, resuming after %s, %.3f s",
            sealed.key,
            sealed.batch_id,
            batch.events,
            f" and {len(batch) - batch.events} malformed" if len(batch) > batch.events else "",
            batch.nbytes / 1e6,
            shown_position(sealed.position),
            seconds,
        )
        every = self._maintain_every
        stream.since_maintenance += 1
        if every > 0 and stream.since_maintenance >= every:
            stream.since_maintenance = 0
            try:
                self._engine.maintain(stream.table)
            except Exception as exc:  # maintenance must not stop landing
                self._log.error("maintenance of %s failed (landing goes on): %s", stream.table, exc)
