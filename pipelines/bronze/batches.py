"""A topic's batches on their way to bronze: the open batch the consuming thread appends
received events to, the sealed batch handed to the committer, and the bronze rows (Arrow
columns) the committer builds from it.

An open batch holds plain lists (replay ids, event ids, schema ids, payloads, run-length
receive times), appended whole columns at a time, so that receiving costs no Python object per
event; :func:`bronze_rows` turns them into Arrow columns with one join per column, releasing
each list as soon as its column is built.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ingest.client import ReplayGap
from ingest.replay import ReplayId
from pipelines.bronze.tables import BRONZE_SCHEMA, CheckpointKind

__all__ = ["OpenBatch", "SealedBatch", "bronze_rows"]


class OpenBatch:
    """Events received for a topic and not yet handed to the committer."""

    __slots__ = (
        "counts",
        "event_ids",
        "nbytes",
        "opened_at",
        "payloads",
        "position",
        "replay_ids",
        "schema_ids",
        "times",
    )

    def __init__(self) -> None:
        self.replay_ids: list[bytes] = []
        self.event_ids: list[str] = []
        self.schema_ids: list[str] = []
        self.payloads: list[bytes] = []
        # Run-length receive times: one entry per server response.
        self.times: list[int] = []
        self.counts: list[int] = []
        self.nbytes = 0
        self.position: ReplayId | None = None
        self.opened_at: float | None = None


@dataclass
class SealedBatch:
    """A batch handed to the committer: a topic's events (``kind`` ``events``), or only a
    position to checkpoint (``keepalive``) or a replay gap (``replay_gap``)."""

    topic: str
    batch_id: int
    kind: CheckpointKind
    position: ReplayId | None
    batch: OpenBatch
    gap: ReplayGap | None = None
    # Commit time (epoch ms) of the batch's last event, read before its columns are built.
    newest_ms: int | None = None


def _binary(values: list[bytes]) -> pa.Array:
    """A binary column of ``values``: one join and the offsets, instead of a conversion per
    value (the payloads of a batch are megabytes, copied once here)."""
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, values), np.int64, len(values)), out=offsets[1:])
    if offsets[-1] >= 2**31:
        return pa.array(values, pa.binary())  # past 32-bit offsets: let Arrow chunk it
    data = pa.py_buffer(b"".join(values))
    return pa.Array.from_buffers(
        pa.binary(), len(values), [None, pa.py_buffer(offsets.astype(np.int32)), data]
    )


def _strings(values: list[str]) -> pa.Array:
    """A string column of ``values`` (event and schema ids are ASCII: their lengths in
    characters are their lengths in bytes)."""
    first = values[0] if values else ""
    if values.count(first) == len(values):
        return pa.repeat(pa.scalar(first, pa.string()), len(values))
    joined = "".join(values)
    if not joined.isascii():
        return pa.array(values, pa.string())
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(np.fromiter(map(len, values), np.int32, len(values)), out=offsets[1:])
    data = pa.py_buffer(joined.encode("ascii"))
    return pa.Array.from_buffers(pa.string(), len(values), [None, pa.py_buffer(offsets), data])


def bronze_rows(sealed: SealedBatch) -> pa.Table:
    """The bronze rows of a batch, built column by column from the received values; the
    batch's lists are released as soon as their column is built."""
    batch = sealed.batch
    n = len(batch.replay_ids)
    received = np.repeat(
        np.asarray(batch.times, dtype=np.int64), np.asarray(batch.counts, dtype=np.int64)
    )
    payloads = _binary(batch.payloads)
    batch.payloads = []
    event_ids = _strings(batch.event_ids)
    batch.event_ids = []
    schema_ids = _strings(batch.schema_ids)
    batch.schema_ids = []
    columns = [
        _binary(batch.replay_ids),
        event_ids,
        schema_ids,
        payloads,
        pa.repeat(pa.scalar(sealed.topic, pa.string()), n),
        pa.array(received, BRONZE_SCHEMA.field("received_at").type),
        pa.array(np.full(n, sealed.batch_id, dtype=np.int64)),
        pa.array(np.arange(n, dtype=np.int32)),
    ]
    return pa.Table.from_arrays(columns, schema=BRONZE_SCHEMA)
