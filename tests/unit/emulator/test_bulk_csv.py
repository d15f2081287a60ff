"""The emulated Bulk API's CSV rows, written by Arrow from columns of cell texts, against the
cell-by-cell definition (``_text_cell``: every value quoted, its quotes doubled, a null an empty
cell), for every delimiter and line ending a job may ask for, with and without the ``eol``
option of Arrow's CSV writer (which the Arrow of some Databricks runtimes lacks)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.emulator import bulk
from ingest.emulator.bulk import _csv_rows, _text_cell

# Any text a record holds: quotes, delimiters and line breaks included.
CELL = st.one_of(st.none(), st.text(st.characters(exclude_categories=("Cs",)), max_size=12))
ROWS = st.integers(0, 6).flatmap(
    lambda n: st.lists(st.lists(CELL, min_size=n, max_size=n), min_size=1, max_size=3)
)


def _by_cell(columns: list[list[str | None]], delimiter: str, ending: str) -> str:
    return "".join(
        delimiter.join(_text_cell(v) for v in row) + ending for row in zip(*columns, strict=True)
    )


_WRITE_OPTIONS = pa_csv.WriteOptions


def _without_eol(**options: Any) -> pa_csv.WriteOptions:
    if "eol" in options:
        raise TypeError("__init__() got an unexpected keyword argument 'eol'")
    return _WRITE_OPTIONS(**options)


@settings(max_examples=150, deadline=None)
@given(ROWS, st.sampled_from([",", "\t", "|", ";", "^", "`"]), st.sampled_from(["\n", "\r\n"]))
def test_rows_are_written_as_each_cell_is_quoted(
    columns: list[list[str | None]], delimiter: str, ending: str
) -> None:
    table = pa.table({f"c{n}": pa.array(c, pa.string()) for n, c in enumerate(columns)})
    want = _by_cell(columns, delimiter, ending).encode()
    assert _csv_rows(table, delimiter, ending) == want
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bulk.pa_csv, "WriteOptions", _without_eol)
        assert _csv_rows(table, delimiter, ending) == want
