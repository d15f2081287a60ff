"""The gold job builds the same tables whether it folds silver's changes as they arrive, a
small batch per pass, or all of them at once, as one large batch (a lake that fell behind),
or a backlog in several steps of at most ``gold.max_rows_per_commit`` rows: gold, tombstones,
SCD2 history and re-sync rows alike, on either engine. A run that dies between two steps
resumes at the next one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ingest.errors import LakeError
from pipelines.engines import LakeEngine, TableRef
from pipelines.engines.local import LocalEngine
from pipelines.gold import object_run
from pipelines.gold.job import app_id, history_table, tombstone_table
from pipelines.gold.resync import RESYNC_TABLE
from pipelines.silver.columns import FieldLayout
from tests.conftest import engine_params
from tests.spark.gold.conftest import Silver, account_schema_json
from tests.spark.gold.lakes import GOLD, RATING, SILVER, Lake, LakeFactory, register

# The silver commits of _batches hold 3, 8, 3 and 1 rows: at most 11 rows per step folds a
# backlog of all four in two steps, up to the second commit and up to the fourth.
CHUNKED = "max_rows_per_commit: 11"
HARD_SCD2 = "deletes: hard, scd2: {enabled: true, track: [Phone]}"


def _batches() -> list[Silver]:
    # In commit order across batches: a change that arrives a batch after a newer one of its
    # record is ignored then, but applied in order within one batch (late delivery is what
    # the fold tests cover).
    first = Silver()
    first.create("001A", 0, Phone="p0")
    first.create("001B", 0, Phone="b0")
    first.create("001C", 0, Phone="c0")
    second = first.next_batch()
    second.update("001A", 5, Phone="p1")
    second.update("001A", 6, NumberOfEmployees=50)
    second.add("001B", "DELETE", 7)
    second.update("001B", 3, Phone="stale")  # delivered after the delete, older than it
    second.add("001B", "GAP_DELETE", 7.5)  # resolved by the UNDELETE below
    second.add("001C", "GAP_UPDATE", 8)
    second.add(None, "GAP_OVERFLOW", 9, record_count=0)
    second.update("001D", 9, Phone="unknown record")
    third = second.next_batch()
    third.add("001B", "UNDELETE", 12, Name="Company 001B", Phone="back")
    third.add("001C", "UPDATE", 13, changed=["Phone"], Phone="c1", Name="Company 001C")
    third.add("001*", "UPDATE", 14, wildcard=True, changed=["Phone"], Phone="all")
    # A new silver column arrives with a later schema.
    fourth = Silver(extra=(FieldLayout("Rating__c", "leaf", "double"),), batch=9)
    fourth.update("001A", 20, Rating__c=4.5)
    return [first, second, third, fourth]


def _rows(engine: LakeEngine, table: TableRef) -> list[dict[str, Any]]:
    # A record deleted and live again within one batch needs no tombstone table at all.
    if not engine.exists(table):
        return []
    return sorted(engine.read_arrow(table).to_pylist(), key=repr)


def _tables(env: Lake) -> dict[str, Any]:
    obj = env.conf.objects[0]
    tables = (GOLD, tombstone_table(obj), history_table(obj), RESYNC_TABLE)
    return {str(t): _rows(env.engine, t) for t in tables}


def _versions(env: Lake) -> dict[str, int | None]:
    obj = env.conf.objects[0]
    tables = (GOLD, tombstone_table(obj), history_table(obj), RESYNC_TABLE)
    return {str(t): env.engine.version(t) for t in tables}


def _gold_commits(env: Lake) -> list[int]:
    """The silver versions the gold MERGEs recorded, oldest first."""
    gold_app = app_id(env.conf.objects[0])
    entries = env.engine.history(GOLD, limit=50)
    return sorted(e.txn.version for e in entries if e.txn is not None and e.txn.app_id == gold_app)


def _step_ends(env: Lake) -> list[int]:
    """The silver versions a backlog of _batches is folded up to, in CHUNKED steps."""
    entries = env.engine.history(SILVER, limit=50)
    appends = sorted(e.version for e in entries if e.txn is not None)
    return [appends[1], appends[3]]


def _local_lake(root: Path, gold: str, batches: list[Silver]) -> Lake:
    """A local lake whose silver table holds ``batches``, gold not run yet."""
    env = Lake(lambda location, **o: LocalEngine(location=location, **o), "local", root, gold)
    register(env.engine, account_schema_json(), account_schema_json(extra=[RATING]))
    for batch in batches:
        env.land(batch)
    return env


def _cases() -> list[Any]:
    """Each engine with soft deletes, and with hard deletes and SCD2 history together (one
    Spark run less than one each) and the backlog in two steps. Over Spark Connect only the
    latter, which writes every table the former writes and more: each spark case is a minute
    or more of MERGEs on two cores."""
    golds = {"soft": "", "hard-scd2-chunked": f"gold: {{{HARD_SCD2}, {CHUNKED}}}\n"}
    return [
        pytest.param(engine.values[0], gold, id=f"{engine.id}-{name}", marks=engine.marks)
        for engine in engine_params(connect=True)
        for name, gold in golds.items()
        if engine.id != "spark_connect" or name == "hard-scd2-chunked"
    ]


@pytest.mark.parametrize(("engine_name", "gold"), _cases(), indirect=["engine_name"])
def test_small_batches_and_one_large_batch_build_the_same_tables(
    lake: LakeFactory, tmp_path: Path, gold: str
) -> None:
    # Built once: every row has its own event id, commit number and replay id.
    batches = _batches()
    small = lake(gold, root=tmp_path / "small")
    for batch in batches:
        if batch is batches[-1]:
            register(small.engine, account_schema_json(), account_schema_json(extra=[RATING]))
        small.land(batch)
        (result,) = small.gold().objects
        assert not result.skipped
    large = lake(gold, root=tmp_path / "large")
    register(large.engine, account_schema_json(), account_schema_json(extra=[RATING]))
    for batch in batches:
        large.land(batch)
    (result,) = large.gold().objects
    assert (result.changes, result.skipped) == (sum(len(b.rows) for b in batches), False)
    silver_version = large.engine.version(SILVER)
    steps = _step_ends(large) if CHUNKED in gold else [silver_version]
    assert _gold_commits(large) == steps and result.silver_version == silver_version
    assert large.engine.txn_version(GOLD, app_id(large.conf.objects[0])) == silver_version
    tables = _tables(small)
    assert _tables(large) == tables
    for env in (small, large):
        # Nothing new: nothing read, nothing written.
        versions = _versions(env)
        (again,) = env.gold().objects
        assert again.skipped and _versions(env) == versions
    gold_rows = {r["Id"]: r for r in tables[str(GOLD)]}
    assert gold_rows["001A"]["Rating__c"] == 4.5
    assert gold_rows["001B"]["Phone"] == "all"
    resync = {(r["record_id"], r["change_type"]): r for r in tables[str(RESYNC_TABLE)]}
    assert resync[("001B", "GAP_DELETE")]["resolved_by"] is not None


def test_a_run_that_dies_between_two_steps_resumes_at_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The local engine only: the steps are the engine-independent part.
    batches = _batches()
    once = _local_lake(tmp_path / "once", f"gold: {{{HARD_SCD2}}}\n", batches)
    once.gold()
    assert len(_gold_commits(once)) == 1
    env = _local_lake(tmp_path / "steps", f"gold: {{{HARD_SCD2}, {CHUNKED}}}\n", batches)
    merge_gold = object_run.ObjectRun._merge_gold
    merges: list[int] = []

    def dies_at_the_second(self: Any, source: Any, plan: Any, version: int, *rest: Any) -> Any:
        merges.append(version)
        if len(merges) == 2:
            raise LakeError("killed")
        return merge_gold(self, source, plan, version, *rest)

    monkeypatch.setattr(object_run.ObjectRun, "_merge_gold", dies_at_the_second)
    with pytest.raises(LakeError, match="killed"):
        env.gold()
    first, last = _step_ends(env)
    assert _gold_commits(env) == [first]
    monkeypatch.setattr(object_run.ObjectRun, "_merge_gold", merge_gold)
    (result,) = env.gold().objects
    # The second run folds the second step only; the first one's writes stay as they were.
    assert (result.after_version, result.silver_version) == (first, last)
    assert result.changes == sum(len(b.rows) for b in batches[2:])
    assert _gold_commits(env) == [first, last] and last == env.engine.version(SILVER)
    assert _tables(env) == _tables(once)
