"""Streaming API landing throughput against the emulator over loopback HTTPS, printed beside
the Pub/Sub landing figure measured in the same run.

Two emulators run in processes of their own, as remote servers would:

- Streaming API: TLS on, a backlog of generic events (``/u/Bench``, payloads of random
  printable text) delivered up to ``--batch`` per ``/meta/connect`` reply. ``CometdLanding``
  with the local engine (delta-rs, no JVM) and the default batching subscribes with replay
  ``-2`` and lands the whole backlog into a fresh lake: bronze commit and checkpoint commit per
  batch. Timed from the subscription until the last notification is committed in Delta.
- Pub/Sub API: ``benchmarks/bronze_landing.py``'s landing measurement (1 KB Avro events on one
  topic, ``BronzeLanding``, local engine, default batching), on the same number of events.

Each measurement runs in a fresh process, and the machine's load average is printed: other
work on the machine moves both rates.

Target: Streaming API landing >= 20,000 notifications/s.

    python benchmarks/cometd_landing.py [--events 200000] [--size 1024] [--batch 2000]
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import bronze_landing as pubsub  # noqa: E402

CHANNEL = "/u/Bench"
TARGET = 20_000


def _payloads(count: int, size: int) -> list[str]:
    text = base64.b64encode(os.urandom(count * size * 3 // 4 + 3)).decode("ascii")
    return [text[i * size : (i + 1) * size] for i in range(count)]


# -- the emulator process ----------------------------------------------------------------------


def serve(events: int, size: int, batch: int) -> None:
    from ingest.emulator.catalogue import default_catalogue
    from ingest.emulator.cometd import CometdSettings
    from ingest.emulator.server import Emulator, EmulatorConfig

    settings = CometdSettings(poll_timeout=1.0, batch_size=batch)
    config = EmulatorConfig(tls=True, streaming=settings, idle_timeout=600.0)
    with Emulator(default_catalogue(), config) as emu:
        channel_id = emu.streaming.create_channel(CHANNEL)
        chunk = 20_000
        for first in range(0, events, chunk):
            emu.streaming.push(channel_id, *_payloads(min(chunk, events - first), size))
        info = {
            "grpc_port": emu.grpc_port,
            "http_port": emu.http_port,
            "ca_file": str(emu.ca_cert_path),
        }
        print(json.dumps(info), flush=True)
        sys.stdin.read()  # serve until the parent closes our stdin


# -- the measured process ----------------------------------------------------------------------


def _conf(root: Path, info: dict[str, Any]) -> Path:
    conf = root / "conf"
    (conf / "objects").mkdir(parents=True)
    (conf / "pipeline.yml").write_text(
        "connection:\n"
        "  emulator:\n"
        "    mode: external\n"
        f"    grpc_port: {info['grpc_port']}\n"
        f"    http_port: {info['http_port']}\n"
        f"    tls: {{enabled: true, ca_file: {info['ca_file']}}}\n"
        f"lake: {{engine: local, location: {root / 'lake'}}}\n"
        "defaults: {replay: {start: earliest}}\n"
        "ingest: {progress_interval_seconds: 600}\n"
    )
    (conf / "objects" / "bench.yml").write_text(f"kind: streaming_api\nchannel: {CHANNEL}\n")
    return conf


def measure(info: dict[str, Any], events: int) -> dict[str, Any]:
    from pipelines.bronze.cometd import CometdLanding
    from pipelines.connect import connect, secret_resolver
    from pipelines.session import engine_for
    from pipelines.spec.load import load_conf

    with tempfile.TemporaryDirectory(prefix="sfcdc-bench-") as tmp:
        conf = load_conf(_conf(Path(tmp), info))
        with connect(conf.pipeline.connection, secrets=secret_resolver()) as source:
            source.tokens.current()
            landing = CometdLanding(
                engine_for(conf.pipeline.lake),
                conf.enabled_streams(),
                tokens=source.tokens,
                ca_file=source.ca_file,
                streaming=conf.pipeline.streaming_api,
                ingest=conf.pipeline.ingest,
            )
            results = []
            runner = threading.Thread(
                target=lambda: results.append(landing.run()), name="bench-consumer"
            )
            cpu = pubsub._cpu_seconds()
            started = time.perf_counter()
            runner.start()
            # Once every notification is received, stop: the open batch is committed at once
            # and the time runs until it is in Delta.
            while runner.is_alive() and sum(t.received for t in landing.snapshot().topics) < events:
                time.sleep(0.005)
            landing.stop("benchmark done")
            runner.join()
            seconds = time.perf_counter() - started
            cpu = pubsub._cpu_seconds() - cpu
        (result,) = results
        topic = result.topics[0]
        bronze_mb = sum(f.stat().st_size for f in (Path(tmp) / "lake").rglob("*.parquet")) / 1e6
    return {
        "events": topic.events,
        "seconds": seconds,
        "cpu": cpu,
        "peak_rss_mb": pubsub._peak_rss_mb(),
        "commits": topic.commits,
        "parquet_mb": bronze_mb,
    }


def _child(info: dict[str, Any], events: int, server: int) -> dict[str, Any]:
    before = pubsub._process_cpu(server)
    done = subprocess.run(
        [
            *(sys.executable, __file__, "--measure"),
            *("--info", json.dumps(info), "--events", str(events)),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"streaming landing run failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    after = pubsub._process_cpu(server)
    if before is not None and after is not None:
        result["server_cpu"] = after - before
    return result


def _server(script: str, *args: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    server = subprocess.Popen(
        [sys.executable, script, "--serve", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    return server, json.loads(server.stdout.readline())


def _stop(server: subprocess.Popen[str]) -> None:
    if server.stdin is not None:
        server.stdin.close()
    server.wait(timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024, help="payload bytes per event")
    parser.add_argument(
        "--batch", type=int, default=2000, help="most notifications per /meta/connect reply"
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--info", help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.serve:
        serve(args.events, args.size, args.batch)
        return 0
    if args.measure:
        print(json.dumps(measure(json.loads(args.info), args.events)))
        return 0

    sized = ("--events", str(args.events), "--size", str(args.size))
    prepared = time.perf_counter()
    server, info = _server(__file__, *sized, "--batch", str(args.batch))
    try:
        backlog = time.perf_counter() - prepared
        streaming = _child(info, args.events, server.pid)
    finally:
        _stop(server)
    server, info = _server(pubsub.__file__, *sized)
    try:
        landing = pubsub._child("landing", info, args.events, server.pid)
    finally:
        _stop(server)

    print(
        f"bronze landing, Streaming API beside Pub/Sub API: {args.events:,} events of "
        f"{args.size} B on one channel / topic, emulator in its own process (Streaming API "
        f"backlog built in {backlog:.0f} s, up to {args.batch} notifications per connect "
        f"reply, HTTPS on loopback), local engine, default batching, cores={os.cpu_count()}"
    )
    print(
        f"{'':30}{'events':>11}{'seconds':>9}{'events/s':>11}{'MB/s':>8}"
        f"{'CPU us/event':>14}{'peak RSS MB':>13}{'commits':>9}{'emulator CPU us/event':>23}"
    )
    rows = [("Streaming API (CometD/HTTPS)", streaming), ("Pub/Sub API (gRPC)", landing)]
    for label, r in rows:
        rate = r["events"] / r["seconds"]
        print(
            f"{label:30}{r['events']:>11,.0f}{r['seconds']:>9.2f}{rate:>11,.0f}"
            f"{rate * args.size / 1e6:>8.1f}{r['cpu'] / r['events'] * 1e6:>14.1f}"
            f"{r['peak_rss_mb']:>13.0f}{r['commits']:>9.0f}"
            + (f"{r['server_cpu'] / r['events'] * 1e6:>23.1f}" if "server_cpu" in r else "")
        )
    load = os.getloadavg()[0]
    print(f"machine load average during the run: {load:.1f} on {os.cpu_count()} cores")
    rate = streaming["events"] / streaming["seconds"]
    verdict = "meets" if rate >= TARGET else "MISSES"
    print(f"Streaming API landing {verdict} the target of {TARGET:,} notifications/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
