"""The settings a local Spark session starts with: each lake's own warehouse and Derby home,
so two runs (or two users' pipelines, or parallel tests) over different lakes never share a
metastore."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipelines.session import local_session_conf


def metastore_dirs(conf: dict[str, str]) -> tuple[Path, Path]:
    found = re.search(r"-Dderby\.system\.home=(\S+)", conf["spark.driver.extraJavaOptions"])
    assert found, conf["spark.driver.extraJavaOptions"]
    return Path(conf["spark.sql.warehouse.dir"]), Path(found.group(1))


def test_two_lakes_get_their_own_warehouse_and_derby_home(tmp_path: Path) -> None:
    first, second = tmp_path / "lake-a", tmp_path / "lake-b"
    dirs_first = metastore_dirs(local_session_conf(workdir=first))
    dirs_second = metastore_dirs(local_session_conf(workdir=second))
    for root, dirs in ((first, dirs_first), (second, dirs_second)):
        assert all(d.is_relative_to(root) for d in dirs), (root, dirs)
    assert set(dirs_first).isdisjoint(dirs_second)
    warehouse, derby = dirs_first
    assert warehouse != derby


def test_without_a_lake_the_session_works_in_the_users_cache_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    warehouse, derby = metastore_dirs(local_session_conf())
    assert warehouse.is_relative_to(tmp_path / ".cache" / "sfcdc")
    assert derby.is_relative_to(tmp_path / ".cache" / "sfcdc")


def test_settings_given_by_the_caller_win() -> None:
    conf = local_session_conf(conf={"spark.sql.shuffle.partitions": "3"})
    assert conf["spark.sql.shuffle.partitions"] == "3"
