"""A Structured Streaming driver the tests start as a subprocess (and SIGKILL): the
``salesforce`` source into a Delta table through Delta's streaming sink.

``python -m tests.spark_source.driver SETTINGS_JSON`` where the JSON holds ``options`` (the
source's), ``table``, ``checkpoint``, ``workdir``, ``timeout`` (seconds to run unless killed
first) and ``connect`` (run the query over Spark Connect, as a Databricks serverless job does,
to the service of this process's own session: killing the process kills its server too, as
it kills a classic driver). It prints ``STARTED`` once the query runs and ``FAILED <error>``
when the query fails (exit status 3).
"""

from __future__ import annotations

import json
import os
import sys
import time

from pipelines.session import CONNECT_SERVICE_CONF, connect_session, local_session, serve_connect
from pipelines.spark_source import SalesforceSource


def main(argv: list[str]) -> int:
    settings = json.loads(argv[0])
    connect = bool(settings.get("connect"))
    spark = local_session(
        "sfcdc-spark-source-driver",
        cores=1,
        conf={
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "1",
            "spark.driver.memory": "1g",
            **(CONNECT_SERVICE_CONF if connect else {}),
        },
        delta=True,
        workdir=settings["workdir"],
    )
    if connect:
        os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"  # a Spark Connect process from here on
        spark = connect_session(serve_connect(spark))
    spark.dataSource.register(SalesforceSource)
    events = spark.readStream.format("salesforce").options(**settings["options"]).load()
    query = (
        events.writeStream.format("delta")
        .option("checkpointLocation", settings["checkpoint"])
        .option("mergeSchema", "true")
        .trigger(processingTime="200 milliseconds")
        .start(settings["table"])
    )
    print("STARTED", flush=True)
    deadline = time.monotonic() + float(settings.get("timeout", 120))
    try:
        while query.isActive and time.monotonic() < deadline:
            time.sleep(0.5)
        failure = query.exception()
        if failure is not None:
            print(f"FAILED {failure}", flush=True)
            return 3
    finally:
        query.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
