"""The landing child's command line and the progress reports it prints (no JVM, no child)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pipelines.bronze import LandingResult, TopicResult
from pipelines.commands.ingest import PROGRESS_PREFIX, decode_progress, encode_progress
from pipelines.run import LandingProcess
from pipelines.spec import parse_override


def _result(stopped: str) -> LandingResult:
    topic = TopicResult(
        topic="/data/AccountChangeEvent",
        table="bronze.account_change_event",
        received=12,
        events=10,
        payload_bytes=2048,
        commits=3,
        keepalive_commits=1,
        replay_gaps=0,
        redelivered_skipped=2,
        last_replay_id="00ff",
    )
    return LandingResult((topic,), 4.5, stopped)


def test_a_progress_report_is_one_marked_line_that_reads_back_equal() -> None:
    line = encode_progress(_result("running"))
    assert line.startswith(PROGRESS_PREFIX) and "\n" not in line
    assert decode_progress(line + "\n") == _result("running")
    assert decode_progress("sfcdc ingest: stopped after 4.5 s (received SIGTERM)") is None


def test_a_marked_line_that_does_not_parse_says_what_was_expected() -> None:
    with pytest.raises(ValueError, match="expected a landing snapshot") as caught:
        decode_progress(PROGRESS_PREFIX + '{"topics": [{"topic": 1}]}')
    assert '{"topics"' in str(caught.value)


def test_the_child_command_line_carries_the_configuration_and_its_overrides(
    tmp_path: Path,
) -> None:
    overrides = (parse_override("lake.location=/data/lake"), parse_override("ingest.x={a: [1]}"))
    spec = LandingProcess(tmp_path / "conf", overrides, cli_options=("-v",))
    argv = spec.argv(objects=("Account", "Contact"), duration=30.0)
    assert argv[:5] == [sys.executable, "-m", "pipelines.cli", "-v", "ingest"]
    assert argv[argv.index("--conf") + 1] == str((tmp_path / "conf").resolve())
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    # Each value goes back through --set's own parser unchanged.
    # ... and the parent alone serves metrics.
    assert [parse_override(s) for s in sets] == [*overrides, ("ops.prometheus.port", None)]
    assert argv[argv.index("--objects") + 1] == "Account,Contact"
    assert argv[argv.index("--for") + 1] == "30.0"
    assert "--stop-on-eof" in argv and argv[argv.index("--report-progress") + 1] == "1.0"
    assert "--for" not in spec.argv(objects=None, duration=None)
    # Logs and errors show the keys of --set, never a value (one may be a credential).
    shown = spec.shown(argv)
    assert "--set lake.location=... --set ingest.x=..." in shown and "/data/lake" not in shown
    assert "/data/lake" not in repr(spec)


def test_the_child_finds_this_copy_of_sfcdc_first_on_its_path() -> None:
    env = LandingProcess(Path("conf"), environ={"PYTHONPATH": "/opt/x", "HOME": "/h"}).env()
    root = str(Path(__file__).resolve().parents[3])
    assert env["PYTHONPATH"].split(":") == [root, "/opt/x"] and env["HOME"] == "/h"
    with pytest.raises(ValueError, match="progress_seconds"):
        LandingProcess(Path("conf"), progress_seconds=0)
