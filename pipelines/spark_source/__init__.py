"""Salesforce Pub/Sub API topics as a Spark data source named ``salesforce``.

::

    from pipelines.spark_source import SalesforceSource

    spark.dataSource.register(SalesforceSource)
    events = spark.readStream.format("salesforce").option("pipeline", "conf/pipeline.yml") \\
        .option("topic", "/data/AccountChangeEvent").load()

Options, offsets and exactly-once: docs/spark-source.md.
"""

from pipelines.spark_source.errors import ReplayMismatchError, SchemaChangedError
from pipelines.spark_source.source import SalesforceSource

__all__ = ["ReplayMismatchError", "SalesforceSource", "SchemaChangedError"]
