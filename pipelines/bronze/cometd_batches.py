"""A Streaming API channel's batches on their way to bronze: the open batch the consuming thread
appends received messages to (:class:`~pipelines.bronze.cometd.CometdLanding`), the sealed
batch handed to the committer (:mod:`pipelines.bronze.cometd_commit`), and the bronze rows
(Arrow columns) the committer builds from it.

An open batch holds plain lists, one per column (replay id, channel, event type,
``createdDate``, ``EventUuid``, raw JSON, ``malformed`` reason) and run-length receive times;
:func:`cometd_rows` turns them into Arrow columns. :func:`shown_position` and
:func:`newest_created` describe a position and a batch's newest ``createdDate`` for the log and
the commit records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa

from ingest.cometd import ReplayGap
from pipelines.bronze.cometd_checkpoints import REPLAY_ALL, REPLAY_NEW
from pipelines.bronze.cometd_tables import COMETD_BRONZE_SCHEMA

__all__ = [
    "CometdOpenBatch",
    "CometdSealedBatch",
    "cometd_rows",
    "newest_created",
    "shown_position",
]


class CometdOpenBatch:
    """Messages received for a channel and not yet handed to the committer."""

    __slots__ = (
        "channels",
        "counts",
        "created",
        "events",
        "malformed",
        "nbytes",
        "opened_at",
        "position",
        "raws",
        "replay_ids",
        "stamped",
        "times",
        "types",
        "uuids",
    )

    def __init__(self) -> None:
        self.replay_ids: list[int | None] = []
        self.channels: list[str | None] = []
        self.types: list[str | None] = []
        self.created: list[str | None] = []
        self.uuids: list[str | None] = []
        self.raws: list[str] = []
        self.malformed: list[str | None] = []
        self.times: list[int] = []  # run-length receive times: one entry per connect reply
        self.counts: list[int] = []
        self.stamped = 0  # messages covered by times/counts
        self.events = 0
        self.nbytes = 0
        self.position: int | None = None  # replay id of the last notification
        self.opened_at: float | None = None

    def __len__(self) -> int:
        return len(self.raws)


@dataclass
class CometdSealedBatch:
    """A batch handed to the committer: a channel's messages (``kind`` ``events``) or a replay
    gap (``replay_gap``, with an empty batch), and the position to resume from after it."""

    key: str
    batch_id: int
    kind: str  # events | replay_gap
    position: int
    batch: CometdOpenBatch
    gap: ReplayGap | None = None


def shown_position(position: int) -> str:
    """A channel's position as the log shows it."""
    if position == REPLAY_ALL:
        return "-2 (every retained notification)"
    if position == REPLAY_NEW:
        return "-1 (new notifications only)"
    return f"replay id {position}"


def newest_created(created: Sequence[str | None]) -> datetime | None:
    """The latest ``createdDate`` of a batch (ISO 8601; ``None`` when none parses)."""
    newest = None
    for text in created:
        if not text:
            continue
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            continue
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        if newest is None or value > newest:
            newest = value
    return newest


def cometd_rows(sealed: CometdSealedBatch) -> pa.Table:
    """The bronze rows of a batch, built column by column."""
    batch = sealed.batch
    n = len(batch)
    received = np.repeat(
        np.asarray(batch.times, dtype=np.int64), np.asarray(batch.counts, dtype=np.int64)
    )
    schema = COMETD_BRONZE_SCHEMA
    columns = [
        pa.array(batch.replay_ids, pa.int64()),
        pa.array(batch.channels, pa.string()),
        pa.array(batch.types, pa.string()),
        pa.array(batch.created, pa.string()),
        pa.array(batch.uuids, pa.string()),
        pa.array(batch.raws, pa.string()),
        pa.array(batch.malformed, pa.string()),
        pa.array(received, schema.field("received_at").type),
        pa.array(np.full(n, sealed.batch_id, dtype=np.int64)),
        pa.array(np.arange(n, dtype=np.int32)),
    ]
    return pa.Table.from_arrays(columns, schema=schema)
