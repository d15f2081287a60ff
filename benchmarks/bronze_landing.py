"""Bronze landing throughput against the emulator, next to the client's raw receive rate.

The emulator runs in its own process, as a remote server would, holding a backlog of 1 KB
events on one topic. Two clients then read the whole backlog from EARLIEST, each in a fresh
process of its own so that each reports its own peak memory:

- ceiling: the sfcdc client alone (``MultiSubscription`` over one ``Subscription``, the loop
  landing uses), counting events: what landing could reach at best on this machine;
- landing: ``BronzeLanding`` with the local engine (delta-rs, no JVM) and the default batching,
  into a fresh lake: events built into Arrow columns, registered schema, bronze commit and
  checkpoint commit per batch. Timed until the last event is committed in Delta (the last,
  partial batch is committed as soon as its events are received).

Both rows also show CPU per event of the measured process and of the emulator serving it
(they share the machine's cores), and the load average is printed: other work on the machine
moves both rates.

Target: landing >= 100,000 events/s sustained over >= 1,000,000 events. Payloads carry random
printable text (1 KB each, none alike): close to the worst case for Parquet compression.

    python benchmarks/bronze_landing.py [--events 1000000] [--size 1024]
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ingest.emulator.topics import Catalogue, EmittedEvent, TopicDef  # noqa: E402
from ingest.schema import parse_event_schema  # noqa: E402

TOPIC = "/event/Bench_Event__e"
TARGET = 100_000
SCHEMA = parse_event_schema(
    json.dumps(
        {
            "type": "record",
            "name": "Bench_Event__e",
            "namespace": "com.sforce.eventbus",
            "fields": [
                {"name": "CreatedDate", "type": "long", "doc": "CreatedDate:DateTime"},
                {"name": "CreatedById", "type": "string", "doc": "CreatedBy:EntityId"},
                {"name": "Body__c", "type": ["null", "string"], "default": None},
            ],
        }
    )
)


def _zigzag(value: int) -> bytes:
    encoded = (value << 1) ^ (value >> 63)
    out = bytearray()
    while encoded > 0x7F:
        out.append((encoded & 0x7F) | 0x80)
        encoded >>= 7
    out.append(encoded)
    return bytes(out)


def _payloads(count: int, size: int) -> list[bytes]:
    """Avro records of the schema above, ``size`` bytes each, with random text bodies (written
    by hand: fastavro would take longer than the benchmark itself)."""
    user = b"005000000000001AAA"
    head = _zigzag(1_700_000_000_000) + _zigzag(len(user)) + user + _zigzag(1)
    body = max(64, size - len(head) - 2)
    body_prefix = _zigzag(body)
    text = base64.b64encode(os.urandom(count * body * 3 // 4 + 3))
    return [head + body_prefix + text[i * body : (i + 1) * body] for i in range(count)]


# -- the emulator process ----------------------------------------------------------------------


def serve(events: int, size: int) -> None:
    from ingest.emulator.server import Emulator, EmulatorConfig

    catalogue = Catalogue.of([TopicDef(TOPIC, "platform_event", None, (SCHEMA,))])
    with Emulator(catalogue, EmulatorConfig(keepalive_interval=1.0, idle_timeout=120.0)) as emu:
        chunk = 50_000
        for first in range(0, events, chunk):
            payloads = _payloads(min(chunk, events - first), size)
            emu.append(
                EmittedEvent(TOPIC, SCHEMA.schema_id, p, str(uuid.uuid4())) for p in payloads
            )
        info = {"grpc_port": emu.grpc_port, "http_port": emu.http_port}
        print(json.dumps(info), flush=True)
        sys.stdin.read()  # serve until the parent closes our stdin


# -- the measured processes --------------------------------------------------------------------


@contextmanager
def backlog_server(events: int, size: int) -> Iterator[tuple[dict[str, int], int]]:
    """The emulator in a process of its own (``--serve``) holding ``events`` events of
    ``size`` bytes: yields its ports (``grpc_port``, ``http_port``) and its pid, and stops it
    on exit."""
    server = subprocess.Popen(
        [*(sys.executable, __file__, "--serve"), *("--events", str(events), "--size", str(size))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        yield json.loads(server.stdout.readline()), server.pid
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=60)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu_seconds() -> float:
    """User + system CPU of this process so far, all threads (Rust writer threads included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _ThreadCpu:
    """CPU seconds per component (thread kind) of this process between :meth:`start` and
    :meth:`stop`, read from /proc (Linux only; empty elsewhere). Python threads are named by
    what they run; threads Python did not start (delta-rs' runtime, gRPC core) by their OS
    name. A thread that ends before :meth:`stop` reports the CPU time it had at its end."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}
        self._ended: dict[int, float] = {}
        self._start: dict[int, float] = {}
        self._run = threading.Thread.run

    @staticmethod
    def _tasks() -> dict[int, tuple[str, float]]:
        tasks = {}
        tick = os.sysconf("SC_CLK_TCK")
        for task in Path("/proc/self/task").iterdir():
            tid = task.name
            try:
                stat = Path(f"/proc/self/task/{tid}/stat").read_text()
            except OSError:
                continue
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat.rsplit(")", 1)[1].split()
            tasks[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / tick)
        return tasks

    def _component(self, thread: threading.Thread) -> str:
        target = getattr(thread, "_target", None)
        where = f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', '')}"
        if thread.name.startswith("sfcdc-committer"):
            return "committer"
        if thread.name.startswith("sfcdc-reader"):
            return "stream reader"
        if thread.name.startswith("sfcdc-pump"):
            return "pump"
        if thread.name == "bench-consumer":
            return "consumer"
        if where.startswith("grpc"):
            return "gRPC Python threads"
        return f"other ({thread.name})"

    def start(self, consumer: str = "consumer") -> None:
        if not Path("/proc/self/task").is_dir():
            return
        meter, run = self, self._run

        def measured_run(thread: threading.Thread) -> None:
            meter._names[threading.get_native_id()] = meter._component(thread)
            try:
                run(thread)
            finally:
                meter._ended[threading.get_native_id()] = time.thread_time()

        threading.Thread.run = measured_run  # type: ignore[method-assign]
        self._names[threading.get_native_id()] = consumer
        self._start = {tid: cpu for tid, (_name, cpu) in self._tasks().items()}

    def stop(self) -> dict[str, float]:
        if not self._start and not Path("/proc/self/task").is_dir():
            return {}
        threading.Thread.run = self._run  # type: ignore[method-assign]
        totals: dict[str, float] = {}
        alive = self._tasks()
        for tid in {*alive, *self._ended}:
            name, cpu = alive.get(tid, ("?", self._ended.get(tid, 0.0)))
            if tid in self._ended and tid not in alive:
                cpu = self._ended[tid]
            label = self._names.get(tid)
            if label is None:
                label = "delta-rs runtime" if name.startswith("tokio") else "gRPC core, other"
            spent = cpu - self._start.get(tid, 0.0)
            totals[label] = totals.get(label, 0.0) + max(spent, 0.0)
        return totals


def _conf(root: Path, info: dict[str, int]) -> Path:
    conf = root / "conf"
    (conf / "objects").mkdir(parents=True)
    (conf / "pipeline.yml").write_text(
        "connection:\n"
        "  emulator:\n"
        "    mode: external\n"
        f"    grpc_port: {info['grpc_port']}\n"
        f"    http_port: {info['http_port']}\n"
        f"lake: {{engine: local, location: {root / 'lake'}}}\n"
        "ingest: {progress_interval_seconds: 600}\n"
    )
    (conf / "objects" / "bench.yml").write_text(
        "object: Bench_Event__e\nkind: platform_event\ntopic: /event/Bench_Event__e\n"
    )
    return conf


def measure_ceiling(info: dict[str, int], events: int) -> dict[str, Any]:
    from ingest.client import EventBatch, MultiSubscription, Subscription
    from ingest.replay import Earliest
    from pipelines.connect import connect, secret_resolver
    from pipelines.spec.load import load_conf

    with tempfile.TemporaryDirectory(prefix="sfcdc-bench-") as tmp:
        conf = load_conf(_conf(Path(tmp), info))
        with connect(conf.pipeline.connection, secrets=secret_resolver()) as source:
            source.tokens.current()
            sub = Subscription(source.channel, TOPIC, start=Earliest(), tokens=source.tokens)
            got = 0
            threads = _ThreadCpu()
            threads.start()
            cpu = _cpu_seconds()
            started = time.perf_counter()
            with MultiSubscription([sub]) as multi:
                for item in multi:
                    if isinstance(item, EventBatch):
                        got += len(item)
                        if got >= events:
                            break
            seconds = time.perf_counter() - started
            cpu = _cpu_seconds() - cpu
            components = threads.stop()
    return {
        "events": got,
        "seconds": seconds,
        "cpu": cpu,
        "peak_rss_mb": _peak_rss_mb(),
        "components": components,
    }


def measure_landing(info: dict[str, int], events: int) -> dict[str, Any]:
    from pipelines.bronze import BronzeLanding
    from pipelines.connect import connect, secret_resolver
    from pipelines.session import engine_for
    from pipelines.spec.load import load_conf

    with tempfile.TemporaryDirectory(prefix="sfcdc-bench-") as tmp:
        conf = load_conf(_conf(Path(tmp), info))
        with connect(conf.pipeline.connection, secrets=secret_resolver()) as source:
            source.tokens.current()
            landing = BronzeLanding(
                engine_for(conf.pipeline.lake),
                conf.topics(),
                channel=source.channel,
                tokens=source.tokens,
                ingest=conf.pipeline.ingest,
            )
            results = []
            runner = threading.Thread(
                target=lambda: results.append(landing.run()), name="bench-consumer"
            )
            threads = _ThreadCpu()
            threads.start(consumer="benchmark's polling loop")
            cpu = _cpu_seconds()
            started = time.perf_counter()
            runner.start()
            # Once every event is received, stop: the open batch is committed at once instead
            # of after batching.max_age_seconds, and the time runs until it is in Delta.
            while runner.is_alive() and sum(t.received for t in landing.snapshot().topics) < events:
                time.sleep(0.005)
            landing.stop("benchmark done")
            runner.join()
            seconds = time.perf_counter() - started
            cpu = _cpu_seconds() - cpu
            components = threads.stop()
        (result,) = results
        commits = result.topics[0].commits
        bronze_mb = sum(f.stat().st_size for f in (Path(tmp) / "lake").rglob("*.parquet")) / 1e6
    return {
        "events": result.events,
        "seconds": seconds,
        "cpu": cpu,
        "peak_rss_mb": _peak_rss_mb(),
        "commits": commits,
        "parquet_mb": bronze_mb,
        "components": components,
    }


def _process_cpu(pid: int) -> float | None:
    """User + system CPU seconds of another process (Linux only), for the emulator's share."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _child(mode: str, info: dict[str, int], events: int, server: int) -> dict[str, Any]:
    before = _process_cpu(server)
    done = subprocess.run(
        [
            *(sys.executable, __file__, "--measure", mode),
            *("--info", json.dumps(info), "--events", str(events)),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    after = _process_cpu(server)
    if before is not None and after is not None:
        result["server_cpu"] = after - before
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=1024, help="payload bytes per event")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--measure", choices=("ceiling", "landing"), help=argparse.SUPPRESS)
    parser.add_argument("--info", help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.serve:
        serve(args.events, args.size)
        return 0
    if args.measure:
        info = json.loads(args.info)
        run = measure_ceiling if args.measure == "ceiling" else measure_landing
        print(json.dumps(run(info, args.events)))
        return 0

    prepared = time.perf_counter()
    with backlog_server(args.events, args.size) as (info, server):
        backlog = time.perf_counter() - prepared
        ceiling = _child("ceiling", info, args.events, server)
        landing = _child("landing", info, args.events, server)

    rows = [("client only (ceiling)", ceiling), ("bronze landing", landing)]
    print(
        f"bronze landing: {args.events:,} events of {args.size} B on one topic, emulator in its "
        f"own process (backlog built in {backlog:.0f} s), local engine, default batching, "
        f"cores={os.cpu_count()}"
    )
    print(
        f"{'':24}{'events':>11}{'seconds':>9}{'events/s':>11}{'MB/s':>8}"
        f"{'CPU us/event':>14}{'peak RSS MB':>13}{'emulator CPU us/event':>23}"
    )
    for label, r in rows:
        rate = r["events"] / r["seconds"]
        print(
            f"{label:24}{r['events']:>11,.0f}{r['seconds']:>9.2f}{rate:>11,.0f}"
            f"{rate * args.size / 1e6:>8.1f}{r['cpu'] / r['events'] * 1e6:>14.1f}"
            f"{r['peak_rss_mb']:>13.0f}"
            + (f"{r['server_cpu'] / r['events'] * 1e6:>23.1f}" if "server_cpu" in r else "")
        )
    for label, r in rows:
        parts = sorted(r.get("components", {}).items(), key=lambda kv: -kv[1])
        shown = [f"{name} {cpu / r['events'] * 1e6:.1f}" for name, cpu in parts if cpu > 0]
        if shown:
            print(f"  {label}, CPU us/event by thread: {', '.join(shown)}")
    ceiling_rate = ceiling["events"] / ceiling["seconds"]
    landing_rate = landing["events"] / landing["seconds"]
    load = os.getloadavg()[0]
    print(f"machine load average during the run: {load:.1f} on {os.cpu_count()} cores")
    print(
        f"landing / ceiling: {landing_rate / ceiling_rate:.2f}; {landing['commits']:.0f} "
        f"commits, {landing['parquet_mb']:.0f} MB of Parquet written"
    )
    verdict = "meets" if landing_rate >= TARGET and landing["events"] >= 1_000_000 else "MISSES"
    print(f"landing {verdict} the target of {TARGET:,} events/s over >= 1,000,000 events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
