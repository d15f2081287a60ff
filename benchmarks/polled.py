"""A polled object's landing rate next to the event landing of the same volume, in the same run.

The emulator (in a process of its own) holds ``--records`` records of one object, each created
by one transaction, so the org has as many CREATE change events as records. Both sides land into a
fresh local-engine lake and are timed until the last record is committed in Delta:

- the baseline, event landing: ``sfcdc ingest --once`` of the object's change event topic
  (Pub/Sub Subscribe over gRPC, Avro payloads, bronze and checkpoint commits per batch);
- polling: the object declared ``kind: polled``; its first poll (``poll_objects``, as ``sfcdc
  poll`` runs it) reads every record with ``queryAll`` over ``--api`` (a Bulk API 2.0 job by
  default: CSV result sets, four for a job of 100,000 records (``ingest.bulk.set_size``), shaped
  like REST records) and commits them with the describe and watermark in one commit. The
  emulator runs the job in the background from its creation, as Salesforce does, and the client
  polls its state with its own pauses (the first after 0.1 s); each set of results is written
  as CSV when the client asks for it, while the client converts the sets before it.

Target: polled landing >= 0.5x the event landing's rate (records per second against events per
second). The emulator serves from a process of its own, as Salesforce's servers are not on the
client's interpreter; it still shares the machine's cores with the client (and with whatever
else runs). ``--emulator-in-process`` serves it from the client's process instead. Run from the
repository root::

    PYTHONPATH=. python benchmarks/polled.py [--records 100000] [--api bulk|rest] [--rounds 3]

Both landings run ``--rounds`` times, one after the other (each into a fresh lake), and a line
per round shows both times; the round with the median ratio (the lower of two) stands for the
run. The last lines print its rates and ``polled / events: N.NNx``; for a Bulk read also the
time the emulator spent running the job (the job's ``totalProcessingTime``, reading the
records: work Salesforce does on its servers, done here on the same machine) and
the ratio without it. Writing the result sets' CSV is the emulator's work too, but it is done
while the client reads and is counted on sfcdc's side.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import resource
import shutil
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.emulator_rest import rest_and_bulk  # noqa: E402
from ingest.emulator.catalogue import default_catalogue  # noqa: E402
from ingest.emulator.server import Emulator, EmulatorConfig  # noqa: E402
from ingest.emulator.workload import Workload, WorkloadMix  # noqa: E402
from pipelines.cli import main as sfcdc  # noqa: E402
from pipelines.engines import TableRef  # noqa: E402
from pipelines.polled import poll_objects, polled_table  # noqa: E402
from pipelines.session import engine_for  # noqa: E402
from pipelines.spec.load import load_conf  # noqa: E402
from pipelines.spec.models import default_tables, default_topic  # noqa: E402

TARGET = 0.5
ONLY_CREATES = dict.fromkeys(
    (
        "update",
        "bulk_update",
        "mass_update",
        "delete",
        "mass_delete",
        "undelete",
        "lead_conversion",
        "gap",
        "overflow",
        "wildcard",
        "platform_event",
    ),
    0.0,
)


def _conf(root: Path, emulator: Any, entity: str, body: str) -> Path:
    conf = root / "conf"
    (conf / "objects").mkdir(parents=True)
    (conf / "pipeline.yml").write_text(
        textwrap.dedent(
            f"""\
            connection:
              emulator:
                mode: external
                grpc_port: {emulator.grpc_port}
                http_port: {emulator.http_port}
                tls: {{enabled: false}}
            lake: {{engine: local, location: {root / "lake"}}}
            defaults:
              replay: {{start: earliest}}
            ingest:
              maintain_every_commits: 0
            """
        )
    )
    (conf / "objects" / "object.yml").write_text(f"object: {entity}\n{body}")
    return conf


def _round(
    emulator: Any, root: Path, entity: str, api: str, events: int, records: int
) -> tuple[float, float, float, str]:
    """One event landing and one first poll of the object, each into a fresh lake under
    ``root``: ``(event seconds, poll seconds, the emulator's job seconds, the api used)``."""
    events_dir = _conf(root / "events", emulator, entity, "kind: change_events\n")
    t0 = time.perf_counter()
    assert sfcdc(["-q", "ingest", "--once", "--conf", str(events_dir)]) == 0
    event_seconds = time.perf_counter() - t0
    conf = load_conf(events_dir)
    topic = default_topic(entity, "change_events")
    bronze = TableRef("bronze", default_tables(entity, topic).bronze)
    landed = engine_for(conf.pipeline.lake).read_arrow(bronze, columns=["event_id"])
    assert landed.num_rows == events, (landed.num_rows, events)

    polled_dir = _conf(root / "polled", emulator, entity, f"kind: polled\npoll: {{api: {api}}}\n")
    conf = load_conf(polled_dir)
    engine = engine_for(conf.pipeline.lake)
    with rest_and_bulk(emulator) as (rest, bulk):
        t0 = time.perf_counter()
        (result,) = poll_objects(engine, conf, rest=rest, bulk=bulk, force=True)
        poll_seconds = time.perf_counter() - t0
        job = bulk.bulk.last_job if result.api == "bulk" else None
        server_seconds = (job.processing_ms or 0) / 1000 if job is not None else 0.0
    stored = engine.read_arrow(
        polled_table(conf.object(entity)), columns=["kind"], where=[("kind", "=", "record")]
    )
    assert result.records == stored.num_rows == records, (result, stored.num_rows, records)
    return event_seconds, poll_seconds, server_seconds, result.api


def _serve(workload: Workload, events: list[Any], conn: Any) -> None:
    """The emulator, in a process of its own, serving the org until told to stop: its
    ports go back over ``conn``."""
    with Emulator(workload.catalogue, EmulatorConfig(keepalive_interval=0.2)) as emulator:
        emulator.serve_records(workload.truth)
        emulator.append(events)
        conn.send(
            {
                "grpc_port": emulator.grpc_port,
                "http_port": emulator.http_port,
                "http_url": emulator.http_url,
            }
        )
        conn.recv()


@contextlib.contextmanager
def _emulator(workload: Workload, events: list[Any], *, in_process: bool) -> Iterator[Any]:
    """The emulator serving the org: in a process of its own (as Salesforce's servers are not
    on the client's CPU time or interpreter lock), or in this one."""
    if in_process:
        with Emulator(workload.catalogue, EmulatorConfig(keepalive_interval=0.2)) as emulator:
            emulator.serve_records(workload.truth)
            emulator.append(events)
            yield emulator
        return
    context = multiprocessing.get_context("fork")  # the org generated here, not pickled
    ours, theirs = context.Pipe()
    server = context.Process(target=_serve, args=(workload, events, theirs), daemon=True)
    server.start()
    try:
        if not ours.poll(600):
            raise RuntimeError("the emulator's process did not start in 600 s")
        yield SimpleNamespace(**ours.recv())
    finally:
        with contextlib.suppress(OSError):
            ours.send("stop")
        server.join(60)
        if server.is_alive():
            server.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000, help="records (and events)")
    parser.add_argument("--entity", default="Opportunity", help="the object (default Opportunity)")
    parser.add_argument("--api", choices=("bulk", "rest"), default="bulk", help="how polls read")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of both landings, one after the other; the headline is their median",
    )
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: temp)")
    parser.add_argument(
        "--emulator-in-process",
        action="store_true",
        help="run the emulator in this process (its Bulk job and result sets then take the "
        "client's CPU time and interpreter lock) instead of a process of its own",
    )
    args = parser.parse_args()
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="sfcdc-bench-polled-"))
    entity = args.entity

    started = time.perf_counter()
    workload = Workload(
        default_catalogue(),
        seed=38,
        mix=WorkloadMix(**ONLY_CREATES, create=1.0, entity_weights={entity: 1.0}),
    )
    events = []
    while len(workload.truth.records(entity)) < args.records:
        events.extend(
            workload.events(min(5_000, args.records - len(workload.truth.records(entity))))
        )
    records = len(workload.truth.records(entity))
    print(
        f"org: {records:,} {entity} records from {len(events):,} change events; generated in "
        f"{time.perf_counter() - started:.0f} s; load average {os.getloadavg()[0]:.1f}"
    )
    rounds: list[tuple[float, float, float, str]] = []
    try:
        with _emulator(workload, events, in_process=args.emulator_in_process) as emulator:
            for n in range(max(1, args.rounds)):
                rounds.append(
                    _round(emulator, scratch / f"round-{n}", entity, args.api, len(events), records)
                )
                event_seconds, poll_seconds, server_seconds, _api = rounds[-1]
                print(
                    f"round {n + 1}: events {event_seconds:5.1f} s, polled {poll_seconds:5.1f} s "
                    f"(the emulator's job {server_seconds:.1f} s): "
                    f"{event_seconds / poll_seconds:.2f}x"
                )
    finally:
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # The median round by ratio stands for the run (of an even number, the lower one): one
    # round on a shared machine can be stretched by whatever else ran then, on either side,
    # and the first pays for first imports and connections on both.
    median = sorted(rounds, key=lambda r: r[0] / r[1])[(len(rounds) - 1) // 2]
    event_seconds, poll_seconds, server_seconds, api = median
    event_rate = len(events) / event_seconds
    poll_rate = records / poll_seconds
    print(f"peak RSS {rss:,.0f} MB; load average {os.getloadavg()[0]:.1f}")
    print(f"the median of {len(rounds)} round(s):")
    print(
        f"event landing (sfcdc ingest --once): {len(events):,} events in {event_seconds:6.1f} s "
        f"= {event_rate:9,.0f} events/s"
    )
    print(
        f"polled landing (first poll over {'the Bulk API' if api == 'bulk' else 'REST'}): "
        f"{records:,} records in {poll_seconds:6.1f} s = {poll_rate:9,.0f} records/s"
    )
    if server_seconds:
        # The emulator runs the job in this process, on the same CPU, in a thread of its own;
        # Salesforce runs it on its own servers (the event baseline's emulator encoded its
        # events before the clock started).
        client_seconds = poll_seconds - server_seconds
        print(
            f"  of which the emulator running the Bulk job (Salesforce's side, its "
            f"totalProcessingTime): {server_seconds:.1f} s; sfcdc's own part: {client_seconds:.1f} "
            f"s = {records / client_seconds:9,.0f} records/s"
        )
    ratio = poll_rate / event_rate
    verdict = "meets" if ratio >= TARGET else "misses"
    print(f"polled / events: {ratio:.2f}x ({verdict} the target >= {TARGET:.2f}x)")
    if server_seconds:
        own = records / client_seconds / event_rate
        verdict = "meets" if own >= TARGET else "misses"
        print(f"polled / events without the emulator's job time: {own:.2f}x ({verdict} the target)")


if __name__ == "__main__":
    main()
