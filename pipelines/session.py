"""Creating the Spark session sfcdc runs in.

On Databricks the session already exists and is passed in by the job; locally sfcdc starts a
Spark local-mode session with settings chosen for the pipeline (UTC, Arrow, few shuffle
partitions). Library code never creates a session itself: it receives one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["LOCAL_SESSION_CONF", "local_session"]

LOCAL_SESSION_CONF: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # Salesforce timestamps are UTC epoch milliseconds; never let the host zone leak in.
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "20000",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.adaptive.enabled": "true",
    "spark.default.parallelism": "4",
    "spark.driver.memory": "4g",
    "spark.sql.warehouse.dir": str(Path.home() / ".cache" / "sfcdc" / "warehouse"),
    # Arrow's per-access bounds and null checks cost a tenth of the JVM's time when it turns
    # wide rows into Arrow for Python (silver); Spark alone writes and reads those buffers.
    "spark.driver.extraJavaOptions": (
        "-Dderby.system.home=/tmp/sfcdc-derby -Darrow.enable_unsafe_memory_access=true "
        "-Darrow.enable_null_check_for_get=false"
    ),
    # Silver rows have more than Spark's default 100 fields (nested ones included); above that
    # Spark stops generating code for a query and interprets it, several times slower.
    "spark.sql.codegen.maxFields": "1000",
    # The local engine collects each write to the driver (it is the executor too) and hands it
    # to delta-rs; silver.max_rows_per_commit bounds one write, not this.
    "spark.driver.maxResultSize": "0",
    "spark.python.worker.reuse": "true",
}


def _python_workers() -> dict[str, str]:
    """Spark's Python workers must run this interpreter (the one sfcdc is installed in, even
    when its virtualenv is not activated: ``python3`` on PATH may be another) and import this
    copy of sfcdc (a checkout run with ``python -m`` is not on their path otherwise)."""
    root = str(Path(__file__).resolve().parent.parent)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    return {
        "spark.pyspark.python": sys.executable,
        "spark.executorEnv.PYTHONPATH": os.pathsep.join([root, *paths]),
    }


def local_session(
    app_name: str = "sfcdc",
    *,
    cores: int | str = "*",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Return a local-mode Spark session (the existing one if a session is already active)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(f"local[{cores}]").appName(app_name)
    for key, value in {**LOCAL_SESSION_CONF, **_python_workers(), **(conf or {})}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
