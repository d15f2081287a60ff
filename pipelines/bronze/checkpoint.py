"""Replay checkpoints in Delta: how a landing commit is written, read back and recovered.

The protocol
------------
Each topic's events are landed in batches numbered ``N = 1, 2, ...``, committed strictly in
order (batch ``N + 1`` is written only once batch ``N``'s checkpoint is committed):

0. schema ids the batch uses that the registry does not hold are appended to
   ``sfcdc_schemas`` (so silver finds every schema it meets);
1. the events are appended to the topic's bronze table with the Delta application
   transaction ``(sfcdc.bronze:<topic>, N)``, recorded atomically in the same commit;
2. the checkpoint row of batch ``N`` (its last replay id) is appended to
   ``sfcdc_checkpoints`` with the transaction ``(sfcdc.checkpoint:<topic>, N)``;
3. only then, for a ManagedSubscribe topic, is the replay id committed to the server.

A keepalive batch has no events: it skips steps 0 and 1, writes its row (position: the
keepalive's ``latest_replay_id``) and commits that position to a ManagedSubscribe server, so
quiet topics advance their checkpoint. A replay gap (the server rejected the stored position
and the corrupted-replay policy moved the subscription) writes only a row of kind
``replay_gap`` naming both positions.

Why a kill at any instant neither loses nor duplicates an event
----------------------------------------------------------------
A Delta commit is atomic: after a kill, each table is at the version before or after the
commit that was under way (an interrupted write leaves Parquet files no version references).
Let ``b`` be the bronze table's transaction version for the topic and ``c`` the checkpoint
table's; ``c`` names the row with the position restart resumes after. Batch ``N + 1`` only
starts after row ``N``, so always ``b <= c + 1``. For a kill while batch ``N`` is handled
(``b <= c = N - 1`` before it starts):

- before step 1 commits (receiving, registering schemas, writing the Parquet files): on disk,
  bronze and checkpoints end at batch ``N - 1``; batch ``N`` existed only in memory, perhaps
  with an extra registry row, which is harmless. Restart resumes after row ``N - 1``, so the
  server delivers batch ``N``'s events again: nothing lost, nothing written twice.
- after step 1, before step 2 commits: bronze holds batch ``N`` once (``b = N``), the
  checkpoints end at ``N - 1``. Restart sees ``b > c`` and recovers: it reads batch ``N`` from
  bronze, takes the replay id of its highest ``batch_seq`` (the batch's last event), writes
  the missing row ``N`` under the same transaction ``N``, and resumes after that event. The
  events are in bronze once and the stream continues right after them. (If the batch's
  position was a keepalive after its last event, resuming after the event is equivalent: the
  keepalive said nothing lay between.) A kill during this recovery is the same case again.
- after step 2: row ``N`` is committed (``c = N``); restart resumes after it. A ManagedSubscribe
  server may not have received step 3 and delivers again the events after its own committed
  position; every such event is in bronze in a batch after the last one the server
  acknowledged (row ``server_acked_batch_id``), so landing recognises those replay ids and
  skips them until the first event it does not hold.
- a keepalive or replay gap row: before its commit, restart resumes after row ``N - 1`` (no
  event of the topic lay between it and the keepalive; a gap is rejected again and the policy
  applies again); after it, restart resumes after the keepalive position, or at the position
  the gap policy chose.

Both transactions also make a repeated write of batch ``N`` a no-op, so no code path can append
a batch twice. ``b > c + 1`` cannot happen and is reported as a
:class:`~ingest.errors.CheckpointError`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from ingest.errors import CheckpointError, LakeError
from ingest.replay import After, Earliest, Latest, ReplayId, StartPosition
from pipelines.bronze.tables import (
    CHECKPOINT_SCHEMA,
    SCHEMA_FAILURES_SCHEMA,
    SCHEMA_REGISTRY_SCHEMA,
    TOPIC_FAILURES_SCHEMA,
    BronzeTables,
    CheckpointKind,
    bronze_app_id,
    checkpoint_app_id,
)
from pipelines.engines.base import CommitResult, Txn

if TYPE_CHECKING:
    from pipelines.engines.base import LakeEngine

__all__ = ["Checkpoint", "CheckpointRow", "CheckpointStore", "Recovery", "describe_position"]

_log = logging.getLogger(__name__)


def describe_position(position: StartPosition) -> str:
    """``earliest``, ``latest`` or ``after:<hex replay id>`` (the form :func:`parse_start`
    reads back)."""
    if isinstance(position, After):
        return f"after:{position.replay_id.hex()}"
    return position.kind


def _resumed(text: str | None) -> StartPosition | None:
    if text == "earliest":
        return Earliest()
    if text == "latest":
        return Latest()
    return None


@dataclass(frozen=True)
class CheckpointRow:
    """One landing commit, as written to the checkpoint table."""

    topic: str
    batch_id: int
    kind: CheckpointKind
    replay_id: ReplayId | None
    event_count: int = 0
    payload_bytes: int = 0
    bronze_version: int | None = None
    gap_requested: str | None = None
    gap_resumed: str | None = None
    detail: str | None = None
    server_acked_batch_id: int | None = None

    def __post_init__(self) -> None:
        if self.batch_id < 1:
            raise ValueError(f"batch ids start at 1 (got {self.batch_id})")
        if self.kind == "replay_gap":
            if _resumed(self.gap_resumed) is None:
                raise ValueError(
                    f"a replay gap row resumes at 'earliest' or 'latest' (got {self.gap_resumed!r})"
                )
        elif self.replay_id is None:
            raise ValueError(f"a {self.kind} checkpoint needs the replay id to resume after")


@dataclass(frozen=True)
class Checkpoint:
    """The latest landing commit of a topic, read back from the checkpoint table."""

    topic: str
    batch_id: int
    kind: CheckpointKind
    replay_id: ReplayId | None
    committed_at: datetime | None
    gap_resumed: str | None = None
    server_acked_batch_id: int | None = None

    @property
    def position(self) -> StartPosition:
        """Where the topic's subscription resumes: after the stored replay id, or where a
        replay gap's policy moved it."""
        if self.replay_id is not None:
            return After(self.replay_id)
        resumed = _resumed(self.gap_resumed)
        if resumed is None:
            raise CheckpointError(
                f"{self.topic}: checkpoint batch {self.batch_id} ({self.kind}) has neither a "
                "replay id nor a gap position to resume at; the checkpoint table was altered"
            )
        return resumed


@dataclass(frozen=True)
class Recovery:
    """What landing needs to (re)start a topic.

    ``start`` is where the subscription begins (after the checkpoint, or the configured start
    without one); ``next_batch_id`` the number of the next landing batch; ``recovered_batch``
    the batch whose checkpoint row was rebuilt from bronze after a crash, if any.
    """

    topic: str
    checkpoint: Checkpoint | None
    start: StartPosition
    next_batch_id: int
    recovered_batch: int | None = None


class CheckpointStore:
    """Reads, recovers and writes the checkpoints of a landing's topics (see the module
    notes for the protocol). ``clock`` (epoch seconds) stamps ``committed_at``."""

    def __init__(
        self,
        engine: LakeEngine,
        tables: BronzeTables,
        *,
        clock: Callable[[], float] = time.time,
        logger: logging.Logger | None = None,
    ) -> None:
        self._engine = engine
        self._tables = tables
        self._clock = clock
        self._log = logger or _log

    # -- reading ------------------------------------------------------------------------------

    def latest(self, topic: str) -> Checkpoint | None:
        """The topic's latest checkpoint (the row of the table's transaction version)."""
        return self.latest_of([topic])[topic]

    def latest_of(self, topics: Sequence[str]) -> dict[str, Checkpoint | None]:
        """Each topic's latest checkpoint (``None``: it has none yet), in one read of the
        checkpoint table: the rows of those topics at their transaction versions."""
        found: dict[str, Checkpoint | None] = dict.fromkeys(topics)
        batches = {
            topic: batch
            for topic in found
            if (
                batch := self._engine.txn_version(
                    self._tables.checkpoints, checkpoint_app_id(topic)
                )
            )
            is not None
        }
        if not batches:
            return found
        rows = self._engine.read_arrow(
            self._tables.checkpoints,
            where=[
                ("topic", "in", sorted(batches)),
                ("batch_id", "in", sorted(set(batches.values()))),
            ],
        ).to_pylist()
        for row in rows:
            topic = row["topic"]
            if batches.get(topic) != row["batch_id"] or found[topic] is not None:
                continue
            replay = row["replay_id"]
            found[topic] = Checkpoint(
                topic=topic,
                batch_id=int(row["batch_id"]),
                kind=row["kind"],
                replay_id=ReplayId(replay) if replay else None,
                committed_at=row["committed_at"],
                gap_resumed=row["gap_resumed"],
                server_acked_batch_id=row["server_acked_batch_id"],
            )
        missing = [topic for topic in batches if found[topic] is None]
        if missing:
            topic = missing[0]
            raise CheckpointError(
                f"{topic}: the checkpoint table records batch {batches[topic]} as committed but "
                f"holds no row for it; was {self._tables.checkpoints} rewritten? Restore it "
                "(Delta RESTORE) rather than deleting rows"
            )
        return found

    def recover(self, topic: str, *, default_start: StartPosition) -> Recovery:
        """Bring the topic's checkpoint in line with its bronze table and say where to resume.

        When bronze holds a batch the checkpoints do not (a kill between the two commits),
        the missing row is written first, from the batch's last event.
        """
        return self.recover_all({topic: default_start})[topic]

    def recover_all(self, starts: Mapping[str, StartPosition]) -> dict[str, Recovery]:
        """:meth:`recover` for each topic of ``starts`` (topic -> where to start without a
        checkpoint), reading the topics' checkpoints in one pass."""
        latests = self.latest_of(list(starts))
        return {
            topic: self._recover(topic, latests[topic], default_start)
            for topic, default_start in starts.items()
        }

    def _recover(
        self, topic: str, latest: Checkpoint | None, default_start: StartPosition
    ) -> Recovery:
        bronze = self._tables.bronze(topic)
        b = self._engine.txn_version(bronze, bronze_app_id(topic))
        c = latest.batch_id if latest is not None else 0
        recovered = None
        if b is not None and b > c:
            if b != c + 1:
                raise CheckpointError(
                    f"{topic}: bronze {bronze} holds batch {b} but the checkpoints end at batch "
                    f"{c}; batches are committed one at a time, so the tables were changed "
                    "outside sfcdc. Restore both to matching versions"
                )
            latest = self._recover_batch(topic, b, previous=latest)
            recovered = b
        next_batch = max(b or 0, c, latest.batch_id if latest else 0) + 1
        start = latest.position if latest is not None else default_start
        return Recovery(topic, latest, start, next_batch, recovered)

    def _recover_batch(self, topic: str, batch: int, *, previous: Checkpoint | None) -> Checkpoint:
        bronze = self._tables.bronze(topic)
        rows = self._engine.read_arrow(
            bronze, columns=["replay_id", "batch_seq", "payload"], where=[("batch_id", "=", batch)]
        )
        if rows.num_rows == 0:
            raise CheckpointError(
                f"{topic}: bronze {bronze} records batch {batch} as committed but holds none of "
                "its rows; was the table rewritten outside sfcdc?"
            )
        last = pc.index(rows.column("batch_seq"), pc.max(rows.column("batch_seq")))
        replay_id = ReplayId(rows.column("replay_id")[last.as_py()].as_py())
        payload_bytes = pc.sum(pc.binary_length(rows.column("payload"))).as_py() or 0
        self._log.warning(
            "%s: batch %d is in bronze but its checkpoint was not written (the process stopped "
            "between the two commits); writing it now from the batch's last event %s",
            topic,
            batch,
            replay_id.hex(),
        )
        row = CheckpointRow(
            topic=topic,
            batch_id=batch,
            kind="events",
            replay_id=replay_id,
            event_count=rows.num_rows,
            payload_bytes=payload_bytes,
            detail="recovered from bronze: the process stopped between the bronze and the "
            "checkpoint commit",
            server_acked_batch_id=previous.server_acked_batch_id if previous else None,
        )
        self.write(row)
        return Checkpoint(
            topic=topic,
            batch_id=batch,
            kind="events",
            replay_id=replay_id,
            committed_at=None,
            server_acked_batch_id=row.server_acked_batch_id,
        )

    def landed_after(self, topic: str, batch_id: int | None) -> set[bytes]:
        """Replay ids of the topic's bronze events in batches after ``batch_id`` (all when
        ``None``): what a ManagedSubscribe server may deliver again."""
        where: list[Any] = [] if batch_id is None else [("batch_id", ">", batch_id)]
        rows = self._engine.read_arrow(
            self._tables.bronze(topic), columns=["replay_id"], where=where
        )
        return set(rows.column("replay_id").to_pylist())

    def landed_from(self, topic: str, replay_id: bytes) -> set[bytes]:
        """Replay ids of the topic's bronze events in the batch holding ``replay_id`` and
        after it (empty when bronze does not hold it): what a stream restarted at EARLIEST
        delivers again when its first event is ``replay_id``."""
        table = self._tables.bronze(topic)
        found = self._engine.read_arrow(
            table, columns=["batch_id"], where=[("replay_id", "=", replay_id)]
        )
        if found.num_rows == 0:
            return set()
        first = min(found.column("batch_id").to_pylist())
        return self.landed_after(topic, first - 1)

    def registered_schemas(self) -> set[str]:
        """Schema ids the registry holds."""
        rows = self._engine.read_arrow(self._tables.schemas, columns=["schema_id"])
        return set(rows.column("schema_id").to_pylist())

    # -- writing ------------------------------------------------------------------------------

    def write(self, row: CheckpointRow) -> CommitResult:
        """Append ``row`` under the topic's checkpoint transaction ``row.batch_id``."""
        (result,) = self.write_all([row])
        return result

    def write_all(self, rows: Sequence[CheckpointRow]) -> list[CommitResult]:
        """Append ``rows`` (of distinct topics), each under its topic's checkpoint transaction
        ``row.batch_id``: in one commit holding every transaction where the engine can (the
        local engine; the spark engine on a lake of paths with Delta's JVM classes at hand),
        one commit per row otherwise (a Spark DataFrameWriter records one transaction).
        Either way a row is durable together with its transaction, which is all the protocol
        needs."""
        topics = [row.topic for row in rows]
        if len(set(topics)) != len(topics):
            raise ValueError(f"checkpoint rows of one commit need distinct topics (got {topics})")
        if not rows:
            return []
        parts = [
            (
                pa.Table.from_pylist([self._record(row)], schema=CHECKPOINT_SCHEMA),
                Txn(checkpoint_app_id(row.topic), row.batch_id),
            )
            for row in rows
        ]
        metadata = {
            "sfcdc.topic": ",".join(row.topic for row in rows),
            "sfcdc.kind": ",".join(row.kind for row in rows),
        }
        described = ", ".join(f"{row.topic} batch {row.batch_id}" for row in rows)
        try:
            results = self._engine.append_parts(self._tables.checkpoints, parts, metadata=metadata)
        except LakeError as exc:
            raise CheckpointError(f"writing checkpoint rows ({described}) failed: {exc}") from exc
        if any(result.skipped for result in results):
            raise CheckpointError(
                f"checkpoint rows ({described}) were already committed by another writer; "
                "two landings of the same topic into the same tables cannot run at once"
            )
        return results

    def register_schemas(self, topic: str, schemas: Mapping[str, str]) -> None:
        """Append registry rows (schema id -> JSON) for ids first seen on ``topic``."""
        if not schemas:
            return
        now = self._now()
        table = pa.Table.from_pylist(
            [
                {"schema_id": sid, "schema_json": text, "topic": topic, "first_seen_at": now}
                for sid, text in sorted(schemas.items())
            ],
            schema=SCHEMA_REGISTRY_SCHEMA,
        )
        self._engine.append(self._tables.schemas, table, metadata={"sfcdc.topic": topic})

    def record_topic_failure(
        self, topic: str, objects: str, *, status: str, error_code: str, error: str
    ) -> None:
        """Append a row saying ``topic`` failed for good (``sfcdc status`` shows it)."""
        row = {
            "topic": topic,
            "objects": objects,
            "status": status,
            "error_code": error_code or None,
            "error": error,
            "failed_at": self._now(),
        }
        table = pa.Table.from_pylist([row], schema=TOPIC_FAILURES_SCHEMA)
        self._engine.append(self._tables.topic_failures, table, metadata={"sfcdc.topic": topic})

    def record_schema_failure(
        self, topic: str, schema_id: str, *, status: str, error_code: str, error: str
    ) -> None:
        """Append a row saying GetSchema refused ``schema_id`` (silver quarantines its
        events with this error until the schema can be fetched)."""
        row = {
            "schema_id": schema_id,
            "topic": topic,
            "status": status,
            "error_code": error_code or None,
            "error": error,
            "failed_at": self._now(),
        }
        table = pa.Table.from_pylist([row], schema=SCHEMA_FAILURES_SCHEMA)
        self._engine.append(self._tables.schema_failures, table, metadata={"sfcdc.topic": topic})

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._clock(), tz=timezone.utc)

    def _record(self, row: CheckpointRow) -> dict[str, Any]:
        return {
            "topic": row.topic,
            "batch_id": row.batch_id,
            "kind": row.kind,
            "replay_id": row.replay_id.value if row.replay_id is not None else None,
            "event_count": row.event_count,
            "payload_bytes": row.payload_bytes,
            "bronze_version": row.bronze_version,
            "committed_at": self._now(),
            "gap_requested": row.gap_requested,
            "gap_resumed": row.gap_resumed,
            "detail": row.detail,
            "server_acked_batch_id": row.server_acked_batch_id,
        }
