"""The YAML keys of lag, health and metrics: defaults, per-object overrides, and problems
named with their file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingest.errors import ConfigError
from pipelines.cli import build_parser
from pipelines.commands.conf_options import conf_from_args
from pipelines.spec import HealthSpec, load_conf
from tests.unit.test_spec import ACCOUNT, problems_of, write_conf


def test_health_and_ops_defaults(tmp_path: Path) -> None:
    conf = load_conf(write_conf(tmp_path))
    (account,) = conf.objects
    assert account.health == HealthSpec() == conf.pipeline.defaults.health
    assert (account.health.lag_warn_seconds, account.health.lag_fail_seconds) == (1800, 7200)
    ops = conf.pipeline.ops
    assert ops.commits_table is True
    assert ops.prometheus.port is None and ops.prometheus.host == "127.0.0.1"
    assert conf.pipeline.connection.emulator.workload.timestamps == "simulated"


def test_an_object_overrides_some_health_keys_and_inherits_the_rest(tmp_path: Path) -> None:
    conf = load_conf(
        write_conf(
            tmp_path,
            "defaults:\n  health: {lag_warn_seconds: 60, lag_fail_seconds: 600}\n",
            {
                "account": ACCOUNT + "health: {lag_fail_seconds: 120, resync_warn_records: 0}\n",
                "contact": "object: Contact\nkind: change_events\n",
            },
        )
    )
    health = {o.api_name: o.health for o in conf.objects}
    assert health["Account"] == HealthSpec(
        lag_warn_seconds=60, lag_fail_seconds=120, resync_warn_records=0
    )
    assert health["Contact"] == HealthSpec(lag_warn_seconds=60, lag_fail_seconds=600)


def test_bad_health_and_ops_keys_are_reported_with_file_and_key(tmp_path: Path) -> None:
    conf = write_conf(
        tmp_path,
        "ops:\n  prometheus: {port: 70000}\n  flush_second: 5\n"
        "connection:\n  emulator:\n    workload: {timestamps: real}\n",
        {"account": ACCOUNT + "health: {lag_warn_seconds: 600, lag_fail_seconds: 60}\n"},
    )
    problems = problems_of(conf)
    assert "conf/pipeline.yml: ops.prometheus.port: must be at most 65535 (got 70000)" in problems
    assert any(
        p.startswith("conf/pipeline.yml: ops.flush_second: unknown key")
        and "(did you mean 'flush_seconds'?)" in p
        for p in problems
    ), problems
    assert any(
        p.startswith("conf/pipeline.yml: connection.emulator.workload.timestamps: must be one of")
        and "'now'" in p
        for p in problems
    ), problems
    assert (
        "conf/objects/account.yml: health.lag_fail_seconds: must be at least lag_warn_seconds "
        "(600) (got 60)" in problems
    )


def test_the_metrics_port_comes_from_the_cli_or_the_yaml(tmp_path: Path) -> None:
    conf_dir = write_conf(tmp_path, "ops:\n  prometheus: {port: 9464}\n")
    parser = build_parser()
    for command in ("ingest", "run"):
        args = parser.parse_args([command, "--conf", str(conf_dir)])
        assert conf_from_args(args).pipeline.ops.prometheus.port == 9464
        args = parser.parse_args([command, "--conf", str(conf_dir), "--metrics-port", "9500"])
        assert conf_from_args(args).pipeline.ops.prometheus.port == 9500
    with pytest.raises(SystemExit):
        parser.parse_args(["ingest", "--conf", str(conf_dir), "--metrics-port", "http"])


def test_a_metrics_port_out_of_range_is_a_config_error(tmp_path: Path) -> None:
    conf_dir = write_conf(tmp_path)
    args = build_parser().parse_args(["ingest", "--conf", str(conf_dir), "--metrics-port", "0"])
    with pytest.raises(ConfigError, match=r"ops\.prometheus\.port: must be at least 1"):
        conf_from_args(args)
