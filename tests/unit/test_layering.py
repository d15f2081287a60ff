"""Dependencies point one way: ``pipelines`` may import ``ingest``; ``ingest`` never imports
Spark, Delta or ``pipelines``; notebooks hold no logic of their own."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN_IN_INGEST = ("pyspark", "delta", "deltalake", "pipelines", "py4j", "pyarrow", "pandas")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_ingest_never_imports_spark_delta_or_pipelines() -> None:
    offenders = []
    for path in sorted((ROOT / "ingest").rglob("*.py")):
        for name in _imports(path):
            if name.split(".")[0] in FORBIDDEN_IN_INGEST:
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, "\n".join(offenders)


def test_library_code_never_configures_logging() -> None:
    offenders = []
    for package in ("ingest", "pipelines"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "cli.py":
                continue
            if "logging.basicConfig" in path.read_text():
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"only the CLI configures logging: {offenders}"
