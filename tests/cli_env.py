"""The environment of an ``sfcdc`` command a test runs in a subprocess of its own."""

from __future__ import annotations

import os
from pathlib import Path

from pipelines.session import JAVA_OPTIONS_ENV

ROOT = Path(__file__).resolve().parent.parent

# The Spark driver such a run starts lives seconds to a minute (the crash tests kill it): the
# optimizing compiler's work would never pay off there, and on a small machine it competes with
# the run itself. Compiling with C1 only starts those drivers faster; the in-process session
# the other tests share keeps the default, as long jobs need it.
SHORT_RUN_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"


def cli_env() -> dict[str, str]:
    """This process's environment with this checkout on ``PYTHONPATH`` and the JVM options of
    a short spark-engine run (unless the caller set its own)."""
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        JAVA_OPTIONS_ENV: os.environ.get(JAVA_OPTIONS_ENV, SHORT_RUN_JAVA_OPTIONS),
    }
