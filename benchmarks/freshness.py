"""End-to-end freshness of ``sfcdc run --continuous``: from an event's commit to the lake.

The emulator runs in this process and a workload appends change events (and the mix's
platform events) at ``--rate`` per second for ``--minutes``. The workload is built with
``clock_ms``, so every event's ``commitTimestamp`` is the moment it was generated, in
milliseconds, and appended at once: Salesforce's whole-second stamps would add up to a second
of truncation to every figure. ``sfcdc run --continuous`` runs as a separate process against
that emulator (``mode: external``, as against Salesforce) and is stopped with SIGTERM at the
end (clean stop: open batches committed, a last silver/gold pass).

Visibility is read afterwards from the Delta logs, so measuring costs the pipeline nothing:

- bronze: an event is visible at the commit time (Delta ``commitInfo.timestamp``) of the
  bronze version whose added files hold its event id; the bronze row's ``received_at`` splits
  that time into delivery (until sfcdc's client received it) and landing (until committed);
- gold: per object, a gold version makes visible every change committed up to the newest
  ``_cdc_last_commit_ts`` its rows carry (changes are applied in commit order, and a record
  whose change was superseded in the same pass shows the later one).

Freshness = visible - commitTimestamp; p50 / p95 over the events generated after a warm-up.
Targets: bronze p95 <= 1 s, gold p95 <= 10 s.

The measured phase runs ``sfcdc run --continuous`` as shipped: its default ``--interval``,
``batching.max_age_seconds`` from the shipped ``conf/pipeline.yml``, the landing in a child
process (``--interval`` and ``--max-age`` override them). The baseline phase
(``--baseline-minutes``) runs it the way it used to be shipped: the landing in a thread of the
pipeline's process (``--landing thread``), ``max_age_seconds`` 5 and ``--interval`` 10, so the
figures have context. (Both phases use the driver-side path for small silver and gold steps:
there is no switch for it.)

    python benchmarks/freshness.py [--minutes 5] [--rate 1000] [--baseline-minutes 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ingest.emulator.catalogue import default_catalogue  # noqa: E402
from ingest.emulator.server import Emulator, EmulatorConfig  # noqa: E402
from ingest.emulator.workload import Workload  # noqa: E402

OBJECTS = {
    "account": ("Account", "change_events", "account_change_event"),
    "contact": ("Contact", "change_events", "contact_change_event"),
    "opportunity": ("Opportunity", "change_events", "opportunity_change_event"),
    "invoice": ("Invoice__c", "change_events", "invoice__change_event"),
    "order_shipped": ("Order_Shipped__e", "platform_event", "order_shipped__e"),
}
GOLD = {api: name for name, (api, kind, _) in OBJECTS.items() if kind == "change_events"}
BRONZE_TARGET_P95 = 1.0
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
GOLD_TARGET_P95 = 10.0


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float
    max_age_seconds: float
    interval: float | None  # None: sfcdc run's default
    landing: str = "process"


@dataclass(frozen=True)
class Figures:
    phase: Phase
    generated: int
    rate: float
    bronze: list[float]
    gold: list[float]
    # bronze split in two: commit -> received by the client, received -> committed in bronze
    delivered: list[float]
    committed_after: list[float]
    missing_bronze: int
    missing_gold: int


def _write_conf(root: Path, emulator: Emulator, max_age: float) -> Path:
    conf = root / "conf"
    (conf / "objects").mkdir(parents=True)
    grpc_port = emulator.grpc_target.rsplit(":", 1)[1]
    http_port = emulator.http_url.rsplit(":", 1)[1]
    (conf / "pipeline.yml").write_text(
        "connection:\n"
        "  source: emulator\n"
        "  emulator:\n"
        "    mode: external\n"
        "    host: 127.0.0.1\n"
        f"    grpc_port: {grpc_port}\n"
        f"    http_port: {http_port}\n"
        "lake:\n"
        "  engine: local\n"
        "  location: ./lake\n"
        "defaults:\n"
        "  batching:\n"
        f"    max_age_seconds: {max_age}\n"
        "ingest:\n"
        "  progress_interval_seconds: 30\n"
    )
    for name, (api, kind, _) in OBJECTS.items():
        (conf / "objects" / f"{name}.yml").write_text(f"object: {api}\nkind: {kind}\n")
    return conf


def _commits(table: Path) -> list[tuple[float, list[Path]]]:
    """(commit time in epoch seconds, data files added) per version, in version order."""
    out = []
    log = table / "_delta_log"
    if not log.is_dir():
        return out
    for entry in sorted(log.glob("*.json")):
        stamp = None
        files = []
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "commitInfo" in action and "timestamp" in action["commitInfo"]:
                stamp = action["commitInfo"]["timestamp"] / 1000.0
            add = action.get("add")
            if add and add.get("dataChange", True):
                files.append(table / add["path"])
        if stamp is None:
            stamp = entry.stat().st_mtime
        out.append((stamp, files))
    return out


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _produce(
    emulator: Emulator, workload: Workload, rate: float, stop: threading.Event
) -> Callable[[], int]:
    appended = [0]

    def run() -> None:
        tick = 0.05
        started = time.monotonic()
        while not stop.is_set():
            # At most a second's worth at once: a producer that fell behind (a busy machine)
            # runs below the rate instead of building one ever larger batch.
            owed = min(int((time.monotonic() - started) * rate) - appended[0], max(1, int(rate)))
            if owed > 0:
                batch = list(workload.events(owed))
                emulator.append(batch)
                appended[0] += len(batch)
            stop.wait(tick)

    thread = threading.Thread(target=run, name="freshness-producer", daemon=True)
    thread.start()

    def finish() -> int:
        stop.set()
        thread.join()
        return appended[0]

    return finish


@contextmanager
def scratch(prefix: str, keep: Path | None) -> Iterator[Path]:
    """A directory for one run's lake, removed afterwards unless it is kept (--keep DIR).

    A continuous run's tables keep every version until VACUUM's retention has passed, so a
    half-hour run leaves gigabytes behind.
    """
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=keep))
    try:
        yield work
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)


def disk_usage(path: Path) -> int:
    """Bytes of the files under path."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run_phase(
    phase: Phase, rate: float, warmup: float, keep: Path | None, verbose: int = 0
) -> Figures:
    with scratch(f"sfcdc-fresh-{phase.name}-", keep) as work:
        return _measure(phase, rate, warmup, work, verbose)


def _measure(phase: Phase, rate: float, warmup: float, work: Path, verbose: int) -> Figures:
    catalogue = default_catalogue()
    emulator = Emulator(
        catalogue, EmulatorConfig(keepalive_interval=1.0, idle_timeout=3600.0)
    ).start()
    workload = Workload(catalogue, seed=11, clock_ms=lambda: int(time.time() * 1000))
    conf = _write_conf(work, emulator, phase.max_age_seconds)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = (work / "pipeline.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipelines.cli",
            *(["-" + "v" * verbose] if verbose else []),
            "run",
            "--conf",
            str(conf),
            "--continuous",
            "--landing",
            phase.landing,
            *([] if phase.interval is None else ["--interval", str(phase.interval)]),
        ],
        cwd=work,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        # Landing is live once its first keepalive checkpoint is committed (Spark has started
        # by then: the pipeline starts it before connecting).
        ready = work / "lake" / "bronze" / "sfcdc_checkpoints" / "_delta_log"
        deadline = time.monotonic() + 600
        while not (ready.is_dir() and len(list(ready.glob("*.json"))) >= 2):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the pipeline did not start; see {work / 'pipeline.log'}")
            time.sleep(0.2)
        print(
            f"[{phase.name}] pipeline live; producing {rate:.0f} events/s for "
            f"{phase.seconds:.0f} s",
            flush=True,
        )
        started = time.time()
        finish = _produce(emulator, workload, rate, threading.Event())
        time.sleep(phase.seconds)
        generated = finish()
        produced_for = time.time() - started
        # The last events' batches close; SIGTERM then brings the last silver/gold pass.
        time.sleep(phase.max_age_seconds + 3)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
        emulator.close()

    cutoff_ms = (started + warmup) * 1000
    measured = {
        c.event_id: (c.entity, c.commit_timestamp / 1000.0)
        for c in workload.log
        if c.commit_timestamp >= cutoff_ms
    }
    lake = work / "lake"
    bronze_seen: dict[str, tuple[float, float]] = {}  # event id -> (committed, received)
    for _name, (_api, _kind, bronze) in OBJECTS.items():
        for stamp, files in _commits(lake / "bronze" / bronze):
            for file in files:
                rows = pq.read_table(file, columns=["event_id", "received_at"])
                received = pc.divide(rows["received_at"].cast(pa.int64()), 1e6).to_pylist()
                for event_id, at in zip(rows["event_id"].to_pylist(), received, strict=True):
                    bronze_seen.setdefault(event_id, (stamp, at))
    seen = [(bronze_seen[e], ts) for e, (_, ts) in measured.items() if e in bronze_seen]
    bronze = [committed - ts for (committed, _), ts in seen]
    delivered = [received - ts for (_, received), ts in seen]
    committed_after = [committed - received for (committed, received), _ in seen]

    gold: list[float] = []
    missing_gold = 0
    for api, table in GOLD.items():
        marks: list[tuple[float, float]] = []  # (watermark, visible at)
        high = float("-inf")
        for stamp, files in _commits(lake / "gold" / table):
            for file in files:
                column = pq.read_table(file, columns=["_cdc_last_commit_ts"])[0]
                if column.null_count < len(column):
                    scale = _PER_SECOND[column.type.unit]
                    newest = pc.max(column.cast(pa.int64())).as_py()
                    high = max(high, newest / scale)
            marks.append((high, stamp))
        for _event, (entity, ts) in measured.items():
            if entity != api:
                continue
            # Changes that only change other records (a cascade's parent) still advance the
            # watermark of their own object's table.
            visible = next((at for mark, at in marks if mark >= ts - 0.0005), None)
            if visible is None:
                missing_gold += 1
            else:
                gold.append(visible - ts)
    return Figures(
        phase,
        generated,
        generated / produced_for,
        bronze,
        gold,
        delivered,
        committed_after,
        missing_bronze=len(measured) - len(bronze),
        missing_gold=missing_gold,
    )


def _line(label: str, values: list[float], target: float | None, width: int = 7) -> str:
    p50, p95 = _percentile(values, 0.5), _percentile(values, 0.95)
    verdict = ""
    if target is not None:
        verdict = f"  target p95 <= {target:g} s: {'met' if p95 <= target else 'NOT met'}"
    return (
        f"  {label:<{width}} p50 {p50:6.2f} s  p95 {p95:6.2f} s  "
        f"max {max(values, default=0):6.2f} s"
        f"  ({len(values)} events){verdict}"
    )


def _shipped_max_age() -> float:
    from pipelines.spec.load import load_conf

    conf = load_conf(ROOT / "conf")
    return min(t.batching.max_age_seconds for t in conf.topics())


def _warmup(given: float | None, seconds: float) -> float:
    return given if given is not None else min(60.0, seconds / 5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="measured phase (5)")
    parser.add_argument("--rate", type=float, default=1000.0, help="events per second (1000)")
    parser.add_argument(
        "--interval",
        type=float,
        default=None,
        help="silver/gold interval of the measured phase (default: sfcdc run's own)",
    )
    parser.add_argument(
        "--max-age",
        type=float,
        default=None,
        help="batching.max_age_seconds of the measured phase (default: the shipped conf's)",
    )
    parser.add_argument(
        "--baseline-minutes", type=float, default=1.0, help="baseline phase; 0 skips it (1)"
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="seconds of events left out at the start, while Spark compiles its first plans "
        "(default: a fifth of each phase, at most 60)",
    )
    parser.add_argument("--keep", type=Path, help="keep the lakes under this directory")
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="pass -v (-vv: every step of every pass, timed) to sfcdc run; its log is "
        "pipeline.log in the phase's directory (see --keep)",
    )
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    max_age = args.max_age if args.max_age is not None else _shipped_max_age()
    phases = [Phase("tuned", args.minutes * 60, max_age, args.interval)]
    if args.baseline_minutes > 0:
        phases.append(Phase("baseline", args.baseline_minutes * 60, 5.0, 10.0, landing="thread"))
    results = [
        run_phase(p, args.rate, _warmup(args.warmup, p.seconds), args.keep, args.verbose)
        for p in phases
    ]
    print()
    print(
        f"freshness of sfcdc run --continuous (emulator at {args.rate:.0f} events/s, "
        f"millisecond commit timestamps, {os.cpu_count()} cores, load "
        f"{os.getloadavg()[0]:.1f})"
    )
    for r in results:
        p = r.phase
        tuned = r.phase.name == "tuned"
        interval = "default" if p.interval is None else f"{p.interval:g} s"
        print(
            f"{p.name}: {p.seconds / 60:g} min, landing in a {p.landing}, max_age_seconds "
            f"{p.max_age_seconds:g}, interval {interval}; {r.generated} events generated "
            f"({r.rate:.0f}/s), first "
            f"{_warmup(args.warmup, p.seconds):g} s left out"
        )
        print(_line("bronze", r.bronze, BRONZE_TARGET_P95 if tuned else None))
        print(_line(" of which delivery (commit -> received by sfcdc)", r.delivered, None, 49))
        print(_line(" and landing (received -> committed in bronze)", r.committed_after, None, 49))
        print(_line("gold", r.gold, GOLD_TARGET_P95 if tuned else None))
        if r.missing_bronze or r.missing_gold:
            print(f"  not visible: {r.missing_bronze} in bronze, {r.missing_gold} in gold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
