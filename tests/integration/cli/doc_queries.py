"""The queries the repository shows its users, read from where they are shown, so the tests
that run them stay true when the documents change: ```sql blocks and ``sfcdc sql "SELECT ..."``
commands of Markdown files, the datasets of the bundle's dashboards and the queries of its
alerts (with the bundle's catalog and schema variables resolved to a local lake's layer
schemas)."""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from pipelines.commands.sql import Result

__all__ = [
    "ROOT",
    "alert_queries",
    "bundle_queries",
    "comparable_rows",
    "dashboard_queries",
    "markdown_queries",
    "named_tables",
]

ROOT = Path(__file__).resolve().parents[3]
_LAYER_VAR = re.compile(r"\$\{var\.(bronze|silver|gold)_schema\}")
_TABLE = re.compile(r"(?<![\w`.])((?:bronze|silver|gold)\.\w+)", re.IGNORECASE)


def markdown_queries(path: Path) -> list[str]:
    """Every query of ``path``: each statement of its ```sql blocks, then the queries of its
    ``sfcdc sql "SELECT ..."`` commands (not placeholders such as ``"<query>"``)."""
    text = path.read_text()
    found = []
    for block in re.findall(r"```sql\n(.*?)```", text, re.DOTALL):
        found.extend(q.strip() for q in block.split(";") if q.strip())
    found.extend(re.findall(r'sfcdc sql[^"\n]* "(SELECT [^"]+)"', text, re.IGNORECASE))
    return found


def _local(sql: str) -> str:
    """``sql`` as it reads on a local lake: no catalog, the layers' schemas by their names."""
    return _LAYER_VAR.sub(r"\1", sql.replace("${var.catalog}.", ""))


def dashboard_queries() -> list[tuple[str, str]]:
    """(dashboard dataset, query) of every dashboard of the bundle. A dashboard's queries name
    its tables alone; its resource's ``dataset_schema`` places them, so they are qualified
    with that schema here."""
    found = []
    for resource in sorted((ROOT / "resources").glob("*.dashboard.yml")):
        dashboards = yaml.safe_load(resource.read_text())["resources"]["dashboards"]
        for name, spec in dashboards.items():
            schema = _local(spec["dataset_schema"])
            document = json.loads((resource.parent / spec["file_path"]).read_text())
            for dataset in document["datasets"]:
                sql = "".join(dataset["queryLines"])
                qualified = re.sub(r"(?<![\w`.])(sfcdc_\w+)\b", rf"{schema}.\1", sql)
                found.append((f"{name}: {dataset['name']}", qualified))
    return found


def alert_queries() -> list[tuple[str, str]]:
    """(alert, query) of every alert of the bundle."""
    found = []
    for resource in sorted((ROOT / "resources").glob("*.alert.yml")):
        alerts = yaml.safe_load(resource.read_text())["resources"]["alerts"]
        found.extend((name, _local(spec["query_text"])) for name, spec in alerts.items())
    return found


def bundle_queries() -> list[tuple[str, str]]:
    """The dashboards' and the alerts' queries."""
    return [*dashboard_queries(), *alert_queries()]


def named_tables(sql: str) -> set[str]:
    """The layer-qualified tables ``sql`` names, lower-cased (``gold.sfcdc_resync``)."""
    return {t.lower() for t in _TABLE.findall(sql)}


def _value(value: Any) -> Any:
    if hasattr(value, "asDict"):  # a Spark Row (struct)
        value = value.asDict()
    if isinstance(value, dict):
        return tuple(sorted((k, _value(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_value(v) for v in value)
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(timezone.utc).replace(tzinfo=None)
    if isinstance(value, float):
        return float(f"{value:.9g}") if math.isfinite(value) else value
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def comparable_rows(result: Result, ordered: bool) -> list[Any]:
    """The rows of a query's ``result`` in a form that compares across SQL engines (Spark
    rows and structs as tuples, timestamps naive UTC, floats to 9 digits); sorted unless the
    query ``ordered`` them."""
    rows = [tuple(_value(v) for v in row) for row in result.rows]
    return rows if ordered else sorted(rows, key=repr)
