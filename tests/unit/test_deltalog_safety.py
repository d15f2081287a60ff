"""What keeps sfcdc's own Delta commits (:mod:`pipelines.engines.deltalog`) from damaging a
table: a linked commit is never taken back, a commit is built only on a version the log still
shows, a file system without hard links sends every write to delta-rs, and statistics and
NOT NULL checks are Delta's."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from ingest.errors import LakeError
from pipelines.engines import TableRef, Txn, deltalog
from pipelines.engines.arrow import arrow_schema_to_spark
from pipelines.engines.deltalog import (
    file_stats,
    indexed_columns,
    links_work,
    nested_nulls,
    truncate_max,
    truncate_min,
)
from pipelines.engines.local import LocalEngine

TABLE = TableRef("bronze", "orders")
SCHEMA = pa.schema([("n", pa.int64()), ("s", pa.string())])


def _rows(*values: int) -> pa.Table:
    return pa.table({"n": pa.array(values, pa.int64()), "s": [f"v{v}" for v in values]})


def _engine(root: Path, **options: Any) -> LocalEngine:
    engine = LocalEngine(location=root / "lake", **options)
    engine.ensure_table(TABLE, arrow_schema_to_spark(SCHEMA))
    return engine


def _commits(engine: LocalEngine) -> dict[int, list[dict[str, Any]]]:
    log = engine.path(TABLE) / "_delta_log"
    return {
        int(p.name[:20]): [json.loads(line) for line in p.read_text().splitlines()]
        for p in sorted(log.glob("*.json"))
    }


def _engine_info(actions: list[dict[str, Any]]) -> str:
    return next(a["commitInfo"].get("engineInfo", "") for a in actions if "commitInfo" in a)


def test_a_linked_commit_is_never_taken_back_when_another_writer_follows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The appender links version N+1; another writer commits N+2 on top of it at once, and
    ``_last_checkpoint`` is unreadable at that moment (being rewritten). Taking N+1 back, as
    the appender once did, left N, N+2 and a gap no reader gets over."""
    engine = _engine(tmp_path)
    engine.append(TABLE, _rows(0), txn=Txn("app", 1))
    uri = engine.uri(TABLE)
    log = engine.path(TABLE) / "_delta_log"
    linked = deltalog.put_if_absent

    def and_another_writer_follows(path: Path, text: str) -> bool:
        done = linked(path, text)
        if done and path.name.endswith(".json") and not path.name.startswith("."):
            monkeypatch.setattr(deltalog, "put_if_absent", linked)
            write_deltalake(uri, _rows(100), mode="append")
            (log / "_last_checkpoint").write_text('{"vers')
        return done

    monkeypatch.setattr(deltalog, "put_if_absent", and_another_writer_follows)
    result = engine.append(TABLE, _rows(1), txn=Txn("app", 2))

    versions = sorted(_commits(engine))
    assert versions == list(range(versions[-1] + 1)), f"a gap in the log: {versions}"
    (log / "_last_checkpoint").unlink()
    dt = DeltaTable(uri)
    assert sorted(dt.to_pyarrow_table().column("n").to_pylist()) == [0, 1, 100]
    assert dt.transaction_version("app") == 2 and result.version == versions[-2]


def test_a_version_the_log_no_longer_shows_is_not_built_on(tmp_path: Path) -> None:
    """The appender knows version N; meanwhile others committed, checkpointed and the log
    was cleaned past N. Building N+1 then writes a commit the checkpoint has passed over:
    the write goes to delta-rs instead, and lands."""
    engine = _engine(tmp_path)
    engine.append(TABLE, _rows(0), txn=Txn("app", 1))
    other = LocalEngine(location=tmp_path / "lake", direct_writes=False)
    for n in range(1, 4):
        other.append(TABLE, _rows(n))
    other.maintain(TABLE, compact=False, checkpoint=True, log_hours=0)
    log = engine.path(TABLE) / "_delta_log"
    assert not (log / f"{0:020d}.json").exists()
    known = engine._direct._state[TABLE].version
    assert known is not None and not (log / f"{known:020d}.json").exists()

    engine.append(TABLE, _rows(4), txn=Txn("app", 2))

    dt = DeltaTable(engine.uri(TABLE))
    assert sorted(dt.to_pyarrow_table().column("n").to_pylist()) == [0, 1, 2, 3, 4]
    assert dt.transaction_version("app") == 2
    assert not (log / f"{known + 1:020d}.json").exists() or dt.version() >= known + 1


@pytest.mark.parametrize("code", [errno.EPERM, errno.ENOTSUP, errno.EXDEV])
def test_without_hard_links_every_write_goes_through_delta_rs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """A FUSE mount (Databricks volumes, gcsfuse) refuses hard links: appends and MERGEs
    still land, committed by delta-rs."""

    def refuse(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        raise OSError(code, os.strerror(code), str(dst))

    monkeypatch.setattr(os, "link", refuse)
    assert not links_work(tmp_path)
    engine = _engine(tmp_path)
    engine.append(TABLE, _rows(1, 2), txn=Txn("app", 1))
    engine.merge(TABLE, _rows(2, 3), on=["n"], txn=Txn("gold", 1))
    commits = _commits(engine)
    assert all(_engine_info(a) != "sfcdc" for a in commits.values())
    rows = DeltaTable(engine.uri(TABLE)).to_pyarrow_table()
    assert sorted(rows.column("n").to_pylist()) == [1, 2, 3]


def test_a_link_error_after_the_probe_falls_back_to_delta_rs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _engine(tmp_path)
    engine.append(TABLE, _rows(0))
    assert _engine_info(_commits(engine)[max(_commits(engine))]) == "sfcdc"

    def refuse(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted", str(dst))

    monkeypatch.setattr(os, "link", refuse)
    engine.append(TABLE, _rows(1), txn=Txn("app", 1))
    engine.append(TABLE, _rows(2), txn=Txn("app", 2))
    dt = DeltaTable(engine.uri(TABLE))
    assert sorted(dt.to_pyarrow_table().column("n").to_pylist()) == [0, 1, 2]
    assert dt.transaction_version("app") == 2
    # No stray data file of the refused commit is left behind.
    referenced = set(pa.table(dt.get_add_actions()).column("path").to_pylist())
    assert {p.name for p in engine.path(TABLE).glob("*.parquet")} == referenced


def test_direct_writes_off_commits_everything_through_delta_rs(tmp_path: Path) -> None:
    engine = _engine(tmp_path, direct_writes=False)
    engine.append(TABLE, _rows(1))
    engine.merge(TABLE, _rows(1, 2), on=["n"])
    assert all(_engine_info(a) != "sfcdc" for a in _commits(engine).values())


# ----------------------------------------------------------------------------- statistics


def test_text_bounds_are_cut_as_delta_cuts_them() -> None:
    short = "x" * 32
    assert truncate_min(short) == short and truncate_max(short) == short
    long = "a" * 40
    assert truncate_min(long) == "a" * 32
    assert truncate_max(long) == "a" * 32 + "\x7f"
    # A character at or above U+007F after the prefix: the tie-breaker is U+10FFFF.
    assert truncate_max("b" * 32 + "é" + "z") == "b" * 32 + "\U0010ffff"
    # A surrogate pair across the cut stays whole (Java counts it as two characters).
    emoji = "c" * 31 + "\U0001f600" + "d" * 5
    assert truncate_min(emoji) == "c" * 31 + "\U0001f600"
    assert truncate_max(emoji) == "c" * 31 + "\U0001f600" + "\x7f"
    # Nothing but U+10FFFF past the prefix: no upper bound within twice its length.
    assert truncate_max("e" * 32 + "\U0010ffff" * 40) is None
    for text in (long, "b" * 32 + "é" + "z", emoji):
        low, high = truncate_min(text), truncate_max(text)
        assert high is not None
        assert low.encode() <= text.encode() <= high.encode()


def test_file_stats_cover_the_indexed_columns_only() -> None:
    table = pa.table(
        {
            "id": ["k" * 50, "a"],
            "n": pa.array([1, 2], pa.int64()),
            "body": ["x", None],
            "addr": pa.array([{"city": "c"}, None], pa.struct([("city", pa.string())])),
        }
    )
    stats = json.loads(file_stats(table, indexed=indexed_columns(table.schema, {})))
    assert stats["minValues"] == {"id": "a", "n": 1, "body": "x"}
    assert stats["maxValues"] == {"id": "k" * 32 + "\x7f", "n": 2, "body": "x"}
    assert stats["nullCount"] == {"id": 0, "n": 0, "body": 1}

    two = indexed_columns(table.schema, {"delta.dataSkippingNumIndexedCols": "2"})
    assert two == {"id", "n"}
    listed = {"delta.dataSkippingStatsColumns": "n, `addr`.city"}
    assert indexed_columns(table.schema, listed) == {"n", "addr"}
    stats = json.loads(file_stats(table, indexed=indexed_columns(table.schema, listed)))
    assert stats["minValues"] == {"n": 1} and stats["nullCount"] == {"n": 0}
    assert indexed_columns(table.schema, {"delta.dataSkippingNumIndexedCols": "-1"}) == set(
        table.schema.names
    )


def test_a_table_that_indexes_few_columns_gets_statistics_of_those_only(tmp_path: Path) -> None:
    engine = LocalEngine(location=tmp_path / "lake")
    engine.ensure_table(
        TABLE,
        arrow_schema_to_spark(SCHEMA),
        properties={"delta.dataSkippingNumIndexedCols": "1"},
    )
    engine.append(TABLE, _rows(1, 2))
    commits = _commits(engine)
    (add,) = [a["add"] for a in commits[max(commits)] if "add" in a]
    assert _engine_info(commits[max(commits)]) == "sfcdc"
    assert json.loads(add["stats"])["minValues"] == {"n": 1}


NESTED = pa.schema(
    [
        ("id", pa.string(), False),
        (
            "addr",
            pa.struct([pa.field("city", pa.string(), nullable=False), ("zip", pa.string())]),
        ),
        ("tags", pa.list_(pa.field("element", pa.string(), nullable=False))),
    ]
)


def _nested(*, city: str | None, tags: list[str | None]) -> pa.Table:
    """One row of NESTED; pyarrow builds a null into a non-nullable field only this way."""
    addr_type = NESTED.field("addr").type
    addr = pa.StructArray.from_arrays(
        [pa.array([city], pa.string()), pa.array(["z"])],
        fields=[addr_type.field(0), addr_type.field(1)],
    )
    element = NESTED.field("tags").type.value_field
    tag_list = pa.ListArray.from_arrays(
        pa.array([0, len(tags)], pa.int32()), pa.array(tags, pa.string())
    ).cast(pa.list_(element))
    return pa.Table.from_arrays([pa.array(["1"]), addr, tag_list], schema=NESTED)


def test_nested_not_null_fields_are_checked_where_the_parent_holds_a_value() -> None:
    good = pa.table(
        {
            "id": ["1", "2"],
            "addr": [{"city": "c", "zip": None}, None],  # a null parent may hold anything
            "tags": [["a"], None],
        },
        schema=NESTED,
    )
    assert nested_nulls(good, NESTED) == []
    bad = _nested(city=None, tags=["a", None])
    assert nested_nulls(bad, NESTED) == ["addr.city", "tags.element"]


def test_an_append_breaking_a_nested_not_null_field_is_refused(tmp_path: Path) -> None:
    engine = LocalEngine(location=tmp_path / "lake")
    table = TableRef("silver", "account")
    engine.ensure_table(table, arrow_schema_to_spark(NESTED))
    rows = _nested(city=None, tags=["a"])
    with pytest.raises(LakeError, match=r"addr\.city"):
        engine.append(table, rows)
    assert engine.read_arrow(table).num_rows == 0
