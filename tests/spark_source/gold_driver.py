"""A Structured Streaming driver the gold sink tests start as a subprocess: the ``salesforce``
source (``decode=silver``) into silver and gold through :class:`GoldSink` in ``foreachBatch``.

``python -m tests.spark_source.gold_driver SETTINGS_JSON`` where the JSON holds ``options``
(the source's), ``conf_dir``, ``object``, ``checkpoint``, ``workdir``, ``timeout`` (seconds to
run unless killed first) and ``die_after_silver``: from this batch id on, the first silver
append of a micro-batch with rows is followed by a SIGKILL of the driver's whole process group
(its JVM and Python workers included), before that batch's gold run and before Spark commits
it to the checkpoint. It prints ``STARTED``
once the query runs, ``SILVER <batch id>`` before dying, and ``FAILED <error>`` when the query
fails (exit status 3).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

from pipelines.session import local_session
from pipelines.spark_source import GoldSink, SalesforceSource


def main(argv: list[str]) -> int:
    settings = json.loads(argv[0])
    spark = local_session(
        "sfcdc-gold-sink-driver",
        cores=1,
        conf={
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "1",
            "spark.driver.memory": "1g",
        },
        delta=True,
        workdir=settings["workdir"],
    )
    spark.dataSource.register(SalesforceSource)
    sink = GoldSink(spark, conf_dir=settings["conf_dir"], object=settings["object"])
    die_after = settings.get("die_after_silver")

    def each(batch: Any, batch_id: int) -> None:
        if die_after is None or batch_id < die_after:
            sink(batch, batch_id)
            return
        if sink.append_silver(batch, batch_id).rows:
            print(f"SILVER {batch_id}", flush=True)
            os.killpg(os.getpgrp(), signal.SIGKILL)

    changes = spark.readStream.format("salesforce").options(**settings["options"]).load()
    query = (
        changes.writeStream.foreachBatch(each)
        .option("checkpointLocation", settings["checkpoint"])
        .trigger(processingTime="200 milliseconds")
        .start()
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
