"""`sfcdc sql` on a lake filled by `sfcdc run --once`: queries by table name, output
formats, the interactive prompt, and clear errors for unknown tables and bad SQL."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest
from deltalake import DeltaTable

from pipelines import cli
from pipelines.commands.sql import shell
from pipelines.spec import load_conf
from tests.integration.cli.conftest import FilledLake

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _sql(lake: FilledLake, *argv: str) -> int:
    return cli.main(["-q", "sql", "--conf", str(lake.conf), *argv])


def test_a_query_prints_an_aligned_table(
    filled_lake: FilledLake, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = DeltaTable(str(filled_lake.lake / "gold" / "account")).to_pyarrow_table(
        columns=["Id"]
    )
    code = _sql(filled_lake, "SELECT count(*) AS records FROM gold.account")
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0].strip() == "records"
    assert set(out[1]) == {"-"}
    assert out[2].strip() == str(expected.num_rows)
    assert out[3] == "(1 row)"


def test_csv_and_json_formats(filled_lake: FilledLake, capsys: pytest.CaptureFixture[str]) -> None:
    query = "SELECT Id, _cdc_last_replay_id FROM gold.contact ORDER BY Id LIMIT 3"
    assert _sql(filled_lake, "--format", "csv", query) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[0] == ["Id", "_cdc_last_replay_id"]
    assert len(rows) == 4
    assert all(r[0].startswith("003") for r in rows[1:])
    int(rows[1][1], 16)  # binary columns print as hex
    assert _sql(filled_lake, "--format", "json", query) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["Id"] for r in records] == [r[0] for r in rows[1:]]


def test_quarantine_and_resync_tables_are_queryable_by_name(
    filled_lake: FilledLake, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _sql(
        filled_lake,
        "--format",
        "json",
        "SELECT count(*) AS n FROM gold.sfcdc_resync WHERE resolved_at IS NULL",
    )
    assert code == 0
    assert json.loads(capsys.readouterr().out)[0]["n"] >= 0


def test_an_unknown_table_names_the_known_ones_without_a_java_trace(
    filled_lake: FilledLake, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _sql(filled_lake, "SELECT * FROM gold.acount")
    captured = capsys.readouterr()
    assert code == 1
    assert captured.out == ""
    # Spark SQL (spark engine) and DataFusion (one-shot on the local engine) word it apart.
    assert ("TABLE_OR_VIEW_NOT_FOUND" in captured.err and "`gold`.`acount`" in captured.err) or (
        "table 'gold.acount' not found" in captured.err
    ), captured.err
    assert "known tables: " in captured.err and "gold.account" in captured.err
    assert "silver.contact" in captured.err and "bronze.sfcdc_checkpoints" in captured.err
    assert "at org.apache" not in captured.err and "Traceback" not in captured.err


def test_bad_sql_is_a_clear_error(
    filled_lake: FilledLake, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _sql(filled_lake, "SELEC Id FROM gold.account")
    err = capsys.readouterr().err
    assert code == 1
    assert ("PARSE_SYNTAX_ERROR" in err and "'SELEC'" in err) or "found: SELEC" in err, err
    assert "known tables: " in err
    assert "at org.apache" not in err and "Traceback" not in err


def test_the_interactive_prompt(filled_lake: FilledLake) -> None:
    lines = iter(
        [
            "\\tables",
            "\\d gold.sfcdc_resync",
            "\\d gold.nope",
            "SELECT count(*) AS n",
            "FROM silver.account;",
            "SELECT * FROM nowhere;",
            "\\q",
            "SELECT 'never read'",
        ]
    )
    written: list[str] = []

    def read_line(prompt: str) -> str:
        return next(lines)

    sh = shell(load_conf(filled_lake.conf))
    assert sh.interact(read_line=read_line, write=written.append) == 0
    text = "\n".join(written)
    assert "gold.account\n" in text and "silver.order_shipped" in text
    assert re.search(r"resolved_at +\| timestamp", text)
    assert "error: no table 'gold.nope'" in text
    silver = DeltaTable(str(filled_lake.lake / "silver" / "account")).to_pyarrow_table(
        columns=["Id"]
    )
    assert re.search(rf"^ *{silver.num_rows}\n\(1 row\)$", text, re.MULTILINE)
    assert "error: [TABLE_OR_VIEW_NOT_FOUND]" in text
    assert "never read" not in text
