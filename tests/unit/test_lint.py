"""The tree stays lint-clean, formatted, and type-checked (strict for ``ingest``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TARGETS = [
    d for d in ("ingest", "pipelines", "tests", "benchmarks", "notebooks") if (ROOT / d).is_dir()
]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False)


@pytest.mark.skipif(
    shutil.which("ruff") is None and not (Path(sys.prefix) / "bin" / "ruff").exists(),
    reason="ruff is a dev dependency",
)
def test_ruff_lint_and_format() -> None:
    ruff = shutil.which("ruff") or str(Path(sys.prefix) / "bin" / "ruff")
    lint = _run(ruff, "check", *TARGETS)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = _run(ruff, "format", "--check", *TARGETS)
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_mypy() -> None:
    pytest.importorskip("mypy")
    result = _run(sys.executable, "-m", "mypy", "ingest", "pipelines")
    assert result.returncode == 0, result.stdout + result.stderr


def test_tests_name_the_error_they_expect() -> None:
    # pytest.raises(Exception) passes for any failure, a TypeError from a typo included; the
    # errors sfcdc raises on purpose are the classes of ingest/errors.py.
    import ast

    vague = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if "node_modules" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "raises"
                and node.args
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id in ("Exception", "BaseException")
            ):
                vague.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert vague == [], f"pytest.raises(Exception) where a named error is meant: {vague}"
