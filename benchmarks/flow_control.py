"""Flow-control efficiency of the sfcdc subscriber against a slow server.

Salesforce lets at most 100 events be outstanding on a Subscribe stream, so with a round trip
of L seconds no client can receive more than 100 / L events per second: that is the protocol
limit, and the figure printed is the fraction of it each client reaches.

The emulator, in its own process as a remote server would be, adds 20 ms, then 50 ms,
before every response; the consumer spends 10 ms on every batch it receives. Two clients
read the same number of 1 KB events from the same emulator, one after the other:

- sfcdc: :class:`ingest.client.Subscription`, which asks for more events as soon as the
  consumer takes a batch, so the next round trip overlaps the consumer's work;
- baseline: the pattern of Salesforce's examples, on the generated stub: request 100, wait
  until all 100 have arrived and been processed (``pending_num_requested == 0``), request 100
  again.

Target: sfcdc >= 0.9 of the limit at both latencies.

Run: ``python benchmarks/flow_control.py`` (about 20 s).
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import fastavro
import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ingest.auth import Secret, StaticToken, TokenManager
from ingest.client import EventBatch, Subscription, TlsSettings, connect
from ingest.emulator.faults import FaultSettings
from ingest.emulator.server import Emulator, EmulatorConfig
from ingest.emulator.topics import Catalogue, EmittedEvent, TopicDef
from ingest.pubsub import pb2, pb2_grpc
from ingest.replay import Earliest
from ingest.schema import parse_event_schema

TOPIC = "/event/Bench_Event__e"
WINDOW = 100
CONSUMER_SECONDS = 0.010
TARGET = 0.9

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


def _payload(i: int) -> bytes:
    buf = io.BytesIO()
    record = {"CreatedDate": 1_700_000_000_000 + i, "CreatedById": "005x", "Body__c": "x" * 980}
    fastavro.schemaless_writer(buf, SCHEMA.parsed, record)
    return buf.getvalue()


def _consume_batch() -> None:
    # The consumer's work per batch (a Delta commit stand-in): CPU-free so it does not compete
    # with the client threads on a 2-core machine.
    time.sleep(CONSUMER_SECONDS)


@dataclass(frozen=True)
class Server:
    """An emulator running in its own process, as a remote server would."""

    target: str
    token: str
    instance_url: str
    org_id: str
    split: bytes  # replay id of the last event of the first half of the backlog


def serve(latency: float, events: int) -> None:
    """Child process: an emulator adding ``latency`` per response, holding ``events`` events."""
    catalogue = Catalogue.of([TopicDef(TOPIC, "platform_event", None, (SCHEMA,))])
    config = EmulatorConfig(
        keepalive_interval=5.0, idle_timeout=60.0, faults=FaultSettings(latency=latency)
    )
    with Emulator(catalogue, config) as emu:
        ids = emu.append(
            EmittedEvent(TOPIC, SCHEMA.schema_id, _payload(i), str(uuid.uuid4()))
            for i in range(events)
        )
        token = emu.issue_token()
        info = {
            "target": emu.grpc_target,
            "token": token.access_token,
            "instance_url": emu.instance_url,
            "org_id": emu.org_id,
            "split": ids[events // 2 - 1].hex(),
        }
        print(json.dumps(info), flush=True)
        sys.stdin.read()  # serve until the parent closes our stdin


def run_sfcdc(server: Server, total: int) -> float:
    """The first half of the backlog, read by :class:`Subscription`."""
    tokens = TokenManager(
        StaticToken(Secret(server.token), instance_url=server.instance_url, tenant_id=server.org_id)
    )
    channel = connect(server.target, tokens=tokens, tls=TlsSettings(enabled=False))
    got = 0
    started = time.perf_counter()
    with Subscription(channel, TOPIC, start=Earliest(), tokens=tokens) as sub:
        for item in sub:
            if isinstance(item, EventBatch):
                got += len(item.events)
                _consume_batch()
                if got >= total:
                    break
    elapsed = time.perf_counter() - started
    channel.close()
    return elapsed


def run_baseline(server: Server, total: int) -> float:
    """The second half of the backlog, read the way Salesforce's examples do: one request for
    100, then wait until all of them have arrived and been processed."""
    metadata = (
        ("accesstoken", server.token),
        ("instanceurl", server.instance_url),
        ("tenantid", server.org_id),
    )
    channel = grpc.insecure_channel(server.target)
    stub = pb2_grpc.PubSubStub(channel)
    semaphore = threading.Semaphore(1)
    done = threading.Event()

    def requests() -> Iterator[pb2.FetchRequest]:
        first = True
        while not done.is_set():
            if not semaphore.acquire(timeout=0.1):
                continue
            if done.is_set():
                return
            if first:
                first = False
                yield pb2.FetchRequest(
                    topic_name=TOPIC,
                    replay_preset=pb2.ReplayPreset.CUSTOM,
                    replay_id=server.split,
                    num_requested=WINDOW,
                )
            else:
                yield pb2.FetchRequest(num_requested=WINDOW)

    got = 0
    started = time.perf_counter()
    call = stub.Subscribe(requests(), metadata=metadata)
    for response in call:
        if response.events:
            got += len(response.events)
            _consume_batch()
        if got >= total:
            break
        if response.pending_num_requested == 0:
            semaphore.release()
    elapsed = time.perf_counter() - started
    done.set()
    semaphore.release()
    call.cancel()
    channel.close()
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="target length of each run")
    parser.add_argument("--serve", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--events", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.events)
        return 0

    rows = []
    for latency in (0.020, 0.050):
        limit = WINDOW / latency
        total = int(limit * args.seconds) // WINDOW * WINDOW
        child = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(latency), "--events", str(2 * total)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            info = json.loads(child.stdout.readline())
            server = Server(**{**info, "split": bytes.fromhex(info["split"])})
            for name, run in (("sfcdc", run_sfcdc), ("baseline", run_baseline)):
                elapsed = run(server, total)
                rate = total / elapsed
                rows.append((latency, name, total, elapsed, rate, limit, rate / limit))
        finally:
            if child.stdin is not None:
                child.stdin.close()
            child.wait(timeout=30)

    print(
        f"flow control: at most {WINDOW} events per round trip, consumer "
        f"{CONSUMER_SECONDS * 1000:.0f} ms per batch, 1 KB events, emulator in its own process"
    )
    header = (
        f"{'latency':>8} {'client':>9} {'events':>7} {'seconds':>8} {'events/s':>9} "
        f"{'limit/s':>8} {'fraction':>8}"
    )
    print(header)
    for latency, name, events, elapsed, rate, limit, fraction in rows:
        print(
            f"{latency * 1000:>6.0f}ms {name:>9} {events:>7} {elapsed:>8.2f} {rate:>9.0f} "
            f"{limit:>8.0f} {fraction:>8.2f}"
        )
    ours = [r[6] for r in rows if r[1] == "sfcdc"]
    verdict = "meets" if min(ours) >= TARGET else "MISSES"
    print(f"sfcdc {verdict} the target of {TARGET} of the protocol limit (lowest {min(ours):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
