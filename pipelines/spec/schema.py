"""The JSON Schema (draft 2020-12) of ``conf/pipeline.yml`` and ``conf/objects/*.yml``, and the
key reference of ``conf/README.md``, both generated from the models in :mod:`pipelines.spec`.

Editors that speak the YAML language server validate and complete the files through the
``# yaml-language-server: $schema=...`` line at their top. Regenerate after changing a model::

    python -m pipelines.spec.schema            # rewrite conf/schema/*.json and the README block
    python -m pipelines.spec.schema --check    # exit 1 when they are stale
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from pipelines.spec.cometd import CometdObjectSpec
from pipelines.spec.fields import (
    DURATION_PATTERN,
    SIZE_PATTERN,
    discriminated,
    iter_models,
    optional_inner,
    secret_ref_schema,
    type_kind,
    yaml_fields,
)
from pipelines.spec.models import ObjectSpec, PipelineSpec

__all__ = [
    "JSON_SCHEMA_DIALECT",
    "README_BEGIN",
    "README_END",
    "SCHEMA_FILES",
    "KeyDoc",
    "json_schema",
    "key_docs",
    "main",
    "render_key_reference",
    "render_schema",
    "update_readme",
    "write_all",
]

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_FILES: Mapping[str, type] = {
    "pipeline.schema.json": PipelineSpec,
    "object.schema.json": ObjectSpec,
    "streaming_api.schema.json": CometdObjectSpec,
}
_TITLES = {
    PipelineSpec: "sfcdc conf/pipeline.yml",
    ObjectSpec: "sfcdc conf/objects/<name>.yml",
    CometdObjectSpec: "sfcdc conf/objects/<name>.yml (kind: streaming_api)",
}
README_BEGIN = "<!-- BEGIN GENERATED KEY REFERENCE: python -m pipelines.spec.schema -->"
README_END = "<!-- END GENERATED KEY REFERENCE -->"

_SECRET_REF_DEF = "SecretRef"


def _describe(f: dataclasses.Field[Any]) -> str:
    text: str = f.metadata["doc"]
    if f.metadata.get("derived"):
        text += f" Derived when left out: {f.metadata['derived']}."
    return text


def _has_default(f: dataclasses.Field[Any]) -> bool:
    return (
        f.default is not dataclasses.MISSING
        or f.default_factory is not dataclasses.MISSING
        or bool(f.metadata.get("derived"))
    )


def _json_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is dataclasses.MISSING or f.metadata.get("derived"):
        return dataclasses.MISSING
    if f.default is None or isinstance(f.default, bool | int | float | str):
        return f.default
    if isinstance(f.default, tuple) and all(isinstance(v, str) for v in f.default):
        return list(f.default)
    return dataclasses.MISSING


def _strings_schema(meta: Mapping[str, Any]) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "string", "minLength": 1}
    if meta.get("pattern") is not None:
        item["pattern"] = meta["pattern"]
    return {"type": "array", "items": item, "minItems": 1, "uniqueItems": True}


def _type_schema(tp: Any, meta: Mapping[str, Any]) -> dict[str, Any]:
    kind = type_kind(tp)
    if kind == "dataclass":
        return {"$ref": f"#/$defs/{tp.__name__}"}
    if kind == "optional":
        return {"anyOf": [_type_schema(optional_inner(tp), meta), {"type": "null"}]}
    if kind == "auth":
        return {"oneOf": [{"$ref": f"#/$defs/{v.__name__}"} for v in discriminated(tp).values()]}
    if kind == "secret":
        return {"$ref": f"#/$defs/{_SECRET_REF_DEF}"}
    if kind == "credential":
        return {
            "oneOf": [
                {"type": "string", "minLength": 1},
                {"$ref": f"#/$defs/{_SECRET_REF_DEF}"},
            ]
        }
    if kind == "literal":
        return {"type": "string", "enum": list(get_args(tp))}
    if kind == "strlist":
        return _strings_schema(meta)
    if kind == "strlist_or_literal":
        words = list(get_args(get_args(tp)[1]))
        return {"oneOf": [_strings_schema(meta), {"type": "string", "enum": words}]}
    if kind == "bytesize":
        low, high = meta.get("minimum"), meta.get("maximum")
        number: dict[str, Any] = {"type": "integer"}
        if low is not None:
            number["minimum"] = low
        if high is not None:
            number["maximum"] = high
        return {"oneOf": [number, {"type": "string", "pattern": SIZE_PATTERN}]}
    if kind == "duration":
        seconds: dict[str, Any] = {"type": "number"}
        for key, name in (
            ("minimum", "minimum"),
            ("maximum", "maximum"),
            ("exclusive_minimum", "exclusiveMinimum"),
        ):
            if meta.get(key) is not None:
                seconds[name] = meta[key]
        return {"oneOf": [seconds, {"type": "string", "pattern": DURATION_PATTERN}]}
    out: dict[str, Any] = {
        "bool": {"type": "boolean"},
        "int": {"type": "integer"},
        "float": {"type": "number"},
        "str": {"type": "string"},
    }[kind]
    for key, name in (
        ("minimum", "minimum"),
        ("maximum", "maximum"),
        ("exclusive_minimum", "exclusiveMinimum"),
        ("pattern", "pattern"),
        ("max_length", "maxLength"),
    ):
        if meta.get(key) is not None:
            out[name] = meta[key]
    return out


def _model_schema(
    cls: type, *, discriminator: bool, inherited_from: str | None = None
) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    required: list[str] = []
    for key, f, tp in yaml_fields(cls):
        prop = _type_schema(tp, f.metadata)
        if discriminator and key == "type":
            prop = {"const": get_args(tp)[0]}
        description = _describe(f)
        if inherited_from:
            description += f" Defaults to {inherited_from}.{key}."
        prop = {**prop, "description": description}
        default = _json_default(f)
        is_discriminator = discriminator and key == "type"
        if inherited_from is None and default is not dataclasses.MISSING and not is_discriminator:
            prop["default"] = default
        properties[key] = prop
        if not _has_default(f) or (discriminator and key == "type"):
            required.append(key)
    schema: dict[str, Any] = {
        "type": "object",
        "description": _first_paragraph(cls.__doc__ or cls.__name__),
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = required
    extra = getattr(cls, "_schema_extra", None)
    if extra is not None:
        schema = _deep_merge(schema, extra())
    return schema


def _first_paragraph(doc: str) -> str:
    return doc.strip().split("\n\n")[0].replace("\n", " ").replace("``", "`")


def _deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _union_variants(root: type) -> set[type]:
    found: set[type] = set()
    for model in iter_models(root):
        for _key, _f, tp in yaml_fields(model):
            inner = optional_inner(tp) if type_kind(tp) == "optional" else tp
            if type_kind(inner) == "auth":
                found.update(discriminated(inner).values())
    return found


def json_schema(root: type) -> dict[str, Any]:
    """The JSON Schema of the YAML file whose top-level model is ``root``."""
    variants = _union_variants(root)
    inherited = {
        tp: f.metadata["inherits"]
        for _k, f, tp in yaml_fields(root)
        if f.metadata.get("inherits") and type_kind(tp) == "dataclass"
    }
    defs: dict[str, Any] = {}
    uses_secrets = False
    for model in iter_models(root):
        if model is root:
            continue
        defs[model.__name__] = _model_schema(
            model, discriminator=model in variants, inherited_from=inherited.get(model)
        )
        uses_secrets = uses_secrets or any(
            type_kind(tp) in ("secret", "credential")
            or (type_kind(tp) == "optional" and type_kind(optional_inner(tp)) == "secret")
            for _k, _f, tp in yaml_fields(model)
        )
    if uses_secrets:
        defs[_SECRET_REF_DEF] = secret_ref_schema()
    schema = {
        "$schema": JSON_SCHEMA_DIALECT,
        "title": _TITLES.get(root, root.__name__),
        **_model_schema(root, discriminator=False),
    }
    if defs:
        schema["$defs"] = dict(sorted(defs.items()))
    return schema


def render_schema(root: type) -> str:
    return json.dumps(json_schema(root), indent=2, ensure_ascii=False) + "\n"


# ------------------------------------------------------------------------- key reference


@dataclass(frozen=True)
class KeyDoc:
    """One documented key: its dotted path, how it is written, its default, what it does.

    ``variant`` names the ``type`` value a key belongs to inside a union (auth flows).
    """

    file: str
    path: str
    type: str
    default: str
    doc: str
    variant: str | None = None


def _type_text(tp: Any, meta: Mapping[str, Any]) -> str:
    kind = type_kind(tp)
    if kind == "dataclass":
        return "mapping"
    if kind == "optional":
        return _type_text(optional_inner(tp), meta) + " or null"
    if kind == "auth":
        return "mapping (by `type`)"
    if kind == "secret":
        return "secret reference"
    if kind == "credential":
        return "string or secret reference"
    if kind == "literal":
        return " \\| ".join(f"`{o}`" for o in get_args(tp))
    if kind == "bytesize":
        return "size (bytes or e.g. `64MiB`)"
    if kind == "duration":
        return "duration (seconds or e.g. `15m`, `24h`)"
    if kind == "strlist":
        return "list of strings"
    if kind == "strlist_or_literal":
        words = " \\| ".join(f"`{w}`" for w in get_args(get_args(tp)[1]))
        return f"list of strings \\| {words}"
    text = {"bool": "boolean", "int": "integer", "float": "number", "str": "string"}[kind]
    bounds = []
    if meta.get("minimum") is not None:
        bounds.append(f">= {meta['minimum']:g}")
    if meta.get("exclusive_minimum") is not None:
        bounds.append(f"> {meta['exclusive_minimum']:g}")
    if meta.get("maximum") is not None:
        bounds.append(f"<= {meta['maximum']:g}")
    if meta.get("pattern") == r"^[A-Za-z_][A-Za-z0-9_]*$":
        bounds.append("identifier")
    return text + (f" ({', '.join(bounds)})" if bounds else "")


def _default_text(f: dataclasses.Field[Any]) -> str:
    if f.metadata.get("derived"):
        return "derived"
    if f.default is not dataclasses.MISSING:
        value = f.default
        if value is None:
            return "null"
        if isinstance(value, bool):
            return f"`{str(value).lower()}`"
        if isinstance(value, int) and value >= 1024**2 and value % 1024**2 == 0:
            return f"`{value // 1024**2}MiB`"
        if isinstance(value, tuple):
            return "`[" + ", ".join(str(v) for v in value) + "]`"
        return f"`{value}`" if value != "" else '`""`'
    if f.default_factory is not dataclasses.MISSING:
        return ""
    return "required"


def key_docs(root: type, file: str) -> Iterator[KeyDoc]:
    """Every key path of a file's model tree, in declaration order."""

    def walk(cls: type, prefix: str, variant: str | None, inherits: str | None) -> Iterator[KeyDoc]:
        for key, f, tp in yaml_fields(cls):
            path = f"{prefix}.{key}" if prefix else key
            kind = type_kind(tp)
            inner = optional_inner(tp) if kind == "optional" else tp
            default = f"from `{inherits}.{key}`" if inherits else _default_text(f)
            doc = KeyDoc(file, path, _type_text(tp, f.metadata), default, _describe(f), variant)
            if variant is not None and key == "type":
                continue
            yield doc
            if type_kind(inner) == "dataclass":
                # A section inside an inheriting section inherits key by key too.
                nested = f.metadata.get("inherits") or (f"{inherits}.{key}" if inherits else None)
                yield from walk(inner, path, variant, nested)
            elif type_kind(inner) == "auth":
                options = list(discriminated(inner))
                yield KeyDoc(
                    file,
                    f"{path}.type",
                    " \\| ".join(f"`{o}`" for o in options),
                    "required",
                    "Which flow; each takes the keys listed under its name below.",
                )
                for name, model in discriminated(inner).items():
                    yield from walk(model, path, name, None)

    yield from walk(root, "", None, None)


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def render_key_reference() -> str:
    """The Markdown key reference that ``conf/README.md`` carries between its markers."""
    out: list[str] = []
    for file, root in (
        ("conf/pipeline.yml", PipelineSpec),
        ("conf/objects/<name>.yml", ObjectSpec),
        ("conf/objects/<name>.yml (kind: streaming_api)", CometdObjectSpec),
    ):
        docs = list(key_docs(root, file))
        out.append(f"### `{file}`\n")
        out.append("| key | type | default | meaning |")
        out.append("|---|---|---|---|")
        out.extend(
            f"| `{d.path}` | {d.type} | {d.default} | {_escape(d.doc)} |"
            for d in docs
            if d.variant is None
        )
        out.append("")
        variants = sorted({d.variant for d in docs if d.variant}, key=_variant_order(docs))
        for variant in variants:
            out.append(f"#### `type: {variant}`\n")
            out.append("| key | type | default | meaning |")
            out.append("|---|---|---|---|")
            out.extend(
                f"| `{d.path}` | {d.type} | {d.default} | {_escape(d.doc)} |"
                for d in docs
                if d.variant == variant
            )
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def _variant_order(docs: Sequence[KeyDoc]) -> Any:
    order = list(dict.fromkeys(d.variant for d in docs if d.variant))
    return order.index


def update_readme(text: str) -> str:
    """``text`` (conf/README.md) with its generated block replaced by the current one."""
    try:
        head, rest = text.split(README_BEGIN, 1)
        _old, tail = rest.split(README_END, 1)
    except ValueError:
        raise ValueError(
            f"conf/README.md must contain the markers {README_BEGIN!r} and {README_END!r}"
        ) from None
    return f"{head}{README_BEGIN}\n\n{render_key_reference()}\n{README_END}{tail}"


def write_all(conf_dir: Path, *, check: bool = False) -> list[Path]:
    """Write (or with ``check``, only compare) the schema files and the README block; returns
    the files that were (or would be) changed."""
    expected = {
        conf_dir / "schema" / name: render_schema(root) for name, root in SCHEMA_FILES.items()
    }
    readme = conf_dir / "README.md"
    if readme.is_file():
        expected[readme] = update_readme(readme.read_text(encoding="utf-8"))
    changed = [
        path
        for path, content in expected.items()
        if not path.is_file() or path.read_text(encoding="utf-8") != content
    ]
    if not check:
        for path in changed:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(expected[path], encoding="utf-8")
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.spec.schema",
        description="Regenerate conf/schema/*.json and the key reference in conf/README.md.",
    )
    parser.add_argument("--conf-dir", type=Path, default=Path("conf"))
    parser.add_argument("--check", action="store_true", help="exit 1 if anything is stale")
    args = parser.parse_args(argv)
    changed = write_all(args.conf_dir, check=args.check)
    for path in changed:
        print(f"{'stale' if args.check else 'wrote'}: {path}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
