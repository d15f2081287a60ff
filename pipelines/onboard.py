"""Onboarding an object: its ``conf/objects/<name>.yml`` written from its event schema.

The schema says everything the file needs: a change event's schema starts with
``ChangeEventHeader`` and is named after its entity (``Invoice__ChangeEvent`` is ``Invoice__c``),
anything else is a platform event. :func:`object_yaml` renders the file from a parsed schema;
:func:`fetch_schema` asks the configured source for a topic's current schema (GetTopic, then
GetSchema); :func:`onboard` does both, writes the file and loads the whole ``conf/`` again, so
a file that would clash with another object (same table, same topic) is refused and removed.

The onboarding notebook prints :func:`object_yaml` of :func:`fetch_schema` (files written in a
Databricks workspace are replaced by the next bundle deploy: the file belongs in the
repository); on a laptop :func:`onboard` writes it::

    python -c "from pathlib import Path; from pipelines.onboard import onboard; \\
        print(onboard(Path('conf'), '/data/Invoice__ChangeEvent'))"
"""

from __future__ import annotations

import dataclasses
import logging
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ingest.auth import SecretResolver
from ingest.client.schemas import SchemaCache
from ingest.errors import ConfigError
from ingest.schema import HEADER_FIELD, EventSchema
from pipelines.connect import connect, secret_resolver
from pipelines.spec import (
    ConnectionSpec,
    EmulatorWorkload,
    ObjectKind,
    default_tables,
    default_topic,
    load_conf,
    parse_topic,
)

__all__ = ["fetch_schema", "object_file_name", "object_yaml", "onboard"]

_log = logging.getLogger(__name__)


def _kind(schema: EventSchema) -> ObjectKind:
    return "change_events" if schema.is_change_event else "platform_event"


def object_file_name(schema: EventSchema) -> str:
    """``invoice.yml`` for ``Invoice__c``: the object's silver/gold table name."""
    api_name = schema.entity_name
    return f"{default_tables(api_name, default_topic(api_name, _kind(schema))).gold}.yml"


def object_yaml(schema: EventSchema, *, topic: str | None = None) -> str:
    """The object file for the entity ``schema`` describes.

    ``topic`` is written only when it differs from the entity's default topic (a custom
    channel); it must carry the entity, which :func:`~pipelines.spec.load_conf` checks.
    The schema's fields are listed in a comment, with the kinds silver gives them, as a
    starting point for ``gold.scd2.track``.
    """
    api_name = schema.entity_name
    kind = _kind(schema)
    derived = default_topic(api_name, kind)
    chosen = topic or derived
    tables = default_tables(api_name, chosen)
    what = (
        f"Change Data Capture of {api_name}"
        if kind == "change_events"
        else f"The platform event {api_name}"
    )
    # A no-break space keeps each "Name (kind)" on one comment line; it is put back after.
    fields = [f"{f.name}\u00a0({f.kind})" for f in schema.fields if f.name != HEADER_FIELD]
    listed = textwrap.wrap(", ".join(fields), width=96, break_on_hyphens=False)
    layers = (
        f"silver {tables.silver}, gold {tables.gold}"
        if kind == "change_events"
        else f"silver {tables.silver} (platform events have no gold table)"
    )
    lines = [
        "# yaml-language-server: $schema=../schema/object.schema.json",
        f"# {what}, generated from its event schema {schema.schema_id}.",
        f"#   topic {chosen}, bronze {tables.bronze}, {layers}.",
        f"# Fields ({len(fields)}):",
        *(f"#   {line}".replace("\u00a0", " ") for line in listed),
        f"object: {api_name}",
        f"kind: {kind}",
    ]
    if chosen != derived:
        lines.append(f"topic: {chosen}")
    return "\n".join(lines) + "\n"


def fetch_schema(
    connection: ConnectionSpec,
    topic: str,
    *,
    secrets: SecretResolver | None = None,
) -> EventSchema:
    """The current schema of ``topic`` from the source ``connection`` describes.

    Channels that carry several objects (``/data/ChangeEvents``, ``__chn`` channels) have no
    schema of their own: name the object's own topic (``/data/AccountChangeEvent``).
    """
    info = parse_topic(topic)
    if info.kind in ("change_event_channel", "platform_event_channel"):
        raise ConfigError(
            f"{topic} is a channel of several objects and has no schema of its own; onboard "
            "each object from its own topic, such as /data/AccountChangeEvent or "
            "/event/Order_Shipped__e, then set topic: to the channel in its file"
        )
    if connection.source == "emulator" and connection.emulator.mode == "in_process":
        # Only the catalogue is needed: an emulator in memory with no workload, so onboarding
        # never writes events into the state directory the pipeline replays from.
        emulator = dataclasses.replace(
            connection.emulator,
            state_dir=None,
            workload=EmulatorWorkload(events=0, platform_events=0),
        )
        connection = dataclasses.replace(connection, emulator=emulator)
    resolver = secrets if secrets is not None else secret_resolver()
    with connect(connection, secrets=resolver) as source:
        schema = SchemaCache(source.channel, tokens=source.tokens).current_schema(topic)
    _log.info("fetched schema %s of %s (%d fields)", schema.schema_id, topic, len(schema.fields))
    return schema


def onboard(
    conf_dir: Path,
    topic: str,
    *,
    channel: str | None = None,
    overrides: Sequence[tuple[str, Any]] = (),
    secrets: SecretResolver | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``conf_dir/objects/<name>.yml`` for the object of ``topic`` and return its path.

    The schema is fetched from the source ``conf_dir/pipeline.yml`` (with ``overrides``)
    connects to. ``channel`` puts the object on a channel shared with others instead of its
    own topic. An existing file is kept unless ``overwrite``; a file that makes ``conf_dir``
    invalid is removed again and the problems raised.
    """
    conf = load_conf(conf_dir, overrides=overrides)
    schema = fetch_schema(conf.pipeline.connection, topic, secrets=secrets)
    if schema.entity_name in {o.api_name for o in conf.objects} and not overwrite:
        existing = conf.object_files.get(schema.entity_name, conf_dir / "objects")
        raise ConfigError(
            f"{schema.entity_name} is already configured in {existing}; pass overwrite=True "
            "to replace that file"
        )
    path = conf.object_files.get(schema.entity_name) or (
        Path(conf_dir) / "objects" / object_file_name(schema)
    )
    if path.exists() and not overwrite:
        raise ConfigError(f"{path} exists; pass overwrite=True to replace it")
    previous = path.read_text(encoding="utf-8") if path.exists() else None
    path.write_text(object_yaml(schema, topic=channel), encoding="utf-8")
    try:
        load_conf(conf_dir, overrides=overrides)
    except ConfigError:
        if previous is None:
            path.unlink()
        else:
            path.write_text(previous, encoding="utf-8")
        raise
    _log.info("onboarded %s from %s into %s", schema.entity_name, topic, path)
    return path
