"""Bronze: raw events landed exactly once per topic, with replay checkpoints in Delta.

``BronzeLanding(engine, conf.topics(), channel=..., tokens=...).run()`` lands every topic's
events; :mod:`pipelines.bronze.checkpoint` holds the commit protocol and the argument that a
kill at any instant neither loses nor duplicates an event; :mod:`pipelines.bronze.tables`
the table layouts.
"""

from pipelines.bronze.checkpoint import (
    Checkpoint,
    CheckpointRow,
    CheckpointStore,
    Recovery,
    describe_position,
)
from pipelines.bronze.landing import BronzeLanding
from pipelines.bronze.landing_state import LandingResult, TopicResult
from pipelines.bronze.tables import (
    BRONZE_LAYOUT,
    BRONZE_SCHEMA,
    CHECKPOINT_SCHEMA,
    CHECKPOINT_TABLE,
    RESERVED_TABLES,
    SCHEMA_REGISTRY_SCHEMA,
    SCHEMA_REGISTRY_TABLE,
    BronzeTables,
    CheckpointKind,
    bronze_app_id,
    bronze_tables,
    checkpoint_app_id,
    ensure_tables,
)
from pipelines.ops.table import COMMITS_TABLE

__all__ = [
    "BRONZE_LAYOUT",
    "BRONZE_SCHEMA",
    "CHECKPOINT_SCHEMA",
    "CHECKPOINT_TABLE",
    "COMMITS_TABLE",
    "RESERVED_TABLES",
    "SCHEMA_REGISTRY_SCHEMA",
    "SCHEMA_REGISTRY_TABLE",
    "BronzeLanding",
    "BronzeTables",
    "Checkpoint",
    "CheckpointKind",
    "CheckpointRow",
    "CheckpointStore",
    "LandingResult",
    "Recovery",
    "TopicResult",
    "bronze_app_id",
    "bronze_tables",
    "checkpoint_app_id",
    "describe_position",
    "ensure_tables",
]
