"""A lake for the gold job's tests: a configuration, a schema registry and a silver Account
table filled batch by batch as the silver job does, on the lake engine under test."""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa

from ingest.schema import schema_id
from pipelines.engines import LakeEngine, Rows, TableRef, Txn
from pipelines.gold.job import GoldResult, run_gold
from pipelines.spec import Conf, load_conf
from tests.spark.gold.conftest import Silver, account_schema_json

GOLD = TableRef("gold", "account")
SILVER = TableRef("silver", "account")
REGISTRY = TableRef("bronze", "sfcdc_schemas")
CHECKPOINTS = TableRef("bronze", "sfcdc_checkpoints")
RATING = ("Rating__c", "double", "Data:Double")
NOW = datetime(2025, 6, 1, tzinfo=timezone.utc)


def make_conf(root: Path, gold: str = "", *, engine: str = "local") -> Conf:
    conf = root / "conf"
    (conf / "objects").mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    (conf / "pipeline.yml").write_text(
        textwrap.dedent(
            f"""\
            lake:
              engine: {engine}
              location: {root / "lake"}
              schemas: {{bronze: bronze_{tag}, silver: silver_{tag}, gold: gold_{tag}}}
            """
        )
    )
    (conf / "objects" / "account.yml").write_text(
        "object: Account\nkind: change_events\n" + textwrap.dedent(gold)
    )
    return load_conf(conf)


def register(engine: LakeEngine, *schemas: str) -> None:
    """The schema registry holds ``schemas`` (the last one seen most recently)."""
    rows = [
        {
            "schema_id": schema_id(text),
            "schema_json": text,
            "topic": "/data/AccountChangeEvent",
            "first_seen_at": NOW - timedelta(days=len(schemas) - i),
        }
        for i, text in enumerate(schemas)
    ]
    schema = pa.schema(
        [
            ("schema_id", pa.string()),
            ("schema_json", pa.string()),
            ("topic", pa.string()),
            ("first_seen_at", pa.timestamp("us", tz="UTC")),
        ]
    )
    engine.overwrite(REGISTRY, pa.Table.from_pylist(rows, schema=schema))


EngineFactory = Callable[..., LakeEngine]


class Lake:
    """A lake with a silver Account table filled batch by batch, as the silver job does,
    through an engine ``make_engine`` makes (the test's)."""

    def __init__(
        self, make_engine: EngineFactory, engine_name: str, root: Path, gold: str = ""
    ) -> None:
        # Over Spark Connect the lake is a spark lake: commands use the active (Connect) session.
        self.conf = make_conf(root, gold, engine=engine_name.removesuffix("_connect"))
        lake = self.conf.pipeline.lake
        self.engine = make_engine(lake.location, schemas=lake.schemas)
        self.version = 0
        register(self.engine, account_schema_json())

    def land(self, silver: Silver) -> int:
        self.version += 1
        self.engine.append(
            SILVER, silver.rows_of(self.engine), txn=Txn("sfcdc.silver:Account", self.version)
        )
        return self.version

    def gold(self, *, now: datetime = NOW, **options: Any) -> GoldResult:
        return run_gold(self.engine, self.conf, now=lambda: now, partitions=2, **options)

    def read(self, table: TableRef = GOLD) -> Rows:
        return self.engine.read(table)


LakeFactory = Callable[..., Lake]
