"""``sfcdc-job`` as a Databricks wheel task runs it: a ``{secret: {scope, key}}`` reference in
``conf/pipeline.yml`` is read with the ``dbutils`` the entry point is given, the landing logs in
with it, and the value shows up in no log line, output or error."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ingest.emulator.server import DEFAULT_CLIENT
from pipelines.jobs import main
from tests.fake_dbutils import FakeDbutils

pytestmark = pytest.mark.integration

SCOPE, KEY = "sfcdc", "emulator-client-secret"


def _conf(root: Path) -> Path:
    conf = root / "conf"
    (conf / "objects").mkdir(parents=True)
    (conf / "pipeline.yml").write_text(
        "connection:\n"
        "  emulator:\n"
        "    seed: 5\n"
        "    keepalive_seconds: 0.2\n"
        f"    client_secret: {{secret: {{scope: {SCOPE}, key: {KEY}}}}}\n"
        "    workload:\n"
        "      events: 40\n"
        "      platform_events: 0\n"
        "lake:\n"
        "  engine: local\n"
        "  location: ./lake\n"
    )
    (conf / "objects" / "account.yml").write_text("object: Account\nkind: change_events\n")
    return conf


def test_the_job_logs_in_with_the_secret_dbutils_reads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    dbutils = FakeDbutils({(SCOPE, KEY): DEFAULT_CLIENT.client_secret})
    main(["-vv", "ingest", "--once", "--conf", str(_conf(tmp_path))], dbutils=dbutils)
    captured = capsys.readouterr()
    assert dbutils.secrets.calls == [(SCOPE, KEY)]
    assert "Account" in captured.out or "account" in captured.out
    for text in (caplog.text, captured.out, captured.err):
        assert DEFAULT_CLIENT.client_secret not in text


def test_a_missing_secret_fails_the_task_naming_scope_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["-q", "ingest", "--once", "--conf", str(_conf(tmp_path))], dbutils=FakeDbutils())
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"cannot read secret scope '{SCOPE}' key '{KEY}'" in err
    assert f"databricks secrets list-secrets {SCOPE}" in err
