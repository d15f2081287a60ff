"""The columnar writing of Bulk API 2.0 result sets as JSON payloads, against the json module:
any text, as Salesforce's CSV quotes it, comes out of the CSV parser as it went in and is
escaped exactly as ``json.dumps`` escapes it."""

from __future__ import annotations

import csv
import io
import json
import threading
from collections.abc import Iterator

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.bulk import QueryJob, ResultSet, typed_value
from ingest.errors import BulkJobError, RestError
from pipelines.snapshot_read import _csv_table, _json_text, _json_typed, _read_ahead

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


# A number as a CSV may write it: Python's repr, fixed decimals, exponents, upper case.
NUMBER_TEXT = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).flatmap(
        lambda x: st.sampled_from(
            [repr(x), f"{x:.2f}", f"{x:.4f}", f"{x:g}", f"{x:.17g}", repr(x).upper(), f"{x:.15g}"]
        )
    ),
    st.integers(-(10**20), 10**20).flatmap(
        lambda n: st.sampled_from([str(n), f"{n}.0", f"+{n}", f"{n:05d}", f"{n}E0"])
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(st.none(), NUMBER_TEXT), min_size=1, max_size=20),
    st.sampled_from(["double", "currency", "percent", "int", "long"]),
)
def test_numbers_are_written_as_json_dumps_writes_what_the_record_reader_reads(
    texts: list[str | None], sf_type: str
) -> None:
    # Texts already in the form json.dumps writes are kept as they are; the others are read
    # and written one by one: either way, the payload says what the record reader reads.
    def written(text: str | None) -> str | None:
        try:
            return None if text is None else json.dumps(typed_value(text, sf_type))
        except ValueError:
            return "error"

    want = [written(t) for t in texts]
    ids = pa.array([f"001{n:012d}" for n in range(len(texts))])
    try:
        got = _json_typed(pa.array(texts, pa.string()), sf_type, "N", entity="A", ids=ids)
    except RestError:
        assert "error" in want
    else:
        assert got.to_pylist() == want


def test_reading_ahead_keeps_the_order_and_raises_a_failure_where_it_happened() -> None:
    def sets() -> Iterator[int]:
        yield 1
        yield 2
        raise BulkJobError("set 3 is gone", job_id="750", state="JobComplete")

    got = []
    with pytest.raises(BulkJobError, match="set 3 is gone"):
        for item in _read_ahead(sets()):
            got.append(item)
    assert got == [1, 2]


def test_a_reader_that_stops_early_closes_the_sets_once_the_worker_is_done() -> None:
    closed = threading.Event()

    def sets() -> Iterator[int]:
        try:
            yield from range(10)
        finally:
            closed.set()

    reading = _read_ahead(sets())
    assert next(reading) == 0
    reading.close()
    assert closed.is_set()
    assert not [t for t in threading.enumerate() if t.name.startswith("sfcdc-read-ahead")]
