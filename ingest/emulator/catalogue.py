"""The emulated org's objects: the Avro schemas shipped in ``ingest/emulator/schemas``.

Each ``.avsc`` file is one schema version of one topic. ``<Name>.avsc`` is version 1 and
``<Name>.v<N>.avsc`` version *N*. Change event schemas (``AccountChangeEvent``,
``Invoice__ChangeEvent``) give the topics ``/data/<Name>``; platform event schemas
(``Order_Shipped__e``) give ``/event/<Name>``.

:func:`default_catalogue` starts every topic at its first version. Later versions are schema
changes that happen mid-stream (:meth:`ingest.emulator.workload.Workload.change_schema`):
``AccountChangeEvent.v2`` inserts ``RecordTypeId`` before ``ParentId``, so every later field,
and every later bitmap position, moves up by one, and adds the custom field ``Tier__c``.

Schemas are served as compact JSON (no whitespace), as Salesforce serves them; the schema id is
the fingerprint of the parsing canonical form, so the formatting of the files does not matter.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources

from ingest.emulator.topics import Catalogue, TopicDef
from ingest.schema import EventSchema, parse_event_schema

__all__ = [
    "default_catalogue",
    "load_schema",
    "schema_files",
    "schema_versions",
    "topic_for_schema",
]

_FILE = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9_]*)(?:\.v(?P<version>[0-9]+))?\.avsc$")


def _schema_dir() -> resources.abc.Traversable:
    return resources.files("ingest.emulator").joinpath("schemas")


def _parse_name(filename: str) -> tuple[str, int]:
    match = _FILE.fullmatch(filename)
    if match is None:
        raise ValueError(
            f"schema file names look like <Name>.avsc or <Name>.v<N>.avsc (got {filename!r})"
        )
    return match["name"], int(match["version"] or 1)


def schema_files() -> tuple[str, ...]:
    """The shipped schema file names, ordered by schema name and then version."""
    names = [p.name for p in _schema_dir().iterdir() if p.name.endswith(".avsc")]
    return tuple(sorted(names, key=_parse_name))


@cache
def _load(filename: str) -> EventSchema:
    _parse_name(filename)
    path = _schema_dir().joinpath(filename)
    if not path.is_file():
        raise FileNotFoundError(
            f"no shipped schema {filename!r}; shipped schemas: {', '.join(schema_files())}"
        )
    raw = json.loads(path.read_text(encoding="utf-8"))
    schema = parse_event_schema(json.dumps(raw, separators=(",", ":"), ensure_ascii=False))
    uuid = raw.get("uuid")
    if uuid is not None and uuid != schema.schema_id:
        raise ValueError(
            f"{filename}: the uuid attribute must equal the schema id {schema.schema_id} "
            f"(got {uuid!r})"
        )
    return schema


def load_schema(filename: str) -> EventSchema:
    """The shipped schema in ``filename`` (for example ``AccountChangeEvent.v2.avsc``).

    Parsed once per process: an :class:`EventSchema` is immutable, so sharing it is safe.
    """
    return _load(filename)


def schema_versions(entity: str) -> tuple[EventSchema, ...]:
    """Every shipped schema version of ``entity`` (``Account``, ``Invoice__c``,
    ``Order_Shipped__e``), oldest first. Raises ``KeyError`` for an unknown entity."""
    versions = [load_schema(f) for f in schema_files()]
    matching = tuple(s for s in versions if s.entity_name == entity)
    if not matching:
        known = sorted({s.entity_name for s in versions})
        raise KeyError(f"no shipped schema for entity {entity!r} (entities: {', '.join(known)})")
    return matching


def topic_for_schema(schema: EventSchema) -> TopicDef:
    """A one-version topic for ``schema``: ``/data/<Name>`` for change events,
    ``/event/<Name>`` for platform events."""
    short = schema.name.rsplit(".", 1)[-1]
    if schema.is_change_event:
        return TopicDef(f"/data/{short}", "change_events", schema.entity_name, (schema,))
    return TopicDef(f"/event/{short}", "platform_event", schema.entity_name, (schema,))


def default_catalogue() -> Catalogue:
    """A fresh catalogue of every shipped topic at its first schema version, plus
    ``/data/ChangeEvents``. Each call returns a new instance, so schema changes made on one do
    not leak into another."""
    firsts: dict[str, EventSchema] = {}
    for filename in schema_files():
        schema = load_schema(filename)
        firsts.setdefault(schema.name, schema)
    return Catalogue.of(topic_for_schema(s) for s in firsts.values())
