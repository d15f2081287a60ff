"""Progress of long work: a rich bar with rate and ETA when standard error is a terminal (seen
through a real pseudo-terminal), INFO log lines when it is not, nothing with -q."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipelines.progress import LogReporter, Progress, describe

ROOT = Path(__file__).resolve().parents[2]
# Entry-point style: configure once, then report work (0.9 s, so bars and lines both show).
SCRIPT = textwrap.dedent(
    """
    import logging, sys, time
    from pipelines.progress import configure, progress
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    configure("auto", interval=0.2, delay=0.1)
    with progress(total=300, unit="records", label="resync Account") as bar:
        for _ in range(6):
            time.sleep(0.15)
            bar.advance(50)
    print("done", file=sys.stderr, flush=True)
    """
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SFCDC_PROGRESS"}
    env.update(PYTHONPATH=str(ROOT), TERM="xterm-256color", COLUMNS="100", **extra)
    return env


def test_a_terminal_gets_a_bar_with_rate_and_eta() -> None:
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=_env(),
        close_fds=True,
    )
    os.close(follower)
    out = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 30)
        if not ready:
            break
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert proc.wait(timeout=30) == 0
    text = out.decode("utf-8", "replace")
    assert "done" in text
    assert "resync Account" in text and "300/300 records" in text
    assert "━" in text  # rich's bar
    assert "records/s" in text and "ETA" in text
    assert "\x1b[" in text  # drawn with terminal control sequences
    assert "INFO resync Account" not in text  # no log lines where a bar is drawn


def test_a_pipe_gets_log_lines_with_rate_and_eta() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        check=False,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "resync Account" in line]
    assert len(lines) >= 2
    assert all(line.startswith("INFO resync Account: ") for line in lines)
    assert any("records/s, ETA" in line for line in lines[:-1])
    assert "300/300 records (100%)" in lines[-1] and "done in" in lines[-1]
    assert "━" not in result.stderr and "\x1b[" not in result.stderr


def test_log_lines_come_every_interval_and_when_the_work_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    reporter = LogReporter(interval=10, delay=2, monotonic=lambda: now[0])
    caplog.set_level("INFO", logger="pipelines.progress")
    work = Progress(
        total=None, unit="events", label="landing", reporter=reporter, monotonic=lambda: now[0]
    )
    reporter.started(work)
    for _ in range(6):
        now[0] += 4
        work.advance(100)
    work.finish()
    messages = [r.getMessage() for r in caplog.records]
    # At 12 s (an interval passed), 24 s (another since the last line), and at the end.
    assert messages == [
        "landing: 300 events, 25 events/s, 12 s",
        "landing: 600 events, 25 events/s, 24 s",
        "landing: 600 events, 25 events/s, done in 24 s",
    ]
    assert describe(work) == messages[-1]
