"""Typed, strict validation of plain data (parsed YAML) into frozen dataclass models.

The models of :mod:`pipelines.spec` carry their YAML documentation and constraints in field
metadata (built with :func:`meta`); :func:`parse_model` walks a model's type hints, checks a
mapping against them and builds the model, reporting every problem with its key path to a
:class:`Problems` collector instead of stopping at the first. :mod:`pipelines.spec.schema`
walks the same metadata to publish the JSON Schema, so the two cannot drift apart.

Supported field types: nested models, ``Literal`` options, ``bool``/``int``/``float``/``str``,
``X | None``, secret references (:data:`ingest.auth.SecretRef`: the
:class:`~ingest.auth.EnvRef` and :class:`~ingest.auth.ScopeRef` that connecting resolves),
strings-or-references (:data:`Credential`), sizes (``Annotated[int, ByteSize]``), durations
(``Annotated[float, Duration]``: seconds, or ``"15m"``, ``"24h"``), lists of
strings (``tuple[str, ...]``: non-empty, no duplicates), a list of strings or one of some
words (``tuple[str, ...] | Literal["all"]``) and unions of models told apart by their
``type`` key. A model may define ``_problems(self) -> list[tuple[str, str]]`` for rules
spanning several of its keys.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from ingest.auth import EnvRef, ScopeRef, SecretRef

__all__ = [
    "DURATION_PATTERN",
    "ENV_PATTERN",
    "INVALID",
    "SCOPE_PATTERN",
    "SIZE_PATTERN",
    "ByteSize",
    "Credential",
    "Duration",
    "EnvRef",
    "Problems",
    "ScopeRef",
    "SecretRef",
    "discriminated",
    "has_scheme",
    "iter_models",
    "join",
    "meta",
    "optional_inner",
    "parse_byte_size",
    "parse_duration",
    "parse_model",
    "parse_value",
    "resolve_paths",
    "secret_ref_schema",
    "show",
    "type_kind",
    "yaml_fields",
]

ENV_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
SCOPE_PATTERN = r"^[A-Za-z0-9_.@-]{1,128}$"


def meta(
    doc: str,
    *,
    key: str | None = None,
    pattern: str | None = None,
    hint: str | None = None,
    max_length: int | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: float | None = None,
    derived: str | None = None,
    inherits: str | None = None,
    path: bool = False,
) -> dict[str, Any]:
    """Field metadata: ``doc`` (the key's documentation, required), ``key`` (the YAML key when
    it differs from the attribute name), constraints, ``derived`` (how the value is computed
    when the key is left out), ``inherits`` (the key path its defaults come from) and
    ``path`` (resolved against the configuration's base directory)."""
    return {
        "doc": doc,
        "key": key,
        "pattern": pattern,
        "hint": hint,
        "max_length": max_length,
        "minimum": minimum,
        "maximum": maximum,
        "exclusive_minimum": exclusive_minimum,
        "derived": derived,
        "inherits": inherits,
        "path": path,
    }


class ByteSize:
    """Marker for sizes given as a byte count or a string such as ``"64MiB"`` or ``"512 kB"``."""


_SIZE_UNITS = {
    "": 1,
    "B": 1,
    "kB": 1000,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")
SIZE_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*(B|kB|KB|MB|GB|KiB|MiB|GiB)?\s*$"


def parse_byte_size(value: int | str) -> int:
    """``67108864``, ``"64MiB"``, ``"64 MB"`` to a byte count (kB/MB/GB are powers of 1000,
    KiB/MiB/GiB powers of 1024). Raises ``ValueError`` naming the accepted forms."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"must be a byte count or a size such as '64MiB' (got {show(value)})")
    if isinstance(value, int):
        return value
    match = _SIZE_RE.fullmatch(value)
    if not match or match.group(2) not in _SIZE_UNITS:
        raise ValueError(
            "must be a byte count or a size such as '64MiB', '512kB' or '1GB' "
            f"(units {', '.join(u for u in _SIZE_UNITS if u)}; got {value!r})"
        )
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])


class Duration:
    """Marker for durations in seconds, given as a number of seconds or a string such as
    ``"15m"``, ``"90s"``, ``"24h"`` or ``"7d"``."""


_DURATION_UNITS = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)\s*$")
DURATION_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*(ms|s|m|h|d)?\s*$"


def parse_duration(value: int | float | str) -> float:
    """``900``, ``"15m"``, ``"90s"``, ``"24h"``, ``"7d"`` to seconds. Raises ``ValueError``
    naming the accepted forms."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"must be seconds or a duration such as '15m' (got {show(value)})")
    if not isinstance(value, str):
        return float(value)
    match = _DURATION_RE.fullmatch(value)
    if not match or match.group(2) not in _DURATION_UNITS:
        raise ValueError(
            "must be seconds or a duration such as '90s', '15m', '24h' or '7d' "
            f"(units {', '.join(u for u in _DURATION_UNITS if u)}; got {value!r})"
        )
    return float(match.group(1)) * _DURATION_UNITS[match.group(2)]


# --------------------------------------------------------------------------------- secrets

# Secret references are ingest.auth's own types, so the parsed spec is handed to the resolvers
# unchanged. Identifiers such as a client id are not secret, but may come from the same stores.
Credential = str | EnvRef | ScopeRef
_SECRET_MEMBERS = frozenset({EnvRef, ScopeRef})
_ENV_META = meta("Environment variable holding the value.", pattern=ENV_PATTERN)
_SCOPE_FIELDS = {
    "scope": meta("Databricks secret scope.", pattern=SCOPE_PATTERN),
    "key": meta("Key inside the scope.", pattern=SCOPE_PATTERN),
}


# ------------------------------------------------------------------------ model validation


class _Invalid:
    def __repr__(self) -> str:
        return "<invalid>"


INVALID: Any = _Invalid()


@dataclass
class Problems:
    file: str
    problems: list[str] = field(default_factory=list)

    def add(self, path: str, message: str) -> None:
        where = f"{self.file}: {path}: " if path else f"{self.file}: "
        self.problems.append(where + message)


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def show(value: Any) -> str:
    """``'50k', a str`` / ``12, an int``: the received value and its type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()}, a bool"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text}, {_article(type(value).__name__)}"


def _article(noun: str) -> str:
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls, include_extras=True)
    return _HINTS[cls]


def yaml_fields(cls: type) -> list[tuple[str, dataclasses.Field[Any], Any]]:
    """(YAML key, dataclass field, type) of a model, in declaration order."""
    hints = _hints(cls)
    return [
        (f.metadata.get("key") or f.name, f, hints[f.name])
        for f in dataclasses.fields(cls)
        if "doc" in f.metadata
    ]


def _union_args(tp: Any) -> tuple[Any, ...] | None:
    if get_origin(tp) in (Union, types.UnionType):
        return get_args(tp)
    return None


def _is_str_tuple(tp: Any) -> bool:
    return get_origin(tp) is tuple and get_args(tp) == (str, ...)


def type_kind(tp: Any) -> str:
    """How a model type is written in YAML: one of dataclass, auth, secret, credential,
    optional, literal, bytesize, duration, strlist, strlist_or_literal, bool, int, float,
    str."""
    if get_origin(tp) is Annotated:
        markers = get_args(tp)[1:]
        if ByteSize in markers:
            return "bytesize"
        return "duration" if Duration in markers else type_kind(get_args(tp)[0])
    if _is_str_tuple(tp):
        return "strlist"
    args = _union_args(tp)
    if args is not None:
        if len(args) == 2 and _is_str_tuple(args[0]) and get_origin(args[1]) is Literal:
            return "strlist_or_literal"
        members = set(args)
        if members == _SECRET_MEMBERS:
            return "secret"
        if members == {str, *_SECRET_MEMBERS}:
            return "credential"
        if type(None) in members:
            return "optional"
        if all(dataclasses.is_dataclass(a) for a in args):
            return "auth"
        raise TypeError(f"unsupported union in a spec model: {tp}")
    if get_origin(tp) is Literal:
        return "literal"
    if dataclasses.is_dataclass(tp):
        return "dataclass"
    if tp in (bool, int, float, str):
        return tp.__name__  # type: ignore[no-any-return]
    raise TypeError(f"unsupported type in a spec model: {tp}")


def optional_inner(tp: Any) -> Any:
    args = _union_args(tp) or ()
    rest = tuple(a for a in args if a is not type(None))
    return rest[0] if len(rest) == 1 else Union[rest]  # noqa: UP007


def discriminated(tp: Any) -> dict[str, type]:
    """Variants of a ``type``-discriminated union of models, by their ``type`` value."""
    out: dict[str, type] = {}
    for variant in _union_args(tp) or ():
        out[get_args(_hints(variant)["type"])[0]] = variant
    return out


_KIND_NAMES = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string"}


def parse_value(
    tp: Any, value: Any, path: str, ctx: Problems, *, meta: Mapping[str, Any], base: Any = None
) -> Any:
    kind = type_kind(tp)
    if kind == "dataclass":
        return parse_model(tp, {} if value is None else value, path, ctx, _as_base(base))
    if kind == "optional":
        if value is None:
            return None
        return parse_value(optional_inner(tp), value, path, ctx, meta=meta, base=base)
    if kind == "auth":
        return _parse_auth(tp, value, path, ctx)
    if kind == "secret":
        return _parse_secret(value, path, ctx)
    if kind == "credential":
        if isinstance(value, str) and value:
            return value
        if isinstance(value, dict):
            return _parse_secret(value, path, ctx)
        ctx.add(path, f"must be a string or a secret reference (got {show(value)})")
        return INVALID
    if kind == "literal":
        options = get_args(tp)
        if isinstance(value, str) and value in options:
            return value
        listed = ", ".join(repr(o) for o in options)
        shown = repr(value) if isinstance(value, str) else show(value)
        ctx.add(path, f"must be one of {listed} (got {shown})")
        return INVALID
    if kind == "strlist":
        return _parse_strings(value, path, ctx, meta)
    if kind == "strlist_or_literal":
        words = get_args(get_args(tp)[1])
        if isinstance(value, str):
            if value in words:
                return value
            listed = ", ".join(repr(w) for w in words)
            ctx.add(path, f"must be a list of strings or one of {listed} (got {value!r})")
            return INVALID
        return _parse_strings(value, path, ctx, meta)
    if kind == "bytesize":
        try:
            parsed: Any = parse_byte_size(value)
        except ValueError as exc:
            ctx.add(path, str(exc))
            return INVALID
        return _check_bounds(parsed, path, ctx, meta)
    if kind == "duration":
        try:
            seconds: Any = parse_duration(value)
        except ValueError as exc:
            ctx.add(path, str(exc))
            return INVALID
        return _check_bounds(seconds, path, ctx, meta)
    if kind == "bool":
        if isinstance(value, bool):
            return value
    elif kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return _check_bounds(value, path, ctx, meta)
    elif kind == "float":
        if isinstance(value, int | float) and not isinstance(value, bool):
            return _check_bounds(float(value), path, ctx, meta)
    elif kind == "str" and isinstance(value, str):
        return _check_string(value, path, ctx, meta)
    ctx.add(path, f"must be {_KIND_NAMES[kind]} (got {show(value)})")
    return INVALID


def _parse_strings(value: Any, path: str, ctx: Problems, meta: Mapping[str, Any]) -> Any:
    if not isinstance(value, list) or not value:
        ctx.add(path, f"must be a non-empty list of strings (got {show(value)})")
        return INVALID
    out: list[str] = []
    ok = True
    for i, item in enumerate(value):
        sub = f"{path}[{i}]"
        if not isinstance(item, str) or not item:
            ctx.add(sub, f"must be a non-empty string (got {show(item)})")
            ok = False
        elif item in out:
            ctx.add(sub, f"{item!r} is listed twice")
            ok = False
        elif _check_string(item, sub, ctx, meta) is INVALID:
            ok = False
        else:
            out.append(item)
    return tuple(out) if ok else INVALID


def _number(value: float) -> str:
    # Whole numbers in full (byte sizes run to billions); fractions as they were written.
    if float(value).is_integer() and abs(value) < 1e18:
        return str(int(value))
    return f"{value:g}"


def _check_bounds(value: float, path: str, ctx: Problems, meta: Mapping[str, Any]) -> Any:
    low, high, above = meta.get("minimum"), meta.get("maximum"), meta.get("exclusive_minimum")
    if low is not None and value < low:
        ctx.add(path, f"must be at least {_number(low)} (got {_number(value)})")
        return INVALID
    if high is not None and value > high:
        ctx.add(path, f"must be at most {_number(high)} (got {_number(value)})")
        return INVALID
    if above is not None and value <= above:
        ctx.add(path, f"must be greater than {_number(above)} (got {_number(value)})")
        return INVALID
    return value


def _check_string(value: str, path: str, ctx: Problems, meta: Mapping[str, Any]) -> Any:
    pattern, limit = meta.get("pattern"), meta.get("max_length")
    # Patterns are written for JSON Schema (ECMA-262), where `$` ends the string; Python's `$`
    # also matches before a final newline, so "account\n" would pass re.match.
    if pattern and re.fullmatch(pattern, value) is None:
        hint = meta.get("hint") or f"a string matching {pattern}"
        ctx.add(path, f"must be {hint} (got {value!r})")
        return INVALID
    if limit is not None and len(value) > limit:
        ctx.add(path, f"must be at most {limit} characters (got {len(value)})")
        return INVALID
    return value


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")


def has_scheme(location: str) -> bool:
    """Whether ``location`` is a URI (``s3://b/p``, ``dbfs:/p``, ``file:/p``) rather than a
    path; a Windows drive letter (``C:``) is a path."""
    return _SCHEME.match(location) is not None


def resolve_paths(instance: Any, base_dir: Path) -> Any:
    """``instance`` with every relative ``path`` field (at any depth) made absolute against
    ``base_dir``; URIs (``s3://...``, ``dbfs:/...``) and absolute paths are kept."""
    if not dataclasses.is_dataclass(instance) or isinstance(instance, type):
        return instance
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        if f.metadata.get("path") and isinstance(value, str):
            if not has_scheme(value) and not Path(value).expanduser().is_absolute():
                changes[f.name] = str((base_dir / Path(value).expanduser()).resolve())
            elif value.startswith("~"):
                changes[f.name] = str(Path(value).expanduser())
        elif dataclasses.is_dataclass(value):
            resolved = resolve_paths(value, base_dir)
            if resolved is not value:
                changes[f.name] = resolved
    return dataclasses.replace(instance, **changes) if changes else instance


def _suggest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _as_base(instance: Any) -> Mapping[str, Any] | None:
    if instance is None or not dataclasses.is_dataclass(instance):
        return None
    return {f.name: getattr(instance, f.name) for f in dataclasses.fields(instance)}


def parse_model(
    cls: type, value: Any, path: str, ctx: Problems, base: Mapping[str, Any] | None = None
) -> Any:
    """Parse a mapping into ``cls``. Keys missing from ``value`` take their value from
    ``base`` (inherited settings) when it has them, else the field default."""
    if not isinstance(value, dict):
        ctx.add(path, f"must be a mapping of keys to values (got {show(value)})")
        return INVALID
    spec = yaml_fields(cls)
    valid = [key for key, _, _ in spec]
    for key in value:
        if key not in valid:
            listed = ", ".join(repr(k) for k in sorted(valid))
            ctx.add(
                join(path, str(key)),
                f"unknown key; valid keys are {listed}{_suggest(str(key), valid)}",
            )
    kwargs: dict[str, Any] = {}
    ok = True
    for key, f, tp in spec:
        sub = join(path, key)
        inherited = base.get(f.name) if base is not None else None
        if key in value:
            parsed = parse_value(tp, value[key], sub, ctx, meta=f.metadata, base=inherited)
        elif base is not None and f.name in base:
            parsed = inherited
        elif f.default is not dataclasses.MISSING:
            parsed = f.default
        elif f.default_factory is not dataclasses.MISSING:
            parsed = f.default_factory()
        else:
            ctx.add(sub, f"required key is missing ({f.metadata['doc']})")
            ok = False
            continue
        if parsed is INVALID:
            ok = False
        kwargs[f.name] = parsed
    if not ok:
        return INVALID
    instance = cls(**kwargs)
    # Rules that span several keys of one section live on the model as `_problems`.
    check = getattr(instance, "_problems", None)
    if check is not None:
        for sub, message in check():
            ctx.add(join(path, sub), message)
    return instance


def _parse_auth(tp: Any, value: Any, path: str, ctx: Problems) -> Any:
    variants = discriminated(tp)
    listed = ", ".join(repr(v) for v in variants)
    if not isinstance(value, dict):
        ctx.add(path, f"must be a mapping with a 'type' key (got {show(value)})")
        return INVALID
    if "type" not in value:
        ctx.add(join(path, "type"), f"required key is missing; one of {listed}")
        return INVALID
    kind = value["type"]
    if not isinstance(kind, str) or kind not in variants:
        shown = repr(kind) if isinstance(kind, str) else show(kind)
        ctx.add(join(path, "type"), f"must be one of {listed} (got {shown})")
        return INVALID
    return parse_model(variants[kind], value, path, ctx)


_SECRET_FORMS = "{env: NAME} or {secret: {scope: ..., key: ...}}"


def _parse_secret(value: Any, path: str, ctx: Problems) -> Any:
    # Never echo the received value: a literal here is most likely the secret itself.
    if not isinstance(value, dict):
        what = "a literal value" if value is not None else "null"
        ctx.add(
            path,
            f"must be a secret reference, {_SECRET_FORMS} (got {what}, "
            f"{_article(type(value).__name__)}); secret values never go in YAML",
        )
        return INVALID
    keys = set(value)
    if keys == {"env"}:
        name = parse_value(str, value["env"], join(path, "env"), ctx, meta=_ENV_META)
        return INVALID if name is INVALID else EnvRef(name)
    if keys == {"secret"}:
        return _parse_scope(value["secret"], join(path, "secret"), ctx)
    ctx.add(
        path,
        f"must be a secret reference, {_SECRET_FORMS} (got a mapping with keys "
        f"{', '.join(repr(str(k)) for k in sorted(keys, key=str)) or 'none'})",
    )
    return INVALID


def _parse_scope(value: Any, path: str, ctx: Problems) -> Any:
    if not isinstance(value, dict):
        ctx.add(path, f"must be a mapping of keys to values (got {show(value)})")
        return INVALID
    valid = sorted(_SCOPE_FIELDS)
    for key in value:
        if key not in _SCOPE_FIELDS:
            listed = ", ".join(repr(k) for k in valid)
            ctx.add(
                join(path, str(key)),
                f"unknown key; valid keys are {listed}{_suggest(str(key), valid)}",
            )
    parts: dict[str, Any] = {}
    for key, field_meta in _SCOPE_FIELDS.items():
        if key not in value:
            ctx.add(join(path, key), f"required key is missing ({field_meta['doc']})")
            parts[key] = INVALID
        else:
            parts[key] = parse_value(str, value[key], join(path, key), ctx, meta=field_meta)
    if INVALID in parts.values() or set(value) - set(_SCOPE_FIELDS):
        return INVALID
    return ScopeRef(parts["scope"], parts["key"])


def secret_ref_schema() -> dict[str, Any]:
    """The JSON Schema of a secret reference (``{env: NAME}`` or ``{secret: {scope, key}}``)."""
    scope = {
        "type": "object",
        "description": "A key of a Databricks secret scope.",
        "properties": {
            key: {"type": "string", "pattern": m["pattern"], "description": m["doc"]}
            for key, m in _SCOPE_FIELDS.items()
        },
        "required": list(_SCOPE_FIELDS),
        "additionalProperties": False,
    }
    return {
        "description": "A secret reference: never the secret itself.",
        "oneOf": [
            {
                "type": "object",
                "description": "Read from an environment variable when connecting.",
                "properties": {"env": {"type": "string", "pattern": ENV_PATTERN}},
                "required": ["env"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "description": "Read from a Databricks secret scope when connecting.",
                "properties": {"secret": scope},
                "required": ["secret"],
                "additionalProperties": False,
            },
        ],
    }


def iter_models(cls: type) -> Iterator[type]:
    """Every model class reachable from ``cls`` (itself included), each once."""
    seen: list[type] = []

    def visit(tp: Any) -> Iterator[type]:
        kind = type_kind(tp)
        if kind == "dataclass" and tp not in seen:
            seen.append(tp)
            yield tp
            for _key, _f, sub in yaml_fields(tp):
                yield from visit(sub)
        elif kind == "optional":
            yield from visit(optional_inner(tp))
        elif kind == "auth":
            for variant in discriminated(tp).values():
                yield from visit(variant)

    yield from visit(cls)
