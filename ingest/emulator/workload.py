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
on every record by a lossy type conversion, which also changes the field's type in
``describe``: percent, currency and number fields to number or percent, text and picklists
to or from multi-select picklists, so the values keep their representation) and platform
events (``CreatedDate`` the publish time in epoch ms, ``CreatedById`` a user, custom fields
mostly set). The generator never emits
an impossible event: no UPDATE or DELETE of a deleted record, no UNDELETE of a live one, and
live records only reference live records.

The ground truth's semantics (what each change type does to a record) are documented in
:mod:`ingest.emulator.truth`; person accounts are Account records only (their hidden Contact
has no change events here).

The generator's parts, each in a module of its own: :mod:`~ingest.emulator.workload_mix` (the
mix and weighted picks), :mod:`~ingest.emulator.workload_plans` (what is known about each
object and its current schema), :mod:`~ingest.emulator.workload_records` (live and deleted
records, links, cascades), :mod:`~ingest.emulator.workload_values` (field values and changes),
:mod:`~ingest.emulator.workload_emit` (clock, encoding, event ids, log) and
:mod:`~ingest.emulator.workload_tx` (the transaction kinds). This module puts them together.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator, Sequence

from ingest.emulator import catalogue as shipped
from ingest.emulator.ids import IdFactory, assign_key_prefixes, key_prefix, to_18
from ingest.emulator.topics import Catalogue, EmittedEvent, TopicDef
from ingest.emulator.truth import GroundTruth
from ingest.emulator.values import ValueFactory
from ingest.emulator.workload_emit import (
    ChangeTypeName,
    Emitter,
    EventKind,
    GeneratedChange,
    LogView,
)
from ingest.emulator.workload_mix import TransactionKind, WorkloadMix
from ingest.emulator.workload_plans import Plan, build_plan, entity_of
from ingest.emulator.workload_records import Records
from ingest.emulator.workload_tx import Transactions
from ingest.emulator.workload_values import FieldValues
from ingest.schema import EventSchema

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
        # Everything random comes from this one generator, shared by every part: the order of
        # the draws (these first: org id, first commit number, value pools, users, record
        # types) is part of the output, and reordering any of them changes every event.
        rng = random.Random(seed)
        self._org_id = self._resolve_org_id(org_id, rng)
        self._ids = IdFactory(rng, pod=self._org_id[3:5])
        commit_number = (1 << 60) + rng.randrange(1 << 50)
        self._values = ValueFactory(rng, start_ms=start_ms)
        self._users = tuple(self._ids.new("005") for _ in range(6))
        self._truth = GroundTruth(org_id=self._org_id)
        self._truth.use_formulas(catalogue.formulas)

        change_topics = [t for t in catalogue if t.kind == "change_events"]
        self._pe_topics = [t for t in catalogue if t.kind == "platform_event"]
        if not change_topics and not self._pe_topics:
            raise ValueError(
                "the catalogue has no change event or platform event topic to generate events for"
            )
        entities = [entity_of(t) for t in change_topics]
        self._prefixes = assign_key_prefixes(entities)
        record_types = {e: tuple(self._ids.new("012") for _ in range(3)) for e in entities}
        self._emitter = Emitter(
            rng,
            self._values,
            self._users,
            start_ms=start_ms,
            commit_number=commit_number,
            clock_ms=clock_ms,
        )
        self._plans: dict[str, Plan] = {}
        for topic in change_topics:
            self._install(topic)
        self._records = Records(
            self._truth,
            entities,
            plans=self._plans,
            prefixes=self._prefixes,
            random_=rng.random,
            now_ms=lambda: self._emitter.now,
        )
        self._fields = FieldValues(
            rng,
            self._values,
            self._ids,
            self._records,
            users=self._users,
            record_types=record_types,
            mix=self._mix,
        )
        self._transactions = Transactions(
            rng.random,
            self._values,
            plans=self._plans,
            records=self._records,
            fields=self._fields,
            emitter=self._emitter,
            truth=self._truth,
            catalogue=catalogue,
            users=self._users,
            mix=self._mix,
            platform_events=bool(self._pe_topics),
        )

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
        self._transactions.set_mix(mix)
        self._fields.mix = mix
        self._mix = mix

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
        return self._emitter.now

    @property
    def truth(self) -> GroundTruth:
        """The org's state after every event generated so far (updated per transaction)."""
        return self._truth

    @property
    def log(self) -> Sequence[GeneratedChange]:
        """One :class:`GeneratedChange` per emitted event, in emission order (a live view)."""
        return LogView(self._emitter.log)

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
        kind = self._transactions.pick_kind()
        if kind in ("delete", "mass_delete") and self._records.below_live_share(
            self._mix.live_share
        ):
            kind = "undelete"
        if kind == "platform_event":
            return self.platform_events(self._values.between(1, 5))
        return self._transactions.run(kind)

    def empty_recycle_bin(self, entity: str, count: int) -> list[str]:
        """Hard-delete up to ``count`` deleted records of ``entity`` (as emptying the Recycle
        Bin does): no event is emitted and ``queryAll`` no longer returns them. Returns their
        ids. Only records whose delete cascaded to nothing are chosen."""
        _check_count("count", count)
        return self._records.hard_delete(entity, count)

    def platform_events(self, n: int) -> list[EmittedEvent]:
        """``n`` platform events (one publish call), on the catalogue's platform event topics."""
        _check_count("n", n)
        if not self._pe_topics:
            raise ValueError("the catalogue has no platform event topic (/event/...)")
        if n == 0:
            return []
        self._emitter.advance_clock()
        out = []
        for _ in range(n):
            topic = self._values.pick(self._pe_topics)
            out.append(
                self._emitter.platform_event(
                    self._catalogue.topic(topic.name), self._records.live.get("Account")
                )
            )
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

    @staticmethod
    def _resolve_org_id(org_id: str | None, rng: random.Random) -> str:
        if org_id is None:
            return IdFactory.org_id(rng)
        try:
            full = to_18(org_id)
        except ValueError as exc:
            raise ValueError(f"org_id must be a 15- or 18-char org id: {exc}") from exc
        if key_prefix(full) != "00D":
            raise ValueError(f"org_id must start with the org key prefix 00D (got {org_id!r})")
        return full

    def _install(self, topic: TopicDef) -> None:
        """Generate ``topic``'s object with the topic's current schema from now on."""
        entity = entity_of(topic)
        plan = build_plan(
            topic,
            prefix=self._prefixes[entity],
            writer_for=self._emitter.writer,
            values=self._values,
        )
        self._plans[entity] = plan
        self._truth.register(entity, [f.name for f in plan.schema.fields[1:]], plan.compounds)


def _check_count(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be an int >= 0 (got {value!r})")
