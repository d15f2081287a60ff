"""Onboarding an object: its ``conf/objects/<name>.yml`` written from its event schema, or
from its describe when it has no change events.

Given an object's API name (``Opportunity``), :func:`propose` asks for its change event topic:
where Change Data Capture is on for it (the topic exists), the file says ``kind: change_events``;
where it is not (GetTopic answers NOT_FOUND: an org selects at most five entities without the
add-on licence), it says ``kind: polled``, written from the object's describe, with the
default poll schedule and, when the object has formula fields, their refresh as a suggestion.

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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ingest.auth import SecretResolver
from ingest.client.schemas import SchemaCache
from ingest.errors import ConfigError, PubSubError
from ingest.schema import HEADER_FIELD, EventSchema
from pipelines.connect import connect, secret_resolver
from pipelines.spec.conf import Conf
from pipelines.spec.connection import ConnectionSpec, EmulatorWorkload
from pipelines.spec.load import load_conf
from pipelines.spec.models import ObjectKind, default_tables, default_topic, parse_topic

__all__ = [
    "fetch_schema",
    "object_file_name",
    "object_yaml",
    "onboard",
    "polled_yaml",
    "propose",
]

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


def polled_yaml(api_name: str, describe: Mapping[str, Any]) -> str:
    """The object file of ``api_name`` read by polls (no change events), from its describe:
    its fields (formula fields apart) in a comment, the default schedule written out."""
    fields = [f for f in describe.get("fields", []) if isinstance(f, Mapping) and "name" in f]
    stored = [
        f"{f['name']}\u00a0({f.get('type', '?')})"
        for f in fields
        if not f.get("calculated") and not f.get("compoundFieldName")
    ]
    formulas = [str(f["name"]) for f in fields if f.get("calculated")]
    tables = default_tables(api_name, default_topic(api_name, "polled"))
    lines = [
        "# yaml-language-server: $schema=../schema/object.schema.json",
        f"# {api_name} has no change events (Change Data Capture is off for it): it is read by",
        "# incremental queries on SystemModstamp, generated from its describe.",
        f"#   bronze {tables.bronze}, silver {tables.silver}, gold {tables.gold}.",
        f"# Fields ({len(stored)}):",
        *(
            f"#   {line}".replace("\u00a0", " ")
            for line in textwrap.wrap(", ".join(stored), width=96, break_on_hyphens=False)
        ),
    ]
    if formulas:
        lines.append(f"# Formula fields, in gold when refreshed: {', '.join(formulas)}")
    lines += [
        f"object: {api_name}",
        "kind: polled",
        "poll: {every: 15m, lookback: 5m}",
    ]
    if formulas:
        lines.append("formulas: {refresh_every: 24h}")
    return "\n".join(lines) + "\n"


def propose(conf: Conf, api_name: str, *, secrets: SecretResolver | None = None) -> tuple[str, str]:
    """The object file for ``api_name`` (its name and YAML): ``kind: change_events`` when its
    change event topic exists, ``kind: polled`` from its describe when it does not, and
    ``kind: platform_event`` for a platform event (``__e``)."""
    event = api_name.endswith("__e")
    topic = default_topic(api_name, "platform_event" if event else "change_events")
    try:
        schema = fetch_schema(conf.pipeline.connection, topic, secrets=secrets)
    except PubSubError as exc:
        if event or exc.status != "NOT_FOUND":
            raise
        _log.info("%s has no change event topic (%s): proposing kind polled", api_name, topic)
    else:
        return object_file_name(schema), object_yaml(schema)
    from pipelines.commands.bootstrap import open_rest

    resolver = secrets if secrets is not None else secret_resolver()
    with open_rest(conf, secrets=resolver) as (_source, rest):
        describe = rest.describe(api_name)
    name = default_tables(api_name, default_topic(api_name, "polled")).gold
    return f"{name}.yml", polled_yaml(api_name, describe)


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

    ``topic`` is a topic (``/data/InvoiceChangeEvent``), or an object's API name
    (``Opportunity``), which :func:`propose` turns into ``kind: change_events`` or ``kind:
    polled`` as the org has change events for it or not. The schema (or describe) comes from
    the source ``conf_dir/pipeline.yml`` (with ``overrides``) connects to. ``channel`` puts the
    object on a channel shared with others instead of its
    own topic. An existing file is kept unless ``overwrite``; a file that makes ``conf_dir``
    invalid is removed again and the problems raised.
    """
    conf = load_conf(conf_dir, overrides=overrides)
    if topic.startswith("/"):
        schema = fetch_schema(conf.pipeline.connection, topic, secrets=secrets)
        entity, file_name = schema.entity_name, object_file_name(schema)
        text = object_yaml(schema, topic=channel)
    else:
        # An object's API name: change events where its topic exists, polls elsewhere.
        entity = topic
        file_name, text = propose(conf, topic, secrets=secrets)
    if entity in {o.api_name for o in conf.objects} and not overwrite:
        existing = conf.object_files.get(entity, conf_dir / "objects")
        raise ConfigError(
            f"{entity} is already configured in {existing}; pass overwrite=True to replace "
            "that file"
        )
    path = conf.object_files.get(entity) or (Path(conf_dir) / "objects" / file_name)
    if path.exists() and not overwrite:
        raise ConfigError(f"{path} exists; pass overwrite=True to replace it")
    previous = path.read_text(encoding="utf-8") if path.exists() else None
    path.write_text(text, encoding="utf-8")
    try:
        load_conf(conf_dir, overrides=overrides)
    except ConfigError:
        if previous is None:
            path.unlink()
        else:
            path.write_text(previous, encoding="utf-8")
        raise
    _log.info("onboarded %s from %s into %s", entity, topic, path)
    return path
