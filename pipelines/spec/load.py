"""Reading ``conf/``: ``conf/pipeline.yml`` and ``conf/objects/<name>.yml`` into the models of
:mod:`pipelines.spec.models`, :mod:`pipelines.spec.cometd` and :class:`~pipelines.spec.conf.Conf`
(re-exported, with these functions, by :mod:`pipelines.spec`).

This is the only module that parses YAML. The loader refuses aliases and duplicate keys;
``--set`` overrides (:func:`parse_override`) replace keys of ``pipeline.yml`` before it is
validated; the checks across fields and files (topics, shared subscriptions, physical table
names) run here, after each file has been parsed into its model. Every problem in every file
is reported at once, in one :class:`~ingest.errors.ConfigError`.
"""

from __future__ import annotations

import copy
import difflib
import re
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from ingest.errors import ConfigError
from pipelines.spec.cometd import CometdGoldSpec, CometdObjectSpec, check_streams
from pipelines.spec.conf import Conf
from pipelines.spec.fields import (
    INVALID,
    Problems,
    join,
    parse_model,
    resolve_paths,
    show,
    yaml_fields,
)
from pipelines.spec.models import (
    _IDENTIFIER_MAX,
    _LAYERS,
    LakeSpec,
    ObjectSpec,
    PipelineSpec,
    default_topic,
    parse_topic,
)
from pipelines.spec.sections import DefaultsSpec

__all__ = [
    "load_conf",
    "load_object",
    "load_pipeline",
    "parse_override",
    "pipeline_from_overrides",
]


# ---------------------------------------------------------------------------- YAML reading


class _AliasRefused(yaml.MarkedYAMLError):
    """An alias (``*name``) in a configuration file or a ``--set`` value."""


# Aliases are refused outright rather than counted: nine lines of nested aliases ("billion
# laughs") expand to 9**9 values, and every later walk of the data (duplicate keys, validation,
# messages) would pay for each. The files do not need them: what objects share goes under
# `defaults` in pipeline.yml.
_ALIAS_FIX = (
    "aliases are not supported in configuration files (they can expand a small file into "
    "billions of values); write the value out, or put what objects share under defaults in "
    "pipeline.yml"
)


class _Loader(yaml.SafeLoader):
    """Safe loader that refuses aliases while composing (before anything is expanded);
    duplicate keys are found on the node tree before construction."""

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise _AliasRefused(
                problem=f"YAML alias *{event.anchor}", problem_mark=event.start_mark
            )
        return super().compose_node(parent, index)


def _duplicate_keys(node: yaml.Node, path: str, found: list[tuple[str, str]]) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, str] = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = key_node.value
                mark = key_node.start_mark
                where = f"line {mark.line + 1}, column {mark.column + 1}"
                sub = join(path, str(key))
                if key in seen:
                    found.append(
                        (
                            sub,
                            f"duplicate key (first at {seen[key]}, again at {where}); "
                            "YAML would silently keep the last one",
                        )
                    )
                else:
                    seen[key] = where
                _duplicate_keys(value_node, sub, found)
            else:
                _duplicate_keys(value_node, path, found)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _duplicate_keys(item, f"{path}[{i}]", found)


_EMPTY = object()


def _read_yaml(path: Path, ctx: Problems) -> Any:
    """The document in ``path``; problems (syntax, duplicates) go to ``ctx``. Returns
    ``_EMPTY`` for a file without content and ``INVALID`` when it cannot be used."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        ctx.add("", f"cannot be read ({exc.strerror or exc})")
        return INVALID
    except UnicodeDecodeError as exc:
        ctx.add("", f"is not UTF-8 text ({exc.reason} at byte {exc.start})")
        return INVALID
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return _EMPTY
        duplicates: list[tuple[str, str]] = []
        _duplicate_keys(node, "", duplicates)
        for key_path, message in duplicates:
            ctx.add(key_path, message)
        data = loader.construct_document(node)
    except _AliasRefused as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        ctx.add("", f"{where}{exc.problem}: {_ALIAS_FIX}")
        return INVALID
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        what = " ".join(p for p in (exc.context, exc.problem) if p)
        ctx.add("", f"{where}invalid YAML: {what}")
        return INVALID
    except yaml.YAMLError as exc:
        ctx.add("", f"invalid YAML: {exc}")
        return INVALID
    finally:
        loader.dispose()
    return data


# ------------------------------------------------------------------- cross-field checks


def _check_polled(obj: ObjectSpec, data: Mapping[str, Any], ctx: Problems) -> None:
    """Keys that name a subscription mean nothing for an object read by queries, and ``poll``
    means nothing for one that is not."""
    if obj.kind != "polled":
        if "poll" in data:
            ctx.add("poll", f"applies to kind polled only (this object is {obj.kind})")
        if obj.kind == "platform_event" and "formulas" in data:
            ctx.add("formulas", "a platform event has no formula fields (it has no records)")
        return
    if obj.api_name.endswith("__e"):
        ctx.add(
            "kind",
            f"{obj.api_name} is a platform event (__e); its kind is platform_event (got 'polled')",
        )
    for key in ("topic", "managed_subscription", "num_requested"):
        if key in data:
            ctx.add(
                key,
                "a polled object has no subscription: it is read by queries on SystemModstamp "
                f"(leave {key} out, or use kind change_events where Change Data Capture is on)",
            )


def _check_object(obj: ObjectSpec, lake: LakeSpec, ctx: Problems) -> None:
    name, kind = obj.api_name, obj.kind
    if kind == "polled":
        _check_tables(obj, lake, ctx)
        return
    if kind == "platform_event" and name.endswith("__c"):
        ctx.add(
            "kind", f"{name} is a custom object (__c); its kind is change_events (got {kind!r})"
        )
    if kind == "change_events" and name.endswith("__e"):
        ctx.add(
            "kind", f"{name} is a platform event (__e); its kind is platform_event (got {kind!r})"
        )
    try:
        info = parse_topic(obj.topic)
    except ValueError as exc:
        ctx.add("topic", str(exc))
        return
    expects = ("change_events", "change_event_channel")
    if kind == "platform_event":
        expects = ("platform_event", "platform_event_channel")
    if info.kind not in expects:
        ctx.add(
            "topic",
            f"a {kind} object needs a "
            + ("/data/... topic" if kind == "change_events" else "/event/... topic")
            + f" (got {obj.topic!r}, a {info.kind.replace('_', ' ')} topic)",
        )
    elif info.entity is not None and info.entity != name:
        ctx.add(
            "topic",
            f"{obj.topic!r} carries {info.entity}, not {name}; use "
            f"{default_topic(name, kind)!r} or a channel shared by several objects",
        )
    _check_tables(obj, lake, ctx)


def _check_tables(obj: ObjectSpec, lake: LakeSpec, ctx: Problems) -> None:
    for layer in _LAYERS:
        physical = lake.table_name(obj.tables.for_layer(layer))
        if len(physical) > _IDENTIFIER_MAX:
            ctx.add(
                f"tables.{layer}",
                f"with lake.table_prefix the name must be at most {_IDENTIFIER_MAX} characters "
                f"(got {len(physical)})",
            )


def _check_objects(objs: list[tuple[ObjectSpec, Problems]], lake: LakeSpec) -> None:
    by_name: dict[str, Problems] = {}
    for obj, ctx in objs:
        if obj.api_name in by_name:
            ctx.add(
                "object", f"{obj.api_name} is already configured in {by_name[obj.api_name].file}"
            )
        else:
            by_name[obj.api_name] = ctx

    # One subscription and one bronze table per topic: the objects on it must agree.
    first_on_topic: dict[str, tuple[ObjectSpec, Problems]] = {}
    for obj, ctx in objs:
        if obj.topic not in first_on_topic:
            first_on_topic[obj.topic] = (obj, ctx)
            continue
        other, other_ctx = first_on_topic[obj.topic]
        for key in ("tables.bronze", "replay", "batching", "managed_subscription", "num_requested"):
            mine = obj.tables.bronze if key == "tables.bronze" else getattr(obj, key)
            theirs = other.tables.bronze if key == "tables.bronze" else getattr(other, key)
            if mine != theirs:
                ctx.add(
                    key,
                    f"objects sharing topic {obj.topic} share one subscription and bronze table, "
                    f"so {key} must equal that of {other.api_name} ({other_ctx.file})",
                )

    # A managed subscription belongs to one topic: two topics cannot take turns on it.
    managed_by: dict[str, tuple[str, str]] = {}
    for obj, ctx in objs:
        name = obj.managed_subscription
        if name is None:
            continue
        topic, file = managed_by.setdefault(name, (obj.topic, ctx.file))
        if topic != obj.topic:
            ctx.add(
                "managed_subscription",
                f"{name} already serves topic {topic} ({file}); a managed subscription "
                f"follows one topic, so {obj.topic} needs its own",
            )

    # Physical names: (schema, table) must be unique, across layers when schemas coincide.
    owners: dict[tuple[str, str], tuple[str, str, str]] = {}
    for obj, ctx in objs:
        for layer in _LAYERS:
            schema = lake.schemas.for_layer(layer)
            table = lake.table_name(obj.tables.for_layer(layer))
            owner = f"topic {obj.topic}" if layer == "bronze" else obj.api_name
            previous = owners.setdefault((schema, table), (layer, owner, ctx.file))
            if previous == (layer, owner, ctx.file) or previous[:2] == ("bronze", owner):
                continue
            if previous[0] == layer == "bronze":
                message = (
                    f"table {schema}.{table} already lands {previous[1]} ({previous[2]}); "
                    "each topic needs its own bronze table"
                )
            else:
                message = (
                    f"table {schema}.{table} is already the {previous[0]} table of "
                    f"{previous[1]} ({previous[2]}); give one of them another name"
                )
            ctx.add(f"tables.{layer}", message)


# ------------------------------------------------------------------------------- loading


def _display(path: Path, conf_dir: Path) -> str:
    try:
        return str(Path(conf_dir.name) / path.relative_to(conf_dir))
    except ValueError:
        return str(path)


def parse_override(text: str) -> tuple[str, Any]:
    """``lake.catalog=main`` as ``("lake.catalog", "main")``: a ``pipeline.yml`` key path and a
    value read as YAML (``50`` is a number, ``null`` is null, ``'{env: NAME}'`` a mapping).

    Jobs pass what differs between deployments (catalog, schemas, engine, source) this way,
    so ``conf/`` stays the same in every environment."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not sep or not key or not all(_OVERRIDE_KEY_RE.fullmatch(p) for p in parts):
        shown = key if sep else text
        raise ConfigError(
            f"--set expects KEY=VALUE with a dotted pipeline.yml key such as "
            f"lake.catalog=main (got {shown!r}{'' if sep else ' without ='})"
        )
    loader = _Loader(raw)
    try:
        value = loader.get_single_data() if raw.strip() else ""
    except _AliasRefused:
        raise ConfigError(f"--set {key}: YAML aliases are not supported in values") from None
    except yaml.YAMLError:
        # The value is not echoed: it may be meant for a secret key.
        raise ConfigError(f"--set {key}: the value is not valid YAML") from None
    finally:
        loader.dispose()
    return key, value


_OVERRIDE_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _apply_overrides(data: Any, overrides: Sequence[tuple[str, Any]], ctx: Problems) -> Any:
    if not overrides:
        return data
    if not isinstance(data, dict):
        # The file itself is not a mapping; parse_model reports that.
        return data
    merged = copy.deepcopy(data)
    for key, value in overrides:
        node = merged
        parts = key.split(".")
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(parts[: depth + 1])
                ctx.add(key, f"--set cannot set a key inside {where}, which is not a mapping")
                break
            node = child
        else:
            node[parts[-1]] = value
    return merged


def _load_pipeline(
    path: Path, ctx: Problems, overrides: Sequence[tuple[str, Any]] = ()
) -> PipelineSpec | None:
    data = _read_yaml(path, ctx)
    if data is INVALID:
        return None
    data = _apply_overrides({} if data is _EMPTY else data, overrides, ctx)
    spec = parse_model(PipelineSpec, data, "", ctx)
    if spec is INVALID:
        return None
    return spec  # type: ignore[no-any-return]


def object_kinds() -> tuple[str, ...]:
    """Every value an object file's ``kind`` may take, from the models that read the files
    (:class:`ObjectSpec`'s kinds, then ``streaming_api``)."""
    kinds: list[str] = []
    for model in (ObjectSpec, CometdObjectSpec):
        for key, _field, tp in yaml_fields(model):
            if key == "kind":
                kinds.extend(str(k) for k in typing.get_args(tp))
    return tuple(kinds)


def _load_object(
    path: Path, defaults: DefaultsSpec, lake: LakeSpec, ctx: Problems
) -> ObjectSpec | CometdObjectSpec | None:
    data = _read_yaml(path, ctx)
    if data is INVALID:
        return None
    if data is _EMPTY:
        ctx.add("", "is empty; an object file needs at least 'object' and 'kind'")
        return None
    kind = data.get("kind") if isinstance(data, dict) else None
    kinds = object_kinds()
    if kind is not None and kind not in kinds:
        # Which model reads the rest depends on the kind: say only this.
        close = difflib.get_close_matches(kind, kinds, n=1) if isinstance(kind, str) else []
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        listed = ", ".join(repr(k) for k in kinds)
        shown = repr(kind) if isinstance(kind, str) else show(kind)
        ctx.add("kind", f"must be one of {listed} (got {shown}){hint}")
        return None
    if kind == "streaming_api":
        return _load_stream(data, defaults, ctx)
    # Sections the file leaves out, and keys a section leaves out, come from the defaults.
    inherited = {
        "replay": defaults.replay,
        "batching": defaults.batching,
        "silver": defaults.silver,
        "gold": defaults.gold,
        "health": defaults.health,
    }
    spec = parse_model(ObjectSpec, data, "", ctx, inherited)
    if spec is INVALID:
        return None
    _check_polled(spec, data, ctx)
    _check_object(spec, lake, ctx)
    return spec  # type: ignore[no-any-return]


def _load_stream(data: Any, defaults: DefaultsSpec, ctx: Problems) -> CometdObjectSpec | None:
    inherited = {
        "replay": defaults.replay,
        "batching": defaults.batching,
        "silver": defaults.silver,
        # The order of a channel's changes is the channel's own (see CometdGoldSpec).
        "gold": CometdGoldSpec(
            deletes=defaults.gold.deletes,
            scd2=defaults.gold.scd2,
            max_rows_per_commit=defaults.gold.max_rows_per_commit,
        ),
    }
    spec = parse_model(CometdObjectSpec, data, "", ctx, inherited)
    return None if spec is INVALID else spec


def load_pipeline(path: Path) -> PipelineSpec:
    """Read one ``pipeline.yml`` (relative paths resolved against its directory's parent)."""
    ctx = Problems(str(path))
    spec = _load_pipeline(path, ctx)
    if ctx.problems or spec is None:
        raise ConfigError(f"{path} is invalid", ctx.problems)
    resolved: PipelineSpec = resolve_paths(spec, path.resolve().parent.parent)
    return resolved


def pipeline_from_overrides(
    overrides: Sequence[tuple[str, Any]], *, base: Path, shown: str
) -> PipelineSpec:
    """A ``pipeline.yml`` made only of ``overrides`` (key path, value) pairs, as
    :func:`parse_override` reads them, over the defaults; relative paths are resolved against
    ``base``. ``shown`` names where the keys came from in messages. For callers that receive
    the settings as flat key/value options instead of a file (the Spark data source)."""
    ctx = Problems(shown)
    data = _apply_overrides({}, overrides, ctx)
    spec = parse_model(PipelineSpec, data, "", ctx)
    if ctx.problems or spec is INVALID:
        raise ConfigError(f"{shown} are invalid", ctx.problems)
    resolved: PipelineSpec = resolve_paths(spec, base)
    return resolved


def load_object(
    path: Path, *, defaults: DefaultsSpec | None = None, lake: LakeSpec | None = None
) -> ObjectSpec:
    """Read one object file, applying ``defaults`` (the built-in ones when omitted)."""
    ctx = Problems(str(path))
    spec = _load_object(path, defaults or DefaultsSpec(), lake or LakeSpec(), ctx)
    if ctx.problems or spec is None:
        raise ConfigError(f"{path} is invalid", ctx.problems)
    if not isinstance(spec, ObjectSpec):
        raise ConfigError(
            f"{path} is a Streaming API object file (kind: streaming_api); load it with the "
            "rest of its conf/ directory (load_conf), which keeps it in Conf.streams"
        )
    return spec


def _object_files(objects_dir: Path) -> list[Path]:
    files = [p for p in objects_dir.iterdir() if p.suffix in (".yml", ".yaml") and p.is_file()]
    return sorted(p for p in files if not p.name.startswith((".", "_")))


def load_conf(conf_dir: Path, *, overrides: Sequence[tuple[str, Any]] = ()) -> Conf:
    """Load ``conf_dir/pipeline.yml`` and every ``conf_dir/objects/*.yml``.

    Defaults are applied and derived names filled in; relative paths (lake location, CA
    files, emulator state) are resolved against ``conf_dir``'s parent. ``overrides`` (key
    path, value) pairs from :func:`parse_override` replace keys of ``pipeline.yml`` before it
    is validated, so they are checked like the file's own keys. Raises one
    :class:`ConfigError` listing every problem in every file.
    """
    conf_dir = Path(conf_dir)
    problems: list[str] = []
    pipeline_path = conf_dir / "pipeline.yml"
    if not conf_dir.is_dir():
        raise ConfigError(f"configuration directory {conf_dir} does not exist")
    if not pipeline_path.is_file():
        raise ConfigError(
            f"{pipeline_path} is missing: every deployment needs a pipeline.yml "
            "(connection, lake, defaults, ingest)"
        )
    shown = _display(pipeline_path, conf_dir)
    if overrides:
        shown += f" (with --set {', '.join(key for key, _ in overrides)})"
    pipe_ctx = Problems(shown)
    pipeline = _load_pipeline(pipeline_path, pipe_ctx, overrides)
    if pipeline is not None:
        pipeline = resolve_paths(pipeline, conf_dir.resolve().parent)
    problems.extend(pipe_ctx.problems)
    defaults = pipeline.defaults if pipeline else DefaultsSpec()
    lake = pipeline.lake if pipeline else LakeSpec()

    objects_dir = conf_dir / "objects"
    files = _object_files(objects_dir) if objects_dir.is_dir() else []
    if not files:
        problems.append(
            f"{_display(objects_dir, conf_dir)}: no object files (*.yml); add one per "
            "Salesforce object or platform event"
        )
    loaded: list[tuple[ObjectSpec, Problems]] = []
    streams: list[tuple[CometdObjectSpec, Problems]] = []
    contexts: list[Problems] = []
    object_files: dict[str, Path] = {}
    for path in files:
        ctx = Problems(_display(path, conf_dir))
        contexts.append(ctx)
        obj = _load_object(path, defaults, lake, ctx)
        if isinstance(obj, ObjectSpec):
            loaded.append((obj, ctx))
            object_files.setdefault(obj.api_name, path)
        elif obj is not None:
            streams.append((obj, ctx))
            object_files.setdefault(obj.key, path)
    _check_objects(loaded, lake)
    if streams:
        check_streams(streams, loaded, lake)
    for ctx in contexts:
        problems.extend(ctx.problems)
    if problems or pipeline is None:
        count = len(problems)
        raise ConfigError(
            f"{conf_dir}: {count} configuration problem{'s' if count != 1 else ''}", problems
        )
    objects = tuple(sorted((obj for obj, _ in loaded), key=lambda o: o.api_name))
    channels = tuple(sorted((spec for spec, _ in streams), key=lambda s: s.channel))
    return Conf(
        pipeline=pipeline,
        objects=objects,
        conf_dir=conf_dir,
        object_files=object_files,
        streams=channels,
    )
