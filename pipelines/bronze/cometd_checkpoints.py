"""Replay checkpoints of Streaming API channels: the Pub/Sub landing's protocol, with integer
positions.

The protocol is :mod:`pipelines.bronze.checkpoint`'s, step for step, for each channel (keyed
``streaming:<channel>``): batch ``N``'s rows are appended to the channel's bronze table with the
Delta application transaction ``(sfcdc.bronze:<key>, N)``, then the checkpoint row ``N`` to
``bronze.sfcdc_checkpoints`` with ``(sfcdc.checkpoint:<key>, N)``; batch ``N + 1`` starts only
after row ``N``. The argument that a kill at any instant neither loses nor duplicates a
notification is the same; so is the recovery of a kill between the two commits
(:meth:`CometdCheckpoints.recover` rebuilds row ``N`` from bronze).

What differs is the position. A Streaming API subscription resumes from an integer: a replay
id (notifications after it), ``-1`` (new ones only) or ``-2`` (every retained one). A row stores
the position to resume from after its batch, as decimal digits in ``replay_id``: the batch's last
notification's replay id, or the position before the batch when it only holds malformed
messages (which carry no usable replay id). A ``replay_gap`` row (the server rejected the
stored id and ``on_corrupted`` moved the channel to ``-2`` or ``-1``) names the rejected id in
``gap_requested`` and the new start in ``gap_resumed`` (``earliest`` / ``latest``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow.compute as pc

from ingest.errors import CheckpointError
from ingest.replay import ReplayId
from pipelines.bronze.checkpoint import Checkpoint, CheckpointRow, CheckpointStore
from pipelines.bronze.cometd_tables import CometdTables, replay_bytes, replay_number
from pipelines.bronze.tables import bronze_app_id

if TYPE_CHECKING:
    from pipelines.engines.base import LakeEngine

__all__ = ["REPLAY_ALL", "REPLAY_NEW", "CometdCheckpoints", "StreamRecovery", "position_of"]

_log = logging.getLogger(__name__)

REPLAY_NEW = -1
REPLAY_ALL = -2
_GAP_POSITIONS = {"earliest": REPLAY_ALL, "latest": REPLAY_NEW}


def position_of(checkpoint: Checkpoint) -> int:
    """Where a channel resumes after ``checkpoint``."""
    if checkpoint.replay_id is not None:
        return replay_number(checkpoint.replay_id.value)
    resumed = _GAP_POSITIONS.get(checkpoint.gap_resumed or "")
    if resumed is None:
        raise CheckpointError(
            f"{checkpoint.topic}: checkpoint batch {checkpoint.batch_id} has neither a position "
            "nor a gap position; the checkpoint table was altered"
        )
    return resumed


@dataclass(frozen=True)
class StreamRecovery:
    """Where a channel's landing (re)starts: ``position`` to subscribe from, the number of
    its next batch, and the batch whose checkpoint row was rebuilt from bronze, if any."""

    key: str
    position: int
    next_batch_id: int
    last_replay_id: int | None
    recovered_batch: int | None = None


class CometdCheckpoints:
    """Reads, recovers and writes the checkpoint rows of Streaming API channels."""

    def __init__(
        self,
        engine: LakeEngine,
        tables: CometdTables,
        *,
        clock: Callable[[], float],
        logger: logging.Logger | None = None,
    ) -> None:
        self._engine = engine
        self._tables = tables
        self._log = logger or _log
        self.store = CheckpointStore(engine, tables.as_bronze_tables(), clock=clock, logger=logger)

    def recover(self, key: str, *, default_start: int) -> StreamRecovery:
        """Bring the channel's checkpoint in line with its bronze table and say where to
        resume (``default_start`` without any checkpoint)."""
        bronze = self._tables.bronze(key)
        b = self._engine.txn_version(bronze, bronze_app_id(key))
        latest = self.store.latest(key)
        c = latest.batch_id if latest is not None else 0
        position = position_of(latest) if latest is not None else default_start
        recovered = None
        if b is not None and b > c:
            if b != c + 1:
                raise CheckpointError(
                    f"{key}: bronze {bronze} holds batch {b} but the checkpoints end at batch "
                    f"{c}; batches are committed one at a time, so the tables were changed "
                    "outside sfcdc. Restore both to matching versions"
                )
            position = self._recover_batch(key, b, before=position)
            recovered = b
        next_batch = max(b or 0, c) + 1
        last = position if position >= 0 else None
        return StreamRecovery(key, position, next_batch, last, recovered)

    def _recover_batch(self, key: str, batch: int, *, before: int) -> int:
        bronze = self._tables.bronze(key)
        rows = self._engine.read_arrow(
            bronze, columns=["replay_id", "batch_seq", "raw"], where=[("batch_id", "=", batch)]
        )
        if rows.num_rows == 0:
            raise CheckpointError(
                f"{key}: bronze {bronze} records batch {batch} as committed but holds none of "
                "its rows; was the table rewritten outside sfcdc?"
            )
        ids = rows.filter(pc.is_valid(rows.column("replay_id")))
        if ids.num_rows:
            last = pc.index(ids.column("batch_seq"), pc.max(ids.column("batch_seq"))).as_py()
            position = int(ids.column("replay_id")[last].as_py())
        else:
            position = before  # only malformed messages: the position did not move
        self._log.warning(
            "%s: batch %d is in bronze but its checkpoint was not written (the process stopped "
            "between the two commits); writing it now, resuming after replay id %d",
            key,
            batch,
            position,
        )
        self.store.write(
            CheckpointRow(
                topic=key,
                batch_id=batch,
                kind="events",
                replay_id=ReplayId(replay_bytes(position)),
                event_count=int(ids.num_rows),
                payload_bytes=int(pc.sum(pc.utf8_length(rows.column("raw"))).as_py() or 0),
                detail="recovered from bronze: the process stopped between the bronze and the "
                "checkpoint commit",
            )
        )
        return position
