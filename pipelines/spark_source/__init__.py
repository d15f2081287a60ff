"""Salesforce Pub/Sub API topics as a Spark data source named ``salesforce``.

::

    from pipelines.spark_source import SalesforceSource

    spark.dataSource.register(SalesforceSource)
    events = spark.readStream.format("salesforce").option("pipeline", "conf/pipeline.yml") \\
        .option("topic", "/data/AccountChangeEvent").load()

Options, offsets and exactly-once: docs/spark-source.md. Gold from such a query (decode=silver)
in ``foreachBatch``: :class:`GoldSink`.
"""

from typing import TYPE_CHECKING, Any

from pipelines.spark_source.errors import ReplayMismatchError, SchemaChangedError
from pipelines.spark_source.source import SalesforceSource

if TYPE_CHECKING:
    from pipelines.spark_source.gold_sink import BatchResult, GoldSink

__all__ = [
    "BatchResult",
    "GoldSink",
    "ReplayMismatchError",
    "SalesforceSource",
    "SchemaChangedError",
]


def __getattr__(name: str) -> Any:
    # The gold sink on first use only: it imports the gold job, and every Python worker that
    # reads for the source (and Spark's data source lookup, see pyspark_salesforce) imports
    # this package without needing it.
    if name in ("BatchResult", "GoldSink"):
        from pipelines.spark_source import gold_sink

        return getattr(gold_sink, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
