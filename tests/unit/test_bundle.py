"""The Databricks asset bundle, checked without the Databricks CLI.

Every job of every target loads into Databricks' own typed models (``databricks-bundles``,
which rejects unknown keys); every ``${var.*}`` is defined; every file a job names exists; the
wheel's entry point is a script of this project; and every wheel task's parameters, with the
target's variables substituted, are accepted by the ``sfcdc`` parser and give a ``conf/`` that
loads.
"""

from __future__ import annotations

import copy
import fnmatch
import importlib
import json
import re
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from databricks.bundles.alerts import Alert
from databricks.bundles.dashboards import Dashboard
from databricks.bundles.jobs import Job

from ingest.auth import EnvRef
from pipelines.cli import build_parser
from pipelines.commands.conf_options import conf_from_args
from pipelines.connect import secret_resolver
from pipelines.ops.table import COMMITS_TABLE
from pipelines.spec import load_conf

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "databricks.yml"
RESOURCES = ROOT / "resources"
VAR_RE = re.compile(r"\$\{var\.([A-Za-z0-9_]+)\}")
# What the Databricks CLI fills in at deploy time, with the values a deployment would have.
WORKSPACE = {
    "${workspace.file_path}": "/Workspace/Users/jane.doe@example.com/.bundle/sfcdc/dev/files",
    "${workspace.current_user.short_name}": "jane_doe",
    "${bundle.name}": "sfcdc",
}


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


BUNDLE_DOC = _load(BUNDLE)
TARGETS = sorted(BUNDLE_DOC["targets"])


def _resource_files() -> list[Path]:
    return sorted(RESOURCES.glob("*.yml"))


def _jobs() -> dict[str, tuple[Path, dict[str, Any]]]:
    jobs: dict[str, tuple[Path, dict[str, Any]]] = {}
    for path in _resource_files():
        for key, job in _load(path)["resources"].get("jobs", {}).items():
            assert key not in jobs, f"job {key} defined in {jobs[key][0]} and {path}"
            jobs[key] = (path, job)
    return jobs


JOBS = _jobs()


def _merge(base: Any, override: Any) -> Any:
    """A target's resource override applied the way the bundle CLI does: mappings merge key by
    key, and list items with the same ``task_key`` / ``job_cluster_key`` merge with each other."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = _merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(override, list):
        keyed = ("task_key", "job_cluster_key", "environment_key")
        merged_list = copy.deepcopy(base)
        for item in override:
            key = next((k for k in keyed if isinstance(item, dict) and k in item), None)
            match = next(
                (i for i, b in enumerate(merged_list) if key and b.get(key) == item[key]), None
            )
            if match is None:
                merged_list.append(copy.deepcopy(item))
            else:
                merged_list[match] = _merge(merged_list[match], item)
        return merged_list
    return copy.deepcopy(override)


def _target_job(target: str, key: str) -> dict[str, Any]:
    _, job = JOBS[key]
    override = BUNDLE_DOC["targets"][target].get("resources", {}).get("jobs", {}).get(key, {})
    merged: dict[str, Any] = _merge(job, override)
    return merged


# What a `lookup` variable resolves to at deploy time (an id of the workspace).
LOOKED_UP = "0123456789abcdef"
# Resource sections of the bundle and the file suffix of each (resources/<key>.<kind>.yml).
KINDS = {"jobs": "job", "dashboards": "dashboard", "alerts": "alert", "pipelines": "pipeline"}


def _variables(target: str) -> dict[str, str]:
    values = {
        name: LOOKED_UP if "lookup" in spec else spec.get("default")
        for name, spec in BUNDLE_DOC["variables"].items()
    }
    values.update(BUNDLE_DOC["targets"][target].get("variables", {}))
    return {name: str(value) for name, value in values.items()}


def _substitute(value: Any, variables: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _substitute(v, variables) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, variables) for v in value]
    if not isinstance(value, str):
        return value
    for _ in range(5):  # variables may refer to workspace values and to each other
        for ref, real in WORKSPACE.items():
            value = value.replace(ref, real)
        value = VAR_RE.sub(lambda m: variables[m.group(1)], value)
    assert "${" not in value, f"unresolved reference in {value!r}"
    return value


def _strings(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [s for v in node.values() for s in _strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return [node] if isinstance(node, str) else []


def _wheel_tasks() -> list[tuple[str, str, str, dict[str, Any]]]:
    return [
        (target, key, task["task_key"], task)
        for target in TARGETS
        for key in sorted(JOBS)
        for task in _target_job(target, key)["tasks"]
        if "python_wheel_task" in task
    ]


def _registered_commands() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return set(sub.choices)  # type: ignore[arg-type]


def _salesforce_example() -> str:
    """The commented ``salesforce:`` example of conf/pipeline.yml, uncommented."""
    text = (ROOT / "conf" / "pipeline.yml").read_text()
    block = re.search(r"  # salesforce:\n(?:  #   .*\n)+", text)
    assert block, "conf/pipeline.yml lost its commented salesforce example"
    return "\n".join(line.replace("  # ", "  ", 1) for line in block.group(0).splitlines())


def _conf_for(variables: dict[str, str], tmp_path: Path) -> Path:
    """The repository's conf/, with the salesforce section filled in as docs/databricks.md
    says when the target reads a real org."""
    if variables["source"] != "salesforce":
        return ROOT / "conf"
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    text = (conf / "pipeline.yml").read_text()
    (conf / "pipeline.yml").write_text(
        text.replace("connection:\n", "connection:\n" + _salesforce_example() + "\n", 1)
    )
    return conf


# ---------------------------------------------------------------------------------- layout


def test_the_bundle_has_a_name_dev_and_prod_targets_and_includes_every_resource_file() -> None:
    assert BUNDLE_DOC["bundle"]["name"] == "sfcdc"
    assert BUNDLE_DOC["targets"]["dev"]["mode"] == "development"
    assert BUNDLE_DOC["targets"]["dev"]["default"] is True
    assert BUNDLE_DOC["targets"]["prod"]["mode"] == "production"
    assert "run_as" in BUNDLE_DOC["targets"]["prod"]
    files = [p.relative_to(ROOT).as_posix() for p in _resource_files()]
    assert files, "no resources/*.yml"
    for name in files:
        assert any(fnmatch.fnmatch(name, g) for g in BUNDLE_DOC["include"]), name
        assert name.endswith(tuple(f".{kind}.yml" for kind in KINDS.values())), (
            f"{name}: one file per resource, named <key>.<kind>.yml ({', '.join(KINDS.values())})"
        )
    assert {"sfcdc_ingest", "sfcdc_silver_gold"} <= set(JOBS)


def test_every_resource_file_holds_one_resource_named_after_it() -> None:
    for path in _resource_files():
        key, kind = path.name.removesuffix(".yml").rsplit(".", 1)
        resources = _load(path)["resources"]
        section = next(s for s, k in KINDS.items() if k == kind)
        assert list(resources) == [section], path
        assert list(resources[section]) == [key], path


def test_every_variable_referenced_is_defined_and_every_defined_one_is_used() -> None:
    defined = set(BUNDLE_DOC["variables"])
    texts = [BUNDLE.read_text(), *(p.read_text() for p in _resource_files())]
    used = {m for text in texts for m in VAR_RE.findall(text)}
    assert used - defined == set(), f"undefined variables: {sorted(used - defined)}"
    assert defined - used == set(), f"variables nothing uses: {sorted(defined - used)}"
    for target in TARGETS:
        overridden = set(BUNDLE_DOC["targets"][target].get("variables", {}))
        assert overridden <= defined, f"{target} sets undefined variables"
    for name, spec in BUNDLE_DOC["variables"].items():
        assert spec.get("description"), f"variable {name} has no description"


# ------------------------------------------------------------------------- typed models


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("key", sorted(JOBS))
def test_every_job_of_every_target_loads_into_the_databricks_job_model(
    target: str, key: str
) -> None:
    job = Job.from_dict(_target_job(target, key))  # type: ignore[arg-type]
    assert job.name
    assert job.tasks, f"{key} has no tasks"
    clusters = {c.job_cluster_key for c in job.job_clusters}
    for task in job.tasks:
        assert task.job_cluster_key in clusters, f"{key}.{task.task_key}: unknown job cluster"
        assert [lib.whl for lib in task.libraries] == ["../dist/*.whl"]


def test_the_model_rejects_a_misspelt_key() -> None:
    # What the checks above rely on: an unknown key is an error, not ignored.
    _, job = JOBS["sfcdc_ingest"]
    broken = copy.deepcopy(job)
    broken["tasks"][0]["python_wheel_task"]["entry_piont"] = "sfcdc"
    with pytest.raises(ValueError, match="entry_piont"):
        Job.from_dict(broken)


def test_ingest_is_continuous_and_silver_gold_scheduled_with_gold_after_silver() -> None:
    ingest = Job.from_dict(_target_job("prod", "sfcdc_ingest"))  # type: ignore[arg-type]
    assert ingest.continuous is not None
    assert ingest.max_concurrent_runs == 1
    assert [t.python_wheel_task.parameters[0] for t in ingest.tasks] == ["ingest"]  # type: ignore[union-attr]
    transform = Job.from_dict(_target_job("prod", "sfcdc_silver_gold"))  # type: ignore[arg-type]
    assert transform.schedule is not None
    tasks = {t.task_key: t for t in transform.tasks}
    assert tasks["silver"].python_wheel_task.parameters[0] == "silver"  # type: ignore[union-attr]
    assert tasks["gold"].python_wheel_task.parameters[0] == "gold"  # type: ignore[union-attr]
    assert [d.task_key for d in tasks["gold"].depends_on] == ["silver"]


def test_poll_runs_one_at_a_time_and_refreshes_formulas_after_its_polls() -> None:
    # One poller per object at a time (pipelines.polled.poll): one run at a time.
    poll = Job.from_dict(_target_job("prod", "sfcdc_poll"))  # type: ignore[arg-type]
    assert poll.schedule is not None and poll.max_concurrent_runs == 1
    tasks = {t.task_key: t for t in poll.tasks}
    assert tasks["poll"].python_wheel_task.parameters[0] == "poll"  # type: ignore[union-attr]
    assert tasks["formulas"].python_wheel_task.parameters[0] == "formulas"  # type: ignore[union-attr]
    assert [d.task_key for d in tasks["formulas"].depends_on] == ["poll"]


# ---------------------------------------------------------------------- referenced files


def test_the_wheel_artifact_builds_this_project_into_the_directory_jobs_install_from() -> None:
    (artifact,) = BUNDLE_DOC["artifacts"].values()
    assert artifact["type"] == "whl"
    assert (ROOT / artifact["path"] / "pyproject.toml").is_file()
    assert "--wheel-dir dist" in artifact["build"]
    for path, job in JOBS.values():
        for task in job["tasks"]:
            for lib in task.get("libraries", []):
                resolved = (path.parent / lib["whl"]).parent.resolve()
                assert resolved == (ROOT / artifact["path"] / "dist").resolve()


def test_the_entry_point_is_a_script_of_this_project() -> None:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for _target, key, task_key, task in _wheel_tasks():
        wheel = task["python_wheel_task"]
        assert wheel["package_name"] == project["name"], f"{key}.{task_key}"
        target = project["scripts"][wheel["entry_point"]]
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function))


def test_every_notebook_a_job_runs_exists_and_declares_the_parameters_it_is_given() -> None:
    for path, job in JOBS.values():
        for task in job["tasks"]:
            if "notebook_task" not in task:
                continue
            notebook = (path.parent / task["notebook_task"]["notebook_path"]).resolve()
            assert notebook.is_file(), f"{path.name}: {notebook} does not exist"
            widgets = set(re.findall(r'dbutils\.widgets\.text\("([^"]+)"', notebook.read_text()))
            given = set(task["notebook_task"].get("base_parameters", {}))
            given |= {p["name"] for p in job.get("parameters", [])}
            assert given <= widgets, f"{notebook.name} has no widget for {given - widgets}"


def test_the_conf_dir_is_the_synced_conf_directory() -> None:
    default = BUNDLE_DOC["variables"]["conf_dir"]["default"]
    assert default == "${workspace.file_path}/conf"
    assert (ROOT / "conf" / "pipeline.yml").is_file()


# ------------------------------------------------------------------------ task parameters


def _task_id(case: tuple[str, str, str, dict[str, Any]]) -> str:
    return f"{case[0]}-{case[1]}-{case[2]}"


@pytest.mark.parametrize("case", _wheel_tasks(), ids=_task_id)
def test_every_wheel_task_parses_and_loads_the_conf(
    case: tuple[str, str, str, dict[str, Any]], tmp_path: Path
) -> None:
    target, key, task_key, task = case
    variables = _substitute(_variables(target), _variables(target))
    params = _substitute(task["python_wheel_task"]["parameters"], variables)
    command = params[0]
    registered = _registered_commands()
    assert command in registered, (
        f"{JOBS[key][0].name}: task {task_key} runs `sfcdc {command}`, which is not an sfcdc "
        f"command (commands: {', '.join(sorted(registered))})"
    )
    # The synced conf/ is at the workspace file path; here it is the repository's conf/.
    conf_dir = _conf_for(variables, tmp_path)
    synced = WORKSPACE["${workspace.file_path}"] + "/conf"
    params = [str(conf_dir) if p == synced else p for p in params]
    args = build_parser().parse_args(params)
    assert args.command == command
    conf = conf_from_args(args)
    assert conf.conf_dir == conf_dir
    lake = conf.pipeline.lake
    assert lake.engine == "spark"
    assert lake.catalog == variables["catalog"]
    assert (lake.schemas.bronze, lake.schemas.silver, lake.schemas.gold) == (
        variables["bronze_schema"],
        variables["silver_schema"],
        variables["gold_schema"],
    )


def test_every_job_passes_the_same_lake_to_every_command() -> None:
    lakes = set()
    for _target, key, task_key, task in _wheel_tasks():
        params = task["python_wheel_task"]["parameters"]
        sets = tuple(sorted(p for p in params if p.startswith("lake.")))
        assert params[params.index("--conf") + 1] == "${var.conf_dir}", f"{key}.{task_key}"
        lakes.add(sets)
    assert len(lakes) == 1, f"jobs disagree on the lake: {lakes}"


# -------------------------------------------------------------------------------- secrets


def test_prod_jobs_that_reach_salesforce_get_the_credentials_the_conf_names() -> None:
    """The commented salesforce section of conf/pipeline.yml, filled in as docs/databricks.md
    says, resolves every secret from the environment prod's clusters get from the scope."""
    section = yaml.safe_load(textwrap.dedent(_salesforce_example()))
    refs = [EnvRef(v["env"]) for v in section["salesforce"]["auth"].values() if isinstance(v, dict)]
    assert refs, "the example names no secret"
    for key in ("sfcdc_ingest", "sfcdc_resync", "sfcdc_reconcile", "sfcdc_poll", "sfcdc_onboard"):
        job = _target_job("prod", key)
        for cluster in job["job_clusters"]:
            env = cluster["new_cluster"].get("spark_env_vars", {})
            for value in env.values():
                assert re.fullmatch(r"\{\{secrets/\$\{var\.secret_scope\}/[a-z-]+\}\}", value)
            resolver = secret_resolver(environ=dict.fromkeys(env, "value-from-scope"))
            for ref in refs:
                assert resolver.resolve(ref).reveal() == "value-from-scope", (key, ref)
    # dev reads the in-process emulator: no scope needed, none referenced.
    for key in JOBS:
        for cluster in _target_job("dev", key)["job_clusters"]:
            assert "spark_env_vars" not in cluster["new_cluster"]


def _runtime_order(key: str) -> tuple[int, int]:
    major, _, minor = key.split("-", maxsplit=1)[0].removesuffix(".x").partition(".")
    return int(major), int(minor or 0)


def test_the_job_clusters_default_to_the_newest_runtime_whose_libraries_the_wheel_fits() -> None:
    """constraints/ lists the packages of the runtimes the wheel is checked against
    (tests/unit/test_runtime_constraints.py); the jobs run the newest of them by default."""
    keys = []
    for path in sorted((ROOT / "constraints").glob("databricks-*.txt")):
        match = re.search(r"\(cluster key ([\w.-]+)\)", path.read_text().splitlines()[0])
        assert match, f"{path.name}: the first line names the runtime's cluster key"
        keys.append(match[1])
    assert BUNDLE_DOC["variables"]["spark_version"]["default"] == max(keys, key=_runtime_order)


def test_no_literal_secret_or_host_in_the_bundle() -> None:
    for text in _strings(BUNDLE_DOC) + [s for _, j in JOBS.values() for s in _strings(j)]:
        assert "token" not in text.lower() or "{{secrets/" in text, text
    assert "host" not in BUNDLE.read_text().split("targets:")[1]


# ------------------------------------------------------------------------------ notebooks

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.py"))


def test_the_explore_onboard_and_resync_notebooks_exist() -> None:
    assert {p.stem for p in NOTEBOOKS} >= {"explore", "onboard", "resync"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_are_databricks_source_that_compiles(path: Path) -> None:
    text = path.read_text()
    assert text.startswith("# Databricks notebook source\n")
    assert "\n# COMMAND ----------\n" in text
    compile(text, str(path), "exec")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_what_notebooks_import_from_pipelines_exists(path: Path) -> None:
    imports = re.findall(r"^from (pipelines[\w.]*) import ([\w, ]+)$", path.read_text(), re.M)
    for module, names in imports:
        loaded = importlib.import_module(module)
        for name in (n.strip() for n in names.split(",")):
            assert hasattr(loaded, name), f"{path.name}: {module}.{name} does not exist"


# ------------------------------------------------------------------- dashboard and alerts


def _resources(section: str) -> dict[str, tuple[Path, dict[str, Any]]]:
    found: dict[str, tuple[Path, dict[str, Any]]] = {}
    for path in _resource_files():
        for key, resource in _load(path)["resources"].get(section, {}).items():
            found[key] = (path, resource)
    return found


DASHBOARDS = _resources("dashboards")
ALERTS = _resources("alerts")


def test_the_bundle_deploys_an_operations_dashboard_and_a_lag_alert() -> None:
    assert set(DASHBOARDS) == {"sfcdc_ops"}
    assert set(ALERTS) == {"sfcdc_lag"}


@pytest.mark.parametrize("target", TARGETS)
def test_dashboards_and_alerts_load_into_the_databricks_models(target: str) -> None:
    variables = _variables(target)
    resolved = {name: _substitute(value, variables) for name, value in variables.items()}
    for path, resource in DASHBOARDS.values():
        dashboard = Dashboard.from_dict(_substitute(resource, variables))
        assert dashboard.warehouse_id == LOOKED_UP
        assert dashboard.dataset_catalog == resolved["catalog"]
        assert dashboard.dataset_schema == resolved["bronze_schema"]
        assert (path.parent / str(dashboard.file_path)).is_file(), dashboard.file_path
    for _, resource in ALERTS.values():
        alert = Alert.from_dict(_substitute(resource, variables))
        table = f"{resolved['catalog']}.{resolved['bronze_schema']}.{COMMITS_TABLE}"
        assert table in str(alert.query_text)
        assert alert.evaluation.source.name == "lag_seconds"  # type: ignore[union-attr]
        subscribers = alert.evaluation.notification.subscriptions  # type: ignore[union-attr]
        assert [s.user_email for s in subscribers] == [resolved["alert_email"]]


def test_the_models_reject_a_misspelt_dashboard_or_alert_key() -> None:
    _, dashboard = DASHBOARDS["sfcdc_ops"]
    with pytest.raises(ValueError, match="warehouse_idd"):
        Dashboard.from_dict({**dashboard, "warehouse_idd": "x"})
    _, alert = ALERTS["sfcdc_lag"]
    with pytest.raises(ValueError, match="treshold"):
        Alert.from_dict({**alert, "evaluation": {**alert["evaluation"], "treshold": {}}})


def test_the_lag_alert_fires_at_the_yaml_fail_threshold() -> None:
    conf = load_conf(ROOT / "conf")
    fail = {obj.health.lag_fail_seconds for obj in conf.objects}
    assert fail == {conf.pipeline.defaults.health.lag_fail_seconds}
    assert float(BUNDLE_DOC["variables"]["lag_alert_seconds"]["default"]) == fail.pop()
    _, alert = ALERTS["sfcdc_lag"]
    assert alert["evaluation"]["threshold"]["value"]["double_value"] == "${var.lag_alert_seconds}"
    assert alert["evaluation"]["comparison_operator"] == "GREATER_THAN"


def test_every_job_tells_the_on_call_address_when_it_fails() -> None:
    for key, (_, job) in JOBS.items():
        assert job["email_notifications"]["on_failure"] == ["${var.alert_email}"], key


def _selected(sql: str) -> set[str]:
    """The column names a dataset query's last SELECT gives (``... AS name`` or a bare
    column)."""
    last = sql[sql.rfind("SELECT") + len("SELECT") : sql.rfind("FROM")]
    names = set(re.findall(r"\bAS\s+(\w+)", last))
    for part in last.split(","):
        bare = re.fullmatch(r"\s*(?:\w+\.)?(\w+)\s*", part)
        if bare:
            names.add(bare.group(1))
    return names


def test_every_dashboard_widget_reads_a_dataset_column_that_its_query_selects() -> None:
    for path, resource in DASHBOARDS.values():
        document = json.loads((path.parent / resource["file_path"]).read_text())
        datasets = {d["name"]: "".join(d["queryLines"]) for d in document["datasets"]}
        for sql in datasets.values():
            assert COMMITS_TABLE in sql
        used: set[str] = set()
        for page in document["pages"]:
            for item in page["layout"]:
                widget = item["widget"]
                for query in widget.get("queries", []):
                    name = query["query"]["datasetName"]
                    assert name in datasets, f"{widget['name']}: no dataset {name}"
                    used.add(name)
                    columns = _selected(datasets[name])
                    for field in query["query"]["fields"]:
                        referenced = set(re.findall(r"`(\w+)`", field["expression"]))
                        assert referenced <= columns, (widget["name"], referenced - columns)
                    encoded = [
                        e["fieldName"] for e in widget["spec"]["encodings"].get("columns", [])
                    ] + [
                        e["fieldName"]
                        for k, e in widget["spec"]["encodings"].items()
                        if k != "columns"
                    ]
                    fields = {f["name"] for f in query["query"]["fields"]}
                    assert set(encoded) <= fields, (widget["name"], set(encoded) - fields)
        assert used == set(datasets), f"datasets no widget shows: {set(datasets) - used}"
        # The charts the issue names: lag, throughput, quarantine, re-sync, errors.
        assert {"lag", "throughput", "quarantine_resync", "errors"} <= set(datasets)


def test_the_dashboard_and_the_alert_compute_lag_the_same_way() -> None:
    path, resource = DASHBOARDS["sfcdc_ops"]
    document = json.loads((path.parent / resource["file_path"]).read_text())
    (lag,) = [d for d in document["datasets"] if d["name"] == "lag"]
    dashboard_sql = "".join(lag["queryLines"])
    alert_sql = ALERTS["sfcdc_lag"][1]["query_text"]

    def core(sql: str) -> str:
        return " ".join(sql[sql.index("last_layer AS") : sql.index("SELECT a.object")].split())

    assert core(dashboard_sql).replace("sfcdc_commits", "commits") == core(alert_sql)
