"""``pip install sfcdc`` without extras has neither pyspark, delta-spark, delta-rs nor pandas:
``sfcdc --help``, ``validate``, ``emulator serve --help`` and ``publish --help`` work, and a
command that needs an extra names it. The commands run in a process of their own where
importing an extra's package fails as it does when it is not installed (CI also installs the
wheel without extras into a virtualenv of its own and runs these commands: .ci/run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

# The packages the extras of pyproject.toml bring (local: pyspark, py4j, delta-rs, pandas;
# spark: delta-spark).
EXTRAS = ("delta", "deltalake", "pandas", "py4j", "pyspark")
ROOT = Path(__file__).resolve().parents[3]
COMMANDS = {
    "help": ["--help"],
    "validate": ["validate", "--conf", "conf/"],
    "emulator": ["emulator", "serve", "--help"],
    "publish": ["publish", "--help"],
    "ingest": ["ingest", "--conf", "conf/", "--once"],
}
WITHOUT_EXTRAS = f"""
import contextlib, importlib.abc, io, json, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {sorted(EXTRAS)!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
from pipelines.cli import main
results = {{}}
for name, argv in {COMMANDS!r}.items():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    results[name] = {{"code": code, "out": out.getvalue(), "err": err.getvalue()}}
leaked = sorted(m for m in sys.modules if m.split(".")[0] in {sorted(EXTRAS)!r})
print(json.dumps({{"results": results, "leaked": leaked}}))
"""


def _run() -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return report


def test_commands_need_an_extra_only_where_they_say_so() -> None:
    report = _run()
    results = report["results"]
    for name, says in (
        ("help", "validate"),
        ("validate", "valid;"),
        ("emulator", "--keepalive-seconds"),
        ("publish", "JSON lines"),
    ):
        assert results[name]["code"] in (0, None), (name, results[name]["err"])
        assert says in results[name]["out"], (name, results[name]["out"])
    assert "ingest       (needs pip install 'sfcdc[local]')" in results["help"]["out"]
    ingest = results["ingest"]
    assert ingest["code"] == 2
    assert "sfcdc ingest needs pyspark" in ingest["err"], ingest["err"]
    assert "pip install 'sfcdc[local]'" in ingest["err"]
    assert report["leaked"] == []
