"""The workload's field values: a new record's full set of values (every field of the current
schema, lookups pointing at live records, compound fields, the fields Salesforce derives such
as an opportunity's probability), random changes to a live record's editable fields (long
text edited and sent as a diff when the rules allow, compound children changed one by one) and
the event :class:`~ingest.emulator.workload_records.Item` of a CREATE, UPDATE or UNDELETE.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from ingest.emulator.ids import IdFactory
from ingest.emulator.textdiff import Newline, decide_diff
from ingest.emulator.values import ValueFactory
from ingest.emulator.workload_emit import Tx
from ingest.emulator.workload_mix import WorkloadMix
from ingest.emulator.workload_plans import REQUIRED_CHILDREN, STAGES, FieldPlan, Plan
from ingest.emulator.workload_records import Item, Meta, Records

__all__ = ["FieldValues"]


class FieldValues:
    """Makes records and changes to them; draws only from the workload's seeded generator.

    ``mix`` is read at every call (the workload replaces it when its mix changes);
    ``record_types`` maps each entity to its record type ids.
    """

    def __init__(
        self,
        rng: random.Random,
        values: ValueFactory,
        ids: IdFactory,
        records: Records,
        *,
        users: tuple[str, ...],
        record_types: Mapping[str, tuple[str, ...]],
        mix: WorkloadMix,
    ) -> None:
        self._random = rng.random
        self._values = values
        self._ids = ids
        self._records = records
        self._users = users
        self._record_types = record_types
        self.mix = mix

    # -- new records ----------------------------------------------------------------------------

    def new_record(self, tx: Tx, plan: Plan, *, person: bool | None = None) -> Item:
        """A new record of ``plan``'s object with every field (``person``: a person account,
        or the mix's share of them when None); registered in the bookkeeping, not yet in the
        truth."""
        entity = plan.entity
        record_id = self._ids.new(plan.prefix)
        is_person = (
            entity == "Account"
            and plan.fields.get("Name") is not None
            and plan.fields["Name"].category == "name"
            and (self._random() < self.mix.person_account_ratio if person is None else person)
        )
        meta = self._records.new_meta(entity, record_id, newline=self._newline(), person=is_person)
        values = self._fresh_values(tx, plan, record_id, meta)
        return Item(record_id=record_id, body=values, changes=values)

    def undelete_item(self, tx: Tx, plan: Plan, record_id: str) -> Item:
        """The full record an UNDELETE of ``record_id`` carries."""
        values = dict(self._records.record(plan.entity, record_id))
        if plan.has("LastModifiedDate"):
            values["LastModifiedDate"] = tx.timestamp
        if plan.has("LastModifiedById"):
            values["LastModifiedById"] = tx.user
        return Item(record_id=record_id, body=values, changes=values)

    def scalar(self, fp: FieldPlan, tx: Tx) -> Any:
        """A fresh value of a scalar field."""
        if fp.maker is None:
            raise ValueError(f"{fp.info.name} has no value generator (category {fp.category})")
        return fp.maker(tx.timestamp)

    def _newline(self) -> Newline:
        return "\r\n" if self._random() < self.mix.crlf_ratio else "\n"

    def _lookup_value(
        self, plan: Plan, fp: FieldPlan, record_id: str, values: Mapping[str, Any]
    ) -> str | None:
        records = self._records
        target = fp.target
        if target is None or target not in records.live:
            return None
        name = fp.info.name
        meta = records.meta[plan.entity].get(record_id)
        if plan.entity == "Account" and name == "ParentId":
            order = meta.order if meta else records.created + 1
            return records.live_pick(
                "Account",
                where=lambda c: (
                    c != record_id
                    and not records.meta["Account"][c].person
                    and records.meta["Account"][c].order < order
                ),
            )
        if plan.entity == "Contact" and name == "AccountId":
            return records.live_pick(
                "Account", where=lambda c: not records.meta["Account"][c].person
            )
        if name in ("ContactId", "Contact__c", "ReportsToId"):
            account = values.get("AccountId") or values.get("Account__c")
            order = meta.order if meta else records.created + 1
            return records.live_pick(
                "Contact",
                where=lambda c: (
                    c != record_id
                    and (
                        account is None or records.record("Contact", c).get("AccountId") == account
                    )
                    and (name != "ReportsToId" or records.meta["Contact"][c].order < order)
                ),
                tries=6,
            )
        return records.live_pick(target)

    def _fresh_values(self, tx: Tx, plan: Plan, record_id: str, meta: Meta) -> dict[str, Any]:
        """A full record for a CREATE: every field of the current schema."""
        values: dict[str, Any] = {}
        random_ = self._random
        person = meta.person
        now = tx.timestamp
        fill = self.mix.fill_ratio
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
                    long=random_() < self.mix.long_text_ratio,
                )
            elif category == "lookup":
                values[name] = self._lookup_value(plan, fp, record_id, values)
            elif category == "user":
                values[name] = tx.user if random_() < 0.6 else self._values.pick(self._users)
            elif category == "record_type":
                values[name] = self._values.pick(self._record_types[plan.entity])
            else:
                values[name] = None
        self._derive_on_create(plan, values)
        return values

    def _derive_on_create(self, plan: Plan, values: dict[str, Any]) -> None:
        if plan.entity == "Invoice__c" and plan.has("Name"):
            values["Name"] = self._values.sequence("INV-")
        if plan.entity != "Opportunity" or not plan.has("StageName"):
            return
        probability, closed, won = STAGES.get(values["StageName"], (None, False, False))
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

    # -- one record's changes -------------------------------------------------------------------

    def changes(
        self, tx: Tx, plan: Plan, record_id: str, *, count: int
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """Random changes to ``count`` editable fields: (dotted name -> new value, diffs)."""
        record = self._records.record(plan.entity, record_id)
        meta = self._records.meta[plan.entity][record_id]
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

    def _pick_field(self, candidates: Sequence[FieldPlan], texts: Sequence[FieldPlan]) -> FieldPlan:
        # Long text edits are what diffs are made of: give them a fair share of updates.
        if texts and self._random() < self.mix.long_text_edit_ratio:
            return self._values.pick(texts)
        return self._values.pick(candidates)

    def _change_field(
        self,
        tx: Tx,
        plan: Plan,
        fp: FieldPlan,
        *,
        record_id: str,
        record: Mapping[str, Any],
        meta: Meta,
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
                    newline=meta.newline, html=html, long=self._random() < self.mix.long_text_ratio
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
            new = self.scalar(fp, tx)
            if new == current:
                new = self.scalar(fp, tx)
        if new is None and not nullable:
            return
        if new != current:
            changes[name] = new

    def _change_compound(
        self,
        plan: Plan,
        fp: FieldPlan,
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
            and c not in REQUIRED_CHILDREN
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
        if value is None and c in REQUIRED_CHILDREN:
            return
        if value != old.get(c):
            changes[f"{name}.{c}"] = value

    def _derive_on_update(
        self, plan: Plan, tx: Tx, record: Mapping[str, Any], changes: dict[str, Any]
    ) -> None:
        if plan.entity != "Opportunity" or not changes:
            return
        if "StageName" in changes and plan.has("StageName"):
            probability, closed, won = STAGES.get(changes["StageName"], (None, False, False))
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

    def update_item(
        self,
        tx: Tx,
        plan: Plan,
        record_id: str,
        changes: dict[str, Any],
        diffs: Mapping[str, str],
        *,
        system: bool = True,
    ) -> Item:
        """The UPDATE part of ``record_id`` for ``changes`` (``system``: with the
        LastModified fields), its body in schema order, diffed values as their diffs."""
        record = self._records.record(plan.entity, record_id)
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
        return Item(
            record_id=record_id,
            body=body,
            changed=names,
            nulled=tuple(n for n in names if changes[n] is None),
            diffed=tuple(n for n in names if n in diffs),
            changes=changes,
        )


def _expected_revenue(amount: Any, probability: Any) -> float | None:
    if amount is None or probability is None:
        return None
    return round(float(amount) * float(probability) / 100.0, 2)
