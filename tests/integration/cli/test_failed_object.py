"""One object whose topic the source does not have: that object fails alone, the others land,
the run ends non-zero naming it, ``status`` shows it as FAIL and ``validate --online`` finds it
beforehand."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines import cli
from pipelines.engines import TableRef
from pipelines.session import engine_for
from pipelines.spec import load_conf
from tests.integration.cli.conftest import write_conf

pytestmark = pytest.mark.integration

LEAD = "object: Lead\nkind: change_events\n"


def _with_lead(tmp_path: Path, engine: str) -> Path:
    conf = write_conf(tmp_path, events=200, platform_events=20, engine=engine)
    (conf / "objects" / "lead.yml").write_text(LEAD)
    return conf


def test_a_missing_topic_fails_its_object_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lake_kind: str
) -> None:
    conf = _with_lead(tmp_path, lake_kind)
    code = cli.main(["-q", "run", "--conf", str(conf), "--once"])
    captured = capsys.readouterr()
    assert code == 1
    assert "Lead (/data/LeadChangeEvent)" in captured.err
    assert "NOT_FOUND" in captured.err
    # Every other object landed and went through silver and gold.
    engine = engine_for(load_conf(conf).pipeline.lake)
    for table in ("account", "contact"):
        assert engine.read_arrow(TableRef("gold", table)).num_rows > 0, table
    assert engine.read_arrow(TableRef("silver", "order_shipped")).num_rows > 0

    assert cli.main(["status", "--conf", str(conf)]) == 0
    out = capsys.readouterr().out
    lead = [line for line in out.splitlines() if "/data/LeadChangeEvent ->" in line]
    assert lead and "FAIL" in lead[0] and "NOT_FOUND" in lead[0]
    assert any(line.strip().startswith("Lead:") and "FAIL" in line for line in out.splitlines())
    account = [line for line in out.splitlines() if "/data/AccountChangeEvent ->" in line]
    assert account and "FAIL" not in account[0]
    # The health verdict of the object is FAIL too, so `status --check` fails.
    assert any(line.strip().startswith("FAIL Lead:") for line in out.splitlines())
    assert "topic subscription failed: " in out
    assert cli.main(["status", "--conf", str(conf), "--check"]) == 1


def test_a_continuous_run_reports_the_failed_object_and_keeps_its_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The landing child exits 1 after its final report when a topic failed: the run reports
    # that object (progress and summary), not a crashed landing, and its last pass still runs.
    conf = _with_lead(tmp_path, "local")
    code = cli.main(
        ["-q", "run", "--conf", str(conf), "--continuous", "--interval", "0.5", "--for", "3"]
    )
    captured = capsys.readouterr()
    assert code == 1, captured.err
    assert "/data/LeadChangeEvent: FAIL, 0 landed: " in captured.out
    assert "sfcdc run: 1 of 4 topics FAILED" in captured.err
    assert "Lead (/data/LeadChangeEvent)" in captured.err and "NOT_FOUND" in captured.err
    assert "the landing process" not in captured.err
    assert "duration reached" in captured.out
    engine = engine_for(load_conf(conf).pipeline.lake)
    assert engine.read_arrow(TableRef("gold", "account")).num_rows > 0


def test_validate_online_checks_every_topic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = _with_lead(tmp_path, "local")
    assert cli.main(["validate", "--conf", str(conf)]) == 0
    capsys.readouterr()
    code = cli.main(["validate", "--conf", str(conf), "--online"])
    captured = capsys.readouterr()
    assert code == 1
    assert "Lead: topic /data/LeadChangeEvent" in captured.err and "NOT_FOUND" in captured.err
    assert "/data/AccountChangeEvent: found" in captured.out
    assert "the emulator serves change events of:" in captured.out
    assert "Account (/data/AccountChangeEvent)" in captured.out
    # The check seeds nothing: the configured state directory stays empty.
    assert not (conf / "emulator").exists() or not any((conf / "emulator").iterdir())
