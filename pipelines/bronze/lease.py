"""Leases: one landing per topic and lake at a time, refused at start rather than at a commit.

Two landings of one topic into one lake would both append bronze batch ``N`` and one would fail
on a commit conflict after a while. So a landing first takes a lease on each of its topics in
the Delta table ``bronze.sfcdc_leases``, which either engine can write wherever the lake lives
(a local directory, cloud storage, Unity Catalog), and renews it every third of
``ingest.lease_seconds``.

How a lease is taken without a lock service. Each topic's lease rows carry a *generation*,
recorded as the Delta application transaction ``(sfcdc.lease:<topic>, generation)`` in the
same commit as the row. Taking, renewing and releasing a lease all append generation ``g + 1``
after reading generation ``g``: Delta records a transaction version once, so of two writers
appending the same generation one wins and the other finds it applied (skipped) or fails on
the conflict, and learns that somebody else wrote in between. A lease is free when its latest
row was released or has expired (``expires_at`` in the past); a process killed without
releasing leaves a lease that expires ``lease_seconds`` after its last renewal and is then
taken over; on the holder's own host a lease whose process no longer exists is taken over at
once (a restart after a crash on a laptop or a driver does not wait). A holder whose renewal
finds a newer generation than its own lost the lease (it stalled for longer than the lease
lasts) and stops.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ingest.errors import LakeError, LeaseHeldError
from pipelines.bronze.tables import LEASE_TABLE
from pipelines.engines.base import TableRef, Txn

if TYPE_CHECKING:
    from pipelines.engines.base import LakeEngine

__all__ = ["LEASE_SCHEMA", "Lease", "LeaseHolder", "LeaseStore", "lease_app_id"]

_log = logging.getLogger(__name__)
_TIMESTAMP = pa.timestamp("us", tz="UTC")
# Compact the lease table and checkpoint its log after this many renewals.
_MAINTAIN_EVERY = 100

LEASE_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("generation", pa.int64(), nullable=False),
        pa.field("owner", pa.string(), nullable=False),
        pa.field("host", pa.string(), nullable=False),
        pa.field("pid", pa.int64(), nullable=False),
        pa.field("acquired_at", _TIMESTAMP, nullable=False),
        pa.field("renewed_at", _TIMESTAMP, nullable=False),
        pa.field("expires_at", _TIMESTAMP, nullable=False),
        pa.field("released", pa.bool_(), nullable=False),
    ]
)


def lease_app_id(topic: str) -> str:
    """The Delta application-transaction id of a topic's lease rows."""
    return f"sfcdc.lease:{topic}"


@dataclass(frozen=True)
class Lease:
    """A topic's latest lease row."""

    topic: str
    generation: int
    owner: str
    host: str
    pid: int
    acquired_at: datetime
    renewed_at: datetime
    expires_at: datetime
    released: bool

    def describe(self) -> str:
        return (
            f"host {self.host}, pid {self.pid}, since {_iso(self.acquired_at)}, until "
            f"{_iso(self.expires_at)} unless renewed"
        )


def _alive(pid: int) -> bool:
    """Whether a process with this id exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists, under another user
        return True
    return True


def _iso(value: datetime) -> str:
    return value.astimezone(timezone.utc).isoformat(timespec="seconds")


class LeaseStore:
    """Reads and writes the lease rows of ``table``; ``clock`` (epoch seconds) says what time
    it is, so expiry can be tested without waiting."""

    def __init__(
        self,
        engine: LakeEngine,
        *,
        table: TableRef | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._engine = engine
        self.table = table or TableRef("bronze", LEASE_TABLE)
        self._clock = clock

    def now(self) -> datetime:
        return datetime.fromtimestamp(self._clock(), tz=timezone.utc)

    def latest(self, topic: str) -> Lease | None:
        """The topic's latest lease row, if it ever had one."""
        return self.latest_of([topic])[topic]

    def latest_of(self, topics: Sequence[str]) -> dict[str, Lease | None]:
        """Each topic's latest lease row (``None``: it never had one), with one read of the
        table: each topic's generation is its transaction version, looked up topic by topic
        (an engine may refresh the log between two lookups), and then one read fetches the
        rows of those topics at those generations. A row is written in the commit that
        records its generation, so the read, which comes after the lookups, finds it."""
        found: dict[str, Lease | None] = dict.fromkeys(topics)
        if not topics or not self._engine.exists(self.table):
            return found
        generations = {
            topic: generation
            for topic in found
            if (generation := self._engine.txn_version(self.table, lease_app_id(topic))) is not None
        }
        if not generations:
            return found
        rows = self._engine.read_arrow(
            self.table,
            where=[
                ("topic", "in", sorted(generations)),
                ("generation", "in", sorted(set(generations.values()))),
            ],
        ).to_pylist()
        for row in rows:
            if generations.get(row["topic"]) == row["generation"]:
                found[row["topic"]] = Lease(**{name: row[name] for name in LEASE_SCHEMA.names})
        return found

    def write(self, leases: Sequence[Lease]) -> list[bool]:
        """Append ``leases`` (distinct topics), each under its topic's transaction version
        ``generation``; True where the row was written, False where another writer had written
        that generation first."""
        parts = [
            (
                pa.Table.from_pylist([_record(lease)], schema=LEASE_SCHEMA),
                Txn(lease_app_id(lease.topic), lease.generation),
            )
            for lease in leases
        ]
        try:
            results = self._engine.append_parts(
                self.table, parts, metadata={"sfcdc.lease": ",".join(x.topic for x in leases)}
            )
        except LakeError as exc:
            if _io_failure(exc):
                # The lake cannot be written (read-only, no permission, no space): not
                # another landing's lease.
                raise
            # A concurrent writer of the same transaction: Delta refused this commit.
            return [False] * len(leases)
        return [not result.skipped for result in results]

    def maintain(self) -> None:
        self._engine.maintain(self.table)


def _io_failure(exc: BaseException) -> bool:
    """Whether an operating system error caused ``exc`` (rather than a commit conflict)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _record(lease: Lease) -> dict[str, Any]:
    return {name: getattr(lease, name) for name in LEASE_SCHEMA.names}


class LeaseHolder:
    """The leases of one landing: :meth:`acquire` takes every topic's lease or none (raising
    :class:`~ingest.errors.LeaseHeldError` naming the holder), a thread renews them every
    third of ``seconds``, and :meth:`release` gives them back. ``on_lost`` is called (from the
    renewing thread) with the error when a renewal finds the lease taken over."""

    def __init__(
        self,
        store: LeaseStore,
        topics: Sequence[str],
        *,
        seconds: float,
        on_lost: Callable[[LeaseHeldError], None],
        host: str | None = None,
        pid: int | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        if seconds <= 0:
            raise ValueError(f"a lease lasts > 0 seconds (got {seconds})")
        self._store = store
        self._topics = list(dict.fromkeys(topics))
        self._seconds = seconds
        self._on_lost = on_lost
        self.host = host or socket.gethostname()
        self.pid = os.getpid() if pid is None else pid
        self.owner = f"{self.host}:{self.pid}:{uuid.uuid4()}"
        self._log = logger or _log
        self._held: dict[str, Lease] = {}
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._renewals = 0

    @property
    def held(self) -> dict[str, Lease]:
        with self._lock:
            return dict(self._held)

    def acquire(self) -> None:
        """Take every topic's lease, or raise naming who holds one (taking none)."""
        now = self._store.now()
        wanted: list[Lease] = []
        latest = self._store.latest_of(self._topics)
        for topic in self._topics:
            current = latest[topic]
            if current is not None and self._in_force(current, now):
                raise self._held_error(topic, current)
            wanted.append(self._row(topic, (current.generation if current else 0) + 1, now, now))
        written = self._store.write(wanted)
        lost = [lease.topic for lease, ok in zip(wanted, written, strict=True) if not ok]
        if lost:
            # Somebody took one between our read and our commit: give back what we took.
            taken = [lease for lease, ok in zip(wanted, written, strict=True) if ok]
            self._give_back(taken)
            current = self._store.latest(lost[0])
            if current is None:
                raise LeaseHeldError(
                    f"{lost[0]}: another landing took the lease of this topic while this one "
                    "was taking it; only one landing of a topic may run at once"
                )
            raise self._held_error(lost[0], current)
        with self._lock:
            self._held = {lease.topic: lease for lease in wanted}
        self._log.info(
            "leased %s until %s (%s)",
            ", ".join(self._topics),
            _iso(wanted[0].expires_at) if wanted else "-",
            self.owner,
        )
        self._thread = threading.Thread(target=self._renew_loop, name="sfcdc-lease", daemon=True)
        self._thread.start()

    def renew(self) -> bool:
        """Renew every held lease now; False (after calling ``on_lost``) when one was taken
        over."""
        now = self._store.now()
        with self._lock:
            held = list(self._held.values())
        if not held:
            return True
        rows = [
            self._row(lease.topic, lease.generation + 1, lease.acquired_at, now) for lease in held
        ]
        written = self._store.write(rows)
        if not all(written):
            topic = next(r.topic for r, ok in zip(rows, written, strict=True) if not ok)
            current = self._store.latest(topic)
            with self._lock:
                self._held = {}
            holder = current.describe() if current is not None else "unknown"
            self._on_lost(
                LeaseHeldError(
                    f"{topic}: this landing's lease was taken over by another landing ({holder}) "
                    f"after it went unrenewed for more than {self._seconds:g} s; stopping so "
                    "that the two do not land the same topic"
                )
            )
            return False
        with self._lock:
            self._held = {row.topic: row for row in rows}
        self._renewals += 1
        if self._renewals % _MAINTAIN_EVERY == 0:
            try:
                self._store.maintain()
            except Exception as exc:  # maintenance must not cost the lease
                self._log.warning("maintenance of %s failed: %s", self._store.table, exc)
        return True

    def release(self) -> None:
        """Stop renewing and give every held lease back (the next landing starts at once)."""
        self._done.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
            held = list(self._held.values())
            self._held = {}
        self._give_back(held)

    def _give_back(self, leases: Sequence[Lease]) -> None:
        if not leases:
            return
        now = self._store.now()
        rows = [
            Lease(
                lease.topic,
                lease.generation + 1,
                self.owner,
                self.host,
                self.pid,
                lease.acquired_at,
                now,
                now,
                True,
            )
            for lease in leases
        ]
        try:
            self._store.write(rows)
        except Exception as exc:  # the lease then expires on its own
            self._log.warning("releasing the leases failed (they expire on their own): %s", exc)

    def _renew_loop(self) -> None:
        while not self._done.wait(self._seconds / 3):
            try:
                if not self.renew():
                    return
            except Exception as exc:  # retried at the next tick; expiry is the backstop
                self._log.warning("renewing the leases of %s failed: %s", self._topics, exc)

    def _in_force(self, lease: Lease, now: datetime) -> bool:
        if lease.released or lease.expires_at <= now:
            return False
        if lease.host == self.host and lease.pid != self.pid and not _alive(lease.pid):
            self._log.warning(
                "%s: taking over the lease of process %d on this host, which no longer exists",
                lease.topic,
                lease.pid,
            )
            return False
        return True

    def _row(self, topic: str, generation: int, acquired: datetime, now: datetime) -> Lease:
        expires = datetime.fromtimestamp(now.timestamp() + self._seconds, tz=timezone.utc)
        return Lease(
            topic, generation, self.owner, self.host, self.pid, acquired, now, expires, False
        )

    def _held_error(self, topic: str, lease: Lease) -> LeaseHeldError:
        return LeaseHeldError(
            f"{topic}: another landing holds this topic's lease in {self._store.table} "
            f"({lease.describe()}); two landings of one topic into one lake cannot run at "
            "once. Stop that one first, or wait for its lease to expire if it was killed "
            f"(leases last ingest.lease_seconds, here {self._seconds:g} s, after the last "
            "renewal)"
        )
