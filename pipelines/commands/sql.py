"""``sfcdc sql``: query the lake's tables by name.

::

    sfcdc sql "SELECT Name, AnnualRevenue FROM gold.account ORDER BY AnnualRevenue DESC LIMIT 5"
    sfcdc sql --format csv "SELECT * FROM gold.sfcdc_resync"
    sfcdc sql                         # interactive: \\tables, \\d <table>, \\q

Every bronze, silver and gold table of ``lake.location`` (quarantine and re-sync tables
included) is registered under ``<schema>.<table>`` (``gold.account``,
``silver.sfcdc_quarantine``, ``gold.sfcdc_resync``). An unknown table or a SQL error prints
the reason and the known tables, and exits with status 1.

A one-shot query on the local engine is answered by delta-rs's DataFusion, in about a second
with no Spark session; ``--spark-sql`` and the interactive prompt use Spark SQL (the spark
engine always does). docs/querying.md lists where the two dialects differ.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ingest.errors import LakeError
from pipelines.commands.conf_options import add_conf_options, conf_from_args
from pipelines.commands.empty_lake import empty_lake_note
from pipelines.engines.base import TableRef
from pipelines.session import engine_for
from pipelines.spec.conf import Conf

if TYPE_CHECKING:
    from pipelines.engines.base import LakeEngine

__all__ = [
    "OutputFormat",
    "QueryError",
    "Result",
    "SqlShell",
    "format_rows",
    "register",
    "run",
    "shell",
]

OutputFormat = Literal["text", "csv", "json"]
_HISTORY = Path.home() / ".cache" / "sfcdc" / "sql_history"
_MAX_CELL = 60


def register(subparsers: Any) -> None:
    """Add ``sql`` to the ``sfcdc`` command."""
    parser = subparsers.add_parser(
        "sql",
        help="query bronze/silver/gold/quarantine/re-sync tables with SQL (or interactively)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("query", nargs="?", help="a SQL query; without one, an interactive prompt")
    add_conf_options(parser)
    parser.add_argument(
        "--format",
        choices=("text", "csv", "json"),
        default="text",
        help="output format (default: an aligned text table)",
    )
    parser.add_argument(
        "--max-rows",
        type=int,
        default=1000,
        metavar="N",
        help="print at most N rows (default: 1000)",
    )
    parser.add_argument(
        "--spark-sql",
        action="store_true",
        help="answer a one-shot query with Spark SQL on the local engine too (starts a Spark "
        "session; for functions DataFusion lacks, see docs/querying.md)",
    )
    parser.set_defaults(handler=run)


class QueryError(Exception):
    """A query failed: ``str()`` is the short reason, without the JVM's stack trace."""


@dataclass(frozen=True)
class Result:
    """Rows of a query, at most ``max_rows`` of them; ``truncated`` if there were more."""

    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    truncated: bool


def _cell(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, list | tuple):
        return [_cell(v) for v in value]
    if isinstance(value, dict):
        return {k: _cell(v) for k, v in value.items()}
    if hasattr(value, "asDict"):  # a Spark Row (struct column)
        return {k: _cell(v) for k, v in value.asDict().items()}
    return value


def _text(value: Any) -> str:
    value = _cell(value)
    if value is None:
        return "NULL"
    if isinstance(value, list | dict):
        text = json.dumps(value, default=str)
    elif isinstance(value, float):
        text = f"{value:.2f}" if abs(value) < 1e15 else repr(value)
    else:
        text = str(value)
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= _MAX_CELL else text[: _MAX_CELL - 1] + "…"


def _csv(value: Any) -> Any:
    value = _cell(value)
    if value is None:
        return ""
    return json.dumps(value) if isinstance(value, list | dict) else value


def format_rows(result: Result, fmt: OutputFormat = "text") -> str:
    """``result`` as an aligned text table (numbers right-aligned), CSV or a JSON array."""
    if fmt == "json":
        records = [dict(zip(result.columns, map(_cell, row), strict=True)) for row in result.rows]
        return json.dumps(records, indent=2, default=str)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(result.columns)
        for row in result.rows:
            writer.writerow([_csv(v) for v in row])
        return out.getvalue().rstrip("\n")
    cells = [[_text(v) for v in row] for row in result.rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(result.columns)]
    numeric = [
        all(isinstance(row[i], int | float | Decimal) or row[i] is None for row in result.rows)
        and any(row[i] is not None for row in result.rows)
        for i in range(len(result.columns))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return " | ".join(parts).rstrip()

    lines = [line(result.columns), "-+-".join("-" * w for w in widths)]
    lines.extend(line(r) for r in cells)
    count = len(result.rows)
    more = f", first {count} shown" if result.truncated else ""
    lines.append(f"({count} row{'s' if count != 1 else ''}{more})")
    return "\n".join(lines)


def _plain(qualified: str) -> str:
    return qualified.replace("`", "")


def _short(exc: BaseException) -> str:
    # Spark's messages carry the analysed plan and a JVM trace after the first lines.
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return first.split(" SQLSTATE:")[0].strip()


class SqlShell:
    """Queries over an engine's tables, registered by name when the shell is created.

    With ``arrow=True`` each query is answered by the engine's :meth:`~pipelines.engines.
    LakeEngine.query_arrow` over the tables it names (on the local engine: DataFusion, no
    Spark session); otherwise by Spark SQL (:meth:`~pipelines.engines.LakeEngine.sql`).
    ``empty_note`` is what errors say when the lake has no tables at all.
    """

    def __init__(
        self,
        engine: LakeEngine,
        *,
        max_rows: int = 1000,
        arrow: bool = False,
        empty_note: str | None = None,
    ) -> None:
        self.engine = engine
        self.max_rows = max_rows
        self.arrow = arrow
        self._empty_note = empty_note
        # Registering a table may cost a Spark round trip or two; only the tables a query
        # names are registered, when it first names them.
        self._pending: dict[str, TableRef] = {
            _plain(engine.qualified_name(t)): t for t in engine.tables()
        }
        self.tables: list[str] = list(self._pending)
        self._patterns = {
            name: re.compile(
                r"(?<![\w`.])`?"
                + r"`?\s*\.\s*`?".join(map(re.escape, name.split(".")))
                + r"`?(?![\w`])",
                re.IGNORECASE,
            )
            for name in self.tables
        }

    def _named(self, sql: str, among: dict[str, TableRef]) -> list[TableRef]:
        return [ref for name, ref in among.items() if self._patterns[name].search(sql) is not None]

    def _register(self, sql: str) -> None:
        wanted = self._named(sql, self._pending)
        if wanted:
            self.engine.register_sql(wanted)
            for ref in wanted:
                self._pending.pop(_plain(self.engine.qualified_name(ref)), None)

    def known(self) -> str:
        """The registered tables, for error messages (``empty_note`` when there are none)."""
        if not self.tables:
            return self._empty_note or "no tables exist yet (run `sfcdc run --once` first)"
        return "known tables: " + ", ".join(self.tables)

    def query(self, sql: str) -> Result:
        """Run ``sql``; a failure raises :class:`QueryError` naming the known tables."""
        if self.arrow:
            return self._query_arrow(sql)
        from pyspark.errors import PySparkException

        try:
            self._register(sql)
            frame = self.engine.sql(sql)
            columns = tuple(frame.columns)
            rows = frame.limit(self.max_rows + 1).collect()
        except PySparkException as exc:
            raise QueryError(f"{_short(exc)}\n{self.known()}") from None
        except Exception as exc:  # py4j errors and the like: still no JVM trace for the user
            raise QueryError(f"{_short(exc)}\n{self.known()}") from None
        return Result(
            columns,
            tuple(tuple(r) for r in rows[: self.max_rows]),
            truncated=len(rows) > self.max_rows,
        )

    def _query_arrow(self, sql: str) -> Result:
        every = {_plain(self.engine.qualified_name(t)): t for t in self.engine.tables()}
        try:
            table = self.engine.query_arrow(sql, self._named(sql, every), limit=self.max_rows + 1)
        except LakeError as exc:
            raise QueryError(f"{exc}\n{self.known()}") from None
        columns = tuple(table.column_names)
        values = [table.column(i).to_pylist() for i in range(table.num_columns)]
        rows = list(zip(*values, strict=True)) if values else []
        return Result(
            columns,
            tuple(tuple(r) for r in rows[: self.max_rows]),
            truncated=len(rows) > self.max_rows,
        )

    def describe(self, table: str) -> Result:
        """Columns and types of ``table``."""
        name = table.strip().rstrip(";")
        if name not in self.tables:
            raise QueryError(f"no table {name!r}\n{self.known()}")
        self._register(name)
        frame = self.engine.sql(f"SELECT * FROM {name} LIMIT 0")
        rows = tuple((f.name, f.dataType.simpleString(), f.nullable) for f in frame.schema.fields)
        return Result(("column", "type", "nullable"), rows, truncated=False)

    def interact(
        self,
        *,
        read_line: Callable[[str], str] = input,
        write: Callable[[str], None] = print,
        fmt: OutputFormat = "text",
    ) -> int:
        """A prompt: SQL (ending with ``;`` or a blank line), ``\\tables``, ``\\d <table>``,
        ``\\q``. Returns 0; errors are printed and the prompt continues."""
        write(f"sfcdc sql: {self.known()}")
        write("end a query with ';'; \\tables lists tables, \\d <table> describes one, \\q quits")
        buffer: list[str] = []
        while True:
            try:
                text = read_line("sql> " if not buffer else "...> ")
            except EOFError:
                write("")
                return 0
            stripped = text.strip()
            if not buffer and stripped in ("\\q", "quit", "exit"):
                return 0
            if not buffer and stripped == "\\tables":
                write("\n".join(self.tables) if self.tables else self.known())
                continue
            if not buffer and stripped.startswith("\\d"):
                try:
                    write(format_rows(self.describe(stripped[2:]), fmt))
                except QueryError as exc:
                    write(f"error: {exc}")
                continue
            if stripped:
                buffer.append(text)
            if not buffer or (stripped and not stripped.endswith(";")):
                continue
            sql = "\n".join(buffer).strip().rstrip(";")
            buffer = []
            try:
                write(format_rows(self.query(sql), fmt))
            except QueryError as exc:
                write(f"error: {exc}")


def shell(conf: Conf, *, max_rows: int = 1000) -> SqlShell:
    """A shell over the tables of ``conf``'s lake (starts a local Spark session if needed)."""
    return SqlShell(
        engine_for(conf.pipeline.lake, sql=True),
        max_rows=max_rows,
        empty_note=empty_lake_note(conf, "sql"),
    )


def _readline_input() -> Callable[[str], str]:
    try:
        import readline
    except ImportError:  # not every platform has it; the prompt works without history
        return input
    import atexit
    import contextlib

    _HISTORY.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        readline.read_history_file(_HISTORY)
    readline.set_history_length(1000)
    atexit.register(readline.write_history_file, _HISTORY)
    return input


def run(args: argparse.Namespace) -> int:
    """Run ``args.query`` (or the interactive prompt) against the lake of ``args.conf``."""
    if args.max_rows < 1:
        print(f"sfcdc sql: --max-rows must be >= 1 (got {args.max_rows})", file=sys.stderr)
        return 2
    # PySpark logs every failed query with its JVM trace; the reason is printed below instead.
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    conf = conf_from_args(args)
    if args.query is None:
        sh = shell(conf, max_rows=args.max_rows)
        return sh.interact(read_line=_readline_input(), fmt=args.format)
    if args.spark_sql:
        sh = shell(conf, max_rows=args.max_rows)
    else:
        # One query: the engine answers it without starting Spark when it can (local engine).
        sh = SqlShell(
            engine_for(conf.pipeline.lake),
            max_rows=args.max_rows,
            arrow=True,
            empty_note=empty_lake_note(conf, "sql"),
        )
    try:
        result = sh.query(args.query)
    except QueryError as exc:
        print(f"sfcdc sql: {exc}", file=sys.stderr)
        return 1
    print(format_rows(result, args.format))
    return 0
