"""The Databricks asset bundle, checked without the Databricks CLI (which needs a workspace
to validate a bundle).

Every job and pipeline of every target loads into Databricks' own typed models
(``databricks-bundles``, which rejects unknown keys); every ``${var.*}`` is defined; the
variables a deployment must give have no default; every file a job names exists; the wheel's
entry point is a script of this project; every wheel task's parameters, with the target's
variables substituted, are accepted by the ``sfcdc`` parser and give a ``conf/`` that loads;
dev and prod give every task a job cluster and the serverless target a serverless environment.
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
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from databricks.bundles.alerts import Alert
from databricks.bundles.dashboards import Dashboard
from databricks.bundles.jobs import Job
from databricks.bundles.pipelines import Pipeline

from ingest.auth import EnvRef, parse_secret_ref
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
    "${workspace.current_user.userName}": "jane.doe@example.com",
    "${bundle.name}": "sfcdc",
}
CLASSIC = ("dev", "prod")


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


def _pipelines() -> dict[str, tuple[Path, dict[str, Any]]]:
    found: dict[str, tuple[Path, dict[str, Any]]] = {}
    for path in _resource_files():
        for key, pipeline in _load(path)["resources"].get("pipelines", {}).items():
            found[key] = (path, pipeline)
    return found


PIPELINES = _pipelines()


def _target_pipeline(target: str, key: str) -> dict[str, Any]:
    _, pipeline = PIPELINES[key]
    targeted = BUNDLE_DOC["targets"][target].get("resources", {})
    merged: dict[str, Any] = _merge(pipeline, targeted.get("pipelines", {}).get(key, {}))
    return merged


# What a deployment passes for the variables that have no default (`--var` or BUNDLE_VAR_*).
GIVEN = {
    "node_type_id": "m6gd.xlarge",
    "alert_email": "data-oncall@corp.test",
    "service_principal": "6f0c1d2e-3a4b-4c5d-8e9f-a0b1c2d3e4f5",
}
REQUIRED = set(GIVEN)
# The commands that read no lake table.
NO_LAKE = {"onboard"}


# What a `lookup` variable resolves to at deploy time (an id of the workspace).
LOOKED_UP = "0123456789abcdef"
# Resource sections of the bundle and the file suffix of each (resources/<key>.<kind>.yml).
KINDS = {"jobs": "job", "dashboards": "dashboard", "alerts": "alert", "pipelines": "pipeline"}


def _variables(target: str) -> dict[str, str]:
    values = {
        name: LOOKED_UP if "lookup" in spec else spec.get("default", GIVEN.get(name))
        for name, spec in BUNDLE_DOC["variables"].items()
    }
    values.update(BUNDLE_DOC["targets"][target].get("variables", {}))
    return {name: str(value) for name, value in values.items()}


def _job_parameters(job: dict[str, Any], text: str) -> str:
    """``{{job.parameters.NAME}}`` replaced as the run does, with the parameter's default."""
    for parameter in job.get("parameters", []):
        text = text.replace(f"{{{{job.parameters.{parameter['name']}}}}}", parameter["default"])
    assert "{{" not in text, f"unknown dynamic value in {text!r}"
    return text


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
    environments = {e.environment_key: e for e in job.environments}
    for task in job.tasks:
        name = f"{target}: {key}.{task.task_key}"
        if target in CLASSIC:
            # A job cluster with the wheel installed.
            assert task.job_cluster_key in clusters, f"{name}: unknown job cluster"
            assert [lib.whl for lib in task.libraries] == ["./dist/*.whl"], name
            assert task.environment_key is None and not environments, name
        else:
            # Serverless: an environment whose dependency is the wheel, no cluster.
            assert task.environment_key in environments, f"{name}: no serverless environment"
            spec = environments[task.environment_key].spec
            assert spec is not None and spec.dependencies == ["./dist/*.whl"], name
            assert str(spec.environment_version) == "${var.serverless_environment_version}", name
            assert task.job_cluster_key is None and not clusters and not task.libraries, name
            assert task.new_cluster is None and task.existing_cluster_id is None, name


@pytest.mark.parametrize("target", TARGETS)
def test_the_lakeflow_pipeline_loads_into_the_pipeline_model_on_its_compute(target: str) -> None:
    assert set(PIPELINES) == {"sfcdc_lakeflow"}
    for key, (path, _) in PIPELINES.items():
        pipeline = Pipeline.from_dict(_target_pipeline(target, key))  # type: ignore[arg-type]
        assert str(pipeline.catalog) == "${var.catalog}"
        assert pipeline.environment is not None
        assert pipeline.environment.dependencies == ["../dist/*.whl"]
        for library in pipeline.libraries:
            notebook = (path.parent / str(library.notebook.path)).resolve()  # type: ignore[union-attr]
            assert notebook.is_file(), f"{key}: {notebook} does not exist"
            compile(notebook.read_text(), str(notebook), "exec")
        if target in CLASSIC:
            assert not pipeline.serverless
            assert [str(c.node_type_id) for c in pipeline.clusters] == ["${var.node_type_id}"]
        else:
            assert pipeline.serverless is True and not pipeline.clusters, key


def test_the_pipeline_model_rejects_a_misspelt_key() -> None:
    _, pipeline = PIPELINES["sfcdc_lakeflow"]
    with pytest.raises(ValueError, match="serverles"):
        Pipeline.from_dict({**pipeline, "serverles": True})


def test_the_model_rejects_a_misspelt_key() -> None:
    # What the checks above rely on: an unknown key is an error, not ignored.
    _, job = JOBS["sfcdc_ingest"]
    broken = copy.deepcopy(job)
    broken["tasks"][0]["python_wheel_task"]["entry_piont"] = "sfcdc"
    with pytest.raises(ValueError, match="entry_piont"):
        Job.from_dict(broken)


def _commands(job: Job) -> dict[str, list[str]]:
    return {
        t.task_key: list(t.python_wheel_task.parameters)  # type: ignore[union-attr,arg-type]
        for t in job.tasks
    }


@pytest.mark.parametrize("target", TARGETS)
def test_ingest_lands_both_apis_and_silver_gold_processes_both(target: str) -> None:
    ingest = Job.from_dict(_target_job(target, "sfcdc_ingest"))  # type: ignore[arg-type]
    assert ingest.continuous is not None
    assert ingest.max_concurrent_runs == 1
    # One landing process for the Pub/Sub topics and the Streaming API channels.
    assert [p[:2] for p in _commands(ingest).values()] == [["ingest", "--with-streams"]]
    transform = Job.from_dict(_target_job(target, "sfcdc_silver_gold"))  # type: ignore[arg-type]
    assert transform.schedule is not None
    commands = {
        key: p[: 2 if p[0] == "streaming" else 1] for key, p in _commands(transform).items()
    }
    assert commands == {
        "silver": ["silver"],
        "gold": ["gold"],
        "streaming_silver": ["streaming", "silver"],
        "streaming_gold": ["streaming", "gold"],
    }
    after = {t.task_key: sorted(d.task_key for d in t.depends_on) for t in transform.tasks}
    assert after["gold"] == ["silver"]
    # A channel's change events merge into the objects' gold tables: never at the same time.
    assert after["streaming_gold"] == ["gold", "streaming_silver"]


@pytest.mark.parametrize("target", TARGETS)
def test_maintenance_runs_on_a_schedule_and_bootstrap_and_onboard_on_demand(target: str) -> None:
    maintenance = Job.from_dict(_target_job(target, "sfcdc_maintenance"))  # type: ignore[arg-type]
    assert maintenance.schedule is not None and maintenance.max_concurrent_runs == 1
    assert str(maintenance.schedule.quartz_cron_expression) == "${var.maintenance_schedule}"
    assert [p[0] for p in _commands(maintenance).values()] == ["maintain"]
    for key, command, parameter in (
        ("sfcdc_bootstrap", "bootstrap", "object"),
        ("sfcdc_onboard", "onboard", "topic"),
    ):
        job = Job.from_dict(_target_job(target, key))  # type: ignore[arg-type]
        assert job.schedule is None and job.continuous is None and job.trigger is None, key
        (params,) = _commands(job).values()
        assert params[:2] == [command, f"{{{{job.parameters.{parameter}}}}}"], key
        assert [p.name for p in job.parameters] == [parameter], key


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
    dist = (ROOT / artifact["path"] / "dist").resolve()
    # Target overrides live in databricks.yml: their paths are relative to it.
    wheels = [
        lib["whl"]
        for target in TARGETS
        for key in JOBS
        for task in _target_job(target, key)["tasks"]
        for lib in task.get("libraries", [])
    ] + [
        dep
        for target in TARGETS
        for key in JOBS
        for env in _target_job(target, key).get("environments", [])
        for dep in env["spec"]["dependencies"]
    ]
    assert wheels
    for wheel in wheels:
        assert (BUNDLE.parent / wheel).parent.resolve() == dist, wheel
    for path, _ in PIPELINES.values():
        for dep in _load(path)["resources"]["pipelines"]["sfcdc_lakeflow"]["environment"][
            "dependencies"
        ]:
            assert (path.parent / dep).parent.resolve() == dist


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
    params = [_job_parameters(_target_job(target, key), p) for p in params]
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
    if command in NO_LAKE:
        return
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
        assert params[params.index("--conf") + 1] == "${var.conf_dir}", f"{key}.{task_key}"
        if params[0] not in NO_LAKE:
            lakes.add(tuple(sorted(p for p in params if p.startswith("lake."))))
    assert len(lakes) == 1, f"jobs disagree on the lake: {lakes}"


# -------------------------------------------------------------------------------- secrets


def test_prod_jobs_that_reach_salesforce_get_the_credentials_the_conf_names() -> None:
    """The commented salesforce section of conf/pipeline.yml, filled in as docs/databricks.md
    says, resolves every secret from the environment prod's clusters get from the scope."""
    section = yaml.safe_load(textwrap.dedent(_salesforce_example()))
    refs = [EnvRef(v["env"]) for v in section["salesforce"]["auth"].values() if isinstance(v, dict)]
    assert refs, "the example names no secret"
    jobs = ("sfcdc_ingest", "sfcdc_resync", "sfcdc_reconcile", "sfcdc_poll", "sfcdc_onboard")
    for key in (*jobs, "sfcdc_bootstrap"):
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


class FakeScopes:
    """dbutils.secrets as a Databricks job has it: values by scope and key."""

    def __init__(self, values: dict[tuple[str, str], str]) -> None:
        self.values = values

    def get(self, scope: str, key: str) -> str:
        return self.values[(scope, key)]


def test_serverless_jobs_read_the_credentials_from_the_scope_through_dbutils() -> None:
    """Serverless compute has no cluster environment to fill from a scope: its conf names the
    scope's keys ({secret: {scope, key}}), which sfcdc-job reads with dbutils."""
    scope = _variables("serverless")["secret_scope"]
    example = yaml.safe_load(textwrap.dedent(_salesforce_example()))["salesforce"]["auth"]
    keys = {"SFCDC_CLIENT_ID": "client-id", "SFCDC_CLIENT_SECRET": "client-secret"}
    refs = [
        parse_secret_ref({"secret": {"scope": scope, "key": keys[v["env"]]}})
        for v in example.values()
        if isinstance(v, dict)
    ]
    assert refs
    dbutils = SimpleNamespace(
        secrets=FakeScopes({(scope, key): f"{key}-value" for key in keys.values()})
    )
    resolver = secret_resolver(environ={}, dbutils=dbutils)  # type: ignore[arg-type]
    assert sorted(resolver.resolve(r).reveal() for r in refs) == [
        "client-id-value",
        "client-secret-value",
    ]
    for key in JOBS:
        job = _target_job("serverless", key)
        assert "job_clusters" not in job, key
        for task in job["tasks"]:
            assert task["python_wheel_task"]["entry_point"] == "sfcdc-job", key


def test_variables_a_deployment_must_give_have_no_default_and_no_placeholder() -> None:
    variables = BUNDLE_DOC["variables"]
    for name in REQUIRED:
        assert "default" not in variables[name] and "lookup" not in variables[name], name
    # prod and serverless take them from the deployment; dev fills in the deploying user.
    for target in ("prod", "serverless"):
        given = set(BUNDLE_DOC["targets"][target].get("variables", {}))
        assert {"alert_email", "service_principal"}.isdisjoint(given), target
    assert BUNDLE_DOC["targets"]["prod"].get("variables", {}).get("node_type_id") is None
    dev = BUNDLE_DOC["targets"]["dev"]["variables"]
    assert dev["alert_email"] == "${workspace.current_user.userName}"
    for target in ("prod", "serverless"):
        run_as = BUNDLE_DOC["targets"][target]["run_as"]
        assert run_as == {"service_principal_name": "${var.service_principal}"}, target
    texts = [BUNDLE.read_text(), *(p.read_text() for p in _resource_files())]
    for text in texts:
        assert "example.com" not in text and "00000000-0000" not in text
    # Node types exist on one cloud each: none is built in.
    for target in TARGETS:
        for key in JOBS:
            for cluster in _target_job(target, key).get("job_clusters", []):
                assert cluster["new_cluster"]["node_type_id"] == "${var.node_type_id}"


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
