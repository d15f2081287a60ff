"""The local engine's own MERGE (:mod:`pipelines.engines.direct_merge`) against delta-rs' MERGE
of the same rows into the same table: the same rows after, the same counts, the same change
data feed; files no source key can match stay in place; a version taken meanwhile leaves
nothing behind and the MERGE goes to delta-rs; delta-spark reads the result."""

from __future__ import annotations

import json
import random
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from ingest.errors import LakeError
from pipelines.engines import TableRef, Txn
from pipelines.engines.arrow import arrow_schema_to_spark
from pipelines.engines.direct_merge import DirectMerger
from pipelines.engines.local import LocalEngine

GOLD = TableRef("gold", "account")
UTC = timezone.utc
ADDRESS = pa.struct([("City", pa.string()), ("Zip", pa.int32())])
SCHEMA = pa.schema(
    [
        pa.field("Id", pa.string(), nullable=False),
        ("Name", pa.string()),
        ("Amount", pa.float64()),
        ("Address", ADDRESS),
        ("Tags", pa.list_(pa.string())),
        ("resolved_at", pa.timestamp("us", tz="UTC")),
        ("_cdc_is_deleted", pa.bool_()),
        ("_cdc_order_key", pa.string()),
    ]
)
NEWER = "(target._cdc_order_key IS NULL OR source._cdc_order_key > target._cdc_order_key)"
# (update condition, delete condition, insert) as the pipeline's MERGEs use them.
CLAUSES = {
    "gold, soft deletes": (NEWER, None, True),
    "gold, hard deletes": (NEWER, f"source._cdc_is_deleted = true AND {NEWER}", True),
    "snapshot": (None, "source._cdc_is_deleted = true", True),
    "retry": ("source.resolved_at IS NOT NULL AND target.resolved_at IS NULL", None, False),
    "delete all matched": (None, "true", False),
}


def _rows(rng: random.Random, ids: list[int], tag: str) -> pa.Table:
    start = datetime(2025, 1, 1, tzinfo=UTC)
    return pa.table(
        {
            "Id": [f"001{i:08d}" for i in ids],
            "Name": [None if rng.random() < 0.2 else f"{tag} {i}" for i in ids],
            "Amount": [None if rng.random() < 0.3 else rng.random() * 100 for _ in ids],
            "Address": [
                None if rng.random() < 0.3 else {"City": rng.choice(["Lyon", None]), "Zip": i}
                for i in ids
            ],
            "Tags": [[tag] if rng.random() < 0.5 else None for _ in ids],
            "resolved_at": [
                None if rng.random() < 0.5 else start + timedelta(seconds=i) for i in ids
            ],
            "_cdc_is_deleted": [rng.random() < 0.2 for _ in ids],
            "_cdc_order_key": [
                None if rng.random() < 0.1 else f"{rng.randrange(100):03d}" for _ in ids
            ],
        },
        schema=SCHEMA,
    )


def _table(root: Path, name: str, rng_seed: int) -> tuple[LocalEngine, TableRef]:
    """A gold-like table in four files (ids 0..399 by hundreds), change data feed on."""
    engine = LocalEngine(location=root / name)
    engine.ensure_table(GOLD, arrow_schema_to_spark(SCHEMA))
    rng = random.Random(rng_seed)
    for part in range(4):
        engine.append(GOLD, _rows(rng, list(range(part * 100, part * 100 + 100)), "old"))
    return engine, GOLD


def _source(seed: int, ids: list[int]) -> pa.Table:
    return _rows(random.Random(seed), ids, "new")


def _sorted(table: pa.Table) -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=lambda r: (r["Id"], r.get("_change_type") or ""))


def _last_commit(path: Path) -> dict[str, Any]:
    log = sorted((path / "_delta_log").glob("*.json"))[-1]
    actions = [json.loads(line) for line in log.read_text().splitlines()]
    return next(a["commitInfo"] for a in actions if "commitInfo" in a)


def _reference_merge(
    path: Path, source: pa.Table, update: str | None, delete: str | None, insert: bool
) -> dict[str, Any]:
    """delta-rs' MERGE, through its own API."""
    merger = DeltaTable(str(path)).merge(
        source, "target.Id = source.Id", source_alias="source", target_alias="target"
    )
    if delete:
        merger = merger.when_matched_delete(predicate=delete)
    merger = merger.when_matched_update_all(predicate=update)
    if insert:
        merger = merger.when_not_matched_insert_all()
    return merger.execute()


def _changes(path: Path, version: int) -> list[dict[str, Any]]:
    feed = pa.table(DeltaTable(str(path)).load_cdf(starting_version=version).read_all())
    return _sorted(feed.drop_columns(["_commit_version", "_commit_timestamp"]))


@pytest.mark.parametrize("clauses", list(CLAUSES))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_local_merge_does_what_delta_rs_does(tmp_path: Path, clauses: str, seed: int) -> None:
    update, delete, insert = CLAUSES[clauses]
    ours, table = _table(tmp_path, "ours", seed)
    _table(tmp_path, "theirs", seed)
    theirs_path = tmp_path / "theirs" / "gold" / "account"
    ours_path = ours.path(table)
    # Updates of existing ids (some in the same file), new ids, ids of no file in between.
    rng = random.Random(seed)
    ids = sorted(rng.sample(range(600), 150))
    source = _source(seed + 100, ids)

    metrics = ours.merge(
        table,
        source,
        on=["Id"],
        update_condition=update,
        delete_condition=delete,
        insert=insert,
        txn=Txn("sfcdc.gold:Account", 7),
    )
    reference = _reference_merge(theirs_path, source, update, delete, insert)

    assert _last_commit(ours_path)["engineInfo"] == "sfcdc"  # the MERGE ran here
    assert _sorted(ours.to_arrow(ours.read(table))) == _sorted(
        DeltaTable(str(theirs_path)).to_pyarrow_table()
    )
    assert (metrics.inserted, metrics.updated, metrics.deleted, metrics.source_rows) == (
        reference["num_target_rows_inserted"],
        reference["num_target_rows_updated"],
        reference["num_target_rows_deleted"],
        reference["num_source_rows"],
    )
    assert _changes(ours_path, metrics.version) == _changes(
        theirs_path, DeltaTable(str(theirs_path)).version()
    )
    assert DeltaTable(str(ours_path)).transaction_version("sfcdc.gold:Account") == 7
    again = ours.merge(table, source, on=["Id"], txn=Txn("sfcdc.gold:Account", 7))
    assert again.skipped and ours.version(table) == metrics.version


def test_files_no_source_key_reaches_stay_in_place(tmp_path: Path) -> None:
    engine, table = _table(tmp_path, "lake", 5)
    before = set(DeltaTable(str(engine.path(table))).file_uris())
    # Keys of the second file only (ids 100..199), and one new id past the last file.
    source = _source(9, [120, 150, 950])
    metrics = engine.merge(table, source, on=["Id"], update_condition=None)
    after = set(DeltaTable(str(engine.path(table))).file_uris())
    assert (metrics.updated, metrics.inserted) == (2, 1)
    assert len(before - after) == 1 and len(after - before) == 2  # one rewritten, one new
    commit = _last_commit(engine.path(table))
    assert commit["operationMetrics"]["num_target_files_skipped_during_scan"] == 3
    assert engine.count(engine.read(table)) == 401


def test_a_merge_that_changes_nothing_commits_only_its_transaction(tmp_path: Path) -> None:
    engine, table = _table(tmp_path, "lake", 6)
    version = engine.version(table)
    source = _source(3, [5, 6]).set_column(
        SCHEMA.get_field_index("_cdc_order_key"),
        "_cdc_order_key",
        pa.array([None, None], pa.string()),
    )
    metrics = engine.merge(
        table, source, on=["Id"], update_condition=NEWER, insert=False, txn=Txn("app", 1)
    )
    assert (metrics.updated, metrics.inserted, metrics.deleted) == (0, 0, 0)
    assert metrics.version == version + 1 and engine.txn_version(table, "app") == 1
    assert (
        DeltaTable(str(engine.path(table))).file_uris()
        == DeltaTable(str(engine.path(table)), version=version).file_uris()
    )
    untracked = engine.merge(table, source, on=["Id"], update_condition=NEWER, insert=False)
    assert untracked.version == version + 1  # no transaction, no change: no commit


def test_conditions_it_does_not_understand_go_to_delta_rs(tmp_path: Path) -> None:
    engine, table = _table(tmp_path, "lake", 7)
    source = _source(4, [1, 2, 700])
    metrics = engine.merge(
        table, source, on=["Id"], update_condition="source.Amount + 0 >= 0 OR true"
    )
    assert _last_commit(engine.path(table))["engineInfo"].startswith("delta-rs")
    assert (metrics.updated, metrics.inserted) == (2, 1)


def test_two_source_rows_of_one_key_are_refused(tmp_path: Path) -> None:
    engine, table = _table(tmp_path, "lake", 8)
    version = engine.version(table)
    twice = _source(2, [3, 3])
    with pytest.raises(LakeError, match=r"merge into .*(multiple source rows|MULTIPLE_SOURCE)"):
        engine.merge(table, twice, on=["Id"])
    assert engine.version(table) == version


def test_a_version_taken_meanwhile_leaves_no_file_and_no_commit(tmp_path: Path) -> None:
    engine, table = _table(tmp_path, "lake", 9)
    path = engine.path(table)
    stranger = _source(1, [999])

    once = threading.Lock()

    def clock_with_an_append() -> float:
        # Another writer's blind append lands while the MERGE writes its files (the clock
        # is read by the threads rewriting files, so only the first one appends).
        if once.acquire(blocking=False):
            write_deltalake(str(path), stranger, mode="append")
        return datetime.now(UTC).timestamp()

    files = {p.name for p in path.rglob("*.parquet")}
    dt = DeltaTable(str(path))
    plan = DirectMerger.plan(
        dt,
        _source(2, [10, 210, 1000]),
        on=["Id"],
        update_condition=None,
        delete_condition=None,
        insert=True,
    )
    assert plan is not None
    assert DirectMerger(clock=clock_with_an_append).merge(dt, plan, txn=None, metadata=None) is None
    left = {p.name for p in path.rglob("*.parquet")} - files
    assert len(left) == 1  # the stranger's file; the MERGE's own are gone
    assert DeltaTable(str(path)).version() == 5
    # Through the engine, the same MERGE then lands on the newer version.
    metrics = engine.merge(table, _source(2, [10, 210, 1000]), on=["Id"])
    assert (metrics.updated, metrics.inserted) == (2, 1)
    assert engine.count(engine.read(table)) == 402


@pytest.mark.spark
def test_delta_spark_reads_the_merged_table_and_its_change_feed(tmp_path: Path, spark: Any) -> None:
    engine, table = _table(tmp_path, "lake", 10)
    source = _source(11, [1, 101, 201, 301, 800])
    metrics = engine.merge(
        table,
        source,
        on=["Id"],
        update_condition=None,
        delete_condition="source._cdc_is_deleted = true",
    )
    path = str(engine.path(table))
    frame = spark.read.format("delta").load(path)
    assert frame.count() == 400 + metrics.inserted - metrics.deleted
    assert sorted(r.Id for r in frame.collect()) == sorted(
        engine.to_arrow(engine.read(table)).column("Id").to_pylist()
    )
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", metrics.version)
        .load(path)
    )
    kinds = sorted(r._change_type for r in feed.collect())
    assert kinds.count("insert") == metrics.inserted
    assert kinds.count("delete") == metrics.deleted
    assert kinds.count("update_postimage") == kinds.count("update_preimage") == metrics.updated


def test_an_append_only_table_refuses_the_merge_as_delta_rs_does(tmp_path: Path) -> None:
    engine = LocalEngine(location=tmp_path)
    engine.ensure_table(
        GOLD, arrow_schema_to_spark(SCHEMA), properties={"delta.appendOnly": "true"}
    )
    engine.append(GOLD, _source(1, [1, 2]))
    version = engine.version(GOLD)
    with pytest.raises(LakeError, match="merge into"):
        engine.merge(GOLD, _source(2, [2, 3]), on=["Id"])
    assert engine.version(GOLD) == version and engine.count(engine.read(GOLD)) == 2
