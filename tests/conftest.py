"""Fixtures shared by every test layer.

One local Spark session serves the whole run (starting one costs seconds); tests that need it
ask for the ``spark`` fixture and are marked ``spark``. Unit tests never start a JVM. The
session loads Delta Lake from the jars ``sfcdc delta-jars`` resolves (resolved here on first
use), so the ``spark`` lake engine runs on real delta-spark tables; its warehouse and Derby
home live in a folder of this run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    from pipelines.delta_jars import resolve_jars
    from pipelines.session import local_session

    # Python workers must run the interpreter (and virtualenv) that runs the tests, and import
    # this checkout's packages even when it is not pip-installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    root = str(Path(__file__).resolve().parent.parent)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([root, *[p for p in paths if p != root]])

    resolve_jars()  # a no-op once `sfcdc delta-jars` has run (.ci/run runs it)
    session = local_session(
        "sfcdc-tests",
        cores=2,
        conf={"spark.driver.memory": "2g"},
        delta=True,
        workdir=tmp_path_factory.mktemp("spark"),
    )
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests only talk to servers on loopback; a proxy from the environment must not intercept.
    for key in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
