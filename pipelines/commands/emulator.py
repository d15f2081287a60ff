"""``sfcdc emulator serve``: run the Pub/Sub API emulator as a standalone server.

It serves the built-in catalogue (Account, Contact, Opportunity, Invoice__c and the
Order_Shipped__e platform event), appends a seeded workload of change events when it starts
and, optionally, keeps producing events at a steady rate. Faults can be switched on from the
command line. Connection details are printed, and written as JSON with ``--connection-file``
so scripts and other processes (``sfcdc ingest`` against an external emulator) can connect.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.cometd import CometdSettings
from ingest.emulator.faults import FaultSettings, StreamCut
from ingest.emulator.managed import ManagedSubscriptionConfig
from ingest.emulator.server import DEFAULT_CLIENT, Emulator, EmulatorConfig
from ingest.emulator.workload import Workload
from ingest.errors import ConfigError

__all__ = ["EmulatorRun", "register", "serve"]

logger = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "emulator",
        help="run the built-in Salesforce Pub/Sub API emulator",
        description="The built-in Salesforce Pub/Sub API emulator: a real eventbus.v1.PubSub "
        "gRPC server with an OAuth endpoint, seeded change events and fault injection.",
    )
    actions = parser.add_subparsers(dest="emulator_command", metavar="ACTION", required=True)
    serve_parser = actions.add_parser(
        "serve",
        help="start the emulator and keep it running until interrupted",
        description="Start the emulator, append a seeded workload, print how to connect, and "
        "serve until SIGINT/SIGTERM.",
    )
    s = serve_parser
    s.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=7443, help="gRPC port; 0 picks one (7443)")
    s.add_argument("--http-port", type=int, default=0, help="OAuth/SOAP port; 0 picks one")
    s.add_argument("--tls", action="store_true", help="serve gRPC and HTTPS over TLS")
    s.add_argument("--cert-dir", type=Path, help="where the TLS CA and certificate live")
    s.add_argument("--state-dir", type=Path, help="persist the event log here across restarts")
    s.add_argument("--seed", type=int, default=42, help="workload and replay-id seed (42)")
    s.add_argument(
        "--events",
        type=int,
        default=1000,
        help="workload events to append (change events and the platform events the workload "
        "mixes in, in whole transactions, so at least this many; 1000)",
    )
    s.add_argument(
        "--platform-events",
        type=int,
        default=100,
        help="platform events appended on top of --events (100)",
    )
    s.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="keep appending workload events (the same mix as --events) at this rate/s",
    )
    s.add_argument("--retention-hours", type=float, default=72.0, help="event retention (72)")
    s.add_argument("--keepalive-seconds", type=float, default=270.0, help="keepalive (270)")
    s.add_argument("--idle-seconds", type=float, default=60.0, help="idle stream close (60)")
    s.add_argument("--token-ttl-seconds", type=float, default=7200.0, help="token life (7200)")
    s.add_argument(
        "--managed",
        action="append",
        default=[],
        metavar="NAME=TOPIC[:EARLIEST|LATEST]",
        help="define a managed subscription (repeatable)",
    )
    s.add_argument("--cut-every", type=int, metavar="N", help="end streams after N events")
    s.add_argument("--latency-ms", type=float, default=0.0, help="delay added per response")
    s.add_argument(
        "--poll-seconds",
        type=float,
        default=110.0,
        help="Streaming API: seconds a /meta/connect long poll is held (110)",
    )
    s.add_argument(
        "--batch-size",
        type=int,
        default=100,
        help="Streaming API: most events one /meta/connect reply delivers (100)",
    )
    s.add_argument("--connection-file", type=Path, help="write connection details as JSON")
    s.add_argument("--truth-file", type=Path, help="write the ground truth as JSON on exit")
    serve_parser.set_defaults(handler=_serve_command)


@dataclass(frozen=True)
class EmulatorRun:
    """What ``serve`` started: the emulator and the workload that feeds it."""

    emulator: Emulator
    workload: Workload

    def connection(self) -> dict[str, Any]:
        emu = self.emulator
        return {
            "grpc_target": emu.grpc_target,
            "http_url": emu.http_url,
            "instance_url": emu.instance_url,
            "org_id": emu.org_id,
            "tls": emu.ca_cert_path is not None,
            "ca_file": str(emu.ca_cert_path) if emu.ca_cert_path else None,
            # The emulator's built-in test client: local credentials, documented and public.
            "client_id": DEFAULT_CLIENT.client_id,
            "client_secret": DEFAULT_CLIENT.client_secret,
            "topics": sorted(t.name for t in emu.catalogue),
            "cometd_url": f"{emu.instance_url}/cometd/62.0",
        }


def _managed(specs: list[str]) -> tuple[ManagedSubscriptionConfig, ...]:
    out = []
    problems = []
    for spec in specs:
        name, sep, rest = spec.partition("=")
        topic, _, replay = rest.partition(":")
        if not sep or not name or not topic:
            problems.append(f"--managed {spec!r}: expected NAME=TOPIC[:EARLIEST|LATEST]")
            continue
        preset = (replay or "LATEST").upper()
        try:
            out.append(
                ManagedSubscriptionConfig(
                    developer_name=name,
                    topic=topic,
                    default_replay=preset,  # type: ignore[arg-type]
                    error_recovery_replay=preset,  # type: ignore[arg-type]
                )
            )
        except ValueError as exc:
            problems.append(f"--managed {spec!r}: {exc}")
    if problems:
        raise ConfigError("invalid emulator options", problems)
    return tuple(out)


def serve(args: argparse.Namespace) -> EmulatorRun:
    """Start an emulator as ``args`` describe and append the initial workload."""
    faults = FaultSettings(
        stream_cut=StreamCut(args.cut_every, repeat=True) if args.cut_every else None,
        latency=args.latency_ms / 1000.0,
    )
    config = EmulatorConfig(
        host=args.host,
        grpc_port=args.port,
        http_port=args.http_port,
        tls=args.tls,
        cert_dir=args.cert_dir,
        state_dir=args.state_dir,
        retention=timedelta(hours=args.retention_hours),
        keepalive_interval=args.keepalive_seconds,
        idle_timeout=args.idle_seconds,
        token_ttl=args.token_ttl_seconds,
        managed_subscriptions=_managed(args.managed),
        faults=faults,
        seed=args.seed,
        streaming=CometdSettings(poll_timeout=args.poll_seconds, batch_size=args.batch_size),
    )
    catalogue = default_catalogue()
    emulator = Emulator(catalogue, config).start()
    workload = Workload(catalogue, seed=args.seed)
    restored = any(emulator.log(t.name) for t in catalogue if t.kind != "change_event_channel")
    if restored:
        # A persisted log already holds this seed's events; appending them again would
        # duplicate them under new replay ids.
        logger.info(
            "emulator state restored from %s: initial workload not appended", args.state_dir
        )
    else:
        # REST and Bulk API queries answer for the records this workload generates (and, with
        # --state-dir, still do after a restart).
        emulator.serve_records(workload.truth)
        if args.events:
            emulator.append(workload.events(args.events))
        if args.platform_events:
            emulator.append(workload.platform_events(args.platform_events))
    return EmulatorRun(emulator, workload)


def _produce(run: EmulatorRun, rate: float, stop: threading.Event) -> None:
    # Append in small bursts ten times a second; whole transactions keep events realistic.
    tick = 0.1
    owed = 0.0
    while not stop.wait(tick):
        owed += rate * tick
        if owed >= 1:
            n = int(owed)
            owed -= n
            run.emulator.append(run.workload.events(n))


def _serve_command(args: argparse.Namespace) -> int:
    run = serve(args)
    info = run.connection()
    if args.connection_file:
        args.connection_file.parent.mkdir(parents=True, exist_ok=True)
        args.connection_file.write_text(json.dumps(info, indent=2) + "\n")
    scheme = "TLS" if info["tls"] else "plaintext"
    print(f"sfcdc emulator: org {info['org_id']}")
    print(f"  gRPC   {info['grpc_target']} ({scheme})")
    if info["ca_file"]:
        print(f"  CA     {info['ca_file']}")
    print(f"  OAuth  {info['http_url']}/services/oauth2/token")
    print(f"         client_id={info['client_id']} client_secret={info['client_secret']}")
    print(f"  CometD {info['cometd_url']} (Streaming API, long polling)")
    print(f"  topics {', '.join(info['topics'])}")
    for topic in info["topics"]:
        n = len(run.emulator.log(topic))
        if n:
            print(f"         {topic}: {n} events")
    print("serving; Ctrl-C stops", flush=True)

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    producer = None
    if args.rate > 0:
        producer = threading.Thread(target=_produce, args=(run, args.rate, stop), daemon=True)
        producer.start()
    try:
        while not stop.wait(0.5):
            pass
    finally:
        stop.set()
        if producer is not None:
            producer.join(timeout=2)
        if args.truth_file:
            run.workload.truth.export_json(args.truth_file)
        run.emulator.close()
    print("sfcdc emulator: stopped", flush=True)
    return 0
