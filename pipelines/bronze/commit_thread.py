"""The committer thread of a landing: the one thread that writes Delta, fed with the batches
the consuming thread seals.

Both landings run one: the Pub/Sub API's (:class:`~pipelines.bronze.landing.BronzeLanding`,
whose rounds :class:`~pipelines.bronze.committer.BatchCommitter` lands) and the Streaming
API's (:class:`~pipelines.bronze.cometd.CometdLanding`, with
:class:`~pipelines.bronze.cometd_commit.CometdCommitter`). The thread only takes the rounds and
bounds what waits; how a round lands, in what order its commits go and what they record is the
committer's.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

__all__ = ["CommitThread"]

_WAIT = 0.1  # poll interval of waits that must notice a failed committer


class _Payload(Protocol):
    @property
    def nbytes(self) -> int: ...


class _Sealed(Protocol):
    @property
    def batch(self) -> _Payload: ...


B = TypeVar("B", bound=_Sealed)


class CommitThread(Generic[B]):
    """The one thread that writes Delta. Batches are committed in rounds: a round takes the
    oldest waiting batch of each stream (``stream`` names a batch's topic or channel), so each
    stream's batches stay in hand-over order, and ``commit`` lands them together, their
    checkpoint rows in one commit.

    Batches of ``limit`` streams, or of ``max_bytes`` payload bytes, may wait while a round is
    under way; :meth:`submit` waits beyond that, which bounds memory whatever the backlog.

    A failed ``commit`` is logged with ``logger`` (``describe`` says what the round was
    committing) and raised by the next :meth:`check`, :meth:`submit` or :meth:`wait_idle`.
    ``name`` names the thread.
    """

    def __init__(
        self,
        commit: Callable[[list[B]], None],
        *,
        stream: Callable[[B], str],
        describe: Callable[[list[B]], str],
        name: str,
        logger: logging.Logger,
        limit: int = 1,
        max_bytes: int | None = None,
    ) -> None:
        self._commit = commit
        self._stream = stream
        self._describe = describe
        self._log = logger
        self._limit = max(1, limit)
        self._max_bytes = max_bytes
        self._cond = threading.Condition()
        self._pending: deque[B] = deque()
        self._pending_bytes = 0
        self._busy = False
        self._closing = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def check(self) -> None:
        """Raise the committer's failure, if it failed."""
        error = self._error
        if error is not None:
            raise error

    def _full(self) -> bool:
        if not self._pending:
            return False
        if len(self._pending) >= self._limit:
            return True
        return self._max_bytes is not None and self._pending_bytes >= self._max_bytes

    def submit(self, sealed: B) -> None:
        """Hand a batch over; waits while as many as the committer holds are waiting."""
        with self._cond:
            while self._full():
                self.check()
                self._cond.wait(_WAIT)
            self.check()
            self._pending.append(sealed)
            self._pending_bytes += sealed.batch.nbytes
            self._cond.notify_all()

    def wait_idle(self) -> None:
        """Wait until every batch handed over is committed."""
        with self._cond:
            while self._pending or self._busy:
                self.check()
                self._cond.wait(_WAIT)
        self.check()

    def close(self) -> None:
        """Let the round under way finish, then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    def _take_round(self) -> list[B]:
        # Under the lock: the oldest waiting batch of each stream, in hand-over order.
        taken: list[B] = []
        streams: set[str] = set()
        rest: deque[B] = deque()
        for sealed in self._pending:
            stream = self._stream(sealed)
            if stream in streams:
                rest.append(sealed)
            else:
                streams.add(stream)
                taken.append(sealed)
        self._pending = rest
        self._pending_bytes = sum(s.batch.nbytes for s in rest)
        return taken

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending:
                    return
                round_, self._busy = self._take_round(), True
                self._cond.notify_all()
            try:
                self._commit(round_)
            except BaseException as exc:  # surfaced in the consuming thread, which stops
                self._log.error("%s failed: %s", self._describe(round_), exc)
                with self._cond:
                    self._error = exc
                    self._busy = False
                    self._cond.notify_all()
                return
            with self._cond:
                self._busy = False
                self._cond.notify_all()
