"""The Python workers of a local session are forked by sfcdc's daemon, which keeps Spark's
archives (``pyspark.zip``, the py4j archive, the core jar) off their import path: a worker
re-reads the directory of every archive on its path for every task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

from pipelines.worker_daemon import spark_archives

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def test_only_files_inside_spark_home_are_archives(tmp_path: Path) -> None:
    home = tmp_path / "pyspark"
    (home / "python" / "lib").mkdir(parents=True)
    (home / "jars").mkdir()
    inside = [home / "python" / "lib" / "pyspark.zip", home / "jars" / "spark-core.jar"]
    outside = tmp_path / "user.zip"
    for archive in (*inside, outside):
        with zipfile.ZipFile(archive, "w") as z:
            z.writestr("m.py", "")
    linked = tmp_path / "linked.zip"
    linked.symlink_to(inside[0])
    path = [
        str(tmp_path),  # a directory, not an archive
        *map(str, inside),
        str(outside),
        str(linked),  # an archive of Spark's reached through a link
        str(home / "python" / "lib" / "absent.zip"),
        "",
    ]
    assert spark_archives(path, str(home)) == [*map(str, inside), str(linked)]
    assert spark_archives(path, None) == []


def _path_after_drop(spark_home: Path, archive: Path) -> list[str]:
    """``sys.path`` of a daemon's process started with ``archive`` on its path, after the
    daemon's clean-up."""
    code = (
        "import json, sys; from pipelines import worker_daemon as w; "
        "w._drop_archives(); print(json.dumps(sys.path))"
    )
    root = str(Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home),
        "PYTHONPATH": f"{archive}{os.pathsep}{root}",
    }
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    path: list[str] = json.loads(done.stdout)
    return path


def test_the_archives_go_when_the_same_installation_imports_without_them() -> None:
    import pyspark

    home = Path(pyspark.__file__).parent  # a pip-installed pyspark is its own SPARK_HOME
    archive = home / "python" / "lib" / "pyspark.zip"
    if not archive.is_file():
        pytest.skip("this pyspark has no python/lib/pyspark.zip")
    assert str(archive) not in _path_after_drop(home, archive)


def test_the_archives_stay_when_pyspark_would_come_from_another_installation(
    tmp_path: Path,
) -> None:
    # A Spark distribution in SPARK_HOME beside the pip-installed pyspark of this venv: its
    # workers must keep the distribution's pyspark, which matches its JVM.
    home = tmp_path / "spark"
    (home / "python" / "lib").mkdir(parents=True)
    archive = home / "python" / "lib" / "pyspark.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("pyspark/__init__.py", "")
    assert str(archive) in _path_after_drop(home, archive)


def _worker_path(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import sys

    import pyspark

    for _ in batches:
        yield pa.RecordBatch.from_pydict(
            {
                "entry": [*sys.path, "pyspark module: " + pyspark.__file__],
                "home": [os.environ.get("SPARK_HOME", "")] * (len(sys.path) + 1),
            }
        )


@pytest.mark.spark
def test_the_workers_import_pyspark_without_sparks_archives(spark: SparkSession) -> None:
    rows = spark.range(1).mapInArrow(_worker_path, "entry string, home string").collect()
    entries = [r.entry for r in rows if not r.entry.startswith("pyspark module: ")]
    (module,) = [r.entry for r in rows if r.entry.startswith("pyspark module: ")]
    home = rows[0].home
    assert home, "Spark gives its workers SPARK_HOME"
    # Spark put its archives there; the daemon took them off before pyspark was imported.
    assert spark_archives(entries, home) == []
    assert ".zip" not in module, module
    assert Path(module.removeprefix("pyspark module: ")).is_file()
