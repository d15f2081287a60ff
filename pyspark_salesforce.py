"""Spark's automatic registration of the ``salesforce`` data source.

pyspark (4.0+) looks for top-level modules named ``pyspark_*`` that define ``DefaultSource``,
a :class:`~pyspark.sql.datasource.DataSource`, and registers each under its ``name()`` when a
session first resolves a data source. Installing sfcdc therefore makes
``spark.readStream.format("salesforce")`` work without ``spark.dataSource.register``.
"""

import logging

__all__ = ["DefaultSource"]

try:
    from pipelines.spark_source import SalesforceSource as DefaultSource
except ImportError as exc:  # pragma: no cover - an environment without sfcdc's dependencies
    # The lookup runs in every Spark session, before any format is resolved, and a failure
    # there fails every read (delta included): leave the source unregistered instead, and let
    # `spark.dataSource.register(SalesforceSource)` report the missing dependency.
    logging.getLogger(__name__).warning("the salesforce data source is unavailable: %s", exc)
    __all__ = []
