"""A Delta commit that loses to another writer is recognised (delta-rs' real conflict, the
names delta-spark gives its conflicts) and gold reports it as a named error saying what happened
and what to do, instead of delta-rs' text."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from ingest.errors import ConcurrentWriteError, LakeError
from pipelines.engines import TableRef
from pipelines.engines.base import concurrent_write
from pipelines.gold.job import conflict_error


def _real_conflict(path: Path) -> BaseException:
    rows = pa.table({"Id": ["001A", "001B"], "Phone": ["p0", "b0"]})
    write_deltalake(str(path), rows)
    stale = DeltaTable(str(path))
    # Another writer replaces the files the MERGE below has read.
    write_deltalake(str(path), rows, mode="overwrite")
    source = pa.table({"Id": ["001A"], "Phone": ["p1"]})
    try:
        (
            stale.merge(
                source, "target.Id = source.Id", source_alias="source", target_alias="target"
            )
            .when_matched_update_all()
            .execute()
        )
    except Exception as exc:
        try:
            raise LakeError(f"merge into gold.account ({path}) failed: {exc}") from exc
        except LakeError as wrapped:
            return wrapped
    raise AssertionError("delta-rs committed a MERGE over a stale snapshot")


def test_a_real_delta_rs_conflict_is_recognised(tmp_path: Path) -> None:
    error = _real_conflict(tmp_path / "account")
    assert concurrent_write(error)
    assert not concurrent_write(LakeError("merge into gold.account failed: disk full"))


@pytest.mark.parametrize(
    "text",
    [
        "An error occurred while calling o123.execute.\n: io.delta.exceptions."
        "ConcurrentAppendException: Files were added to the root of the table by a concurrent "
        "update.",
        "[DELTA_CONCURRENT_DELETE_READ] ConcurrentDeleteReadException: This transaction "
        "attempted to read one or more files that were deleted",
    ],
)
def test_delta_spark_conflicts_are_recognised(text: str) -> None:
    try:
        raise LakeError("merge into gold.account failed") from RuntimeError(text)
    except LakeError as exc:
        assert concurrent_write(exc)


def test_gold_names_the_conflict_and_the_way_out() -> None:
    error = conflict_error(TableRef("gold", "account"), "Account", 4, 7)
    assert isinstance(error, ConcurrentWriteError) and isinstance(error, LakeError)
    text = str(error)
    assert "another writer committed to gold.account" in text
    assert "silver versions 4..7" in text
    assert "nothing of it was committed" in text
    assert "Run one gold job per lake at a time" in text and "sfcdc gold" in text
