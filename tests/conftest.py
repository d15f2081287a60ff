"""Fixtures shared by every test layer.

One local Spark session serves the whole run (starting one costs seconds); tests that need it
ask for the ``spark`` fixture and are marked ``spark``. Unit tests never start a JVM.
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
def spark() -> Iterator[SparkSession]:
    from pipelines.session import local_session

    # Python workers must run the interpreter (and virtualenv) that runs the tests, and import
    # this checkout's packages even when it is not pip-installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    root = str(Path(__file__).resolve().parent.parent)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([root, *[p for p in paths if p != root]])

    session = local_session("sfcdc-tests", cores=2, conf={"spark.driver.memory": "2g"})
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests only talk to servers on loopback; a proxy from the environment must not intercept.
    for key in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
