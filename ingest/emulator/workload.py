"""A seeded, deterministic generator of Salesforce change events and platform events.

:class:`Workload` plays an org's users: it runs transactions against the objects of a
:class:`~ingest.emulator.topics.Catalogue`, emits the change events Salesforce would emit for
them (Avro binary, written with the topic's schema at that moment) and keeps the
:class:`~ingest.emulator.truth.GroundTruth` (what the org holds afterwards) in step.

Same ``seed`` and same calls give byte-identical events, event ids included: everything random
comes from one ``random.Random(seed)``. Events come out in commit order.

What a transaction looks like on the wire:

* all its events share ``transactionKey``, ``commitTimestamp`` (epoch ms, whole seconds) and
  ``commitNumber`` (increasing, beyond 2**53, within int64); ``sequenceNumber`` starts at 1 and
  increases across the transaction's objects, with gaps where objects without CDC changed;
* ``changeOrigin`` is empty (UI) or ``com/salesforce/api/<api>/62.0[;client=<id>]``;
  ``commitUser`` is a ``005`` user id;
* the same change to several records of one object becomes one event listing every id (mass
  update, mass delete, merged gap events); different changes are separate events.

What the mix produces (weights in :class:`WorkloadMix`): CREATE (every field present, null
only when empty), UPDATE (only changed fields carry values; ``changedFields`` includes
``LastModifiedDate`` and nulled and diffed fields; compound children are flagged one by one in
``P-0x..`` elements without the parent's own bit), long text edits sent as diffs when the rules
of :mod:`ingest.emulator.textdiff` allow, DELETE (empty body; deleting an Account also deletes
its Contacts and Opportunities, in the same transaction), UNDELETE (the full record; an
Account brings back the children deleted with it), lead conversions (Account + Contact +
Opportunity linked by lookups), GAP_CREATE / GAP_UPDATE / GAP_DELETE / GAP_UNDELETE (header
only, the change still happens), GAP_OVERFLOW (a mass update whose first records have UPDATE
events and the rest none), wildcard UPDATEs (``recordIds == ["001*"]``: a custom field nulled
on every record by a lossy type conversion) and platform events (``CreatedDate`` the publish
time in epoch ms, ``CreatedById`` a user, custom fields mostly set). The generator never emits
an impossible event: no UPDATE or DELETE of a deleted record, no UNDELETE of a live one, and
live records only reference live records.

The ground truth's semantics (what each change type does to a record) are documented in
:mod:`ingest.emulator.truth`; person accounts are Account records only (their hidden Contact
has no change events here).
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from ingest.emulator import catalogue as shipped
from ingest.emulator.avrowriter import AvroWriter, HeaderEncoder
from ingest.emulator.bitmaps import BitmapEncoder
from ingest.emulator.ids import IdFactory, assign_key_prefixes, key_prefix, to_18
from ingest.emulator.textdiff import Newline, decide_diff
from ingest.emulator.topics import Catalogue, EmittedEvent, TopicDef
from ingest.emulator.truth import GroundTruth
from ingest.emulator.values import ValueFactory
from ingest.schema import EventSchema, FieldInfo

__all__ = [
    "DEFAULT_START_MS",
    "ChangeTypeName",
    "EventKind",
    "GeneratedChange",
    "TransactionKind",
    "Workload",
    "WorkloadMix",
]

logger = logging.getLogger(__name__)

DEFAULT_START_MS = 1_735_689_600_000  # 2025-01-01T00:00:00Z

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
TransactionKind = Literal[
    "create",
    "update",
    "bulk_update",
    "mass_update",
    "delete",
    "mass_delete",
    "undelete",
    "lead_conversion",
    "gap",
    "overflow",
    "wildcard",
    "platform_event",
]
_KINDS: tuple[TransactionKind, ...] = (
    "create",
    "update",
    "bulk_update",
    "mass_update",
    "delete",
    "mass_delete",
    "undelete",
    "lead_conversion",
    "gap",
    "overflow",
    "wildcard",
    "platform_event",
)
_DEFAULT_ENTITY_WEIGHTS = {"Account": 3.0, "Contact": 4.0, "Opportunity": 3.0, "Invoice__c": 2.0}


@dataclass(frozen=True)
class WorkloadMix:
    """Relative weights of transaction kinds, and a few shape parameters.

    Weights need not sum to anything; a kind that is impossible at the moment (an UNDELETE
    with nothing deleted) is skipped for that transaction. The defaults follow what a busy org
    sends: mostly single-record updates, a steady share of creates, a few mass operations,
    rare gaps and overflows. ``entity_weights`` picks the object a transaction works on;
    ``None`` means realistic defaults for the shipped objects and 1.0 for any other; an object
    left out of a given mapping gets weight 0 (it still receives cascades and lead
    conversions).
    ``fill_ratio`` is the share of optional fields a new record fills, ``long_text_ratio`` the
    share of long text values of 1,000+ characters, ``long_text_edit_ratio`` how often an
    update prefers a long text field (the source of diffs), ``max_batch`` the records of one
    mass operation.
    ``live_share`` above 0 holds the population: while fewer than that share of the records
    created so far are live, a delete becomes an undelete; a gap never creates a record; and a
    transaction that does not fit changes a live record instead of creating one. With
    ``create`` and ``lead_conversion`` at 0 the number of records then stays where it is, which
    deletes would otherwise drain (and the fallback creates refill) within a few hundred
    thousand events.
    """

    create: float = 15.0
    update: float = 48.0
    bulk_update: float = 4.0
    mass_update: float = 3.0
    delete: float = 3.0
    mass_delete: float = 1.0
    undelete: float = 2.0
    lead_conversion: float = 3.0
    gap: float = 0.4
    overflow: float = 0.02
    wildcard: float = 0.01
    platform_event: float = 8.0
    entity_weights: Mapping[str, float] | None = None
    person_account_ratio: float = 0.3
    crlf_ratio: float = 0.4
    fill_ratio: float = 0.6
    long_text_ratio: float = 0.6
    long_text_edit_ratio: float = 0.2
    max_batch: int = 12
    live_share: float = 0.0

    def __post_init__(self) -> None:
        for kind in _KINDS:
            _check_weight(kind, getattr(self, kind))
        if not any(getattr(self, kind) > 0 for kind in _KINDS):
            raise ValueError(f"WorkloadMix needs a positive weight for one of {', '.join(_KINDS)}")
        if self.entity_weights is not None:
            if not isinstance(self.entity_weights, Mapping):
                raise ValueError(
                    "entity_weights must be a mapping of entity name to weight "
                    f"(got {type(self.entity_weights).__name__})"
                )
            for entity, weight in self.entity_weights.items():
                _check_weight(f"entity_weights[{entity!r}]", weight)
        for name in (
            "person_account_ratio",
            "crlf_ratio",
            "fill_ratio",
            "long_text_ratio",
            "long_text_edit_ratio",
            "live_share",
        ):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a number in [0, 1] (got {value!r})")
        if not isinstance(self.max_batch, int) or isinstance(self.max_batch, bool):
            raise ValueError(f"max_batch must be an int >= 3 (got {self.max_batch!r})")
        if self.max_batch < 3:
            raise ValueError(f"max_batch must be an int >= 3 (got {self.max_batch!r})")

    def weights(self) -> dict[TransactionKind, float]:
        return {kind: float(getattr(self, kind)) for kind in _KINDS}


def _check_weight(name: str, value: object) -> None:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"weight {name} must be a finite number >= 0 (got {value!r})")


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


# -- per-object knowledge of the shipped objects ------------------------------------------------

_SYSTEM = frozenset({"CreatedDate", "CreatedById", "LastModifiedDate", "LastModifiedById"})
_USER_FIELDS = frozenset({"OwnerId"})
_LOOKUPS: dict[str, dict[str, str]] = {
    "Account": {"ParentId": "Account"},
    "Contact": {"AccountId": "Account", "ReportsToId": "Contact"},
    "Opportunity": {"AccountId": "Account", "ContactId": "Contact"},
    "Invoice__c": {"Account__c": "Account", "Contact__c": "Contact"},
}
# Deleting an Account deletes its Contacts and Opportunities in the same transaction.
_CASCADE: dict[str, tuple[tuple[str, str], ...]] = {
    "Account": (("Contact", "AccountId"), ("Opportunity", "AccountId")),
}
_REQUIRED: dict[str, frozenset[str]] = {
    "Account": frozenset({"Name", "OwnerId"}),
    "Contact": frozenset({"Name", "OwnerId"}),
    "Opportunity": frozenset({"Name", "StageName", "CloseDate", "OwnerId"}),
    "Invoice__c": frozenset({"Name", "OwnerId"}),
}
_REQUIRED_CHILDREN = frozenset({"LastName"})
_READ_ONLY: dict[str, frozenset[str]] = {
    "Opportunity": frozenset({"ExpectedRevenue", "IsClosed", "IsWon", "LastStageChangeDate"}),
    "Invoice__c": frozenset({"Name"}),  # an auto-number
}
_STAGES: dict[str, tuple[float, bool, bool]] = {
    "Prospecting": (10.0, False, False),
    "Qualification": (10.0, False, False),
    "Needs Analysis": (20.0, False, False),
    "Value Proposition": (50.0, False, False),
    "Id. Decision Makers": (60.0, False, False),
    "Perception Analysis": (70.0, False, False),
    "Proposal/Price Quote": (75.0, False, False),
    "Negotiation/Review": (90.0, False, False),
    "Closed Won": (100.0, True, True),
    "Closed Lost": (0.0, True, False),
}
_ORIGINS: tuple[tuple[str, float], ...] = (
    ("", 0.35),
    ("com/salesforce/api/soap/62.0;client=SfdcInternalAPI", 0.3),
    ("com/salesforce/api/rest/62.0", 0.15),
    ("com/salesforce/api/rest/62.0;client=sfcdc-sync", 0.05),
    ("com/salesforce/api/apex/62.0", 0.1),
    ("com/salesforce/api/bulkapi/62.0;client=DataLoaderBulkUI/62.0", 0.05),
)
_BULK_ORIGIN = "com/salesforce/api/bulkapi/62.0;client=DataLoaderBulkUI/62.0"
_CLOCK_STEPS = (0, 0, 1, 1, 1, 2, 2, 3, 5, 8)
_UUID_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID_SET = (0x4000 << 64) | (0x8000 << 48)
_GAP_TYPES: tuple[ChangeTypeName, ...] = ("GAP_CREATE", "GAP_UPDATE", "GAP_DELETE", "GAP_UNDELETE")

Category = Literal[
    "system", "read_only", "lookup", "user", "record_type", "unknown_id", "long_text",
    "compound", "name", "scalar", "other",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class _FieldPlan:
    info: FieldInfo
    category: Category
    required: bool
    target: str | None = None
    person_only: bool = False
    business_only: bool = False
    maker: Callable[[int], Any] | None = None
    always: bool = False  # present in every CREATE (required, or a checkbox: never null)


@dataclass
class _Plan:
    """Everything about one object's current schema that generation needs, resolved once."""

    entity: str
    topic: str
    prefix: str
    schema: EventSchema
    writer: AvroWriter
    body_writer: AvroWriter
    header: HeaderEncoder | None
    entity_bytes: bytes
    encoder: BitmapEncoder
    fields: dict[str, _FieldPlan]
    order: dict[str, tuple[int, int]]
    compounds: dict[str, tuple[str, ...]]
    editable: tuple[_FieldPlan, ...]
    mass: tuple[_FieldPlan, ...]
    wildcard: tuple[_FieldPlan, ...]
    lookups: frozenset[str]
    _editable: dict[bool, tuple[_FieldPlan, ...]] = field(default_factory=dict)
    _texts: dict[bool, tuple[_FieldPlan, ...]] = field(default_factory=dict)
    _bitmaps: dict[tuple[str, ...], bytes] = field(default_factory=dict)

    def has(self, name: str) -> bool:
        return name in self.fields

    def bitmap_bytes(self, names: tuple[str, ...]) -> bytes:
        """The Avro encoding of the bitmap array for ``names`` (memoized: combinations repeat)."""
        encoded = self._bitmaps.get(names)
        if encoded is None:
            if len(self._bitmaps) >= 20_000:
                self._bitmaps.clear()
            encoded = self._bitmaps[names] = HeaderEncoder.strings(self.encoder.encode(names))
        return encoded

    def texts_for(self, person: bool) -> tuple[_FieldPlan, ...]:
        """The long text fields among :meth:`editable_for`."""
        cached = self._texts.get(person)
        if cached is None:
            cached = self._texts[person] = tuple(
                fp for fp in self.editable_for(person) if fp.category == "long_text"
            )
        return cached

    def editable_for(self, person: bool) -> tuple[_FieldPlan, ...]:
        """Editable fields of a person (or business) account; of any record elsewhere."""
        cached = self._editable.get(person)
        if cached is None:
            cached = self._editable[person] = tuple(
                fp
                for fp in self.editable
                if not (fp.person_only and not person) and not (fp.business_only and person)
            )
        return cached


@dataclass(slots=True)
class _Meta:
    newline: Newline
    person: bool
    order: int
    cascade_root: str | None = None


class _Choice:
    """A weighted choice among keys with one random draw (keys of weight <= 0 never win)."""

    __slots__ = ("_bounds", "_keys", "_total")

    def __init__(self, weights: Mapping[str, float]) -> None:
        self._keys = [k for k, w in weights.items() if w > 0]
        self._bounds = list(itertools.accumulate(w for w in weights.values() if w > 0))
        self._total = self._bounds[-1] if self._bounds else 0.0

    def pick(self, random_: Callable[[], float]) -> str | None:
        if not self._keys:
            return None
        i = bisect.bisect_right(self._bounds, random_() * self._total)
        return self._keys[min(i, len(self._keys) - 1)]


class _IdSet:
    """An ordered set with O(1) add, remove and random pick (deterministic order)."""

    __slots__ = ("_index", "_items")

    def __init__(self) -> None:
        self._items: list[str] = []
        self._index: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, item: object) -> bool:
        return item in self._index

    def add(self, item: str) -> None:
        if item not in self._index:
            self._index[item] = len(self._items)
            self._items.append(item)

    def remove(self, item: str) -> None:
        i = self._index.pop(item)
        last = self._items.pop()
        if i < len(self._items):
            self._items[i] = last
            self._index[last] = i

    def pick(self, random_: Callable[[], float]) -> str:
        return self._items[int(random_() * len(self._items))]


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
class _Tx:
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


@dataclass(slots=True)
class _Item:
    """One record's part of an event: body, bitmap names, and what the truth must apply."""

    record_id: str
    body: dict[str, Any]
    changed: tuple[str, ...] = ()
    nulled: tuple[str, ...] = ()
    diffed: tuple[str, ...] = ()
    changes: dict[str, Any] = field(default_factory=dict)

    def same_event(self, other: _Item) -> bool:
        return (
            self.changed == other.changed
            and self.nulled == other.nulled
            and self.diffed == other.diffed
            and self.body == other.body
        )


_LogEntry = tuple[
    str, str, str, str, EventKind, tuple[str, ...], tuple[str, ...], tuple[str, ...],
    tuple[str, ...], str, int, int, tuple[str, ...],
]  # fmt: skip


class _LogView(Sequence[GeneratedChange]):
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


class Workload:
    """Generates an org's change events and platform events, and keeps the ground truth.

    ``catalogue`` is used and mutated in place: :meth:`change_schema` adds schema versions to
    it, so give the emulator server the same instance. Every change event topic of the
    catalogue gets records (the shipped objects with realistic values and links, any other
    object with values by field type); platform event topics get events. ``seed`` fixes every
    byte produced. ``start_ms`` (epoch ms, whole seconds) is the first commit time; ``mix``
    weighs the transaction kinds (:class:`WorkloadMix`); ``org_id`` (15 or 18 chars, ``00D``)
    defaults to one derived from the seed, and every generated id shares its pod.

    ``clock_ms`` (epoch milliseconds) makes each transaction's ``commitTimestamp`` the time it
    is generated, to the millisecond, instead of a simulated clock of whole seconds. Salesforce
    stamps whole seconds; measuring how long an event takes to reach the lake needs the real
    moment, or the truncation dominates the figure. Events are then no longer reproducible.
    """

    def __init__(
        self,
        catalogue: Catalogue,
        *,
        seed: int,
        start_ms: int = DEFAULT_START_MS,
        mix: WorkloadMix | None = None,
        org_id: str | None = None,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        if not isinstance(catalogue, Catalogue):
            raise TypeError(f"catalogue must be a Catalogue (got {type(catalogue).__name__})")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed must be an int (got {seed!r})")
        if not isinstance(start_ms, int) or isinstance(start_ms, bool) or start_ms < 0:
            raise ValueError(f"start_ms must be a non-negative int of epoch ms (got {start_ms!r})")
        if start_ms % 1000:
            raise ValueError(
                f"start_ms must be whole seconds: commit timestamps have second resolution "
                f"(got {start_ms}, remainder {start_ms % 1000} ms)"
            )
        if mix is not None and not isinstance(mix, WorkloadMix):
            raise TypeError(f"mix must be a WorkloadMix (got {type(mix).__name__})")
        self._catalogue = catalogue
        self._seed = seed
        self._mix = mix or WorkloadMix()
        self._rng = random.Random(seed)
        self._random = self._rng.random
        self._org_id = self._resolve_org_id(org_id)
        self._ids = IdFactory(self._rng, pod=self._org_id[3:5])
        self._now = start_ms
        self._clock_ms = clock_ms
        self._commit_number = (1 << 60) + self._rng.randrange(1 << 50)
        self._values = ValueFactory(self._rng, start_ms=start_ms)
        self._users = tuple(self._ids.new("005") for _ in range(6))
        self._log: list[_LogEntry] = []
        self._truth = GroundTruth(org_id=self._org_id)

        change_topics = [t for t in catalogue if t.kind == "change_events"]
        self._pe_topics = [t for t in catalogue if t.kind == "platform_event"]
        if not change_topics and not self._pe_topics:
            raise ValueError(
                "the catalogue has no change event or platform event topic to generate events for"
            )
        entities = [self._entity_of(t) for t in change_topics]
        self._prefixes = assign_key_prefixes(entities)
        self._record_types = {e: tuple(self._ids.new("012") for _ in range(3)) for e in entities}
        self._plans: dict[str, _Plan] = {}
        self._writers: dict[str, AvroWriter] = {}
        for topic in change_topics:
            self._install(topic)
        self._entity_weights = self._resolve_entity_weights(entities)
        self._entity_choice = _Choice(self._entity_weights)
        self._kind_choices: dict[tuple[bool, bool], _Choice] = {}
        self._live: dict[str, _IdSet] = {e: _IdSet() for e in entities}
        self._live_total = 0
        self._dead_total = 0
        self._dead: dict[str, _IdSet] = {e: _IdSet() for e in entities}
        self._meta: dict[str, dict[str, _Meta]] = {e: {} for e in entities}
        self._referrers: dict[str, dict[tuple[str, str, str], None]] = {}
        self._cascaded: dict[str, list[tuple[str, str]]] = {}
        self._created = 0

    # -- public API ---------------------------------------------------------------------------

    @property
    def catalogue(self) -> Catalogue:
        return self._catalogue

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def mix(self) -> WorkloadMix:
        return self._mix

    @mix.setter
    def mix(self, mix: WorkloadMix) -> None:
        """Generate the next transactions with another mix (a soak first creates a population
        of records, then only changes them, so its tables stop growing)."""
        if not isinstance(mix, WorkloadMix):
            raise TypeError(f"mix must be a WorkloadMix (got {type(mix).__name__})")
        self._mix = mix
        self._entity_weights = self._resolve_entity_weights(list(self._plans))
        self._entity_choice = _Choice(self._entity_weights)
        self._kind_choices.clear()

    @property
    def org_id(self) -> str:
        """The org's 18-char id (``00D``)."""
        return self._org_id

    @property
    def users(self) -> tuple[str, ...]:
        """The org's users (``005`` ids): commit users, owners, platform event publishers."""
        return self._users

    @property
    def now_ms(self) -> int:
        """Commit time of the latest transaction (epoch ms; whole seconds without
        ``clock_ms``)."""
        return self._now

    @property
    def truth(self) -> GroundTruth:
        """The org's state after every event generated so far (updated per transaction)."""
        return self._truth

    @property
    def log(self) -> Sequence[GeneratedChange]:
        """One :class:`GeneratedChange` per emitted event, in emission order (a live view)."""
        return _LogView(self._log)

    def events(self, n: int) -> Iterator[EmittedEvent]:
        """At least ``n`` events: whole transactions, in commit order, generated lazily.

        The ground truth includes a transaction as soon as its first event is yielded.
        """
        _check_count("n", n)
        return self._events(n)

    def _events(self, n: int) -> Iterator[EmittedEvent]:
        produced = 0
        while produced < n:
            batch = self.transaction()
            produced += len(batch)
            yield from batch

    def transaction(self) -> list[EmittedEvent]:
        """One unit of work chosen by the mix: a Salesforce transaction (one or more change
        events) or one publish call of platform events. Never empty."""
        kind = self._pick_kind()
        if kind in ("delete", "mass_delete") and self._below_live_share():
            kind = "undelete"
        if kind == "platform_event":
            return self.platform_events(self._values.between(1, 5))
        tx = self._begin(bulk=kind in ("mass_update", "mass_delete", "overflow"))
        handler = getattr(self, f"_tx_{kind}")
        if not handler(tx):
            # Handlers give up before emitting anything (nothing fits right now): a CREATE
            # always fits.
            if tx.events:
                raise RuntimeError(f"transaction kind {kind} failed after emitting events")
            if not (self._mix.live_share and self._live_total and self._tx_update(tx)):
                self._tx_create(tx)
        return tx.events

    def _below_live_share(self) -> bool:
        """Whether fewer than the mix's ``live_share`` of the records are live."""
        share = self._mix.live_share
        return share > 0 and self._live_total < share * (self._live_total + self._dead_total)

    def platform_events(self, n: int) -> list[EmittedEvent]:
        """``n`` platform events (one publish call), on the catalogue's platform event topics."""
        _check_count("n", n)
        if not self._pe_topics:
            raise ValueError("the catalogue has no platform event topic (/event/...)")
        if n == 0:
            return []
        self._advance_clock()
        out = []
        for _ in range(n):
            topic = self._values.pick(self._pe_topics)
            out.append(self._platform_event(self._catalogue.topic(topic.name)))
        return out

    def change_schema(self, entity: str) -> EventSchema:
        """Switch ``entity``'s topic to the next shipped schema version and return it.

        Later events are written with it; earlier events keep their schema id. Fields the new
        version adds appear in the ground truth as ``None`` on every record.
        """
        try:
            topic = self._catalogue.topic_for_entity(entity)
        except KeyError:
            known = ", ".join(sorted({str(t.entity) for t in self._catalogue if t.entity}))
            raise KeyError(
                f"the catalogue has no topic for {entity!r} (entities: {known})"
            ) from None
        current = topic.current_schema
        versions = shipped.schema_versions(entity)
        ids = [s.schema_id for s in versions]
        if current is None or current.schema_id not in ids:
            raise ValueError(
                f"{topic.name}'s current schema is not a shipped version of {entity}, so it has "
                f"no next version (shipped: {', '.join(ids)})"
            )
        position = ids.index(current.schema_id)
        if position + 1 >= len(versions):
            raise ValueError(
                f"{topic.name} already uses the last shipped schema of {entity} "
                f"(version {position + 1} of {len(versions)}, {current.schema_id})"
            )
        schema = versions[position + 1]
        updated = self._catalogue.add_version(topic.name, schema)
        if topic.kind == "change_events":
            self._install(updated)
        else:
            self._pe_topics = [updated if t.name == topic.name else t for t in self._pe_topics]
        logger.info("schema of %s changed to %s", topic.name, schema.schema_id)
        return schema

    # -- setup ----------------------------------------------------------------------------------

    def _resolve_org_id(self, org_id: str | None) -> str:
        if org_id is None:
            return IdFactory.org_id(self._rng)
        try:
            full = to_18(org_id)
        except ValueError as exc:
            raise ValueError(f"org_id must be a 15- or 18-char org id: {exc}") from exc
        if key_prefix(full) != "00D":
            raise ValueError(f"org_id must start with the org key prefix 00D (got {org_id!r})")
        return full

    @staticmethod
    def _entity_of(topic: TopicDef) -> str:
        if topic.entity:
            return topic.entity
        schema = topic.current_schema
        if schema is None:
            raise ValueError(f"topic {topic.name} has no schema")
        return schema.entity_name

    def _resolve_entity_weights(self, entities: list[str]) -> dict[str, float]:
        given = self._mix.entity_weights
        if given is None:
            return {e: _DEFAULT_ENTITY_WEIGHTS.get(e, 1.0) for e in entities}
        unknown = sorted(set(given) - set(entities))
        if unknown:
            raise ValueError(
                f"mix.entity_weights names {unknown}, which the catalogue has no change event "
                f"topic for (entities: {', '.join(entities)})"
            )
        return {e: float(given.get(e, 0.0)) for e in entities}

    def _install(self, topic: TopicDef) -> None:
        entity = self._entity_of(topic)
        schema = topic.current_schema
        if schema is None or not schema.is_change_event:
            raise ValueError(f"topic {topic.name} has no change event schema")
        plans: dict[str, _FieldPlan] = {}
        order: dict[str, tuple[int, int]] = {}
        compounds: dict[str, tuple[str, ...]] = {}
        required = _REQUIRED.get(entity, frozenset({"Name", "OwnerId"}))
        read_only = _READ_ONLY.get(entity, frozenset())
        lookups = _LOOKUPS.get(entity, {})
        for info in schema.fields[1:]:
            order[info.name] = (info.index, -1)
            if info.is_compound:
                compounds[info.name] = tuple(c.name for c in info.children)
                for c in info.children:
                    order[f"{info.name}.{c.name}"] = (info.index, c.index)
            category = self._category(entity, info, read_only, lookups)
            plans[info.name] = _FieldPlan(
                info=info,
                category=category,
                required=info.name in required,
                target=lookups.get(info.name),
                person_only=entity == "Account" and info.name.startswith("Person"),
                business_only=entity == "Account" and info.name == "ParentId",
                maker=self._maker(entity, info) if category == "scalar" else None,
                always=info.name in required or info.kind == "boolean",
            )
        editable = tuple(
            p
            for p in plans.values()
            if p.category
            in ("lookup", "user", "record_type", "long_text", "compound", "name", "scalar")
        )
        mass = tuple(
            p
            for p in editable
            if p.category == "scalar"
            and not p.person_only
            and (p.info.sf_type in {"DynamicEnum", "StaticEnum"} or p.info.kind == "boolean")
            and not (entity == "Opportunity" and p.info.name == "StageName")
        )
        wildcard = tuple(
            p
            for p in editable
            if p.category == "scalar"
            and p.info.name.endswith("__c")
            and p.info.kind != "boolean"
            and not p.required
        )
        self._plans[entity] = _Plan(
            entity=entity,
            topic=topic.name,
            prefix=self._prefixes[entity],
            schema=schema,
            writer=self._writer(schema),
            body_writer=AvroWriter(schema, first_field=1),
            header=HeaderEncoder.for_schema(schema),
            entity_bytes=HeaderEncoder.string(entity),
            encoder=BitmapEncoder(schema),
            fields=plans,
            order=order,
            compounds=compounds,
            editable=editable,
            mass=mass,
            wildcard=wildcard,
            lookups=frozenset(n for n, p in plans.items() if p.category == "lookup"),
        )
        self._truth.register(entity, [f.name for f in schema.fields[1:]], compounds)

    def _writer(self, schema: EventSchema) -> AvroWriter:
        writer = self._writers.get(schema.schema_id)
        if writer is None:
            writer = self._writers[schema.schema_id] = AvroWriter(schema)
        return writer

    @staticmethod
    def _category(
        entity: str, info: FieldInfo, read_only: frozenset[str], lookups: Mapping[str, str]
    ) -> Category:
        name = info.name
        if name in _SYSTEM:
            return "system"
        if name in read_only:
            return "read_only"
        if info.kind == "switchable_name":
            return "name"
        if info.kind == "compound":
            return "compound"
        if info.kind == "long_text":
            return "long_text"
        if info.kind == "id":
            if name in lookups:
                return "lookup"
            if name in _USER_FIELDS:
                return "user"
            if name == "RecordTypeId":
                return "record_type"
            return "unknown_id"
        if info.kind in ("record", "other"):
            return "other"
        return "scalar"

    # -- randomness helpers ---------------------------------------------------------------------

    def _uuid(self) -> str:
        """A random (version 4) UUID string drawn from the seeded generator."""
        bits = self._rng.getrandbits(128) & _UUID_CLEAR | _UUID_SET
        h = f"{bits:032x}"
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def _weighted(self, weights: Mapping[str, float]) -> str | None:
        return _Choice(weights).pick(self._random)

    def _pick_kind(self) -> TransactionKind:
        if not self._plans:
            return "platform_event"
        live = self._live_total > 0
        dead = self._dead_total > 0
        choice = self._kind_choices.get((live, dead))
        if choice is None:
            weights: dict[str, float] = {str(k): w for k, w in self._mix.weights().items()}
            if not self._pe_topics:
                weights["platform_event"] = 0.0
            if not live:
                for kind in ("update", "bulk_update", "mass_update", "delete", "mass_delete"):
                    weights[kind] = 0.0
                weights["overflow"] = weights["wildcard"] = 0.0
            if not dead:
                weights["undelete"] = 0.0
            if "Account" not in self._plans or "Opportunity" not in self._plans:
                weights["lead_conversion"] = 0.0
            choice = self._kind_choices[(live, dead)] = _Choice(weights)
        picked = choice.pick(self._random)
        return "create" if picked is None else picked  # type: ignore[return-value]

    def _pick_entity(self, *, min_live: int = 0, min_dead: int = 0) -> str | None:
        # Rejection sampling from the full weights gives the same distribution as the filtered
        # weights below, and nearly always succeeds at once.
        for _ in range(4):
            entity = self._entity_choice.pick(self._random)
            if entity is None:
                return None
            if len(self._live[entity]) >= min_live and len(self._dead[entity]) >= min_dead:
                return entity
        weights = {
            e: w
            for e, w in self._entity_weights.items()
            if len(self._live[e]) >= min_live and len(self._dead[e]) >= min_dead
        }
        return self._weighted(weights)

    def _advance_clock(self) -> None:
        if self._clock_ms is not None:
            # Never backwards: commit order and commit time must agree.
            self._now = max(self._now, int(self._clock_ms()))
        else:
            self._now += 1000 * self._values.pick(_CLOCK_STEPS)
        self._commit_number += self._values.between(1, 50_000)

    def _begin(self, *, bulk: bool = False) -> _Tx:
        self._advance_clock()
        if bulk and self._random() < 0.6:
            origin = _BULK_ORIGIN
        else:
            origin = _ORIGIN_CHOICE.pick(self._random) or ""
        return _Tx(
            key=self._uuid(),
            timestamp=self._now,
            commit_number=self._commit_number,
            user=self._values.pick(self._users),
            origin=origin,
        )

    # -- emission -------------------------------------------------------------------------------

    def _next_seq(self, tx: _Tx) -> int:
        if tx.seq == 0:
            tx.seq = 1
        else:
            # Objects without CDC changed in the same transaction take sequence numbers too.
            tx.seq += 1 + (self._values.between(1, 3) if self._random() < 0.15 else 0)
        return tx.seq

    def _emit(
        self,
        tx: _Tx,
        plan: _Plan,
        change_type: ChangeTypeName,
        record_ids: Sequence[str],
        item: _Item | None,
        *,
        affected: Sequence[str] = (),
    ) -> str:
        changed = item.changed if item else ()
        nulled = item.nulled if item else ()
        diffed = item.diffed if item else ()
        sequence_number = self._next_seq(tx)
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
        event_id = self._uuid()
        tx.events.append(EmittedEvent(plan.topic, plan.schema.schema_id, payload, event_id))
        self._log.append(
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

    def _emit_grouped(
        self, tx: _Tx, plan: _Plan, change_type: ChangeTypeName, items: Sequence[_Item]
    ) -> dict[str, str]:
        """Emit ``items``, merging records with an identical change into one event; returns
        record id -> event id."""
        groups: list[tuple[_Item, list[str]]] = []
        for item in items:
            for representative, ids in groups:
                if representative.same_event(item):
                    ids.append(item.record_id)
                    break
            else:
                groups.append((item, [item.record_id]))
        out: dict[str, str] = {}
        for representative, ids in groups:
            event_id = self._emit(tx, plan, change_type, ids, representative)
            out.update(dict.fromkeys(ids, event_id))
        return out

    # -- record bookkeeping ---------------------------------------------------------------------

    def _record(self, entity: str, record_id: str) -> Mapping[str, Any]:
        return self._truth.record(entity, record_id)

    def _targets(self, plan: _Plan, values: Mapping[str, Any]) -> list[tuple[str, str]]:
        out = []
        for name, fp in plan.fields.items():
            if fp.category == "lookup" and values.get(name) is not None:
                out.append((name, str(values[name])))
        return out

    def _link(self, plan: _Plan, record_id: str, values: Mapping[str, Any]) -> None:
        for name, target in self._targets(plan, values):
            self._referrers.setdefault(target, {})[(plan.entity, record_id, name)] = None

    def _unlink(self, plan: _Plan, record_id: str, values: Mapping[str, Any]) -> None:
        for name, target in self._targets(plan, values):
            refs = self._referrers.get(target)
            if refs is not None:
                refs.pop((plan.entity, record_id, name), None)
                if not refs:
                    del self._referrers[target]

    def _is_live(self, record_id: str) -> bool:
        prefix = key_prefix(record_id)
        for entity, p in self._prefixes.items():
            if p == prefix:
                return record_id in self._live[entity]
        return False

    def _live_pick(self, entity: str, *, where: Any = None, tries: int = 8) -> str | None:
        live = self._live.get(entity)
        if not live:
            return None
        for _ in range(tries):
            candidate = live.pick(self._random)
            if where is None or where(candidate):
                return candidate
        return None

    # -- values ---------------------------------------------------------------------------------

    def _newline(self) -> Newline:
        return "\r\n" if self._random() < self._mix.crlf_ratio else "\n"

    def _lookup_value(
        self, plan: _Plan, fp: _FieldPlan, record_id: str, values: Mapping[str, Any]
    ) -> str | None:
        target = fp.target
        if target is None or target not in self._live:
            return None
        name = fp.info.name
        meta = self._meta[plan.entity].get(record_id)
        if plan.entity == "Account" and name == "ParentId":
            order = meta.order if meta else self._created + 1
            return self._live_pick(
                "Account",
                where=lambda c: (
                    c != record_id
                    and not self._meta["Account"][c].person
                    and self._meta["Account"][c].order < order
                ),
            )
        if plan.entity == "Contact" and name == "AccountId":
            return self._live_pick("Account", where=lambda c: not self._meta["Account"][c].person)
        if name in ("ContactId", "Contact__c", "ReportsToId"):
            account = values.get("AccountId") or values.get("Account__c")
            order = meta.order if meta else self._created + 1
            return self._live_pick(
                "Contact",
                where=lambda c: (
                    c != record_id
                    and (account is None or self._record("Contact", c).get("AccountId") == account)
                    and (name != "ReportsToId" or self._meta["Contact"][c].order < order)
                ),
                tries=6,
            )
        return self._live_pick(target)

    def _fresh_values(self, tx: _Tx, plan: _Plan, record_id: str, meta: _Meta) -> dict[str, Any]:
        """A full record for a CREATE: every field of the current schema."""
        values: dict[str, Any] = {}
        random_ = self._random
        person = meta.person
        now = tx.timestamp
        fill = self._mix.fill_ratio
        for name, fp in plan.fields.items():
            if (fp.person_only and not person) or (fp.business_only and person):
                values[name] = None
                continue
            category = fp.category
            if category == "scalar":
                values[name] = fp.maker(now) if fp.always or random_() < fill else None  # type: ignore[misc]
            elif category == "system":
                values[name] = now if fp.info.kind == "datetime" else tx.user
            elif category == "name":
                if person:
                    values[name] = self._values.person_name(plan.compounds[name])
                else:
                    values[name] = self._values.company_name()
            elif not fp.always and random_() >= fill:
                values[name] = None
            elif category == "compound":
                values[name] = self._values.compound(fp.info)
            elif category == "long_text":
                values[name] = self._values.long_text(
                    newline=meta.newline,
                    html=fp.info.sf_type == "HtmlStringPlusClob",
                    long=random_() < self._mix.long_text_ratio,
                )
            elif category == "lookup":
                values[name] = self._lookup_value(plan, fp, record_id, values)
            elif category == "user":
                values[name] = tx.user if random_() < 0.6 else self._values.pick(self._users)
            elif category == "record_type":
                values[name] = self._values.pick(self._record_types[plan.entity])
            else:
                values[name] = None
        self._derive_on_create(plan, tx, values)
        return values

    def _scalar(self, fp: _FieldPlan, tx: _Tx) -> Any:
        if fp.maker is None:
            raise ValueError(f"{fp.info.name} has no value generator (category {fp.category})")
        return fp.maker(tx.timestamp)

    def _maker(self, entity: str, info: FieldInfo) -> Callable[[int], Any]:
        values = self._values
        if entity == "Opportunity" and info.name == "Name":
            return lambda now: f"{values.company_name()} - {values.pick(_PRODUCT_NAMES)}"
        if entity == "Opportunity" and info.name == "StageName":
            stages = tuple(_STAGES)
            return lambda now: values.pick(stages)
        return values.maker(entity, info)

    def _derive_on_create(self, plan: _Plan, tx: _Tx, values: dict[str, Any]) -> None:
        if plan.entity == "Invoice__c" and plan.has("Name"):
            values["Name"] = self._values.sequence("INV-")
        if plan.entity != "Opportunity" or not plan.has("StageName"):
            return
        probability, closed, won = _STAGES.get(values["StageName"], (None, False, False))
        if plan.has("Probability"):
            values["Probability"] = probability
        if plan.has("IsClosed"):
            values["IsClosed"] = closed
        if plan.has("IsWon"):
            values["IsWon"] = won
        if plan.has("LastStageChangeDate"):
            values["LastStageChangeDate"] = None
        if plan.has("ExpectedRevenue"):
            values["ExpectedRevenue"] = _expected_revenue(
                values.get("Amount"), values.get("Probability")
            )

    # -- one record's changes ---------------------------------------------------------------------

    def _changes(
        self, tx: _Tx, plan: _Plan, record_id: str, *, count: int
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """Random changes to ``count`` editable fields: (dotted name -> new value, diffs)."""
        record = self._record(plan.entity, record_id)
        meta = self._meta[plan.entity][record_id]
        candidates = plan.editable_for(meta.person)
        texts = plan.texts_for(meta.person)
        changes: dict[str, Any] = {}
        diffs: dict[str, str] = {}
        if not candidates:
            return changes, diffs
        tried: set[str] = set()
        changed = 0
        for _ in range(count * 4):
            if changed >= count:
                break
            fp = self._pick_field(candidates, texts)
            if fp.info.name in tried:
                continue
            tried.add(fp.info.name)
            before = len(changes)
            self._change_field(
                tx,
                plan,
                fp,
                record_id=record_id,
                record=record,
                meta=meta,
                changes=changes,
                diffs=diffs,
            )
            changed += len(changes) > before
        self._derive_on_update(plan, tx, record, changes)
        return changes, diffs

    def _pick_field(
        self, candidates: Sequence[_FieldPlan], texts: Sequence[_FieldPlan]
    ) -> _FieldPlan:
        # Long text edits are what diffs are made of: give them a fair share of updates.
        if texts and self._random() < self._mix.long_text_edit_ratio:
            return self._values.pick(texts)
        return self._values.pick(candidates)

    def _change_field(
        self,
        tx: _Tx,
        plan: _Plan,
        fp: _FieldPlan,
        *,
        record_id: str,
        record: Mapping[str, Any],
        meta: _Meta,
        changes: dict[str, Any],
        diffs: dict[str, str],
    ) -> None:
        info = fp.info
        name = info.name
        current = record.get(name)
        category = fp.category
        nullable = not fp.required and info.kind != "boolean"
        new: Any
        if category == "compound" or (category == "name" and meta.person):
            self._change_compound(plan, fp, current, changes, person_name=category == "name")
            return
        if nullable and current is not None and self._random() < 0.12:
            changes[name] = None
            return
        if category == "name":
            new = self._values.company_name()
        elif category == "lookup":
            merged = {**record, **changes}
            new = self._lookup_value(plan, fp, record_id, merged)
        elif category == "user":
            new = self._values.pick(self._users)
        elif category == "record_type":
            new = self._values.pick(self._record_types[plan.entity])
        elif category == "long_text":
            html = info.sf_type == "HtmlStringPlusClob"
            roll = self._random()
            if current is None or roll < 0.15:
                new = self._values.long_text(
                    newline=meta.newline, html=html, long=self._random() < self._mix.long_text_ratio
                )
            elif roll < 0.9:
                new = self._values.edit_long_text(current, newline=meta.newline, html=html)
            else:
                new = self._values.grow_long_text(current, newline=meta.newline, html=html)
            if current is not None and new is not None:
                decision = decide_diff(current, new, newline=meta.newline)
                if decision.diff is not None:
                    diffs[name] = decision.diff
        else:
            new = self._scalar(fp, tx)
            if new == current:
                new = self._scalar(fp, tx)
        if new is None and not nullable:
            return
        if new != current:
            changes[name] = new

    def _change_compound(
        self,
        plan: _Plan,
        fp: _FieldPlan,
        current: Any,
        changes: dict[str, Any],
        *,
        person_name: bool,
    ) -> None:
        name = fp.info.name
        children = plan.compounds[name]
        old: Mapping[str, Any] = current if isinstance(current, Mapping) else {}
        roll = self._random()
        if not old or roll < 0.4:
            fresh = self._values.compound(fp.info)
            picked = [c for c in children if fresh.get(c) != old.get(c)]
            if person_name:
                picked = [c for c in picked if c in ("FirstName", "LastName", "Salutation")][:2]
            for c in picked:
                changes[f"{name}.{c}"] = fresh.get(c)
            return
        clearable = [
            c
            for c in children
            if old.get(c) is not None
            and c not in _REQUIRED_CHILDREN
            and not (fp.required and not person_name)
        ]
        if roll < 0.6 and clearable:
            # Clearing a whole address is common; a name keeps its required parts.
            targets = (
                clearable
                if self._random() < 0.5 and not person_name
                else [self._values.pick(clearable)]
            )
            for c in targets:
                changes[f"{name}.{c}"] = None
            return
        c = self._values.pick(children)
        value = self._values.name_part(c) if person_name else self._values.compound(fp.info)[c]
        if value is None and c in _REQUIRED_CHILDREN:
            return
        if value != old.get(c):
            changes[f"{name}.{c}"] = value

    def _derive_on_update(
        self, plan: _Plan, tx: _Tx, record: Mapping[str, Any], changes: dict[str, Any]
    ) -> None:
        if plan.entity != "Opportunity" or not changes:
            return
        if "StageName" in changes and plan.has("StageName"):
            probability, closed, won = _STAGES.get(changes["StageName"], (None, False, False))
            derived = {
                "Probability": probability,
                "IsClosed": closed,
                "IsWon": won,
                "LastStageChangeDate": tx.timestamp,
            }
            for name, value in derived.items():
                if name == "Probability" and name in changes:
                    continue
                if plan.has(name) and record.get(name) != value:
                    changes[name] = value
        if plan.has("ExpectedRevenue") and ("Amount" in changes or "Probability" in changes):
            amount = changes.get("Amount", record.get("Amount"))
            probability = changes.get("Probability", record.get("Probability"))
            revenue = _expected_revenue(amount, probability)
            if revenue != record.get("ExpectedRevenue"):
                changes["ExpectedRevenue"] = revenue

    def _update_item(
        self,
        tx: _Tx,
        plan: _Plan,
        record_id: str,
        changes: dict[str, Any],
        diffs: Mapping[str, str],
        *,
        system: bool = True,
    ) -> _Item:
        record = self._record(plan.entity, record_id)
        if system:
            if plan.has("LastModifiedDate"):
                changes["LastModifiedDate"] = tx.timestamp
            if plan.has("LastModifiedById") and record.get("LastModifiedById") != tx.user:
                changes["LastModifiedById"] = tx.user
        names = tuple(sorted(changes, key=plan.order.__getitem__))
        body: dict[str, Any] = {}
        for n in names:
            parent, _, child = n.partition(".")
            if child:
                nested = body.get(parent)
                if not isinstance(nested, dict):
                    nested = body[parent] = dict.fromkeys(plan.compounds[parent])
                nested[child] = changes[n]
            else:
                body[n] = diffs.get(n, changes[n])
        return _Item(
            record_id=record_id,
            body=body,
            changed=names,
            nulled=tuple(n for n in names if changes[n] is None),
            diffed=tuple(n for n in names if n in diffs),
            changes=changes,
        )

    # -- operations (apply to the truth and the bookkeeping) ------------------------------------

    def _new_record(self, tx: _Tx, plan: _Plan, *, person: bool | None = None) -> _Item:
        entity = plan.entity
        record_id = self._ids.new(plan.prefix)
        is_person = (
            entity == "Account"
            and plan.fields.get("Name") is not None
            and plan.fields["Name"].category == "name"
            and (self._random() < self._mix.person_account_ratio if person is None else person)
        )
        self._created += 1
        meta = _Meta(newline=self._newline(), person=is_person, order=self._created)
        self._meta[entity][record_id] = meta
        values = self._fresh_values(tx, plan, record_id, meta)
        return _Item(record_id=record_id, body=values, changes=values)

    def _apply_create(self, plan: _Plan, item: _Item, event_id: str, *, gap: bool) -> None:
        self._truth.create(
            plan.entity, item.record_id, item.changes, event_id=event_id, gap=gap, owned=True
        )
        self._live[plan.entity].add(item.record_id)
        self._live_total += 1
        self._link(plan, item.record_id, item.changes)

    def _apply_update(self, plan: _Plan, item: _Item, event_id: str, *, gap: bool) -> None:
        relink = not plan.lookups.isdisjoint(item.changes)
        if relink:
            self._unlink(plan, item.record_id, self._record(plan.entity, item.record_id))
        self._truth.update(plan.entity, item.record_id, item.changes, event_id=event_id, gap=gap)
        if relink:
            self._link(plan, item.record_id, self._record(plan.entity, item.record_id))

    def _apply_delete(self, entity: str, record_id: str, event_id: str, *, gap: bool) -> None:
        plan = self._plans[entity]
        self._truth.delete(entity, record_id, event_id=event_id, gap=gap)
        self._live[entity].remove(record_id)
        self._dead[entity].add(record_id)
        self._dead_total += 1
        self._live_total -= 1
        self._unlink(plan, record_id, self._record(entity, record_id))

    def _undelete_item(self, tx: _Tx, plan: _Plan, record_id: str) -> _Item:
        values = dict(self._record(plan.entity, record_id))
        if plan.has("LastModifiedDate"):
            values["LastModifiedDate"] = tx.timestamp
        if plan.has("LastModifiedById"):
            values["LastModifiedById"] = tx.user
        return _Item(record_id=record_id, body=values, changes=values)

    def _apply_undelete(self, plan: _Plan, item: _Item, event_id: str, *, gap: bool) -> None:
        entity = plan.entity
        self._truth.undelete(
            entity, item.record_id, item.changes, event_id=event_id, gap=gap, owned=True
        )
        self._dead[entity].remove(item.record_id)
        self._live[entity].add(item.record_id)
        self._dead_total -= 1
        self._live_total += 1
        self._meta[entity][item.record_id].cascade_root = None
        self._cascaded.pop(item.record_id, None)
        self._link(plan, item.record_id, item.changes)

    def _deletion_set(self, entity: str, record_id: str) -> list[tuple[str, str]] | None:
        """The records deleting ``record_id`` deletes (itself first, then cascaded children),
        or ``None`` when a live record outside that set still references one of them."""
        members = [(entity, record_id)]
        for child_entity, child_field in _CASCADE.get(entity, ()):
            if child_entity not in self._plans:
                continue
            for ref_entity, ref_id, ref_field in self._referrers.get(record_id, {}):
                if ref_entity == child_entity and ref_field == child_field:
                    members.append((ref_entity, ref_id))
        ids = {m[1] for m in members}
        for _, member in members:
            for _, ref_id, _ in self._referrers.get(member, {}):
                if ref_id not in ids:
                    return None
        return members

    def _undeletable(self, entity: str, record_id: str, coming_back: set[str]) -> bool:
        plan = self._plans[entity]
        record = self._record(entity, record_id)
        return all(
            self._is_live(target) or target in coming_back
            for _, target in self._targets(plan, record)
        )

    # -- transaction kinds ----------------------------------------------------------------------

    def _tx_create(self, tx: _Tx) -> bool:
        entity = self._pick_entity()
        if entity is None:
            entity = next(iter(self._plans))
        plan = self._plans[entity]
        count = 1 if self._random() < 0.8 else self._values.between(2, 4)
        for _ in range(count):
            item = self._new_record(tx, plan)
            event_id = self._emit(tx, plan, "CREATE", [item.record_id], item)
            self._apply_create(plan, item, event_id, gap=False)
        return True

    def _tx_update(self, tx: _Tx, *, records: int = 1) -> bool:
        entity = self._pick_entity(min_live=1)
        if entity is None:
            return False
        plan = self._plans[entity]
        chosen: list[str] = []
        for _ in range(records * 2):
            candidate = self._live[entity].pick(self._random)
            if candidate not in chosen:
                chosen.append(candidate)
            if len(chosen) == records:
                break
        items = []
        for record_id in chosen:
            changes, diffs = self._changes(
                tx, plan, record_id, count=self._values.pick((1, 1, 1, 2, 2, 3))
            )
            if changes:
                items.append(self._update_item(tx, plan, record_id, changes, diffs))
        if not items:
            return False
        event_ids = self._emit_grouped(tx, plan, "UPDATE", items)
        for item in items:
            self._apply_update(plan, item, event_ids[item.record_id], gap=False)
        return True

    def _tx_bulk_update(self, tx: _Tx) -> bool:
        return self._tx_update(tx, records=self._values.between(2, 4))

    def _mass_change(self, tx: _Tx, *, low: int, high: int) -> tuple[_Plan, list[_Item]] | None:
        entity = self._pick_entity(min_live=low)
        if entity is None:
            return None
        plan = self._plans[entity]
        if not plan.mass:
            return None
        fp = self._values.pick(plan.mass)
        name = fp.info.name
        if fp.info.kind != "boolean" and not fp.required and self._random() < 0.2:
            value = None
        else:
            value = self._scalar(fp, tx)
        wanted = self._values.between(low, high)
        chosen: list[str] = []
        for _ in range(wanted * 3):
            candidate = self._live[entity].pick(self._random)
            if candidate in chosen or self._record(entity, candidate).get(name) == value:
                continue
            chosen.append(candidate)
            if len(chosen) == wanted:
                break
        if len(chosen) < low:
            return None
        items = [self._update_item(tx, plan, rid, {name: value}, {}) for rid in chosen]
        return plan, items

    def _tx_mass_update(self, tx: _Tx) -> bool:
        found = self._mass_change(tx, low=2, high=self._mix.max_batch)
        if found is None:
            return False
        plan, items = found
        event_ids = self._emit_grouped(tx, plan, "UPDATE", items)
        for item in items:
            self._apply_update(plan, item, event_ids[item.record_id], gap=False)
        return True

    def _tx_delete(self, tx: _Tx) -> bool:
        entity = self._pick_entity(min_live=1)
        if entity is None:
            return False
        for _ in range(8):
            record_id = self._live[entity].pick(self._random)
            members = self._deletion_set(entity, record_id)
            if members is not None:
                break
        else:
            return False
        event_id = self._emit(tx, self._plans[entity], "DELETE", [record_id], None)
        self._apply_delete(entity, record_id, event_id, gap=False)
        children = members[1:]
        by_entity: dict[str, list[str]] = {}
        for child_entity, child_id in children:
            by_entity.setdefault(child_entity, []).append(child_id)
        for child_entity, ids in by_entity.items():
            # The cascade makes the same (empty) change to every child: one event per object.
            event_id = self._emit(tx, self._plans[child_entity], "DELETE", ids, None)
            for child_id in ids:
                self._apply_delete(child_entity, child_id, event_id, gap=False)
                self._meta[child_entity][child_id].cascade_root = record_id
        if children:
            self._cascaded[record_id] = children
        return True

    def _deletable_alone(self, entity: str, count: int) -> list[str]:
        chosen: list[str] = []
        for _ in range(count * 3):
            candidate = self._live[entity].pick(self._random)
            if candidate not in chosen and not self._referrers.get(candidate):
                chosen.append(candidate)
            if len(chosen) == count:
                break
        return chosen

    def _tx_mass_delete(self, tx: _Tx) -> bool:
        entity = self._pick_entity(min_live=2)
        if entity is None:
            return False
        chosen = self._deletable_alone(entity, self._values.between(2, self._mix.max_batch))
        if len(chosen) < 2:
            return False
        event_id = self._emit(tx, self._plans[entity], "DELETE", chosen, None)
        for record_id in chosen:
            self._apply_delete(entity, record_id, event_id, gap=False)
        return True

    def _restore_set(self, entity: str, record_id: str) -> list[tuple[str, str]] | None:
        if not self._undeletable(entity, record_id, set()):
            return None
        members = [(entity, record_id)]
        coming_back = {record_id}
        for child_entity, child_id in self._cascaded.get(record_id, ()):
            if child_id in self._dead[child_entity]:
                meta = self._meta[child_entity][child_id]
                if meta.cascade_root == record_id:
                    members.append((child_entity, child_id))
                    coming_back.add(child_id)
        # Children whose other lookups point at records that stay deleted stay in the recycle
        # bin too; dropping one can strand another that points at it, hence the fixpoint.
        dropped = True
        while dropped:
            dropped = False
            for member_entity, member_id in members[1:]:
                if member_id in coming_back and not self._undeletable(
                    member_entity, member_id, coming_back
                ):
                    coming_back.discard(member_id)
                    dropped = True
        return [m for m in members if m[1] in coming_back]

    def _tx_undelete(self, tx: _Tx) -> bool:
        entity = self._pick_entity(min_dead=1)
        if entity is None:
            return False
        for _ in range(8):
            record_id = self._dead[entity].pick(self._random)
            members = self._restore_set(entity, record_id)
            if members is not None:
                break
        else:
            return False
        for member_entity, member_id in members:
            plan = self._plans[member_entity]
            item = self._undelete_item(tx, plan, member_id)
            event_id = self._emit(tx, plan, "UNDELETE", [member_id], item)
            self._apply_undelete(plan, item, event_id, gap=False)
        return True

    def _tx_lead_conversion(self, tx: _Tx) -> bool:
        account_plan = self._plans["Account"]
        opportunity_plan = self._plans["Opportunity"]
        contact_plan = self._plans.get("Contact")
        person = self._random() < self._mix.person_account_ratio
        account = self._new_record(tx, account_plan, person=person)
        event_id = self._emit(tx, account_plan, "CREATE", [account.record_id], account)
        self._apply_create(account_plan, account, event_id, gap=False)
        contact_id = None
        if contact_plan is not None and not self._meta["Account"][account.record_id].person:
            contact = self._new_record(tx, contact_plan)
            self._relink(
                contact_plan, contact, {"AccountId": account.record_id, "ReportsToId": None}
            )
            event_id = self._emit(tx, contact_plan, "CREATE", [contact.record_id], contact)
            self._apply_create(contact_plan, contact, event_id, gap=False)
            contact_id = contact.record_id
        opportunity = self._new_record(tx, opportunity_plan)
        self._relink(
            opportunity_plan,
            opportunity,
            {"AccountId": account.record_id, "ContactId": contact_id, "LeadSource": "Web"},
        )
        event_id = self._emit(tx, opportunity_plan, "CREATE", [opportunity.record_id], opportunity)
        self._apply_create(opportunity_plan, opportunity, event_id, gap=False)
        # The converted Lead is updated last; Lead has no change events here, so its sequence
        # number is never seen.
        self._next_seq(tx)
        return True

    @staticmethod
    def _relink(plan: _Plan, item: _Item, values: Mapping[str, Any]) -> None:
        for name, value in values.items():
            if plan.has(name):
                item.changes[name] = value
                item.body[name] = value

    def _tx_gap(self, tx: _Tx) -> bool:
        gap_type = self._values.pick(_GAP_TYPES[1:] if self._mix.live_share else _GAP_TYPES)
        count = self._values.between(1, 3)
        if gap_type == "GAP_CREATE":
            entity = self._pick_entity()
            if entity is None:
                return False
            plan = self._plans[entity]
            items = [self._new_record(tx, plan) for _ in range(count)]
            event_id = self._emit(tx, plan, gap_type, [i.record_id for i in items], None)
            for item in items:
                self._apply_create(plan, item, event_id, gap=True)
            return True
        if gap_type == "GAP_UPDATE":
            entity = self._pick_entity(min_live=1)
            if entity is None:
                return False
            plan = self._plans[entity]
            items = []
            for record_id in dict.fromkeys(
                self._live[entity].pick(self._random) for _ in range(count)
            ):
                changes, diffs = self._changes(tx, plan, record_id, count=2)
                if changes:
                    items.append(self._update_item(tx, plan, record_id, changes, diffs))
            if not items:
                return False
            event_id = self._emit(tx, plan, gap_type, [i.record_id for i in items], None)
            for item in items:
                self._apply_update(plan, item, event_id, gap=True)
            return True
        if gap_type == "GAP_DELETE":
            entity = self._pick_entity(min_live=1)
            if entity is None:
                return False
            chosen = self._deletable_alone(entity, count)
            if not chosen:
                return False
            event_id = self._emit(tx, self._plans[entity], gap_type, chosen, None)
            for record_id in chosen:
                self._apply_delete(entity, record_id, event_id, gap=True)
            return True
        entity = self._pick_entity(min_dead=1)
        if entity is None:
            return False
        plan = self._plans[entity]
        chosen = []
        for record_id in dict.fromkeys(self._dead[entity].pick(self._random) for _ in range(count)):
            if self._undeletable(entity, record_id, set()):
                chosen.append(record_id)
        if not chosen:
            return False
        items = [self._undelete_item(tx, plan, record_id) for record_id in chosen]
        event_id = self._emit(tx, plan, gap_type, chosen, None)
        for item in items:
            self._apply_undelete(plan, item, event_id, gap=True)
        return True

    def _tx_overflow(self, tx: _Tx) -> bool:
        found = self._mass_change(tx, low=3, high=self._mix.max_batch * 2)
        if found is None:
            return False
        plan, items = found
        described = items[: max(1, len(items) // 3)]
        silent = items[len(described) :]
        event_ids = self._emit_grouped(tx, plan, "UPDATE", described)
        for item in described:
            self._apply_update(plan, item, event_ids[item.record_id], gap=False)
        silent_ids = [item.record_id for item in silent]
        event_id = self._emit(tx, plan, "GAP_OVERFLOW", [], None, affected=silent_ids)
        self._truth.overflow(
            plan.entity, {item.record_id: item.changes for item in silent}, event_id=event_id
        )
        return True

    def _tx_wildcard(self, tx: _Tx) -> bool:
        candidates = {
            e: w
            for e, w in self._entity_weights.items()
            if self._plans[e].wildcard and (len(self._live[e]) or len(self._dead[e]))
        }
        entity = self._weighted(candidates)
        if entity is None:
            return False
        plan = self._plans[entity]
        fp = self._values.pick(plan.wildcard)
        name = fp.info.name
        tx.origin = ""
        tx.user = self._users[0]
        item = _Item(record_id="", body={}, changed=(name,), nulled=(name,))
        affected = self._truth.null_everywhere(entity, name)
        self._emit(tx, plan, "UPDATE", [f"{plan.prefix}*"], item, affected=affected)
        return True

    # -- platform events ------------------------------------------------------------------------

    def _platform_event(self, topic: TopicDef) -> EmittedEvent:
        schema = topic.current_schema
        if schema is None:
            raise ValueError(f"platform event topic {topic.name} has no schema")
        entity = topic.entity or schema.entity_name
        if self._clock_ms is not None:
            created = self._now
        else:
            created = self._now + self._values.between(0, 999)
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
                accounts = self._live.get("Account")
                datum[info.name] = accounts.pick(self._random) if accounts else None
            elif info.kind == "long_text":
                datum[info.name] = self._values.long_text(newline="\n", html=False, long=False)
            elif info.is_compound:
                datum[info.name] = self._values.compound(info)
            elif info.kind in ("id", "record", "other"):
                datum[info.name] = None if info.nullable else self._users[0]
            else:
                datum[info.name] = self._values.scalar(entity, info, now_ms=self._now)
        payload = self._writer(schema).write(datum)
        event_id = self._uuid()
        self._log.append(
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


_PRODUCT_NAMES = ("Renewal", "Expansion", "Pilot", "Platform Licence", "Support Upgrade")


def _expected_revenue(amount: Any, probability: Any) -> float | None:
    if amount is None or probability is None:
        return None
    return round(float(amount) * float(probability) / 100.0, 2)


def _check_count(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be an int >= 0 (got {value!r})")


_ORIGIN_CHOICE = _Choice(dict(_ORIGINS))
