"""Silver-shaped rows for the gold fold tests, built row by row, and the fold run through the
lake engine under test (the ``engine`` fixture: each test runs once per engine) exactly as the
gold job runs it (:func:`pipelines.gold.job.fold_rows`).

The object is Account-like: a plain text field, a long text field (diffs), an integer, a
datetime, a date, an Address compound and Account's switchable ``Name`` (``Name`` string +
``Name_PersonName`` struct), in struct or flattened form, laid out by silver's own
:class:`~pipelines.silver.columns.SilverLayout` so field names land where silver puts them.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import types as T

import ingest.emulator as emulator_schemas
from pipelines.engines import LakeEngine, Rows
from pipelines.engines.arrow import arrow_schema_to_spark, spark_schema_to_arrow
from pipelines.engines.local import LocalEngine
from pipelines.gold.columns import tombstone_schema
from pipelines.gold.folding import GoldPart, ResyncPart, TombstonePart, VersionsPart
from pipelines.gold.job import batch_wildcards, fold_rows
from pipelines.gold.plan import FoldPlan, fold_plan, versions_schema
from pipelines.gold.resync import RESYNC_SCHEMA
from pipelines.silver.columns import FieldLayout, LeafLayout, SilverLayout
from tests.unit.gold.fold_reference import reference_fold_rows, without_set_flags

# Its assertions explain themselves as the tests' own do.
pytest.register_assert_rewrite("tests.spark.gold.helpers")

T0 = datetime(2025, 3, 1, 9, 0, 0, tzinfo=timezone.utc)
RUN_AT = datetime(2025, 3, 2, 0, 0, 0, tzinfo=timezone.utc)

ADDRESS = ("Street", "City", "PostalCode", "Country")
PERSON = ("Salutation", "FirstName", "LastName")


def layout(compounds: str = "struct", *, extra: Iterable[FieldLayout] = ()) -> SilverLayout:
    fields = (
        FieldLayout("Name", "switchable", "string", tuple(LeafLayout(c, "string") for c in PERSON)),
        FieldLayout("Phone", "leaf", "string"),
        FieldLayout("Description", "leaf", "string"),
        FieldLayout(
            "BillingAddress", "struct", "string", tuple(LeafLayout(c, "string") for c in ADDRESS)
        ),
        FieldLayout("NumberOfEmployees", "leaf", "int"),
        FieldLayout("LastModifiedDate", "leaf", "timestamp"),
        FieldLayout("SLAExpirationDate__c", "leaf", "date"),
        *extra,
    )
    return SilverLayout("Account", True, fields, compounds)  # type: ignore[arg-type]


def account_schema_json(*, extra: Iterable[tuple[str, str, str]] = ()) -> str:
    """An AccountChangeEvent schema whose silver layout is :func:`layout` (``extra``: more
    ``(name, avro type, doc)`` fields at the end, as a later schema version adds them)."""
    shipped = Path(emulator_schemas.__file__).parent / "schemas" / "AccountChangeEvent.avsc"
    header = json.loads(shipped.read_text(encoding="utf-8"))["fields"][0]

    def opt(name: str, avro: Any, doc: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {"name": name, "type": ["null", avro], "default": None}
        if doc:
            out["doc"] = doc
        return out

    person = {
        "type": "record",
        "name": "Switchable_PersonName",
        "fields": [opt(c, "string", None) for c in PERSON],
    }
    address = {
        "type": "record",
        "name": "Address",
        "fields": [opt(c, "string", None) for c in ADDRESS],
    }
    fields = [
        header,
        {
            "name": "Name",
            "type": ["null", "string", person],
            "doc": "Data:Switchable_PersonName",
            "default": None,
        },
        opt("Phone", "string", "Data:Phone"),
        opt("Description", "string", "Data:StringPlusClob"),
        opt("BillingAddress", address, "Data:Address"),
        opt("NumberOfEmployees", "int", "Data:Integer"),
        opt("LastModifiedDate", "long", "Data:DateTime"),
        opt("SLAExpirationDate__c", "long", "Data:DateOnly:00N5g00000Q7dRb"),
        *(opt(n, t, d) for n, t, d in extra),
    ]
    return json.dumps(
        {
            "type": "record",
            "name": "AccountChangeEvent",
            "namespace": "com.sforce.eventbus",
            "fields": fields,
        }
    )


def plan(
    compounds: str = "struct", *, extra: Iterable[FieldLayout] = (), **options: Any
) -> FoldPlan:
    options.setdefault("partitions", 1)
    return fold_plan(layout(compounds, extra=extra), processed_at=RUN_AT, **options)


_counter = itertools.count(1)
_OPTIONS = ("diff", "event", "commit_number", "tx", "seq", "batch", "batch_seq", "wildcard")


@dataclass
class Silver:
    """Silver rows of one object, in the order they are added (stream order by default)."""

    compounds: str = "struct"
    extra: tuple[FieldLayout, ...] = ()
    rows: list[dict[str, Any]] = field(default_factory=list)
    batch: int = 1

    @property
    def schema(self) -> T.StructType:
        return layout(self.compounds, extra=self.extra).silver_schema()

    def add(
        self,
        record_id: str | None,
        change_type: str,
        at: float,
        *,
        changed: Iterable[str] = (),
        nulled: Iterable[str] = (),
        diff: Iterable[str] = (),
        event: str | None = None,
        commit_number: int | None = None,
        tx: str | None = None,
        seq: int = 1,
        batch: int | None = None,
        batch_seq: int | None = None,
        wildcard: bool = False,
        record_count: int = 1,
        **values: Any,
    ) -> dict[str, Any]:
        n = next(_counter)
        row: dict[str, Any] = dict.fromkeys(self.schema.names)
        row.update(
            {
                "Id": record_id,
                "_cdc_change_type": change_type,
                "_cdc_entity": "Account",
                "_cdc_commit_timestamp": T0 + timedelta(seconds=at),
                "_cdc_commit_number": commit_number if commit_number is not None else 10**15 + n,
                "_cdc_transaction_key": tx or f"tx-{n:06d}",
                "_cdc_sequence_number": seq,
                "_cdc_commit_user": "005000000000001AAA",
                "_cdc_change_origin": "",
                "_cdc_event_id": event or f"ev-{n:06d}",
                "_cdc_replay_id": n.to_bytes(10, "big"),
                "_cdc_schema_id": "schema-1",
                "_cdc_changed_fields": list(changed),
                "_cdc_nulled_fields": list(nulled),
                "_cdc_diff_fields": list(diff),
                "_cdc_record_count": record_count,
                "_cdc_is_wildcard": wildcard,
                "_cdc_bronze_batch_id": batch if batch is not None else self.batch,
                "_cdc_bronze_batch_seq": batch_seq if batch_seq is not None else n,
            }
        )
        unknown = set(values) - set(row)
        assert not unknown, f"no silver columns {unknown}"
        row.update(values)
        self.rows.append(row)
        return row

    def create(self, record_id: str, at: float, **values: Any) -> dict[str, Any]:
        full = {"Name": f"Company {record_id}", "Phone": "555-0100", "NumberOfEmployees": 10}
        full.update(values)
        return self.add(record_id, "CREATE", at, **full)

    def update(
        self,
        record_id: str,
        at: float,
        *,
        changed: Iterable[str] | None = None,
        nulled: Iterable[str] | None = None,
        **values: Any,
    ) -> dict[str, Any]:
        """An UPDATE of the given column values; unless given, ``changed`` lists the values'
        columns and ``nulled`` those set to None."""
        options = {k: values.pop(k) for k in _OPTIONS if k in values}
        if changed is None:
            changed = list(values)
        if nulled is None:
            nulled = [k for k, v in values.items() if v is None]
        return self.add(
            record_id, "UPDATE", at, changed=changed, nulled=nulled, **options, **values
        )

    def table(self, rows: Iterable[Mapping[str, Any]] | None = None) -> pa.Table:
        """The rows (default: all added), as Arrow in the silver schema's types."""
        chosen = self.rows if rows is None else rows
        return pa.Table.from_pylist(list(chosen), schema=spark_schema_to_arrow(self.schema))

    def rows_of(self, engine: LakeEngine, rows: Iterable[Mapping[str, Any]] | None = None) -> Rows:
        """:meth:`table` as rows of ``engine``."""
        return engine.rows(self.table(rows), self.schema)

    def next_batch(self) -> Silver:
        return replace(self, rows=[], batch=self.batch + 1)


def fold(
    engine: LakeEngine,
    silver: Silver,
    *,
    gold: Rows | None = None,
    tombstones: Rows | None = None,
    the_plan: FoldPlan | None = None,
    rows: Iterable[Mapping[str, Any]] | None = None,
) -> Rows:
    """The fold output of ``silver``'s rows (or ``rows``) onto ``gold`` and ``tombstones``
    (rows of ``engine``), folded by ``engine`` as the gold job folds a batch, computed once."""
    p = the_plan or plan(silver.compounds, extra=silver.extra)
    changes = silver.rows_of(engine, rows)
    folded = engine.to_arrow(_fold(engine, changes, silver.schema, p, gold, tombstones))
    # The same inputs folded in this process, as the local engine folds them: whatever the
    # engine under test, every case must come out the same, in every column.
    reference = LocalEngine(location=_NO_LAKE)
    expected = _fold(
        reference,
        engine.to_arrow(changes),
        silver.schema,
        p,
        None if gold is None else engine.to_arrow(gold),
        None if tombstones is None else engine.to_arrow(tombstones),
    )
    assert _sorted(folded) == _sorted(reference.to_arrow(expected))
    # And the fold equals its reference model, folding each record in Python.
    one_by_one = reference_fold_rows(
        p,
        silver.schema,
        engine.to_arrow(changes),
        gold=None if gold is None else engine.to_arrow(gold),
        tombstones=None if tombstones is None else engine.to_arrow(tombstones),
        wildcards=batch_wildcards(
            reference, reference.rows(engine.to_arrow(changes)), silver.schema
        ),
    )
    # (It leaves FOLD_SET null.)
    assert _sorted(without_set_flags(folded)) == _sorted(without_set_flags(one_by_one))
    return engine.rows(folded)


def computed(engine: LakeEngine, rows: Rows) -> Rows:
    """``rows`` computed once, for tests that look at them several ways or fold onto them."""
    return engine.rows(engine.to_arrow(rows))


# The in-process reference engine only runs functions: it never touches its lake.
_NO_LAKE = Path("/nonexistent/sfcdc-gold-tests")


def _fold(
    engine: LakeEngine,
    changes: Rows,
    schema: T.StructType,
    the_plan: FoldPlan,
    gold: Rows | None,
    tombstones: Rows | None,
) -> Rows:
    wildcards = batch_wildcards(engine, changes, schema)
    return fold_rows(
        engine,
        changes,
        schema=schema,
        plan=the_plan,
        wildcards=wildcards,
        gold=gold,
        tombstones=tombstones,
    )


def _sorted(table: pa.Table) -> list[dict[str, Any]]:
    rows = table.to_pylist()
    return sorted(rows, key=lambda r: (r["Id"] is not None, r["Id"] or "", repr(r)))


def _output_schema(engine: LakeEngine, folded: Rows) -> T.StructType:
    return arrow_schema_to_spark(engine.to_arrow(folded).schema)


def gold_changes(engine: LakeEngine, folded: Rows) -> Rows:
    """The rows of a fold output the job MERGEs into the gold table (gold columns)."""
    output = _output_schema(engine, folded)
    gold = T.StructType([f for f in output.fields if not f.name.startswith("_fold_")])
    return engine.map_batches(folded, GoldPart(gold.names), gold)


def tombstone_changes(engine: LakeEngine, folded: Rows) -> Rows:
    """The rows of a fold output the job MERGEs into the tombstone table."""
    return engine.map_batches(folded, TombstonePart(), tombstone_schema())


def resync_entries(engine: LakeEngine, folded: Rows) -> Rows:
    """The re-sync rows a fold found."""
    return engine.map_batches(folded, ResyncPart(), RESYNC_SCHEMA)


def history_versions(engine: LakeEngine, folded: Rows) -> Rows:
    """The SCD2 versions a fold started."""
    return engine.map_batches(
        folded, VersionsPart(), versions_schema(_output_schema(engine, folded))
    )


def gold_of(engine: LakeEngine, silver: Silver, **kwargs: Any) -> Rows:
    """The gold rows after folding ``silver`` (what the MERGE would upsert)."""
    return gold_changes(engine, fold(engine, silver, **kwargs))


def day(y: int, m: int, d: int) -> date:
    return date(y, m, d)


@pytest.fixture
def silver() -> Silver:
    return Silver()


@pytest.fixture
def engine(lake_engine: LakeEngine) -> LakeEngine:
    """The lake engine the test folds with: each test asking for it runs once per engine."""
    return lake_engine


@pytest.fixture
def lake(make_engine: Any, engine_name: str, tmp_path: Path) -> Callable[..., Any]:
    """``lake(gold="", root=None)``: a :class:`~tests.spark.gold.lakes.Lake` under
    ``root`` (default: this test's ``tmp_path``) on the engine under test (each test asking
    for it runs once per engine); ``gold`` is the object's ``gold:`` section."""
    from tests.spark.gold.lakes import Lake  # it builds on this module's Silver

    def new(gold: str = "", root: Path | None = None) -> Lake:
        return Lake(make_engine, engine_name, root or tmp_path, gold)

    return new
