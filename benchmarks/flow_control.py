"""Flow-control efficiency of the sfcdc subscriber against a slow server.

Salesforce lets at most 100 events be outstanding on a Subscribe stream, so with a round trip
of L seconds no client can receive more than 100 / L events per second: that is the protocol
limit, and the figure printed is the fraction of it each client reaches.

The emulator adds 20 ms, then 50 ms, before every response; the consumer spends 10 ms on
every batch it receives. Two clients run in the same process, one after the other, on the
same backlog of 1 KB events:

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
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import fastavro

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ingest.auth import Secret, StaticToken, TokenManager
from ingest.client import EventBatch, Subscription, TlsSettings, connect
from ingest.emulator.server import Emulator, EmulatorConfig
from ingest.emulator.topics import Catalogue, EmittedEvent, TopicDef
from ingest.pubsub import pb2, pb2_grpc
from ingest.replay import After, Earliest, ReplayId
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


def run_sfcdc(emu: Emulator, total: int, after: bytes | None) -> float:
    tokens = TokenManager(
        StaticToken(
            Secret(emu.issue_token().access_token),
            instance_url=emu.instance_url,
            tenant_id=emu.org_id,
        )
    )
    channel = connect(emu.grpc_target, tokens=tokens, tls=TlsSettings(enabled=False))
    got = 0
    started = time.perf_counter()
    start = After(ReplayId(after)) if after else Earliest()
    with Subscription(channel, TOPIC, start=start, tokens=tokens) as sub:
        for item in sub:
            if isinstance(item, EventBatch):
                got += len(item.events)
                _consume_batch()
                if got >= total:
                    break
    elapsed = time.perf_counter() - started
    channel.close()
    return elapsed


def run_baseline(emu: Emulator, total: int, after: bytes | None) -> float:
    """Salesforce's example pattern: one request for 100, then wait for all of them."""
    metadata = emu.issue_token().metadata()
    channel = emu.channel()
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
                    replay_preset=pb2.ReplayPreset.CUSTOM if after else pb2.ReplayPreset.EARLIEST,
                    replay_id=after or b"",
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
    args = parser.parse_args()

    catalogue = Catalogue.of([TopicDef(TOPIC, "platform_event", None, (SCHEMA,))])
    rows = []
    with Emulator(catalogue, EmulatorConfig(keepalive_interval=5.0, idle_timeout=60.0)) as emu:
        for latency in (0.020, 0.050):
            limit = WINDOW / latency
            total = int(limit * args.seconds) // WINDOW * WINDOW
            for name, run in (("sfcdc", run_sfcdc), ("baseline", run_baseline)):
                # A fresh backlog per run, read from just after the previous run's events, so
                # both clients read the same number of events.
                emu.faults.latency = 0.0
                log = emu.log(TOPIC)
                after = log[-1].replay_id if log else None
                emu.append(
                    EmittedEvent(TOPIC, SCHEMA.schema_id, _payload(i), str(uuid.uuid4()))
                    for i in range(total)
                )
                emu.faults.latency = latency
                elapsed = run(emu, total, after)
                rate = total / elapsed
                rows.append((latency, name, total, elapsed, rate, limit, rate / limit))

    print(
        f"flow control: at most {WINDOW} events per round trip, consumer "
        f"{CONSUMER_SECONDS * 1000:.0f} ms per batch, 1 KB events"
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
