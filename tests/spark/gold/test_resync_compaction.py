"""The re-sync table gets a small file per object per pass; the gold job compacts it every
few versions so that a continuous run's re-sync reads and MERGEs do not grow with time."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from deltalake import DeltaTable

from pipelines.gold import object_run
from pipelines.gold.resync import RESYNC_TABLE
from tests.spark.gold.conftest import Silver
from tests.spark.gold.lakes import NOW, LakeFactory


def test_the_resync_table_is_compacted_every_few_versions(
    lake: LakeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(object_run, "RESYNC_COMPACT_EVERY", 3)
    env = lake()
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
    path = Path(env.engine.path(RESYNC_TABLE))  # type: ignore[attr-defined]
    files = list(path.glob("*.parquet"))
    live = DeltaTable(str(path)).file_uris()
    assert len(live) < len(files)
