"""The shipped ``conf/`` directory: it loads, matches its published JSON Schema, and its README
documents every key."""

from __future__ import annotations

import json
import re
import shutil
import textwrap
from pathlib import Path

import jsonschema
import pytest
import yaml

from ingest.errors import ConfigError
from pipelines.spec import ObjectSpec, PipelineSpec, load_conf
from pipelines.spec.schema import SCHEMA_FILES, json_schema, key_docs, write_all

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
REGENERATE = "run `python -m pipelines.spec.schema` and commit the result"


def test_shipped_conf_loads() -> None:
    conf = load_conf(CONF)
    assert conf.pipeline.connection.source == "emulator"
    assert conf.pipeline.lake.engine == "local"
    assert conf.pipeline.lake.location == str(ROOT / "lake")
    assert {o.api_name: (o.kind, o.topic) for o in conf.objects} == {
        "Account": ("change_events", "/data/AccountChangeEvent"),
        "Contact": ("change_events", "/data/ContactChangeEvent"),
        "Opportunity": ("change_events", "/data/OpportunityChangeEvent"),
        "Invoice__c": ("change_events", "/data/Invoice__ChangeEvent"),
        "Order_Shipped__e": ("platform_event", "/event/Order_Shipped__e"),
    }
    assert all(o.enabled for o in conf.objects)


def _yaml_files() -> list[Path]:
    return sorted(p for p in CONF.rglob("*") if p.suffix in (".yml", ".yaml"))


@pytest.mark.parametrize("path", _yaml_files(), ids=lambda p: str(p.relative_to(CONF)))
def test_every_conf_file_validates_against_its_published_schema(path: Path) -> None:
    name = "pipeline.schema.json" if path.name == "pipeline.yml" else "object.schema.json"
    first_line = path.read_text().splitlines()[0]
    match = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", first_line)
    assert match, f"{path} must start with '# yaml-language-server: $schema=...'"
    schema_path = (path.parent / match.group(1)).resolve()
    assert schema_path == CONF / "schema" / name
    schema = json.loads(schema_path.read_text())
    document = yaml.safe_load(path.read_text()) or {}
    errors = [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(document)]
    assert errors == []


def test_published_schemas_and_readme_are_current() -> None:
    stale = write_all(CONF, check=True)
    assert stale == [], f"stale generated files {[str(p) for p in stale]}: {REGENERATE}"
    for name, root in SCHEMA_FILES.items():
        published = json.loads((CONF / "schema" / name).read_text())
        assert published == json_schema(root), f"conf/schema/{name} is stale: {REGENERATE}"


def test_readme_documents_every_key() -> None:
    readme = (CONF / "README.md").read_text()
    missing = [
        f"{doc.file}: {doc.path}"
        for root, file in ((PipelineSpec, "pipeline.yml"), (ObjectSpec, "objects/<name>.yml"))
        for doc in key_docs(root, file)
        if f"`{doc.path}`" not in readme
    ]
    assert missing == [], f"keys missing from conf/README.md ({REGENERATE}): {missing}"


def test_readme_validation_examples_are_what_the_loader_says(tmp_path: Path) -> None:
    readme = (CONF / "README.md").read_text()
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "objects" / "account.yml").write_text(
        "object: Account\nkind: change_events\nreplay: {start: yesterday}\n"
    )
    pipeline = conf / "pipeline.yml"
    pipeline.write_text(pipeline.read_text().replace("max_attempts:", "max_attemps:"))
    with pytest.raises(ConfigError) as info:
        load_conf(conf)
    assert len(info.value.problems) == 2
    for problem in info.value.problems:
        assert problem in readme, f"conf/README.md shows an outdated message; now: {problem}"


def test_readme_example_object_file_is_valid(tmp_path: Path) -> None:
    readme = (CONF / "README.md").read_text()
    example = readme.split("```yaml\n", 1)[1].split("```", 1)[0]
    conf = tmp_path / "conf"
    (conf / "objects").mkdir(parents=True)
    (conf / "pipeline.yml").write_text("")
    (conf / "objects" / "invoice.yml").write_text(textwrap.dedent(example))
    (invoice,) = load_conf(conf).objects
    assert invoice.topic == "/data/Invoice__ChangeEvent"
    assert invoice.tables.bronze == "invoice__change_event"
    assert invoice.tables.gold == "invoice"
