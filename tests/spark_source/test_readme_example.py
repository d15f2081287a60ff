"""The README's Structured Streaming example, executed as written (only the emulator's ports
and the output folder changed) in the shared Spark session against the emulator."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from tests.spark_source.conftest import ACCOUNT, ROOT, Org

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.spark_source]


def readme_example() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Spark Structured Streaming source") :]
    match = re.search(r"```py\n(.*?)```", section, re.S)
    assert match is not None, "the section shows its example in a ```py block"
    return match.group(1)


def test_the_readme_example_streams_every_event_into_delta(
    spark: SparkSession, org: Org, tmp_path: Path
) -> None:
    org.publish(200)
    code = readme_example()
    assert len(code.strip().splitlines()) == 5
    code = (
        code.replace('"7443"', f'"{org.emulator.grpc_port}"')
        .replace('"7444"', f'"{org.emulator.http_port}"')
        .replace("/tmp/sfcdc-spark", str(tmp_path))
    )
    scope = {"spark": spark}
    exec(compile(code, "README.md", "exec"), scope)
    query = scope["query"]
    published = {e.replay_id for e in org.emulator.log(ACCOUNT)}
    table = tmp_path / "account_events"
    landed: list[bytes] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(landed) < len(published):
            time.sleep(0.5)
            assert query.exception() is None
            if DeltaTable.is_deltatable(str(table)):
                landed = DeltaTable(str(table)).to_pyarrow_table().column("replay_id").to_pylist()
    finally:
        query.stop()
    assert sorted(landed) == sorted(published)
