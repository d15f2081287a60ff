"""The local engine on object storage (an S3-compatible server and Azurite on loopback): a
``lake.location`` of ``s3://`` or ``az://`` from ``pipeline.yml`` is written there through
delta-rs -- appends, MERGE, maintenance, listing -- and never into a local folder named after
the scheme."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pipelines.engines import TableRef, Txn, make_engine
from pipelines.spec import load_conf
from tests.object_storage import ObjectLake

pytestmark = [pytest.mark.integration]

GOLD = TableRef("gold", "account")


def _conf(root: Path, lake: ObjectLake) -> Path:
    conf = root / "conf"
    (conf / "objects").mkdir(parents=True)
    (conf / "objects" / "account.yml").write_text("object: Account\nkind: change_events\n")
    (conf / "pipeline.yml").write_text(
        textwrap.dedent(
            f"""\
            connection:
              source: emulator
            lake: {lake.yaml()}
            """
        )
    )
    return conf


def test_a_lake_on_object_storage_is_written_there(
    tmp_path: Path, object_lake: ObjectLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    conf = load_conf(_conf(tmp_path, object_lake))
    assert conf.pipeline.lake.location == object_lake.location
    engine = make_engine(conf.pipeline.lake, None)
    rows = pa.table({"Id": ["1", "2"], "Name": ["a", "b"]})
    engine.merge(GOLD, rows, on=["Id"], txn=Txn("sfcdc.gold:Account", 1))
    engine.merge(
        GOLD,
        pa.table({"Id": ["2", "3"], "Name": ["B", "c"]}),
        on=["Id"],
        txn=Txn("sfcdc.gold:Account", 2),
    )
    engine.append(TableRef("bronze", "orders"), pa.table({"n": pa.array([1, 2], pa.int64())}))
    assert sorted(engine.read_arrow(GOLD)["Name"].to_pylist()) == ["B", "a", "c"]
    assert engine.txn_version(GOLD, "sfcdc.gold:Account") == 2
    changes = engine.read_appends(TableRef("bronze", "orders"), after_version=None)
    assert changes.rows.num_rows == 2
    assert set(engine.tables()) == {GOLD, TableRef("bronze", "orders")}
    result = engine.maintain(GOLD, vacuum_hours=0, log_hours=0)
    assert result.checkpoint_version is not None and result.vacuumed_files
    assert sorted(engine.read_arrow(GOLD)["Name"].to_pylist()) == ["B", "a", "c"]

    # Nothing on this machine's disk: the table is in the store, read there by delta-rs.
    assert not any(p.name.startswith(("s3:", "az:")) for p in tmp_path.rglob("*"))
    assert not any(p.name.startswith(("s3:", "az:")) for p in Path(conf.conf_dir).parent.iterdir())
    options = engine.storage_options  # type: ignore[attr-defined]
    stored = DeltaTable(f"{object_lake.location}/gold/account", storage_options=options)
    assert sorted(stored.to_pyarrow_table().column("Name").to_pylist()) == ["B", "a", "c"]
    assert "secret" not in repr(engine) and all(
        v not in repr(engine) for v in os.environ.values() if len(v) > 8 and "test" in v
    )
