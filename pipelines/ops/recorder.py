"""Commit records collected as the layers commit, and written to the commits table in batches.

Jobs hand each commit to :meth:`OpsRecorder.record` (a plain callable they are given), and
the thread that owns the engine's writes calls :meth:`OpsRecorder.flush` when
:meth:`OpsRecorder.due` says so (landing: its committer thread between rounds; silver and
gold: after a pass; one-shot commands: when they end). Writing from the thread that already
writes keeps the commits table off the hot path and out of Spark session settings another
thread's MERGE may have set.

A topic caught up again and again (a keepalive every few seconds on a quiet topic) keeps one
``caught_up`` row per flush: the latest.

A failed write never stops the pipeline: it is logged, the rows are kept for the next flush
(up to ``max_rows``, oldest dropped first) and the data commits go on. The records are also
handed to ``listeners`` (the Prometheus metrics) whether or not the table is written.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone

from ingest.errors import LakeError
from pipelines.engines.arrow import arrow_schema_to_spark
from pipelines.engines.base import LakeEngine
from pipelines.ops.table import OPS_SCHEMA, OPS_TABLE, CommitRecord, records_to_arrow
from pipelines.spec.conf import Conf

__all__ = ["OpsRecorder", "error_record", "recorder_for"]

_log = logging.getLogger(__name__)

Listener = Callable[[CommitRecord], object]


def error_record(
    layer: str,
    error: BaseException | str,
    *,
    at: datetime,
    topic: str | None = None,
    object: str | None = None,
) -> CommitRecord:
    """A record of ``layer``'s run failing with ``error`` (its message; exception messages
    in sfcdc never carry secrets or payloads)."""
    if isinstance(error, BaseException):
        text = str(error) or type(error).__name__
        message = f"{type(error).__name__}: {text}"
    else:
        message = error
    return CommitRecord(
        layer=layer, kind="error", visible_at=at, topic=topic, object=object, message=message
    )


class OpsRecorder:
    """Buffers :class:`~pipelines.ops.table.CommitRecord` rows for ``engine``'s commits table.

    ``enabled`` false keeps nothing (``ops.commits_table: false``) but still tells
    ``listeners``. ``flush_seconds``: :meth:`due` turns true that long after the oldest
    buffered row arrived. Every ``maintain_every`` flushes the table is compacted. ``clock``
    stamps error records; ``monotonic`` times the flushes.
    """

    def __init__(
        self,
        engine: LakeEngine,
        *,
        enabled: bool = True,
        flush_seconds: float = 10.0,
        listeners: Sequence[Listener] = (),
        maintain_every: int = 100,
        max_rows: int = 100_000,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        logger: logging.Logger | None = None,
    ) -> None:
        if flush_seconds <= 0:
            raise ValueError(f"flush_seconds must be > 0 (got {flush_seconds})")
        self._engine = engine
        self._enabled = enabled
        self._flush_seconds = flush_seconds
        self._listeners = list(listeners)
        self._maintain_every = maintain_every
        self._clock = clock
        self._monotonic = monotonic
        self._log = logger or _log
        self._lock = threading.Lock()
        self._rows: deque[CommitRecord] = deque(maxlen=max_rows)
        self._caught_up: dict[tuple[str, str | None], CommitRecord] = {}
        self._oldest: float | None = None
        self._ensured = False
        self._flushes = 0
        self._dropped_warned = False

    @property
    def enabled(self) -> bool:
        """Whether records are written to the table."""
        return self._enabled

    def listen(self, listener: Listener) -> None:
        """Hand every later record to ``listener`` too."""
        self._listeners.append(listener)

    def record(self, record: CommitRecord) -> None:
        """Keep ``record`` for the next flush (thread-safe)."""
        for listener in self._listeners:
            listener(record)
        if not self._enabled:
            return
        with self._lock:
            if self._oldest is None:
                self._oldest = self._monotonic()
            if record.kind == "caught_up":
                self._caught_up[(record.layer, record.topic)] = record
                return
            if len(self._rows) == self._rows.maxlen and not self._dropped_warned:
                self._dropped_warned = True
                self._log.warning(
                    "%s: %d commit records wait to be written; the oldest are dropped",
                    OPS_TABLE,
                    len(self._rows),
                )
            self._rows.append(record)

    def error(
        self,
        layer: str,
        error: BaseException | str,
        *,
        topic: str | None = None,
        object: str | None = None,
    ) -> None:
        """Record that ``layer``'s run failed with ``error``."""
        at = datetime.fromtimestamp(self._clock(), tz=timezone.utc)
        self.record(error_record(layer, error, at=at, topic=topic, object=object))

    @contextlib.contextmanager
    def watching(
        self, layer: str, *, topic: str | None = None, object: str | None = None
    ) -> Iterator[None]:
        """Record a failure of ``layer``'s work in the block (then re-raise it), and write
        the waiting records when the block ends either way."""
        try:
            yield
        except Exception as exc:
            self.error(layer, exc, topic=topic, object=object)
            raise
        finally:
            self.flush()

    def pending(self) -> int:
        """Records waiting to be written."""
        with self._lock:
            return len(self._rows) + len(self._caught_up)

    def due(self) -> bool:
        """Whether the oldest waiting record has waited ``flush_seconds``."""
        with self._lock:
            oldest = self._oldest
        return oldest is not None and self._monotonic() - oldest >= self._flush_seconds

    def flush_if_due(self) -> int:
        """:meth:`flush` when :meth:`due`; the rows written."""
        return self.flush() if self.due() else 0

    def flush(self) -> int:
        """Append the waiting records in one commit; the rows written (0 when the write
        failed: they wait for the next flush)."""
        with self._lock:
            taken = [*self._rows, *self._caught_up.values()]
            self._rows.clear()
            self._caught_up.clear()
            self._oldest = None
        if not taken:
            return 0
        try:
            if not self._ensured:
                self._engine.ensure_table(OPS_TABLE, arrow_schema_to_spark(OPS_SCHEMA))
                self._ensured = True
            result = self._engine.append(
                OPS_TABLE,
                records_to_arrow(taken),
                metadata={"sfcdc.kind": "ops"},
                evolve_schema=False,
            )
        except Exception as exc:  # the data commits must go on; the rows are kept
            self._log.warning(
                "writing %d commit records to %s failed (kept for the next flush): %s",
                len(taken),
                OPS_TABLE,
                exc,
            )
            with self._lock:
                kept = [r for r in taken if r.kind != "caught_up"]
                self._rows.extendleft(reversed(kept))
                for r in taken:
                    if r.kind == "caught_up":
                        self._caught_up.setdefault((r.layer, r.topic), r)
                self._oldest = self._monotonic()
            return 0
        self._log.debug("%s: %d commit records, version %s", OPS_TABLE, result.rows, result.version)
        self._flushes += 1
        if self._maintain_every > 0 and self._flushes % self._maintain_every == 0:
            try:
                self._engine.maintain(OPS_TABLE, compact=True, checkpoint=True)
            except LakeError as exc:
                self._log.warning("compacting %s failed (left for later): %s", OPS_TABLE, exc)
        return result.rows


def recorder_for(
    engine: LakeEngine,
    conf: Conf,
    *,
    listeners: Sequence[Listener] = (),
    logger: logging.Logger | None = None,
) -> OpsRecorder:
    """The recorder ``conf``'s ``ops`` settings describe, writing with ``engine``."""
    ops = conf.pipeline.ops
    return OpsRecorder(
        engine,
        enabled=ops.commits_table,
        flush_seconds=ops.flush_seconds,
        listeners=listeners,
        maintain_every=conf.pipeline.ingest.maintain_every_commits,
        logger=logger,
    )
