"""A lake filled once by ``sfcdc run --once`` from the in-process emulator, shared by the
command tests that read it (run, status, sql)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pipelines import cli

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_OBJECTS = {
    "account": "object: Account\nkind: change_events\n",
    "contact": "object: Contact\nkind: change_events\n",
    "order_shipped": "object: Order_Shipped__e\nkind: platform_event\n",
}


def write_conf(root: Path, *, events: int = 300, platform_events: int = 30) -> Path:
    """A conf/ under ``root``: the in-process emulator with a small seeded workload."""
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
        "  engine: local\n"
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


@pytest.fixture(scope="session")
def filled_lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> FilledLake:
    root = tmp_path_factory.mktemp("cli-lake")
    conf = write_conf(root)
    capture = root / "run.out"
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = cli.main(["-q", "run", "--conf", str(conf), "--once"])
    capture.write_text(buffer.getvalue())
    return FilledLake(conf, root / "lake", code, buffer.getvalue())
