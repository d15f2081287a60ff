"""Lake engines: where the pipeline's Delta tables are read and written, and where the layer
functions run.

``make_engine(conf.pipeline.lake, spark)`` returns the engine the ``lake.engine`` key asks
for; ``auto`` picks ``spark`` where Delta's Spark classes are present (Databricks, clusters
with the delta-spark jar) and ``local`` elsewhere (laptops, CI). The local engine needs
delta-rs (the ``local`` extra) and no Spark session, the spark engine pyspark (an extra too);
each is imported only when asked for, so a Databricks runtime without delta-rs, and an install
without extras (``sfcdc --help``, ``validate``, the emulator), import this package.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from ingest.errors import LakeError
from pipelines.memory import configure_allocators

# Before any engine module loads delta-rs (pipelines.memory says why).
configure_allocators()

from pipelines.engines.base import (  # noqa: E402
    CommitResult,
    HistoryEntry,
    Kept,
    LakeEngine,
    MaintenanceResult,
    MergeMetrics,
    Rows,
    TableChanges,
    TableRef,
    Txn,
    WriteLayout,
)
from pipelines.spec.models import LakeSpec  # noqa: E402

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipelines.engines.local import LocalEngine
    from pipelines.engines.spark import SparkEngine

__all__ = [
    "DELTA_CLASS",
    "DELTA_EXTENSION",
    "CommitResult",
    "HistoryEntry",
    "Kept",
    "LakeEngine",
    "LocalEngine",
    "MaintenanceResult",
    "MergeMetrics",
    "Rows",
    "SparkEngine",
    "TableChanges",
    "TableRef",
    "Txn",
    "WriteLayout",
    "delta_classes_present",
    "detect_engine",
    "local_engine",
    "make_engine",
]

_log = logging.getLogger(__name__)

DELTA_CLASS = "io.delta.tables.DeltaTable"
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"


def detect_engine(
    *, on_databricks: bool, delta_classes: bool | None, sql_extensions: str
) -> Literal["local", "spark"]:
    """The engine ``auto`` resolves to.

    ``delta_classes`` is whether the JVM can load Delta's Spark classes (``None`` when there
    is no JVM to ask, as with Spark Connect); the session's ``spark.sql.extensions`` decides
    then.
    """
    if on_databricks:
        return "spark"
    if delta_classes is not None:
        return "spark" if delta_classes else "local"
    return "spark" if DELTA_EXTENSION in sql_extensions else "local"


def delta_classes_present(spark: SparkSession) -> bool | None:
    """Whether the session's JVM can load Delta's Spark classes; ``None`` without a JVM."""
    jvm: Any = getattr(spark, "_jvm", None) or getattr(
        getattr(spark, "sparkContext", None), "_jvm", None
    )
    if jvm is None:
        return None
    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(DELTA_CLASS, False, loader)
    except Exception:  # py4j wraps ClassNotFoundException in its own error types
        return False
    return True


def make_engine(
    lake: LakeSpec,
    spark: SparkSession | None,
    *,
    environ: Mapping[str, str] = os.environ,
    probe: Callable[[SparkSession], bool | None] = delta_classes_present,
) -> LakeEngine:
    """The engine for a ``lake:`` section. ``spark`` may be ``None`` for the local engine
    (it needs a session only to answer Spark SQL)."""
    choice = lake.engine
    if choice == "auto":
        if spark is None:
            choice = "local"
        else:
            choice = detect_engine(
                on_databricks="DATABRICKS_RUNTIME_VERSION" in environ,
                delta_classes=probe(spark),
                sql_extensions=str(spark.conf.get("spark.sql.extensions", "") or ""),
            )
        _log.info("lake engine auto-detected: %s", choice)
    if choice == "spark":
        if spark is None:
            raise LakeError("the spark lake engine needs a Spark session with Delta Lake")
        from pipelines.engines.spark import SparkEngine

        return SparkEngine.from_spec(lake, spark)
    return local_engine(lake, spark)


def local_engine(lake: LakeSpec, spark: SparkSession | None = None) -> LocalEngine:
    """The local engine of ``lake`` (delta-rs: the ``local`` extra)."""
    try:
        from pipelines.engines.local import LocalEngine
    except ImportError as exc:
        raise LakeError(
            f"the local lake engine needs delta-rs, which is not installed here ({exc}); "
            'install sfcdc[local] (pip install "sfcdc[local]"), or use lake.engine: spark'
        ) from exc
    return LocalEngine.from_spec(lake, spark)


def __getattr__(name: str) -> Any:
    # The engines on first use only: LocalEngine imports delta-rs, SparkEngine pyspark.
    if name == "LocalEngine":
        from pipelines.engines.local import LocalEngine

        return LocalEngine
    if name == "SparkEngine":
        from pipelines.engines.spark import SparkEngine

        return SparkEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
