"""The per-record fold as the reference model of the column-wise fold, on generated histories.

:class:`~pipelines.gold.folding.FoldTable` folds every record column-wise
(:func:`~pipelines.gold.fold.fold_table`); :func:`tests.unit.gold.fold_reference.fold_record`
replays each record's changes one at a time, the definition it must equal. Here hypothesis writes
event sequences over a handful of records of an Account-like object (struct or flattened
compounds, soft or hard deletes): CREATEs, UPDATEs of plain fields, of whole compounds and
of their children, nulled fields, unknown fields, diffs, DELETEs and UNDELETEs, gaps, polled
rows, wildcard changes, events delivered twice, commit timestamps out of stream order, over
several batches whose gold rows and tombstones carry on from one batch to the next (a hard
delete whose gold MERGE did not commit included), with and without SCD2 history. Each batch
folded both ways must give the same rows, in every column."""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import date, datetime, timedelta, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.emulator.textdiff import unified_diff
from pipelines.engines.arrow import spark_schema_to_arrow
from pipelines.gold.columns import body_fields, tombstone_schema
from pipelines.gold.folding import ChangeRows, DiffedFields, FoldTable, StateRows, Wildcards
from pipelines.gold.plan import ROLE_GOLD, ROLE_TOMBSTONE, fold_input_schema, kept_columns
from tests.spark.gold.conftest import ADDRESS, PERSON, Silver, plan
from tests.unit.gold.fold_reference import kept_by_merge, reference_fold, without_set_flags

# SFCDC_HYPOTHESIS_EXAMPLES raises the number of examples for a longer, random hunt; by
# default the examples are derandomized (the same seed on every run).
EXAMPLES = int(os.environ.get("SFCDC_HYPOTHESIS_EXAMPLES", "0"))
RECORDS = ("001A", "001B", "001C", "001D", "001E", "001F")
SEEDED = RECORDS[:4]  # the first batch creates these
# Schema versions: "schema-2" lacks Description and BillingAddress (its events carry nulls
# there, and its full images leave those columns as they were).
VERSIONS = {
    "schema-1": (
        "Name",
        "Phone",
        "Description",
        "BillingAddress",
        "NumberOfEmployees",
        "LastModifiedDate",
        "SLAExpirationDate__c",
    ),
    "schema-2": ("Name", "Phone", "NumberOfEmployees", "LastModifiedDate", "SLAExpirationDate__c"),
}
ABSENT = {"schema-2": ("Description", "BillingAddress")}
LONG_TEXTS = ("", "one", "one\ntwo", "one\nthree", "é😀\ntwo")

# ------------------------------------------------------------------------ values

_TEXT = st.sampled_from(["", "a", "b", "555-0100", "é😀", " x "]) | st.text(max_size=3)
_INT = st.integers(min_value=-(2**31), max_value=2**31 - 1)
_STAMP = st.builds(
    lambda s: datetime(2025, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=s),
    st.integers(min_value=-(10**6), max_value=10**6),
)
_DAY = st.builds(lambda d: date(2025, 1, 1) + timedelta(days=d), st.integers(-400, 400))


def _record(children: Sequence[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({c: st.none() | _TEXT for c in children})


_ADDRESS = _record(ADDRESS)
_PERSON = _record(PERSON)
# One value per top-level field (logical form: a compound is a dict of its children).
_FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "Phone": _TEXT,
    "Description": st.sampled_from(LONG_TEXTS),
    "NumberOfEmployees": _INT,
    "LastModifiedDate": _STAMP,
    "SLAExpirationDate__c": _DAY,
    "BillingAddress": _ADDRESS,
    "Name": _TEXT,
}
_CHILD_PATHS = [f"BillingAddress.{c}" for c in ADDRESS] + [f"Name.{c}" for c in PERSON]
_PATHS = [*_FIELD_VALUES, *_CHILD_PATHS, "Unknown__c"]
_PLAIN_PATHS = ["Phone", "Description", "NumberOfEmployees", "LastModifiedDate"]


def _value_of(path: str) -> st.SearchStrategy[Any]:
    if path in _FIELD_VALUES:
        return _FIELD_VALUES[path]
    return _TEXT


# How an UPDATE names a field: set to a value; nulled (value null, in nulledFields); null but
# not in nulledFields; in nulledFields only (not in changedFields).
_HOW = st.sampled_from(["set", "set", "set", "null", "null_unlisted", "nulled_only"])


@st.composite
def _edit(draw: st.DrawFn, paths: Sequence[str] = _PATHS) -> tuple[str, str, Any]:
    path = draw(st.sampled_from(paths))
    how = draw(_HOW)
    value = draw(_value_of(path)) if how == "set" else None
    return path, how, value


def _image() -> st.SearchStrategy[dict[str, Any]]:
    """A full image: every field, Name as the string or the person branch."""
    return st.fixed_dictionaries(
        {
            **{k: st.none() | v for k, v in _FIELD_VALUES.items() if k != "Name"},
            "Name": st.none() | _TEXT,
            "Name_PersonName": st.none() | _PERSON,
        },
    ).map(_one_name_branch)


def _one_name_branch(image: dict[str, Any]) -> dict[str, Any]:
    if image["Name"] is not None:
        image["Name_PersonName"] = None
    return image


# ------------------------------------------------------------------------ events

_RID = st.sampled_from(RECORDS)
_AT = st.integers(min_value=0, max_value=40)  # commit seconds, in any stream order
_SCHEMA = st.sampled_from(["schema-1", "schema-1", "schema-2"])

_CREATE = st.tuples(st.just("create"), _RID, _AT, _SCHEMA, _image())
_UPDATE = st.tuples(
    st.just("update"), _RID, _AT, st.lists(_edit(), min_size=1, max_size=3), st.booleans()
)
# UPDATEs of fields that land in one column (or struct child) each: the column-wise fold's.
_COMMON_PATHS = [*_PLAIN_PATHS, "SLAExpirationDate__c", "BillingAddress", *_CHILD_PATHS[:4]]


def _plain_update(rid: st.SearchStrategy[str]) -> st.SearchStrategy[tuple[Any, ...]]:
    edits = st.lists(_edit(_COMMON_PATHS), min_size=1, max_size=3)
    return st.tuples(st.just("update"), rid, _AT, edits, st.just(False))


_PLAIN_UPDATE = _plain_update(_RID)
_DELETE = st.tuples(st.just("delete"), _RID, _AT)
_OTHERS = [
    st.tuples(st.just("undelete"), _RID, _AT, _SCHEMA, _image()),
    st.tuples(st.just("diff"), _RID, _AT, st.sampled_from(LONG_TEXTS), st.sampled_from(LONG_TEXTS)),
    st.tuples(
        st.just("gap"),
        _RID,
        _AT,
        st.sampled_from(["GAP_CREATE", "GAP_UPDATE", "GAP_DELETE", "GAP_UNDELETE", "MERGE"]),
    ),
    st.tuples(st.just("again"), st.integers(min_value=0, max_value=10**6)),
    st.tuples(st.just("polled"), _RID, _AT, st.booleans(), _image()),
    st.tuples(st.just("overflow"), _AT),
]
_WILDCARD = st.tuples(
    st.just("wildcard"), _AT, st.lists(_edit(_PLAIN_PATHS), min_size=1, max_size=2)
)
# Batches of the common kinds the column-wise fold takes (one_of picks a branch uniformly).
_COMMON = st.one_of(
    *[_plain_update(st.sampled_from(SEEDED))] * 4,
    _PLAIN_UPDATE,
    st.tuples(st.just("create"), st.sampled_from(RECORDS[len(SEEDED) :]), _AT, _SCHEMA, _image()),
    _DELETE,
)
_MIXED = st.one_of(_PLAIN_UPDATE, _PLAIN_UPDATE, _UPDATE, _CREATE, _DELETE, *_OTHERS)


@st.composite
def _batch(
    draw: st.DrawFn, kinds: Sequence[str] = ("common", "mixed", "mixed", "wildcards", "wildcards")
) -> tuple[bool, list[tuple[Any, ...]]]:
    """``(late, ops)``; ``late``: commit times among the batch before's (else later than
    every earlier batch's)."""
    late = draw(st.integers(0, 3)) == 0
    kind = draw(st.sampled_from(kinds))
    if kind == "common":
        return late, draw(st.lists(_COMMON, min_size=1, max_size=12))
    if kind == "mixed":
        return late, draw(st.lists(_MIXED, max_size=12))
    # Wildcard changes (the batch's other records are folded one at a time) and a few
    # changes of their own for some records.
    wildcards = draw(st.lists(_WILDCARD, min_size=1, max_size=2))
    return late, draw(st.permutations(wildcards + draw(st.lists(_MIXED, max_size=4))))


_History = tuple[str, str, str | None, list[tuple[bool, list[tuple[Any, ...]]]], list[bool]]
# SCD2: no history, every column, or a few (a compound among them).
_TRACKS: dict[str | None, Any] = {
    None: None,
    "all": "all",
    "some": ("Phone", "BillingAddress", "NumberOfEmployees"),
}


@st.composite
def histories(draw: st.DrawFn) -> _History:
    """``(compounds, deletes, track, batches, crashes)``. The first batch creates most of
    the records, the second changes them in the common ways; ``crashes[i]``: after batch
    ``i`` the tombstone MERGE committed and the gold MERGE did not."""
    compounds = draw(st.sampled_from(["struct", "flattened"]))
    deletes = draw(st.sampled_from(["soft", "hard"]))
    track = draw(st.sampled_from([None, None, "all", "some"]))
    seed = [("create", rid, draw(_AT), "schema-1", draw(_image())) for rid in SEEDED]
    common = draw(_batch(("common",)))
    batches = [(False, seed), common, *draw(st.lists(_batch(), max_size=2))]
    crashes = [draw(st.integers(0, 5)) == 0 for _ in batches]
    return compounds, deletes, track, batches, crashes


# ------------------------------------------------------------------------ the object


class _Object:
    """The Account-like object of one compound mode and delete mode: its plan, schemas and
    the two folds of a batch without wildcards."""

    def __init__(self, compounds: str, deletes: str, track: str | None) -> None:
        self.compounds = compounds
        tracked = _TRACKS[track]
        if tracked is not None and tracked != "all" and compounds == "flattened":
            tracked = ("Phone", "BillingAddress_City", "NumberOfEmployees")
        self.plan = plan(compounds, deletes=deletes, versions=VERSIONS, track=tracked)
        assert set(self.plan.absent) == set(ABSENT)
        self.silver = Silver(compounds=compounds).schema
        self.silver_type = spark_schema_to_arrow(self.silver)
        self.inputs = fold_input_schema(self.plan, self.silver)
        self.inputs_type = spark_schema_to_arrow(self.inputs)
        self.table = FoldTable(self.plan, self.silver)
        self.output = spark_schema_to_arrow(self.table.output)
        self.gold_names = [f.name for f in self.output if not f.name.startswith("_fold_")]
        self.gold_type = pa.schema([self.output.field(n) for n in self.gold_names])
        self.stone_type = spark_schema_to_arrow(tombstone_schema())
        self.body = [f.name for f in body_fields(self.silver)]

    def fold(
        self,
        changes: pa.Table,
        gold: pa.Table,
        stones: pa.Table,
        wildcards: list[dict[str, Any]],
        *,
        reference: bool,
    ) -> pa.Table:
        """What the gold job's fold (:func:`~pipelines.gold.job.fold_rows`) makes of a batch,
        without an engine: the change, gold and tombstone rows as fold input, then one
        :class:`FoldTable` over all of them (or the reference model)."""
        parts = [
            ChangeRows(self.inputs, without_wildcards=bool(wildcards))(iter(changes.to_batches())),
            StateRows(self.inputs, role=ROLE_GOLD)(iter(gold.to_batches())),
            StateRows(self.inputs, role=ROLE_TOMBSTONE)(iter(stones.to_batches())),
        ]
        combined = pa.Table.from_batches(
            [b for part in parts for b in part], schema=self.inputs_type
        )
        if reference:
            body = [f.name for f in body_fields(self.silver)]
            return reference_fold(self.plan, body, self.output, combined, wildcards)
        table = FoldTable(self.plan, self.silver, wildcards) if wildcards else self.table
        return table(combined)


_OBJECTS: dict[tuple[str, str, str | None], _Object] = {}


def _object(compounds: str, deletes: str, track: str | None) -> _Object:
    key = (compounds, deletes, track)
    if key not in _OBJECTS:
        _OBJECTS[key] = _Object(compounds, deletes, track)
    return _OBJECTS[key]


# ------------------------------------------------------------------------ silver rows

T0 = datetime(2025, 3, 1, 9, 0, 0, tzinfo=timezone.utc)


class _Writer:
    """Turns ops into silver rows, each at a bronze position of its own."""

    def __init__(self, obj: _Object) -> None:
        self.compounds = obj.compounds
        self.blank = dict.fromkeys(obj.silver_type.names)
        self.position = 0
        self.batch = 0
        self.offset = 0
        self.rows: list[dict[str, Any]] = []  # this batch's
        self.written: list[dict[str, Any]] = []  # every batch's

    def next_batch(self, late: bool) -> None:
        self.batch += 1
        self.offset = 100 * (self.batch - 1 if late else self.batch)
        self.rows = []

    def _columns(self, values: dict[str, Any]) -> dict[str, Any]:
        """Logical values -> silver columns (compounds as structs or flattened)."""
        out: dict[str, Any] = {}
        for name, value in values.items():
            children = {"BillingAddress": ADDRESS, "Name_PersonName": PERSON}.get(name)
            if children is None or self.compounds == "struct":
                out[name] = value
                continue
            prefix = "Name" if name == "Name_PersonName" else name
            for c in children:
                out[f"{prefix}_{c}"] = None if value is None else value[c]
        return out

    def _add(
        self,
        rid: str | None,
        change_type: str,
        at: int,
        *,
        changed: Sequence[str] = (),
        nulled: Sequence[str] = (),
        diff: Sequence[str] = (),
        wildcard: bool = False,
        schema_id: str = "schema-1",
        values: dict[str, Any] | None = None,
    ) -> None:
        self.position += 1
        n = self.position
        row = dict(self.blank)
        row.update(
            {
                "Id": rid,
                "_cdc_change_type": change_type,
                "_cdc_entity": "Account",
                "_cdc_commit_timestamp": T0 + timedelta(seconds=self.offset + at),
                "_cdc_commit_number": 10**15 + n,
                "_cdc_transaction_key": f"tx-{n:04d}",
                "_cdc_sequence_number": 1,
                "_cdc_commit_user": "005000000000001AAA",
                "_cdc_change_origin": "",
                "_cdc_event_id": f"ev-{n:04d}",
                "_cdc_replay_id": n.to_bytes(10, "big"),
                "_cdc_schema_id": schema_id,
                "_cdc_changed_fields": list(changed),
                "_cdc_nulled_fields": list(nulled),
                "_cdc_diff_fields": list(diff),
                "_cdc_record_count": 1,
                "_cdc_is_wildcard": wildcard,
                "_cdc_bronze_batch_id": self.batch,
                "_cdc_bronze_batch_seq": n,
            }
        )
        columns = self._columns(values or {})
        assert set(columns) <= set(row), set(columns) - set(row)
        row.update(columns)
        self.rows.append(row)
        self.written.append(row)

    def write(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind in ("create", "undelete"):
            _, rid, at, schema_id, image = op
            image = dict(image)
            for column in ABSENT.get(schema_id, ()):
                image[column] = None  # not a field of that version
            change = "CREATE" if kind == "create" else "UNDELETE"
            self._add(rid, change, at, schema_id=schema_id, values=image)
        elif kind == "update":
            _, rid, at, edits, noise = op
            self._update(rid, at, edits, noise=noise)
        elif kind == "wildcard":
            _, at, edits = op
            self._update("001*", at, edits, noise=False, wildcard=True)
        elif kind == "delete":
            _, rid, at = op
            self._add(rid, "DELETE", at)
        elif kind == "polled":
            _, rid, at, deleted, image = op
            self._add(rid, "POLLED_DELETED" if deleted else "POLLED", at, values=dict(image))
        elif kind == "diff":
            _, rid, at, old, new = op
            diff = unified_diff(old, new, newline="\n")
            self._add(
                rid,
                "UPDATE",
                at,
                changed=["Description"],
                diff=["Description"],
                values={"Description": diff},
            )
        elif kind == "gap":
            _, rid, at, change = op
            self._add(rid, change, at)
        elif kind == "overflow":
            _, at = op
            self._add(None, "GAP_OVERFLOW", at)
        elif kind == "again" and self.written:
            # An event delivered again, at a later bronze position (this batch's).
            again = dict(self.written[op[1] % len(self.written)])
            self.position += 1
            again["_cdc_bronze_batch_id"] = self.batch
            again["_cdc_bronze_batch_seq"] = self.position
            self.rows.append(again)
            self.written.append(again)

    def _update(
        self,
        rid: str,
        at: int,
        edits: Sequence[tuple[str, str, Any]],
        *,
        noise: bool,
        wildcard: bool = False,
    ) -> None:
        changed: list[str] = []
        nulled: list[str] = []
        values: dict[str, Any] = {}
        for path, how, value in edits:
            if how != "nulled_only":
                changed.append(path)
            if how in ("null", "nulled_only"):
                nulled.append(path)
            parent, _, child = path.partition(".")
            if path == "Unknown__c":
                continue
            if child:
                column = "Name_PersonName" if parent == "Name" else parent
                children = PERSON if parent == "Name" else ADDRESS
                current = values.get(column) or dict.fromkeys(children)
                values[column] = {**current, child: value}
            else:
                values[path] = value
        if noise:
            # Values of fields the change does not name: no change.
            for name, value in (("Phone", "noise"), ("NumberOfEmployees", 99)):
                if name not in changed:
                    values.setdefault(name, value)
        self._add(
            rid,
            "UPDATE",
            at,
            changed=list(dict.fromkeys(changed)),
            nulled=list(dict.fromkeys(nulled)),
            wildcard=wildcard,
            values=values,
        )


# ------------------------------------------------------------------------ folding


def _sorted(table: pa.Table) -> list[dict[str, Any]]:
    rows = without_set_flags(table).to_pylist()
    return sorted(rows, key=lambda r: (r["Id"] is not None, r["Id"] or "", repr(r)))


def _merged(
    rows: dict[str, dict[str, Any]], folded: pa.Table, action: str, names: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """``rows`` (by Id) after the MERGE of the fold output's ``action`` column: an upsert
    guarded by the order key, or a delete."""
    out = dict(rows)
    for row in folded.filter(pc.is_valid(folded.column(action))).to_pylist():
        rid, key = row["Id"], row["_cdc_order_key"]
        current = (out.get(rid) or {}).get("_cdc_order_key")
        newer = current is None or key > current
        if row[action] == "delete":
            if action == "_fold_tombstone" or (newer and row["_cdc_is_deleted"]):
                out.pop(rid, None)
        elif newer:
            out[rid] = {n: row[n] for n in names}
    return out


def _run(history: _History) -> None:
    compounds, deletes, track, batches, crashes = history
    obj = _object(compounds, deletes, track)
    writer = _Writer(obj)
    gold: dict[str, dict[str, Any]] = {}
    stones: dict[str, dict[str, Any]] = {}
    for (late, ops), crash in zip(batches, crashes, strict=True):
        writer.next_batch(late)
        for op in ops:
            writer.write(op)
        changes = pa.Table.from_pylist(writer.rows, schema=obj.silver_type)
        wildcards = [
            row
            for batch in Wildcards(obj.silver)(iter(changes.to_batches()))
            for row in batch.to_pylist()
        ]
        gold_rows = pa.Table.from_pylist(list(gold.values()), schema=obj.gold_type)
        stone_rows = pa.Table.from_pylist(list(stones.values()), schema=obj.stone_type)
        folded = obj.fold(changes, gold_rows, stone_rows, wildcards, reference=False)
        reference = obj.fold(changes, gold_rows, stone_rows, wildcards, reference=True)
        assert _sorted(folded) == _sorted(reference)
        if not wildcards:
            # Gold read without the columns the MERGE keeps (as the gold job reads it): the
            # rows merged are the same.
            diffed = {
                path
                for batch in DiffedFields()(iter(changes.to_batches()))
                for path in batch.column(0).to_pylist()
            }
            kept = kept_columns(obj.plan, obj.body, diffed)
            slim = obj.fold(
                changes, gold_rows.drop_columns(list(kept)), stone_rows, [], reference=False
            )
            assert _sorted(kept_by_merge(slim, gold_rows, obj.body)) == _sorted(reference)
        stones = _merged(stones, reference, "_fold_tombstone", obj.stone_type.names)
        if not crash:
            gold = _merged(gold, reference, "_fold_gold", obj.gold_names)


def _settings(examples: int) -> settings:
    return settings(
        max_examples=EXAMPLES or examples,
        deadline=None,
        derandomize=not EXAMPLES,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def test_the_fold_equals_the_reference_model_on_generated_histories() -> None:
    @_settings(100)
    @given(histories())
    def check(history: _History) -> None:
        _run(history)

    check()
