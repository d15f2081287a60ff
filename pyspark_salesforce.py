"""Spark's automatic registration of the ``salesforce`` data source.

pyspark (4.0+) looks for top-level modules named ``pyspark_*`` that define ``DefaultSource``,
a :class:`~pyspark.sql.datasource.DataSource`, and registers each under its ``name()`` when a
session first resolves a Python data source. Installing sfcdc therefore makes
``spark.readStream.format("salesforce")`` work without ``spark.dataSource.register``.
"""

from pipelines.spark_source import SalesforceSource as DefaultSource

__all__ = ["DefaultSource"]
