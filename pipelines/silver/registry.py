"""The schema registry as silver reads it, and an object's silver columns from its schemas.

Landing records every schema id it meets in ``bronze.sfcdc_schema_registry`` (the schema's
JSON as GetSchema returned it) and every schema GetSchema refused in
``bronze.sfcdc_schema_failures``. :func:`read_registry` parses the registry into
:class:`RegistryEntry` values (a schema that does not parse keeps the reason), and
:func:`silver_layout` builds an object's silver columns from every schema of its entity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from ingest.errors import ConfigError
from ingest.schema import EventSchema, parse_event_schema
from pipelines.bronze.tables import SCHEMA_FAILURES_TABLE, SCHEMA_REGISTRY_TABLE
from pipelines.engines.base import LakeEngine, TableRef
from pipelines.silver.columns import SilverLayout, build_layout
from pipelines.spec.models import ObjectSpec

__all__ = [
    "REGISTRY_TABLE",
    "SCHEMA_FAILURES",
    "RegistryEntry",
    "object_schemas",
    "read_registry",
    "read_schema_failures",
    "silver_layout",
]

REGISTRY_TABLE = TableRef("bronze", SCHEMA_REGISTRY_TABLE)
SCHEMA_FAILURES = TableRef("bronze", SCHEMA_FAILURES_TABLE)


@dataclass(frozen=True)
class RegistryEntry:
    """One schema of the registry table, parsed (``schema`` is None when it does not parse,
    and ``problem`` says why)."""

    schema_id: str
    schema_json: str
    topic: str | None
    first_seen_at: datetime | None
    schema: EventSchema | None
    problem: str | None = None


def read_registry(engine: LakeEngine, table: TableRef = REGISTRY_TABLE) -> dict[str, RegistryEntry]:
    """The schema registry, one entry per schema id (the earliest row of an id wins: a
    landing that crashed may have registered a schema twice)."""
    if not engine.exists(table):
        return {}
    rows = engine.read_arrow(
        table, columns=["schema_id", "schema_json", "topic", "first_seen_at"]
    ).to_pylist()
    entries: dict[str, RegistryEntry] = {}
    ordered = sorted(
        rows,
        key=lambda r: (r["first_seen_at"] is None, r["first_seen_at"] or 0, r["schema_id"] or ""),
    )
    for row in ordered:
        sid, text = row["schema_id"], row["schema_json"]
        if not sid or sid in entries:
            continue
        schema: EventSchema | None = None
        problem: str | None = None
        try:
            schema = parse_event_schema(str(text), expected_id=sid)
        except Exception as exc:  # json, fastavro and our parser each raise their own
            problem = f"schema {sid} in {table} is not a valid event schema: {exc}"
        entries[sid] = RegistryEntry(
            sid, str(text), row["topic"], row["first_seen_at"], schema, problem
        )
    return entries


def read_schema_failures(engine: LakeEngine) -> dict[str, str]:
    """The schema ids GetSchema refused when their events were landed, each with the server's
    answer (its latest refusal)."""
    if not engine.exists(SCHEMA_FAILURES):
        return {}
    rows = engine.read_arrow(
        SCHEMA_FAILURES, columns=["schema_id", "status", "error_code", "error", "failed_at"]
    ).to_pylist()
    failures: dict[str, str] = {}
    for row in sorted(rows, key=lambda r: r["failed_at"]):
        code = f" {row['error_code']}" if row["error_code"] else ""
        failures[row["schema_id"]] = (
            f"GetSchema {row['schema_id']} failed when the event was landed ({row['status']}"
            f"{code}): {row['error']}. `sfcdc silver --retry-quarantine` fetches it again and "
            "decodes these rows"
        )
    return failures


def object_schemas(obj: ObjectSpec, registry: Mapping[str, RegistryEntry]) -> list[EventSchema]:
    """The registry's parsed schemas of ``obj``'s entity, in registry order (oldest first)."""
    return [
        e.schema
        for e in registry.values()
        if e.schema is not None and e.schema.entity_name == obj.api_name
    ]


def silver_layout(obj: ObjectSpec, registry: Mapping[str, RegistryEntry]) -> SilverLayout:
    """``obj``'s silver columns from every registry schema of its entity (oldest first).

    With no schema yet the layout has only the metadata columns; fields arrive with the
    first schema (schema evolution adds them).
    """
    versions = object_schemas(obj, registry)
    change_events = obj.kind == "change_events"
    wrong = [s.schema_id for s in versions if s.is_change_event != change_events]
    if wrong:
        raise ConfigError(
            f"{obj.api_name} is configured as kind {obj.kind}, but its schemas "
            f"{', '.join(wrong)} are {'platform' if change_events else 'change'} events"
        )
    compounds = obj.silver.compound_fields
    if not versions:
        return SilverLayout(obj.api_name, change_events, (), compounds)
    try:
        return build_layout(obj.api_name, versions, compounds=compounds)
    except ValueError as exc:
        raise ConfigError(f"silver columns of {obj.api_name}: {exc}") from exc
