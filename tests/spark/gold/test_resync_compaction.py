"""The re-sync table gets a small file per object per pass; the gold job compacts it every
few versions so that a continuous run's re-sync reads and MERGEs do not grow with time."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pipelines.gold import job
from pipelines.gold.resync import RESYNC_TABLE
from tests.spark.gold.conftest import Silver
from tests.spark.gold.test_job import NOW, Lake

pytestmark = pytest.mark.spark


def test_the_resync_table_is_compacted_every_few_versions(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job, "RESYNC_COMPACT_EVERY", 3)
    env = Lake(spark, tmp_path / "lake")
    batch = Silver()
    for n in range(5):
        # An UPDATE of a record gold has never seen: one re-sync row per pass.
        batch.update(f"001R{n}", n, Phone=f"p{n}")
        env.land(batch)
        env.gold(now=NOW + timedelta(minutes=n))
        batch = batch.next_batch()
    operations = [e.operation for e in env.engine.history(RESYNC_TABLE, limit=50)]
    assert operations.count("OPTIMIZE") == 2, operations
    rows = env.engine.read_arrow(RESYNC_TABLE, columns=["record_id", "reason"]).to_pylist()
    assert sorted((r["record_id"], r["reason"]) for r in rows) == [
        (f"001R{n}", "missing_base") for n in range(5)
    ]
    # Versions 1, 2, 3 (merges), 4 (compaction), 5, 6, 7 (compaction), 8.
    files = list((env.engine.path(RESYNC_TABLE)).glob("*.parquet"))
    live = env.engine.read(RESYNC_TABLE).inputFiles()
    assert len(live) < len(files)
