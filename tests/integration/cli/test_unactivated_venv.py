"""The installed ``sfcdc`` console script run from a virtualenv that is not activated (what a
cron job or a service calling ``.venv/bin/sfcdc`` does), on the spark engine: Spark's Python
workers run sfcdc's interpreter, not the ``python3`` on PATH (here one that cannot import
pyarrow or pyspark), so silver's decoding on the executors works."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipelines.engines import TableRef
from pipelines.engines.local import LocalEngine

pytestmark = [pytest.mark.integration, pytest.mark.spark_engine, pytest.mark.timeout(600)]

CONSOLE_SCRIPT = Path(sys.executable).parent / "sfcdc"


def _unactivated(tmp_path: Path) -> dict[str, str]:
    """This environment as a shell without the virtualenv has it: no VIRTUAL_ENV, the
    virtualenv's bin off PATH, no PYSPARK_PYTHON; ``python3`` on PATH is another Python
    (one that sees no site-packages at all)."""
    other = tmp_path / "other-python"
    other.mkdir()
    python3 = other / "python3"
    python3.write_text(f'#!/bin/sh\nexec "{sys._base_executable}" -S "$@"\n')  # type: ignore[attr-defined]
    python3.chmod(0o755)
    venv_bin = str(CONSOLE_SCRIPT.parent)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
    }
    env["PATH"] = os.pathsep.join([str(other), *path])
    env.setdefault("SFCDC_SPARK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")
    return env


def test_the_console_script_runs_spark_workers_with_its_own_python(tmp_path: Path) -> None:
    assert CONSOLE_SCRIPT.is_file(), f"{CONSOLE_SCRIPT}: install sfcdc into the virtualenv"
    conf = tmp_path / "conf"
    (conf / "objects").mkdir(parents=True)
    (conf / "pipeline.yml").write_text(
        textwrap.dedent(
            """\
            connection:
              emulator:
                keepalive_seconds: 0.3
                workload: {events: 40, platform_events: 0}
            lake: {engine: local, location: ./lake}
            """
        )
    )
    (conf / "objects" / "account.yml").write_text("object: Account\nkind: change_events\n")
    env = _unactivated(tmp_path)
    probe = subprocess.run(
        ["python3", "-c", "import pyarrow"], env=env, capture_output=True, check=False
    )
    assert probe.returncode != 0, "python3 on PATH must not be sfcdc's interpreter here"

    def sfcdc(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(CONSOLE_SCRIPT), "-q", *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=540,
            check=False,
        )

    landed = sfcdc("ingest", "--conf", str(conf), "--once")
    assert landed.returncode == 0, landed.stderr
    decoded = sfcdc("silver", "--conf", str(conf), "--set", "lake.engine=spark")
    assert decoded.returncode == 0, decoded.stderr[-4000:]
    engine = LocalEngine(location=tmp_path / "lake")
    assert engine.read_arrow(TableRef("silver", "account")).num_rows > 0
