"""``sfcdc demo``: the whole pipeline on a laptop in about a minute.

::

    sfcdc demo [--events 2000] [--seed 42] [--dir .sfcdc/demo] [--engine local|spark]

It writes a configuration to ``<dir>/conf`` (Account, Contact, Opportunity, Invoice__c and
the Order_Shipped__e platform event from the Pub/Sub API, and the PushTopic
``/topic/InvoiceUpdates`` on Invoice__c from the Streaming API), starts the built-in emulator
inside this process with TLS and OAuth (a client-credentials login, certificates verified
against the emulator's own CA), creates the PushTopic, generates a seeded workload (creates,
updates, deletes, long-text diffs, gap events: the PushTopic notifies its share of them),
runs ingest -> silver -> gold once into a fresh lake under ``<dir>/lake``, and prints what
landed where and a few queries with their results, the PushTopic's gold table next to the
change events' one. The same seed prints the same output,
timings apart. ``sfcdc sql --conf <dir>/conf`` explores the tables further. ``--engine
spark`` runs it on the spark engine (delta-spark; ``sfcdc delta-jars`` first).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.commands.sql import SqlShell, format_rows
from pipelines.run import Pipeline, RunResult
from pipelines.session import engine_for
from pipelines.spec import load_conf

__all__ = ["EXAMPLES", "Example", "register", "run", "write_conf"]

_OBJECTS = {
    "account": ("Account", "change_events"),
    "contact": ("Contact", "change_events"),
    "opportunity": ("Opportunity", "change_events"),
    "invoice": ("Invoice__c", "change_events"),
    "order_shipped": ("Order_Shipped__e", "platform_event"),
}
# The Streaming API object: a PushTopic sfcdc creates on the emulator before the workload.
_PUSHTOPIC = (
    "invoice_updates",
    "kind: streaming_api\n"
    "channel: /topic/InvoiceUpdates\n"
    "pushtopic:\n"
    "  manage: create_or_update\n"
    "  query: SELECT Id, Name, Status__c, Amount__c, Due_Date__c, Paid_At__c, Is_Paid__c\n"
    "    FROM Invoice__c\n"
    "  notify_for_fields: Referenced\n",
)
# What the demo creates under --dir; nothing else there is touched.
_OWNED = ("conf", "lake", "emulator", "spark.log")


@dataclass(frozen=True)
class Example:
    """A query the demo runs and prints, with what it shows."""

    title: str
    sql: str


EXAMPLES: tuple[Example, ...] = (
    Example(
        "Top accounts by annual revenue (gold: current state)",
        "SELECT Id, coalesce(Name, concat_ws(' ', Name_PersonName.FirstName, "
        "Name_PersonName.LastName)) AS Name, Industry, AnnualRevenue\n"
        "FROM gold.account WHERE NOT _cdc_is_deleted\n"
        "ORDER BY AnnualRevenue DESC NULLS LAST, Id LIMIT 5",
    ),
    Example(
        "Open opportunities by stage",
        "SELECT StageName, count(*) AS opportunities, round(sum(Amount), 2) AS amount\n"
        "FROM gold.opportunity WHERE NOT _cdc_is_deleted AND NOT IsClosed\n"
        "GROUP BY StageName ORDER BY amount DESC NULLS LAST, StageName",
    ),
    Example(
        "Records needing re-sync (gap events and the like)",
        "SELECT object, reason, count(DISTINCT record_id) AS records, count(*) AS events\n"
        "FROM gold.sfcdc_resync WHERE resolved_at IS NULL\n"
        "GROUP BY object, reason ORDER BY object, reason",
    ),
    Example(
        "The PushTopic's gold table (Streaming API) next to the change events' (Pub/Sub API)",
        "SELECT count(*) AS invoices, count_if(p._cdc_is_deleted) AS deleted,\n"
        "       count_if(p.Status__c <=> c.Status__c AND p.Amount__c <=> c.Amount__c\n"
        "                AND p._cdc_is_deleted <=> c._cdc_is_deleted) AS same_in_both\n"
        "FROM gold.invoice_updates p JOIN gold.invoice c USING (Id)",
    ),
    Example(
        "Largest open invoices, from the PushTopic's notifications",
        "SELECT Id, Name, Status__c, Amount__c, Due_Date__c, _cdc_last_change_type AS last\n"
        "FROM gold.invoice_updates WHERE NOT _cdc_is_deleted AND NOT Is_Paid__c\n"
        "ORDER BY Amount__c DESC NULLS LAST, Id LIMIT 5",
    ),
    Example(
        "Change history of the most changed account (silver: every change)",
        "SELECT _cdc_commit_timestamp AS committed, _cdc_change_type AS change,\n"
        "       array_join(_cdc_changed_fields, ', ') AS changed_fields, Rating\n"
        "FROM silver.account\n"
        "WHERE Id = (SELECT Id FROM silver.account GROUP BY Id\n"
        "            ORDER BY count(*) DESC, Id LIMIT 1)\n"
        "ORDER BY _cdc_commit_timestamp, _cdc_sequence_number LIMIT 10",
    ),
)


def register(subparsers: Any) -> None:
    """Add ``demo`` to the ``sfcdc`` command."""
    parser = subparsers.add_parser(
        "demo",
        help="run the pipeline end to end against the built-in emulator and show the result",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument(
        "--events",
        type=_count,
        default=2000,
        help="workload events to generate (change events and a few platform events; 2000)",
    )
    parser.add_argument("--seed", type=int, default=42, help="workload seed (42)")
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path(".sfcdc/demo"),
        help="where the demo's conf/ and lake/ go (default: .sfcdc/demo; its conf, lake and "
        "emulator directories are replaced)",
    )
    parser.add_argument(
        "--temp", action="store_true", help="use a temporary directory, removed at the end"
    )
    parser.add_argument(
        "--engine",
        choices=("local", "spark"),
        default="local",
        help="lake engine: local (delta-rs, the default) or spark (delta-spark in a local "
        "Spark session; resolve its jars once with `sfcdc delta-jars`)",
    )
    parser.set_defaults(handler=run)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number (got {text!r})") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1 (got {text!r})")
    return value


def write_conf(directory: Path, *, events: int, seed: int, engine: str = "local") -> Path:
    """Write the demo's ``conf/`` under ``directory`` (lake ``engine``) and return its path."""
    conf = directory / "conf"
    (conf / "objects").mkdir(parents=True, exist_ok=True)
    (conf / "pipeline.yml").write_text(
        "# Written by `sfcdc demo`: the built-in emulator in this process, TLS and OAuth on.\n"
        "connection:\n"
        "  source: emulator\n"
        "  emulator:\n"
        f"    seed: {seed}\n"
        "    state_dir: ./emulator\n"
        "    keepalive_seconds: 0.5\n"
        "    tls:\n"
        "      enabled: true\n"
        "    workload:\n"
        f"      events: {events}\n"
        f"      platform_events: {max(1, events // 10)}\n"
        "lake:\n"
        f"  engine: {engine}\n"
        "  location: ./lake\n"
    )
    for name, (api_name, kind) in _OBJECTS.items():
        (conf / "objects" / f"{name}.yml").write_text(f"object: {api_name}\nkind: {kind}\n")
    name, text = _PUSHTOPIC
    (conf / "objects" / f"{name}.yml").write_text(text)
    return conf


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    # The JVM writes its start-up banner and warnings straight to file descriptor 2; they
    # would bury the demo's output, so they go to a log file while Spark starts.
    sys.stderr.flush()
    saved = os.dup(2)
    with path.open("ab") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def summary(result: RunResult, shell: SqlShell, seconds: float) -> list[str]:
    """The demo's report: what landed, what silver and gold hold, and what needs re-sync."""
    lines = [f"sfcdc demo: pipeline ran once in {seconds:.1f} s", "", "bronze (events landed):"]
    landed = [*result.landing.topics, *(result.streaming.topics if result.streaming else ())]
    for t in sorted(landed, key=lambda t: t.topic):
        lines.append(f"  {t.topic:<32} {t.events:>6} events -> {t.table}")
    lines.append("silver (decoded rows, one per record and change):")
    for p in result.passes:
        for topic in p.silver.topics:
            for decoded in topic.objects:
                lines.append(f"  {decoded.object:<32} {decoded.rows:>6} rows   -> {decoded.table}")
        for stream in p.streaming.silver.streams if p.streaming else ():
            lines.append(f"  {stream.stream:<32} {stream.rows:>6} rows   -> {stream.table}")
    lines.append("gold (current state):")
    for p in result.passes:
        streamed = p.streaming.gold.objects if p.streaming else ()
        for obj in (*p.gold.objects, *streamed):
            counts = shell.query(
                f"SELECT count(*) AS n, count_if(_cdc_is_deleted) AS deleted, "
                f"count_if(_cdc_needs_resync) AS resync FROM {obj.table}"
            ).rows[0]
            lines.append(
                f"  {obj.object:<32} {counts[0]:>6} records -> {obj.table} ({counts[1]} "
                f"deleted, {counts[2]} needing re-sync)"
            )
    silver_tables = [str(o.silver_table) for p in result.passes for o in p.gold.objects]
    if silver_tables:
        union = "\nUNION ALL\n".join(
            f"SELECT _cdc_change_type AS change, size(_cdc_diff_fields) > 0 AS diff FROM {t}"
            for t in silver_tables
        )
        kinds = shell.query(
            f"SELECT change, count(*) AS n, count_if(diff) AS diffs FROM ({union}) "
            "GROUP BY change ORDER BY change"
        ).rows
        diffs = sum(row[2] for row in kinds)
        lines.append(
            "changes in silver: "
            + ", ".join(f"{n} {change}" for change, n, _ in kinds)
            + f"; {diffs} with long-text diffs"
        )
    quarantined = result.quarantined + sum(
        p.streaming.silver.quarantined for p in result.passes if p.streaming
    )
    open_resync = shell.query(
        "SELECT count(*) FROM gold.sfcdc_resync WHERE resolved_at IS NULL"
    ).rows[0][0]
    lines.append(f"quarantined rows: {quarantined}; open re-sync rows: {open_resync}")
    return lines


def run(args: argparse.Namespace) -> int:
    """Run the demo as ``args`` say."""
    if not getattr(args, "verbose", 0):
        # The summary is the demo's output; per-step progress is one -v away.
        logging.getLogger().setLevel(logging.WARNING)
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    with contextlib.ExitStack() as stack:
        if args.temp:
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sfcdc-")))
        else:
            directory = args.dir
        return _demo(
            directory.absolute(),
            events=args.events,
            seed=args.seed,
            temp=args.temp,
            engine=args.engine,
        )
    raise AssertionError("unreachable")  # pragma: no cover


def _demo(
    directory: Path, *, events: int, seed: int, temp: bool = False, engine: str = "local"
) -> int:
    started = time.monotonic()
    directory.mkdir(parents=True, exist_ok=True)
    for name in _OWNED:
        path = directory / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    conf_dir = write_conf(directory, events=events, seed=seed, engine=engine)
    conf = load_conf(conf_dir)
    log = directory / "spark.log"

    def lake_engine(*, sql: bool = False) -> Any:
        with _stderr_to(log):
            return engine_for(conf.pipeline.lake, sql=sql)

    print(
        f"sfcdc demo: {events} workload events (seed {seed}) from the in-process emulator over "
        f"TLS with an OAuth login; lake at {directory / 'lake'}",
        flush=True,
    )
    # Spark's JVM before the emulator and the client start: launched while their gRPC threads
    # run, it sometimes exited before answering (JAVA_GATEWAY_EXITED, 3 demos in 8 here).
    sql_engine = lake_engine(sql=True)
    pipeline = Pipeline(conf, engine=lake_engine)
    result = pipeline.run_once()
    shell = SqlShell(sql_engine)
    lines = summary(result, shell, result.seconds)
    for line in lines:
        print(line)
    for example in EXAMPLES:
        print()
        print(f"-- {example.title}")
        print(example.sql)
        print(format_rows(shell.query(example.sql)))
    print()
    if temp:
        print("The lake was in a temporary directory and is removed now; without --temp it stays")
        print("under .sfcdc/demo for `sfcdc sql --conf .sfcdc/demo/conf`.")
    else:
        print(f'Explore further:  sfcdc sql --conf {_shown(conf_dir)} "SELECT * FROM gold.account"')
        print(f"Interactive:      sfcdc sql --conf {_shown(conf_dir)}")
        print(f"Re-sync flagged:  sfcdc resync --conf {_shown(conf_dir)}")
    print(f"Done in {time.monotonic() - started:.1f} s.")
    return 0


def _shown(path: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd()))
    return str(path)
