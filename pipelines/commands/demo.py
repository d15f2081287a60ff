"""``sfcdc demo``: the whole pipeline on a laptop in under a minute.

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
change events' one. The queries are answered as a one-shot ``sfcdc sql`` answers them (on the
local engine by DataFusion, with no Spark session), so each runs there as printed; one whose
tables a small workload left without events says so instead. The same seed prints the same
output, timings apart. ``sfcdc sql --conf <dir>/conf`` explores the tables further and
``sfcdc status --conf <dir>/conf`` shows where each object stands. ``--engine spark`` runs it
on the spark engine (delta-spark; ``sfcdc delta-jars`` first).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.bronze.tables import CHECKPOINT_TABLE
from pipelines.commands.empty_lake import DEMO_DIR, shown_path
from pipelines.commands.sql import SqlShell, format_rows
from pipelines.engines.base import TableRef
from pipelines.gold.resync import RESYNC_TABLE
from pipelines.run import Pipeline, RunResult
from pipelines.session import engine_for
from pipelines.spec.load import load_conf

__all__ = ["EXAMPLES", "Example", "missing_tables", "register", "run", "summary", "write_conf"]

CHECKPOINTS = TableRef("bronze", CHECKPOINT_TABLE)

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

    @property
    def tables(self) -> tuple[str, ...]:
        """The layer-qualified tables the query names (``gold.account``), in order."""
        found = re.findall(r"\b((?:bronze|silver|gold)\.\w+)", self.sql)
        return tuple(dict.fromkeys(found))


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
        "SELECT count(*) AS invoices,\n"
        "       count(*) FILTER (WHERE p._cdc_is_deleted) AS deleted,\n"
        "       count(*) FILTER (WHERE p.Status__c <=> c.Status__c\n"
        "                        AND p.Amount__c <=> c.Amount__c\n"
        "                        AND p._cdc_is_deleted <=> c._cdc_is_deleted) AS same_in_both\n"
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
        "ORDER BY _cdc_commit_timestamp, _cdc_commit_number, _cdc_sequence_number LIMIT 10",
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
        default=DEMO_DIR,
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
    """The demo's report: what landed, what silver and gold hold, and what needs re-sync.
    A workload small enough to leave an object without events leaves it out of silver and
    gold; the report says what there is."""
    engine = shell.engine
    lines = [f"sfcdc demo: pipeline ran once in {seconds:.1f} s", "", "bronze (events landed):"]
    landed = [*result.landing.topics, *(result.streaming.topics if result.streaming else ())]
    for t in sorted(landed, key=lambda t: t.topic):
        lines.append(f"  {t.topic:<32} {t.events:>6} events -> {t.table}")
    lines.append("silver (decoded rows, one per record and change):")
    decoded = []
    for p in result.passes:
        for topic in p.silver.topics:
            for obj in topic.objects:
                decoded.append(f"  {obj.object:<32} {obj.rows:>6} rows   -> {obj.table}")
        for stream in p.streaming.silver.streams if p.streaming else ():
            decoded.append(f"  {stream.stream:<32} {stream.rows:>6} rows   -> {stream.table}")
    lines.extend(decoded or ["  (none: no events landed)"])
    lines.append("gold (current state):")
    current = []
    for p in result.passes:
        streamed = p.streaming.gold.objects if p.streaming else ()
        for gold in (*p.gold.objects, *streamed):
            if not engine.exists(gold.table):
                continue
            counts = shell.query(
                "SELECT count(*) AS n, count(*) FILTER (WHERE _cdc_is_deleted) AS deleted, "
                f"count(*) FILTER (WHERE _cdc_needs_resync) AS resync FROM {gold.table}"
            ).rows[0]
            current.append(
                f"  {gold.object:<32} {counts[0]:>6} records -> {gold.table} ({counts[1]} "
                f"deleted, {counts[2]} needing re-sync)"
            )
    lines.extend(current or ["  (none: no change events landed)"])
    silver_tables = [
        str(o.silver_table)
        for p in result.passes
        for o in p.gold.objects
        if engine.exists(o.silver_table)
    ]
    if silver_tables:
        union = "\nUNION ALL\n".join(
            f"SELECT _cdc_change_type AS kind, cardinality(_cdc_diff_fields) > 0 AS diff FROM {t}"
            for t in silver_tables
        )
        kinds = shell.query(
            "SELECT kind, count(*) AS n, count(*) FILTER (WHERE diff) AS diffs "
            f"FROM ({union}) AS changes GROUP BY kind ORDER BY kind"
        ).rows
        diffs = sum(row[2] for row in kinds)
        lines.append(
            "changes in silver: "
            + ", ".join(f"{n} {kind}" for kind, n, _ in kinds)
            + f"; {diffs} with long-text diffs"
        )
    quarantined = result.quarantined + sum(
        p.streaming.silver.quarantined for p in result.passes if p.streaming
    )
    open_resync = shell.query(
        f"SELECT count(*) AS n FROM {RESYNC_TABLE} WHERE resolved_at IS NULL"
    ).rows[0][0]
    lines.append(f"quarantined rows: {quarantined}; open re-sync rows: {open_resync}")
    return lines


def missing_tables(example: Example, shell: SqlShell) -> list[str]:
    """The tables ``example`` names that the lake does not have (a small workload made no
    events for their object)."""
    return [t for t in example.tables if t not in shell.tables]


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

    def lake_engine() -> Any:
        with _stderr_to(log):
            return engine_for(conf.pipeline.lake)

    print(
        f"sfcdc demo: a workload of {events} event{'' if events == 1 else 's'} (seed {seed}) "
        f"from the in-process emulator over TLS with an OAuth login; lake at {directory / 'lake'}",
        flush=True,
    )
    # Spark's JVM (spark engine) before the emulator and the client start: launched while
    # their gRPC threads run, it sometimes exited before answering (JAVA_GATEWAY_EXITED, 3
    # demos in 8 here).
    lake = lake_engine()
    pipeline = Pipeline(conf, engine=lambda: lake)
    result = pipeline.run_once()
    # The queries are answered as a one-shot `sfcdc sql` answers them (on the local engine:
    # DataFusion, no Spark session), so each one printed here runs there as printed.
    shell = SqlShell(lake, arrow=True)
    for line in summary(result, shell, result.seconds):
        print(line)
    for example in EXAMPLES:
        print()
        print(f"-- {example.title}")
        missing = missing_tables(example, shell)
        if missing:
            print(
                f"(not run: no {' or '.join(missing)}; this workload made no events for it, a "
                "larger --events will)"
            )
            continue
        print(example.sql)
        print(format_rows(shell.query(example.sql)))
    print()
    if temp:
        print("The lake was in a temporary directory and is removed now; without --temp it stays")
        print("under .sfcdc/demo for `sfcdc sql --conf .sfcdc/demo/conf`.")
    else:
        shown = shown_path(conf_dir)
        print(f'Explore further:  sfcdc sql --conf {shown} "SELECT * FROM {_explore(shell)}"')
        print(f"Interactive:      sfcdc sql --conf {shown}")
        print(f"Where it stands:  sfcdc status --conf {shown}")
        print(f"Re-sync flagged:  sfcdc resync --conf {shown}")
    print(f"Done in {time.monotonic() - started:.1f} s.")
    return 0


def _explore(shell: SqlShell) -> str:
    """A table worth a look: Account's gold table, else another gold one, else a silver one,
    else the landing checkpoints."""
    objects = [t for t in shell.tables if not t.split(".", 1)[-1].startswith("sfcdc_")]
    for layer in ("gold", "silver"):
        named = [t for t in objects if t.startswith(f"{layer}.")]
        if named:
            return "gold.account" if "gold.account" in named else named[0]
    return str(CHECKPOINTS)
