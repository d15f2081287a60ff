"""How the workload's transactions become events: :class:`Emitter` keeps the commit clock,
opens transactions (:class:`Tx`: key, commit time and number, user, origin), encodes each
change event (Avro binary with the object's current schema, header parts shared within a
transaction encoded once) and each platform event, draws their event ids, and logs what every
event says (:class:`GeneratedChange`, re-exported by :mod:`ingest.emulator.workload`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from ingest.emulator.avrowriter import AvroWriter, HeaderEncoder
from ingest.emulator.topics import EmittedEvent, TopicDef
from ingest.emulator.values import ValueFactory
from ingest.emulator.workload_mix import Choice
from ingest.emulator.workload_plans import Plan
from ingest.emulator.workload_records import IdSet, Item
from ingest.schema import EventSchema

__all__ = [
    "ChangeTypeName",
    "Emitter",
    "EventKind",
    "GeneratedChange",
    "LogView",
    "Tx",
]

ChangeTypeName = Literal[
    "CREATE",
    "UPDATE",
    "DELETE",
    "UNDELETE",
    "GAP_CREATE",
    "GAP_UPDATE",
    "GAP_DELETE",
    "GAP_UNDELETE",
    "GAP_OVERFLOW",
]
EventKind = Literal[
    "CREATE",
    "UPDATE",
    "DELETE",
    "UNDELETE",
    "GAP_CREATE",
    "GAP_UPDATE",
    "GAP_DELETE",
    "GAP_UNDELETE",
    "GAP_OVERFLOW",
    "PLATFORM_EVENT",
]


@dataclass(frozen=True, slots=True)
class GeneratedChange:
    """What one emitted event says, for tests and oracles to explain differences.

    ``record_ids`` is the header's ``recordIds`` (``("001*",)`` for a wildcard, empty for an
    overflow or a platform event); ``affected_ids`` lists the records the ground truth changed
    through this event when that differs from ``record_ids`` (wildcard: the records whose value
    was nulled; overflow: the records changed without an event). ``changed`` / ``nulled`` /
    ``diffed`` are field names in schema order, ``Parent.Child`` for compound children.
    """

    topic: str
    event_id: str
    schema_id: str
    entity: str
    change_type: EventKind
    record_ids: tuple[str, ...]
    changed: tuple[str, ...] = ()
    nulled: tuple[str, ...] = ()
    diffed: tuple[str, ...] = ()
    transaction_key: str = ""
    sequence_number: int = 0
    commit_timestamp: int = 0
    affected_ids: tuple[str, ...] = ()


_ORIGINS: tuple[tuple[str, float], ...] = (
    ("", 0.35),
    ("com/salesforce/api/soap/62.0;client=SfdcInternalAPI", 0.3),
    ("com/salesforce/api/rest/62.0", 0.15),
    ("com/salesforce/api/rest/62.0;client=sfcdc-sync", 0.05),
    ("com/salesforce/api/apex/62.0", 0.1),
    ("com/salesforce/api/bulkapi/62.0;client=DataLoaderBulkUI/62.0", 0.05),
)
_ORIGIN_CHOICE = Choice(dict(_ORIGINS))
_BULK_ORIGIN = "com/salesforce/api/bulkapi/62.0;client=DataLoaderBulkUI/62.0"
_CLOCK_STEPS = (0, 0, 1, 1, 1, 2, 2, 3, 5, 8)
_UUID_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID_SET = (0x4000 << 64) | (0x8000 << 48)

_ENCODED_STRINGS: dict[str, bytes] = {}


def _encoded_string(value: str) -> bytes:
    """Avro encoding of a string drawn from a small set (origins, user ids), memoized."""
    encoded = _ENCODED_STRINGS.get(value)
    if encoded is None:
        if len(_ENCODED_STRINGS) > 1000:
            _ENCODED_STRINGS.clear()
        encoded = _ENCODED_STRINGS[value] = HeaderEncoder.string(value)
    return encoded


@dataclass(slots=True)
class Tx:
    key: str
    timestamp: int
    commit_number: int
    user: str
    origin: str
    seq: int = 0
    events: list[EmittedEvent] = field(default_factory=list)
    # Header parts shared by every event of the transaction, encoded at its first event.
    origin_and_key: bytes = b""
    commit: bytes = b""

    def encode_shared(self) -> None:
        self.origin_and_key = _encoded_string(self.origin) + HeaderEncoder.string(self.key)
        self.commit = (
            HeaderEncoder.long(self.timestamp)
            + HeaderEncoder.long(self.commit_number)
            + _encoded_string(self.user)
        )


_LogEntry = tuple[
    str, str, str, str, EventKind, tuple[str, ...], tuple[str, ...], tuple[str, ...],
    tuple[str, ...], str, int, int, tuple[str, ...],
]  # fmt: skip


class LogView(Sequence[GeneratedChange]):
    """The log as :class:`GeneratedChange` values, built on access: the generator stores plain
    tuples because building a frozen dataclass per event costs more than encoding it."""

    __slots__ = ("_log",)

    def __init__(self, log: list[_LogEntry]) -> None:
        self._log = log

    @overload
    def __getitem__(self, index: int) -> GeneratedChange: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[GeneratedChange]: ...
    def __getitem__(self, index: int | slice) -> GeneratedChange | Sequence[GeneratedChange]:
        if isinstance(index, slice):
            return tuple(GeneratedChange(*entry) for entry in self._log[index])
        return GeneratedChange(*self._log[index])

    def __len__(self) -> int:
        return len(self._log)


class Emitter:
    """The commit clock, transaction headers, event encoding, event ids and the log.

    ``rng`` is the workload's one seeded generator (``values`` draws from it too);
    ``commit_number`` the first commit number; ``clock_ms`` as in
    :class:`~ingest.emulator.workload.Workload`.
    """

    def __init__(
        self,
        rng: random.Random,
        values: ValueFactory,
        users: tuple[str, ...],
        *,
        start_ms: int,
        commit_number: int,
        clock_ms: Callable[[], int] | None,
    ) -> None:
        self._rng = rng
        self._random = rng.random
        self._values = values
        self._users = users
        self.now = start_ms
        self._clock_ms = clock_ms
        self._commit_number = commit_number
        self.log: list[_LogEntry] = []
        self._writers: dict[str, AvroWriter] = {}

    def writer(self, schema: EventSchema) -> AvroWriter:
        """The full-event writer of ``schema`` (one per schema id)."""
        writer = self._writers.get(schema.schema_id)
        if writer is None:
            writer = self._writers[schema.schema_id] = AvroWriter(schema)
        return writer

    def uuid(self) -> str:
        """A random (version 4) UUID string drawn from the seeded generator."""
        bits = self._rng.getrandbits(128) & _UUID_CLEAR | _UUID_SET
        h = f"{bits:032x}"
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def advance_clock(self) -> None:
        """Move to the next commit: its time and its commit number."""
        if self._clock_ms is not None:
            # Never backwards: commit order and commit time must agree.
            self.now = max(self.now, int(self._clock_ms()))
        else:
            self.now += 1000 * self._values.pick(_CLOCK_STEPS)
        self._commit_number += self._values.between(1, 50_000)

    def begin(self, *, bulk: bool = False) -> Tx:
        """Open the next transaction (``bulk``: a mass operation, often from the Bulk API)."""
        self.advance_clock()
        if bulk and self._random() < 0.6:
            origin = _BULK_ORIGIN
        else:
            origin = _ORIGIN_CHOICE.pick(self._random) or ""
        return Tx(
            key=self.uuid(),
            timestamp=self.now,
            commit_number=self._commit_number,
            user=self._values.pick(self._users),
            origin=origin,
        )

    def next_seq(self, tx: Tx) -> int:
        """The sequence number of ``tx``'s next change (of an object with CDC or not)."""
        if tx.seq == 0:
            tx.seq = 1
        else:
            # Objects without CDC changed in the same transaction take sequence numbers too.
            tx.seq += 1 + (self._values.between(1, 3) if self._random() < 0.15 else 0)
        return tx.seq

    def emit(
        self,
        tx: Tx,
        plan: Plan,
        change_type: ChangeTypeName,
        record_ids: Sequence[str],
        item: Item | None,
        *,
        affected: Sequence[str] = (),
    ) -> str:
        """Append one change event to ``tx`` (``item`` None: header only) and log it; returns
        its event id."""
        changed = item.changed if item else ()
        nulled = item.nulled if item else ()
        diffed = item.diffed if item else ()
        sequence_number = self.next_seq(tx)
        body = item.body if item else {}
        encoder = plan.header
        if encoder is not None:
            if not tx.commit:
                tx.encode_shared()
            payload = b"".join(
                (
                    plan.entity_bytes,
                    encoder.strings(record_ids),
                    encoder.change_type(change_type),
                    tx.origin_and_key,
                    encoder.long(sequence_number),
                    tx.commit,
                    plan.bitmap_bytes(nulled),
                    plan.bitmap_bytes(diffed),
                    plan.bitmap_bytes(changed),
                    plan.body_writer.write(body),
                )
            )
        else:
            datum = dict(body)
            datum["ChangeEventHeader"] = {
                "entityName": plan.entity,
                "recordIds": list(record_ids),
                "changeType": change_type,
                "changeOrigin": tx.origin,
                "transactionKey": tx.key,
                "sequenceNumber": sequence_number,
                "commitTimestamp": tx.timestamp,
                "commitNumber": tx.commit_number,
                "commitUser": tx.user,
                "nulledFields": plan.encoder.encode(nulled),
                "diffFields": plan.encoder.encode(diffed),
                "changedFields": plan.encoder.encode(changed),
            }
            payload = plan.writer.write(datum)
        event_id = self.uuid()
        tx.events.append(EmittedEvent(plan.topic, plan.schema.schema_id, payload, event_id))
        self.log.append(
            (
                plan.topic,
                event_id,
                plan.schema.schema_id,
                plan.entity,
                change_type,
                record_ids if isinstance(record_ids, tuple) else tuple(record_ids),
                changed,
                nulled,
                diffed,
                tx.key,
                sequence_number,
                tx.timestamp,
                tuple(affected),
            )
        )
        return event_id

    def emit_grouped(
        self, tx: Tx, plan: Plan, change_type: ChangeTypeName, items: Sequence[Item]
    ) -> dict[str, str]:
        """Emit ``items``, merging records with an identical change into one event; returns
        record id -> event id."""
        groups: list[tuple[Item, list[str]]] = []
        for item in items:
            for representative, ids in groups:
                if representative.same_event(item):
                    ids.append(item.record_id)
                    break
            else:
                groups.append((item, [item.record_id]))
        out: dict[str, str] = {}
        for representative, ids in groups:
            event_id = self.emit(tx, plan, change_type, ids, representative)
            out.update(dict.fromkeys(ids, event_id))
        return out

    def platform_event(self, topic: TopicDef, accounts: IdSet | None) -> EmittedEvent:
        """One platform event on ``topic`` at the current commit time, logged; ``accounts``
        (the live Account ids) supply ``Account_Id__c``."""
        schema = topic.current_schema
        if schema is None:
            raise ValueError(f"platform event topic {topic.name} has no schema")
        entity = topic.entity or schema.entity_name
        if self._clock_ms is not None:
            created = self.now
        else:
            created = self.now + self._values.between(0, 999)
        datum: dict[str, Any] = {}
        for info in schema.fields:
            if info.name == "CreatedDate":
                datum[info.name] = created
            elif info.name == "CreatedById":
                datum[info.name] = (
                    self._users[0] if self._random() < 0.8 else self._values.pick(self._users)
                )
            elif info.nullable and self._random() < 0.15:
                datum[info.name] = None
            elif info.name == "Account_Id__c":
                datum[info.name] = accounts.pick(self._random) if accounts else None
            elif info.kind == "long_text":
                datum[info.name] = self._values.long_text(newline="\n", html=False, long=False)
            elif info.is_compound:
                datum[info.name] = self._values.compound(info)
            elif info.kind in ("id", "record", "other"):
                datum[info.name] = None if info.nullable else self._users[0]
            else:
                datum[info.name] = self._values.scalar(entity, info, now_ms=self.now)
        payload = self.writer(schema).write(datum)
        event_id = self.uuid()
        self.log.append(
            (
                topic.name,
                event_id,
                schema.schema_id,
                entity,
                "PLATFORM_EVENT",
                (),
                (),
                (),
                (),
                "",
                0,
                created,
                (),
            )
        )
        return EmittedEvent(topic.name, schema.schema_id, payload, event_id)
