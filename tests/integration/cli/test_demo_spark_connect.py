"""`sfcdc demo --engine spark` inside a Spark Connect session (as on Databricks serverless or a
standard access mode cluster: no JVM gateway in Python) reaches gold, and every gold table
holds what the same demo builds on a classic session, cell for cell."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from pipelines import cli

pytestmark = [
    pytest.mark.integration,
    pytest.mark.spark,
    pytest.mark.spark_connect,
    pytest.mark.slow,
    # Two whole demos on the spark engine, one of them over Connect: minutes on two cores.
    pytest.mark.timeout(1200),
]

# Stamped with the time the gold job ran (gold rows, and the re-sync list's requests).
RUN_TIME = {"_cdc_updated_at", "detected_at", "resolved_at"}


def _gold(lake: Path) -> dict[str, list[tuple[Any, ...]]]:
    tables = {}
    for directory in sorted((lake / "gold").iterdir()):
        if not (directory / "_delta_log").is_dir():
            continue
        rows = DeltaTable(str(directory)).to_pyarrow_table().to_pylist()
        tables[directory.name] = sorted(
            tuple(sorted((k, repr(v)) for k, v in r.items() if k not in RUN_TIME)) for r in rows
        )
    return tables


def test_the_demo_on_spark_connect_builds_the_gold_of_a_classic_session(
    spark: Any, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    demo = ["demo", "--engine", "spark", "--events", "300", "--seed", "5", "--dir"]
    assert cli.main([*demo, str(tmp_path / "classic")]) == 0, capsys.readouterr().out
    classic = _gold(tmp_path / "classic" / "lake")

    session = request.getfixturevalue("spark_connect")  # this process speaks Spark Connect now
    assert not hasattr(session, "_jvm") or session._jvm is None  # no gateway to fall back on
    code = cli.main([*demo, str(tmp_path / "connect")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "records -> gold.account" in out
    connect = _gold(tmp_path / "connect" / "lake")
    assert set(connect) == set(classic) and {"account", "invoice"} <= set(connect)
    assert classic["account"] and classic["invoice"]
    for table, rows in classic.items():
        assert connect[table] == rows, table
