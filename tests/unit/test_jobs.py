"""``sfcdc-job``: the command's status becomes an exception a Databricks task fails on."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingest.auth import DbutilsSecrets, ScopeRef
from ingest.errors import ConfigError
from pipelines.connect import secret_resolver
from pipelines.jobs import RuntimeDbutils, main

CONF = Path(__file__).resolve().parents[2] / "conf"


def test_a_failed_command_raises_system_exit_with_its_status(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["-q", "silver", "--conf", str(CONF), "--set", "lake.catalog=not-an-identifier"])
    assert info.value.code == 2
    assert "lake.catalog: must be a SQL identifier" in capsys.readouterr().err


def test_a_missing_conf_dir_fails_the_task(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        main(["-q", "gold", "--conf", str(tmp_path / "nowhere")])
    assert info.value.code == 2


def test_bad_arguments_fail_the_task_as_argparse_does() -> None:
    with pytest.raises(SystemExit) as info:
        main(["ingest", "--conf"])
    assert info.value.code == 2


class _NoDbutils:
    """A ``dbutils`` that must not be touched."""

    @property
    def secrets(self) -> DbutilsSecrets:
        raise AssertionError("dbutils was used by a command that reads no secret")


def test_a_command_that_reads_no_secret_never_obtains_dbutils(
    capsys: pytest.CaptureFixture[str],
) -> None:
    main(["-q", "validate", "--conf", str(CONF)], dbutils=_NoDbutils())
    assert "problem" not in capsys.readouterr().err


def test_off_databricks_a_secret_scope_reference_says_where_it_can_be_read() -> None:
    resolver = secret_resolver(dbutils=RuntimeDbutils())
    with pytest.raises(ConfigError, match="exists only on a Databricks cluster"):
        resolver.resolve(ScopeRef("sfcdc", "client-secret"))
    assert "not obtained" in repr(RuntimeDbutils())
