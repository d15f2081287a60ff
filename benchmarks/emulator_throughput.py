"""Subscribe throughput of the Pub/Sub API emulator.

A plain generated-stub client (in a subprocess, so client and server each get a core) keeps 100
events requested, topping up as soon as each response arrives, and reads every event of a topic
from EARLIEST. The same run measures a baseline: the same client against the emulator building
each FetchResponse as a protobuf message, field by field.

    python benchmarks/emulator_throughput.py [--events 500000] [--size 1024]

Target: >= 200,000 events/s for 1 KB events on a 2-core machine.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import queue
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import fastavro  # noqa: E402
import grpc  # noqa: E402

from ingest.emulator.server import Emulator, EmulatorConfig  # noqa: E402
from ingest.emulator.topics import Catalogue, EmittedEvent, TopicDef  # noqa: E402
from ingest.pubsub import pb2, pb2_grpc  # noqa: E402
from ingest.schema import parse_event_schema  # noqa: E402

TOPIC = "/event/Bench_Event__e"
TARGET = 200_000
SCHEMA = {
    "type": "record",
    "name": "Bench_Event__e",
    "namespace": "com.sforce.eventbus",
    "fields": [
        {"name": "CreatedDate", "type": "long", "doc": "CreatedDate:DateTime"},
        {"name": "CreatedById", "type": "string", "doc": "CreatedBy:EntityId"},
        {"name": "Body__c", "type": ["null", "string"], "default": None, "doc": "Data:Text"},
    ],
}


def _payloads(schema: object, size: int, count: int) -> list[bytes]:
    record = {"CreatedDate": 1_700_000_000_000, "CreatedById": "005000000000001AAA"}
    base = io.BytesIO()
    fastavro.schemaless_writer(base, schema, {**record, "Body__c": ""})
    # The string's length prefix grows from one byte to two past 63 characters.
    filler = max(64, size - len(base.getvalue()) - 1)
    out = []
    for i in range(count):
        buf = io.BytesIO()
        fastavro.schemaless_writer(
            buf, schema, {**record, "Body__c": f"{i:08d}".ljust(filler, "x")}
        )
        out.append(buf.getvalue())
    return out


def run_client(target: str, metadata: list[tuple[str, str]], topic: str, events: int) -> dict:
    """Subscribe from EARLIEST, keep 100 requested, and time until ``events`` arrived."""
    channel = grpc.insecure_channel(target)
    stub = pb2_grpc.PubSubStub(channel)
    top_ups: queue.SimpleQueue[int | None] = queue.SimpleQueue()

    def requests():
        yield pb2.FetchRequest(topic_name=topic, replay_preset=pb2.EARLIEST, num_requested=100)
        while True:
            n = top_ups.get()
            if n is None:
                return
            yield pb2.FetchRequest(num_requested=n)

    received = 0
    responses = 0
    last = b""
    start = time.perf_counter()
    call = stub.Subscribe(requests(), metadata=metadata)
    for response in call:
        n = len(response.events)
        if n:
            top_ups.put(n)
            received += n
            responses += 1
            last = response.events[-1].replay_id
        if received >= events:
            break
    elapsed = time.perf_counter() - start
    top_ups.put(None)
    call.cancel()
    channel.close()
    return {
        "events": received,
        "responses": responses,
        "seconds": elapsed,
        "last_replay_id": last.hex(),
    }


def _raw_ceiling(payloads: list[bytes], schema_id: str) -> dict:
    """The transport's own limit: a bare servicer that streams pre-encoded frames under the same
    flow control (reader thread + condition), with no auth, log, timers or faults."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from ingest.emulator.eventlog import EventBus, NewEvent

    catalogue = Catalogue.of(
        [TopicDef(TOPIC, "platform_event", schemas=(parse_event_schema(json.dumps(SCHEMA)),))]
    )
    bus = EventBus(catalogue, clock=time.time, retention=3600.0)
    logged = bus.append(NewEvent(TOPIC, schema_id, p, f"bench-{i}") for i, p in enumerate(payloads))
    frames = [e.wire for e in logged]
    del logged, bus
    tail = b"\x12\x0a" + b"\x00" * 10

    def subscribe(requests, context):
        cond = threading.Condition()
        state = {"pending": 0}

        def read():
            for r in requests:
                with cond:
                    state["pending"] = min(100, state["pending"] + r.num_requested)
                    cond.notify()

        threading.Thread(target=read, daemon=True).start()
        i = 0
        while i < len(frames):
            with cond:
                while not state["pending"]:
                    cond.wait()
                n, state["pending"] = state["pending"], 0
            yield b"".join(frames[i : i + n]) + tail
            i += n

    handler = grpc.stream_stream_rpc_method_handler(
        subscribe,
        request_deserializer=pb2.FetchRequest.FromString,
        response_serializer=lambda b: b,
    )
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("eventbus.v1.PubSub", {"Subscribe": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        return _run_client_subprocess(f"127.0.0.1:{port}", [], len(frames))
    finally:
        server.stop(0)


def _run_client_subprocess(target: str, metadata: list, events: int) -> dict:
    request = {"target": target, "metadata": metadata, "topic": TOPIC, "events": events}
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, __file__, "--client"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(proc.stdout)


def _measure(encoding: str, payloads: list[bytes], schema_id: str, inprocess: bool) -> dict:
    catalogue = Catalogue.of(
        [TopicDef(TOPIC, "platform_event", schemas=(parse_event_schema(json.dumps(SCHEMA)),))]
    )
    config = EmulatorConfig(response_encoding=encoding)  # type: ignore[arg-type]
    with Emulator(catalogue, config) as emulator:
        t0 = time.perf_counter()
        chunk = 20_000
        for i in range(0, len(payloads), chunk):
            emulator.append(
                EmittedEvent(TOPIC, schema_id, p, f"bench-{i + j}")
                for j, p in enumerate(payloads[i : i + chunk])
            )
        append_s = time.perf_counter() - t0
        token = emulator.issue_token()
        metadata = list(token.metadata())
        if inprocess:
            result = run_client(emulator.grpc_target, metadata, TOPIC, len(payloads))
        else:
            result = _run_client_subprocess(emulator.grpc_target, metadata, len(payloads))
    result["append_seconds"] = append_s
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--size", type=int, default=1024, help="Avro payload bytes per event")
    parser.add_argument("--in-process", action="store_true", help="run the client in-process")
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        request = json.loads(sys.stdin.read())
        metadata = [tuple(kv) for kv in request["metadata"]]
        print(
            json.dumps(run_client(request["target"], metadata, request["topic"], request["events"]))
        )
        return

    schema = parse_event_schema(json.dumps(SCHEMA))
    payloads = _payloads(schema.parsed, args.size, args.events)
    print(
        f"emulator Subscribe throughput: {args.events} events of {len(payloads[0])} B payload, "
        f"client keeps 100 requested ({'in-process' if args.in_process else 'subprocess'} client)"
    )
    rows = []
    for label, encoding in (("baseline (message)", "message"), ("emulator (prebuilt)", "prebuilt")):
        result = _measure(encoding, payloads, schema.schema_id, args.in_process)
        rate = result["events"] / result["seconds"]
        rows.append((label, result, rate))
        print(
            f"  {label:22s} {result['events']:>9d} events in {result['seconds']:6.2f} s "
            f"= {rate:>10,.0f} events/s  ({result['responses']} responses, "
            f"append {result['append_seconds']:.1f} s)"
        )
    if not args.in_process:
        raw = _raw_ceiling(payloads, schema.schema_id)
        rate = raw["events"] / raw["seconds"]
        print(
            f"  {'raw stream (ceiling)':22s} {raw['events']:>9d} events in {raw['seconds']:6.2f} s "
            f"= {rate:>10,.0f} events/s  (bare servicer, same flow control, for reference)"
        )
    base, fast = rows[0][2], rows[1][2]
    verdict = "meets" if fast >= TARGET else "MISSES"
    print(f"  speed-up over baseline: {fast / base:.2f}x; target {TARGET:,} events/s: {verdict}")


if __name__ == "__main__":
    main()
