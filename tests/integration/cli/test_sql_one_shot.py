"""A one-shot ``sfcdc sql`` on the local engine is answered by DataFusion (delta-rs), without
starting Spark: it runs where no Java is installed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from pipelines import cli
from tests.integration.cli.conftest import write_conf

pytestmark = pytest.mark.integration


def test_a_one_shot_query_on_the_local_engine_needs_no_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # No java on PATH and no JAVA_HOME: a Spark session could not start, so an answer proves
    # DataFusion gave it.
    conf = write_conf(tmp_path, engine="local", events=150)
    assert cli.main(["-q", "run", "--conf", str(conf), "--once"]) == 0
    capsys.readouterr()
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "SPARK_HOME")}
    env["PATH"] = str(Path(sys.executable).parent)
    query = "SELECT count(*) AS n FROM gold.account WHERE NOT _cdc_is_deleted"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "-q", "sql", "--conf", str(conf), query],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    live = DeltaTable(str(tmp_path / "lake" / "gold" / "account")).to_pyarrow_table(
        columns=["_cdc_is_deleted"]
    )
    assert done.stdout.splitlines()[2].strip() == str(live.num_rows - sum(live[0].to_pylist()))
    print(f"one-shot sfcdc sql on the local engine: {seconds:.2f} s")
