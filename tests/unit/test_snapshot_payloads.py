"""The columnar writing of Bulk API 2.0 result sets as JSON payloads, against the json module:
any text, as Salesforce's CSV quotes it, comes out of the CSV parser as it went in and is
escaped exactly as ``json.dumps`` escapes it."""

from __future__ import annotations

import csv
import io
import json

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.bulk import QueryJob, ResultSet
from ingest.errors import BulkJobError, RestError
from pipelines.snapshot_read import _csv_table, _json_text, _json_typed

# Text as records hold it: any character but a surrogate (UTF-8 cannot carry one), control
# characters, quotes and backslashes included.
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
JOB = QueryJob(id="750000000000001AAA", object="Account", operation="queryAll", state="JobComplete")


def _result_set(header: list[str], rows: list[list[str | None]]) -> ResultSet:
    out = io.StringIO(newline="")
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        # A null is an empty field; a value is quoted, its quotes doubled.
        out.write(",".join("" if v is None else '"' + v.replace('"', '""') + '"' for v in row))
        out.write("\n")
    return ResultSet(JOB, 1, out.getvalue().encode(), len(rows))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), TEXT), min_size=1, max_size=30))
def test_text_is_escaped_as_json_dumps_escapes_it(texts: list[str | None]) -> None:
    got = _json_text(pa.array(texts, pa.string())).to_pylist()
    assert got == [None if t is None else json.dumps(t, ensure_ascii=False) for t in texts]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(TEXT, st.one_of(st.none(), TEXT)), max_size=20))
def test_a_result_set_reads_back_every_value_an_empty_one_as_null(
    rows: list[tuple[str, str | None]],
) -> None:
    # Line breaks (\n, \r\n, a lone \r) inside quoted values stay part of them.
    table = _csv_table(_result_set(["Id", "Name"], [list(r) for r in rows]))
    assert table.column_names == ["Id", "Name"]
    assert table.to_pylist() == [{"Id": i or None, "Name": n or None} for i, n in rows]


def test_a_set_that_is_not_csv_names_the_job_and_the_set() -> None:
    bad = ResultSet(JOB, 3, b'"Id","Name"\n"001","a","extra"\n', 1)
    with pytest.raises(BulkJobError, match=r"750000000000001AAA: set 3 .*cannot be read as CSV"):
        _csv_table(bad)
    with pytest.raises(BulkJobError, match="has no header row"):
        _csv_table(ResultSet(JOB, 1, b"", 0))


def test_booleans_and_numbers_are_written_as_the_record_reader_types_them() -> None:
    ids = pa.array(["001A", "001B", "001C"])
    assert _json_typed(
        pa.array(["TRUE", None, "false"]), "boolean", "IsX", entity="A", ids=ids
    ).to_pylist() == ["true", None, "false"]
    assert _json_typed(
        pa.array(["23.0", "-4", None]), "int", "N", entity="A", ids=ids
    ).to_pylist() == ["23", "-4", None]
    assert _json_typed(
        pa.array(["1.50", "2E3", "7"]), "currency", "A", entity="A", ids=ids
    ).to_pylist() == ["1.5", "2000.0", "7.0"]
    with pytest.raises(RestError, match="Bulk value of A record 001B: IsX: expected true or false"):
        _json_typed(pa.array(["true", "yes", None]), "boolean", "IsX", entity="A", ids=ids)
