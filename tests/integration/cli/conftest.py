"""A lake filled once per lake engine by ``sfcdc run --once`` from the in-process emulator,
shared by the command tests that read it (run, status, sql)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pipelines import cli
from tests.conftest import engine_params

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_OBJECTS = {
    "account": "object: Account\nkind: change_events\n",
    "contact": "object: Contact\nkind: change_events\n",
    "order_shipped": "object: Order_Shipped__e\nkind: platform_event\n",
}


def write_conf(
    root: Path, *, events: int = 300, platform_events: int = 30, engine: str = "local"
) -> Path:
    """A conf/ under ``root``: the in-process emulator with a small seeded workload, into a
    lake of the ``engine``."""
    conf = root / "conf"
    (conf / "objects").mkdir(parents=True)
    (conf / "pipeline.yml").write_text(
        "connection:\n"
        "  emulator:\n"
        "    seed: 7\n"
        "    state_dir: ./emulator\n"
        "    keepalive_seconds: 0.3\n"
        "    workload:\n"
        f"      events: {events}\n"
        f"      platform_events: {platform_events}\n"
        "lake:\n"
        f"  engine: {engine}\n"
        "  location: ./lake\n"
        "defaults:\n"
        "  batching:\n"
        "    max_age_seconds: 0.5\n"
    )
    for name, text in _OBJECTS.items():
        (conf / "objects" / f"{name}.yml").write_text(text)
    return conf


@dataclass(frozen=True)
class FilledLake:
    conf: Path
    lake: Path
    code: int
    out: str
    engine: str


@pytest.fixture(scope="session", params=engine_params())
def filled_lake(
    request: pytest.FixtureRequest, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> FilledLake:
    engine = str(request.param)
    root = tmp_path_factory.mktemp(f"cli-lake-{engine}")
    conf = write_conf(root, engine=engine)
    capture = root / "run.out"
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = cli.main(["-q", "run", "--conf", str(conf), "--once"])
    capture.write_text(buffer.getvalue())
    return FilledLake(conf, root / "lake", code, buffer.getvalue(), engine)


@pytest.fixture
def few_partitions(spark: SparkSession) -> Iterator[SparkSession]:
    """The shared session with one shuffle partition while the test runs: queries over a demo's
    few thousand rows join and group quicker so."""
    before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    yield spark
    spark.conf.set("spark.sql.shuffle.partitions", before or "200")
