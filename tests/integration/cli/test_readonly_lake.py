"""A lake that cannot be written (a read-only file system; for a user other than root, a folder
without write permission): ``sfcdc ingest`` says so in one line naming the folder and the
cause, on a new lake and on one landed before. No traceback, no panic of delta-rs' runtime
while the process exits, and no lease "held by another landing" that is only a refused write."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.cli_env import cli_env

pytestmark = pytest.mark.integration

PIPELINE = """\
connection:
  emulator:
    keepalive_seconds: 0.3
    workload: {events: 30, platform_events: 0}
lake: {engine: local, location: ./lake}
"""


def _can_remount() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False, timeout=30)
    return probe.returncode == 0


@contextmanager
def _read_only(lake: Path) -> Iterator[list[str]]:
    """The command prefix that runs a process seeing ``lake`` read-only: a read-only bind
    mount of its own (root), or the folder without write permission (another user)."""
    if os.geteuid() == 0:
        if not _can_remount():
            pytest.skip("root without mount namespaces: no way to make a folder read-only")
        script = f'mount --bind "{lake}" "{lake}" && mount -o remount,ro,bind "{lake}" && exec "$@"'
        yield ["unshare", "-m", "sh", "-c", script, "sh"]
        return
    modes = {p: p.stat().st_mode for p in [lake, *lake.rglob("*")] if p.is_dir()}
    for path, mode in modes.items():
        path.chmod(stat.S_IMODE(mode) & ~0o222)
    try:
        yield []
    finally:
        for path, mode in modes.items():
            path.chmod(stat.S_IMODE(mode))


def _conf(root: Path) -> Path:
    conf = root / "conf"
    (conf / "objects").mkdir(parents=True)
    (conf / "pipeline.yml").write_text(PIPELINE)
    (conf / "objects" / "account.yml").write_text("object: Account\nkind: change_events\n")
    (root / "lake").mkdir()
    return conf


def _ingest(conf: Path, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    argv = [*prefix, sys.executable, "-m", "pipelines.cli", "-q", "ingest"]
    return subprocess.run(
        [*argv, "--conf", str(conf), "--once"],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=240,
        check=False,
    )


def _assert_one_clear_line(done: subprocess.CompletedProcess[str], lake: Path) -> None:
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    (line,) = lines
    assert line.startswith(f"sfcdc ingest: the lake at {lake} cannot be written: "), line
    assert "Read-only file system" in line or "Permission denied" in line, line


@pytest.mark.parametrize("landed_before", [False, True], ids=["new", "existing"])
def test_a_read_only_lake_is_one_clear_line(tmp_path: Path, landed_before: bool) -> None:
    conf = _conf(tmp_path)
    lake = tmp_path / "lake"
    if landed_before:
        first = _ingest(conf)
        assert first.returncode == 0, first.stderr
        assert (lake / "bronze" / "sfcdc_leases").is_dir()
    with _read_only(lake) as prefix:
        done = _ingest(conf, tuple(prefix))
    _assert_one_clear_line(done, lake)
