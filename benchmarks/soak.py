"""Soak test of ``sfcdc run --continuous``: a long run under steady load and faults.

The emulator runs in this process; a workload appends change events (and the mix's platform
events) at ``--rate`` per second for ``--minutes``, with millisecond commit timestamps (as in
``benchmarks/freshness.py``). Meanwhile the emulator cuts every stream after ``--cut-every``
events and expires every access token every ``--expire-every`` seconds, so the run reconnects
and logs in again throughout. ``sfcdc run --continuous`` runs as a separate process against it
(``mode: external``) and is stopped with SIGTERM at the end (open batches committed, a last
silver/gold pass).

Printed at the end:

- events published vs landed in bronze (distinct event ids, and rows: more rows than events
  would be duplicates), decoded in silver (distinct event ids per object) and applied in gold
  (every record's last change in silver is the one its gold row shows): all must be equal;
- the resident memory (RSS) of the run and of its landing child: the run's curve over the
  whole run, and after the warm-up each window's median and peak (a pass holds hundreds of MB
  for seconds, so single samples mostly say where in a pass they fell), with the growth of both
  from the first window to the last (should stay under 10 %);
- per table: active Delta files, data files on disk and log entries (JSON commits,
  checkpoints), which compaction, checkpoints and the run's scheduled maintenance (VACUUM and
  log cleanup; every ``--maintain-every`` seconds with a retention of ``--retention-minutes``,
  short so that a soak of minutes shows it) should keep bounded;
- p95 freshness (commit timestamp -> visible) of bronze, silver and gold per time window, to
  show whether it drifts over the run (measured from the Delta logs as freshness.py does, but
  read while the run goes on, since maintenance deletes the early log entries and files).

    python benchmarks/soak.py [--minutes 2] [--rate 1000] [--cut-every 3000]
                              [--expire-every 180] [--windows 4] [--mix fixed]
                              [--records 20000] [--maintain-every 300]
                              [--retention-minutes 5] [--keep DIR]

``--mix growing`` (the default) is the emulator's realistic mix, in which about one event in
six creates a record: at 1,000 events/s the gold tables grow by hundreds of thousands of rows
over half an hour, so gold's freshness and the run's memory follow the size of gold (a MERGE
rewrites the files it touches). ``--mix steady`` makes creates and lead conversions ten times
rarer; its gold tables still grow by a few thousand records a minute. ``--mix fixed`` creates
``--records`` records before the run starts and then only changes them (updates, deletes,
undeletes, platform events; no creates, no lead conversions, no gap creates), holding nine in
ten of them live (a delete becomes an undelete below that), so every gold table keeps its size
and what remains is drift of the pipeline itself. Without that hold, deletes drain the live
records within a few minutes and the creates that stand in for the changes that no longer fit
grow gold by about 30 rows a second.

The default is a short run (2 minutes); the long one is ``--minutes 30`` or more.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, Path(__file__).resolve().parent):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from freshness import (  # noqa: E402
    OBJECTS,
    _percentile,
    _produce,
    disk_usage,
    scratch,
)

from ingest.emulator.catalogue import default_catalogue  # noqa: E402
from ingest.emulator.server import Emulator, EmulatorConfig  # noqa: E402
from ingest.emulator.workload import Workload, WorkloadMix  # noqa: E402

# Workload mixes by name: the emulator's default, and one whose tables stop growing fast.
MIXES = {
    "growing": WorkloadMix(),
    "steady": WorkloadMix(create=WorkloadMix.create / 10, lead_conversion=0.3),
    "fixed": WorkloadMix(create=0.0, lead_conversion=0.0, live_share=0.9),
}
# The population the fixed mix changes, created before the run starts.
ONLY_CREATES = WorkloadMix(**{**dict.fromkeys(WorkloadMix().weights(), 0.0), "create": 1.0})

SILVER = {api: name for name, (api, _kind, _) in OBJECTS.items()}
GOLD = {api: name for name, (api, kind, _) in OBJECTS.items() if kind == "change_events"}
BRONZE = {api: bronze for _name, (api, _kind, bronze) in OBJECTS.items()}
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
ORDER = (
    "_cdc_commit_timestamp",
    "_cdc_commit_number",
    "_cdc_transaction_key",
    "_cdc_sequence_number",
    "_cdc_bronze_batch_id",
    "_cdc_bronze_batch_seq",
)


@dataclass
class Memory:
    """RSS samples (seconds since start, run MB, landing child MB)."""

    samples: list[tuple[float, float, float]] = field(default_factory=list)


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return out


def _sample_memory(pid: int, started: float, stop: threading.Event, memory: Memory) -> None:
    while not stop.wait(2.0):
        child = sum(_rss_mb(c) for c in _children(pid))
        memory.samples.append((time.time() - started, _rss_mb(pid), child))


@dataclass
class Storage:
    """Samples of what the lake's tables hold on disk, summed per layer: (seconds since start,
    {layer: (data and change data files, JSON log entries)})."""

    samples: list[tuple[float, dict[str, tuple[int, int]]]] = field(default_factory=list)


def _layer_files(lake: Path) -> dict[str, tuple[int, int]]:
    counts: dict[str, tuple[int, int]] = {}
    for layer in ("bronze", "silver", "gold"):
        files = entries = 0
        for table in (lake / layer).glob("*/_delta_log"):
            with os.scandir(table) as log:
                entries += sum(1 for e in log if e.name.endswith(".json"))
            for folder, _dirs, names in os.walk(table.parent):
                if "_delta_log" not in Path(folder).parts:
                    files += sum(1 for n in names if n.endswith(".parquet"))
        counts[layer] = (files, entries)
    return counts


def _sample_storage(lake: Path, started: float, stop: threading.Event, storage: Storage) -> None:
    while not stop.wait(60.0):
        try:
            storage.samples.append((time.time() - started, _layer_files(lake)))
        except OSError:
            continue  # a file went while it was counted: the next sample counts again


def _print_storage(storage: Storage) -> None:
    """Files on disk over the run: bounded storage levels off once maintenance's retention
    (and the consumers' margin) has passed, growth without bound does not."""
    if not storage.samples:
        return
    print("storage over the run (Parquet files on disk / JSON log entries, summed per layer)")
    step = max(1, len(storage.samples) // 10)
    points = storage.samples[::step]
    if points[-1] is not storage.samples[-1]:
        points.append(storage.samples[-1])
    print(f"  {'at':>6}  " + "".join(f"{layer:>16}" for layer in ("bronze", "silver", "gold")))
    for at, counts in points:
        cells = "".join(
            f"{f'{counts[layer][0]} / {counts[layer][1]}':>16}"
            for layer in ("bronze", "silver", "gold")
        )
        print(f"  {at:5.0f}s  {cells}")


def _print_memory(memory: Memory, warmup: float, windows: int) -> None:
    """RSS over the run, and per window after the warm-up its median and peak: a pass
    allocates hundreds of MB for seconds and frees them, so one sample says more about where
    in a pass it fell than about growth; the windows' medians and peaks do not."""
    print("memory (RSS, MB): run process + landing child")
    if not memory.samples:
        return
    # The whole curve, warm-up included: growth that levels off vs growth that goes on.
    points = [memory.samples[round(i * (len(memory.samples) - 1) / 9)] for i in range(10)]
    print("  run over the run: " + "  ".join(f"{t:.0f}s {r:.0f}" for t, r, _c in points))
    after = [s for s in memory.samples if s[0] >= warmup] or memory.samples
    size = max(1, len(after) // max(1, windows))
    parts = [after[i : i + size] for i in range(0, len(after), size)]
    if len(parts) > 1 and len(parts[-1]) < size // 2:
        parts[-2].extend(parts.pop())  # a short tail joins the window before it
    stats = []
    print(f"  after a {warmup:g} s warm-up, per window: median / peak")
    print(f"  {'window':>15}  {'run':>15}  {'landing':>15}")
    for part in parts:
        run = sorted(s[1] for s in part)
        child = sorted(s[2] for s in part)
        row = (run[len(run) // 2], run[-1], child[len(child) // 2], child[-1])
        stats.append(row)
        print(
            f"  {part[0][0]:6.0f}-{part[-1][0]:6.0f} s  {row[0]:7.1f} / {row[1]:5.0f}  "
            f"{row[2]:7.1f} / {row[3]:5.0f}"
        )
    first, last = stats[0], stats[-1]
    for label, i in (("run", 0), ("landing", 2)):
        median = (last[i] - first[i]) / (first[i] or 1.0) * 100
        peak = (last[i + 1] - first[i + 1]) / (first[i + 1] or 1.0) * 100
        ok = median < 10 and peak < 10
        print(
            f"  growth ({label}), first -> last window: median {median:+.1f} %, peak "
            f"{peak:+.1f} % ({'OK' if ok else 'over 10 %'})"
        )


def _faults(emulator: Emulator, expire_every: float, stop: threading.Event) -> Callable[[], int]:
    expired = [0]

    def run() -> None:
        while not stop.wait(expire_every):
            emulator.faults.expire_tokens()
            expired[0] += 1

    thread = threading.Thread(target=run, name="soak-token-expiry", daemon=True)
    thread.start()

    def finish() -> int:
        stop.set()
        thread.join()
        return expired[0]

    return finish


def _write_conf(root: Path, emulator: Emulator, maintain_every: float, retention: float) -> Path:
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
        "  replay: {start: earliest}\n"
        "  batching:\n"
        "    max_age_seconds: 0.2\n"
        "maintenance:\n"
        f"  every_seconds: {maintain_every:g}\n"
        f"  vacuum_retention_hours: {retention / 60:.6g}\n"
        f"  log_retention_hours: {retention / 60:.6g}\n"
        "ingest:\n"
        "  progress_interval_seconds: 30\n"
        "  retry: {max_attempts: 30, initial_backoff_seconds: 0.05, max_backoff_seconds: 1}\n"
    )
    for name, (api, kind, _) in OBJECTS.items():
        (conf / "objects" / f"{name}.yml").write_text(f"object: {api}\nkind: {kind}\n")
    return conf


class LogWatcher:
    """Follows the Delta logs of bronze, silver and gold while the run goes on, and keeps what
    the freshness figures need: when each event id first became visible in bronze, and per
    silver and gold table the newest commit timestamp visible after each commit.

    Read as the commits happen, not at the end: the run's maintenance deletes log entries and
    VACUUMs files (the soak configures a short retention so that storage stays bounded), so
    after the run the early commits are no longer there to read."""

    def __init__(self, lake: Path) -> None:
        self.lake = lake
        self.seen: dict[str, float] = {}
        self.marks: dict[str, list[tuple[float, float]]] = {}
        # key -> (table path, column read from each added file, next version to read)
        self._tables: dict[str, list[object]] = {}
        self._high: dict[str, float] = {}
        for api, table in BRONZE.items():
            self._tables[f"bronze:{api}"] = [lake / "bronze" / table, "event_id", 0]
        for api, table in SILVER.items():
            if api in GOLD:
                self._tables[f"silver:{api}"] = [
                    lake / "silver" / table,
                    "_cdc_commit_timestamp",
                    0,
                ]
        for api, table in GOLD.items():
            self._tables[f"gold:{api}"] = [lake / "gold" / table, "_cdc_last_commit_ts", 0]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak-log-watcher", daemon=True)

    def start(self) -> LogWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop following, after reading every commit made so far."""
        self._stop.set()
        self._thread.join()
        self.poll()

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            self.poll()

    def poll(self) -> None:
        for key, entry in self._tables.items():
            path, column, version = entry
            assert isinstance(path, Path) and isinstance(column, str) and isinstance(version, int)
            while True:
                commit = path / "_delta_log" / f"{version:020d}.json"
                try:
                    text = commit.read_text()
                except FileNotFoundError:
                    break
                self._read(key, path, column, commit, text)
                version += 1
            entry[2] = version

    def _read(self, key: str, path: Path, column: str, commit: Path, text: str) -> None:
        stamp = None
        files = []
        for line in text.splitlines():
            action = json.loads(line)
            if "commitInfo" in action and "timestamp" in action["commitInfo"]:
                stamp = action["commitInfo"]["timestamp"] / 1000.0
            add = action.get("add")
            if add and add.get("dataChange", True):
                files.append(path / unquote(add["path"]))
        if stamp is None:
            stamp = commit.stat().st_mtime
        high = self._high.get(key, float("-inf"))
        for file in files:
            values = pq.read_table(file, columns=[column])[0]
            if key.startswith("bronze:"):
                for event_id in values.to_pylist():
                    self.seen.setdefault(event_id, stamp)
            elif values.null_count < len(values):
                scale = _PER_SECOND[values.type.unit]
                high = max(high, pc.max(values.cast(pa.int64())).as_py() / scale)
        if not key.startswith("bronze:"):
            self._high[key] = high
            self.marks.setdefault(key, []).append((high, stamp))


def _freshness_by_window(
    events: dict[str, tuple[str, float]],
    seen: dict[str, float],
    marks: dict[str, list[tuple[float, float]]],
    start: float,
    end: float,
    windows: int,
) -> dict[str, list[list[float]]]:
    """Freshness per layer, per window of commit time: bronze by event id, silver and gold by
    the watermarks of each object's table."""
    width = (end - start) / windows
    out: dict[str, list[list[float]]] = {
        layer: [[] for _ in range(windows)] for layer in ("bronze", "silver", "gold")
    }
    for event_id, (entity, ts) in events.items():
        if ts < start or ts >= end:
            continue
        w = min(windows - 1, int((ts - start) / width))
        if event_id in seen:
            out["bronze"][w].append(seen[event_id] - ts)
        for layer in ("silver", "gold"):
            table_marks = marks.get(f"{layer}:{entity}")
            if table_marks is None:
                continue
            visible = next((at for mark, at in table_marks if mark >= ts - 0.0005), None)
            if visible is not None:
                out[layer][w].append(visible - ts)
    return out


def _delta_stats(table: Path) -> tuple[int, int, int, int]:
    """(active data files, data files on disk, JSON log entries, checkpoints) of a Delta
    table."""
    from deltalake import DeltaTable

    log = table / "_delta_log"
    if not log.is_dir():
        return 0, 0, 0, 0
    files = len(DeltaTable(str(table)).file_uris())
    on_disk = sum(1 for f in table.rglob("*.parquet") if log not in f.parents)
    return (
        files,
        on_disk,
        len(list(log.glob("*.json"))),
        len(list(log.glob("*.checkpoint*.parquet"))),
    )


def _gold_check(lake: Path) -> dict[str, tuple[int, int, int]]:
    """Per object: (records in silver, gold rows, gold rows whose last event is silver's last
    change of the record)."""
    from deltalake import DeltaTable

    out = {}
    for api, table in GOLD.items():
        silver_path = lake / "silver" / SILVER[api]
        last: dict[str, tuple[tuple[object, ...], str]] = {}
        first: dict[str, tuple[object, ...]] = {}
        wildcards: list[tuple[tuple[object, ...], str]] = []
        if silver_path.is_dir():
            rows = DeltaTable(str(silver_path)).to_pyarrow_table(
                columns=["Id", "_cdc_event_id", "_cdc_is_wildcard", *ORDER]
            )
            for row in rows.to_pylist():
                if row["Id"] is None:
                    continue
                key = tuple(row[c] for c in ORDER)
                if row["_cdc_is_wildcard"]:
                    wildcards.append((key, row["_cdc_event_id"]))
                    continue
                current = last.get(row["Id"])
                if current is None or key > current[0]:  # type: ignore[operator]
                    last[row["Id"]] = (key, row["_cdc_event_id"])
                if row["Id"] not in first or key < first[row["Id"]]:  # type: ignore[operator]
                    first[row["Id"]] = key
            # A wildcard UPDATE changes every record that exists at that point of the order.
            for key, event_id in wildcards:
                for rid, (current, _) in list(last.items()):
                    if first[rid] < key and current < key:  # type: ignore[operator]
                        last[rid] = (key, event_id)
        gold_path = lake / "gold" / table
        if not gold_path.is_dir():
            out[api] = (len(last), 0, 0)
            continue
        gold = DeltaTable(str(gold_path)).to_pyarrow_table(columns=["Id", "_cdc_last_event_id"])
        applied = sum(
            1
            for rid, eid in zip(
                gold.column("Id").to_pylist(),
                gold.column("_cdc_last_event_id").to_pylist(),
                strict=True,
            )
            if rid in last and last[rid][1] == eid
        )
        out[api] = (len(last), gold.num_rows, applied)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=2.0, help="how long to produce (2)")
    parser.add_argument("--rate", type=float, default=1000.0, help="events per second (1000)")
    parser.add_argument(
        "--cut-every", type=int, default=3000, help="cut every stream after this many events"
    )
    parser.add_argument(
        "--expire-every",
        type=float,
        default=None,
        help="expire every access token this often, in seconds (default: 180, or half the "
        "run when shorter)",
    )
    parser.add_argument("--windows", type=int, default=4, help="freshness windows (4)")
    parser.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="seconds left out at the start (default: a tenth of the run, at most 60)",
    )
    parser.add_argument(
        "--mix",
        choices=sorted(MIXES),
        default="growing",
        help="workload mix: growing (realistic, tables grow fast), steady (creates ten "
        "times rarer) or fixed (--records created first, then only changed)",
    )
    parser.add_argument(
        "--records",
        type=int,
        default=20_000,
        help="records the fixed mix creates before the run starts (default 20,000)",
    )
    parser.add_argument(
        "--maintain-every",
        type=float,
        default=300.0,
        help="the run maintains every table this often, in seconds (300; 0: never)",
    )
    parser.add_argument(
        "--retention-minutes",
        type=float,
        default=5.0,
        help="VACUUM and log retention of that maintenance, in minutes (5)",
    )
    parser.add_argument("--keep", type=Path, help="keep the lake under this directory")
    args = parser.parse_args()
    # The in-process emulator's own warnings (its REST view of records) are not the run's.
    logging.getLogger("ingest.emulator").setLevel(logging.ERROR)
    seconds = args.minutes * 60
    warmup = args.warmup if args.warmup is not None else min(60.0, seconds / 10)
    expire_every = args.expire_every or min(180.0, seconds / 2)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    with scratch("sfcdc-soak-", args.keep) as work:
        return _soak(args, work, seconds, warmup, expire_every)


def _soak(
    args: argparse.Namespace, work: Path, seconds: float, warmup: float, expire_every: float
) -> int:
    catalogue = default_catalogue()
    emulator = Emulator(
        catalogue, EmulatorConfig(keepalive_interval=1.0, idle_timeout=3600.0)
    ).start()
    workload = Workload(
        catalogue, seed=17, clock_ms=lambda: int(time.time() * 1000), mix=MIXES[args.mix]
    )
    if args.mix == "fixed":
        workload.mix = ONLY_CREATES
        emulator.append(list(workload.events(args.records)))
        workload.mix = MIXES["fixed"]
    conf = _write_conf(work, emulator, args.maintain_every, args.retention_minutes)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log_path = work / "pipeline.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "run", "--conf", str(conf), "--continuous"],
        cwd=work,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    memory = Memory()
    storage = Storage()
    stop_memory = threading.Event()
    try:
        ready = work / "lake" / "bronze" / "sfcdc_checkpoints" / "_delta_log"
        deadline = time.monotonic() + 600
        while not (ready.is_dir() and len(list(ready.glob("*.json"))) >= 2):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the pipeline did not start; see {log_path}")
            time.sleep(0.2)
        print(
            f"pipeline live; producing {args.rate:.0f} events/s for {seconds:.0f} s, streams cut "
            f"every {args.cut_every} events, tokens expired every {expire_every:g} s",
            flush=True,
        )
        watcher = LogWatcher(work / "lake").start()
        emulator.faults.cut_streams(args.cut_every, repeat=True)
        started = time.time()
        sampler = threading.Thread(
            target=_sample_memory, args=(proc.pid, started, stop_memory, memory), daemon=True
        )
        sampler.start()
        counter = threading.Thread(
            target=_sample_storage,
            args=(work / "lake", started, stop_memory, storage),
            daemon=True,
        )
        counter.start()
        stop_faults = _faults(emulator, expire_every, threading.Event())
        finish = _produce(emulator, workload, args.rate, threading.Event())
        time.sleep(seconds)
        generated = finish()
        produced_for = time.time() - started
        expirations = stop_faults()
        emulator.faults.clear_stream_cut()
        # The last batches close and the landing catches up; SIGTERM brings the last pass.
        time.sleep(5)
        stop_memory.set()
        sampler.join()
        counter.join()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=900)
        watcher.stop()
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
        emulator.close()

    lake = work / "lake"
    published: Counter[str] = Counter()
    events: dict[str, tuple[str, float]] = {}
    for _name, (api, _kind, _bronze) in OBJECTS.items():
        published[api] = len(emulator.log(catalogue.topic_for_entity(api).name))
    for change in workload.log:
        events[change.event_id] = (change.entity, change.commit_timestamp / 1000.0)

    bronze_rows: Counter[str] = Counter()
    bronze_ids: dict[str, set[str]] = defaultdict(set)
    for api, table in BRONZE.items():
        from deltalake import DeltaTable

        current = DeltaTable(str(lake / "bronze" / table)).to_pyarrow_table(columns=["event_id"])
        bronze_rows[api] = current.num_rows
        bronze_ids[api] = set(current.column("event_id").to_pylist())
    silver_ids: dict[str, int] = {}
    for api, table in SILVER.items():
        path = lake / "silver" / table
        if not path.is_dir():
            silver_ids[api] = 0
            continue
        from deltalake import DeltaTable

        ids = DeltaTable(str(path)).to_pyarrow_table(columns=["_cdc_event_id"])
        silver_ids[api] = len(set(ids.column("_cdc_event_id").to_pylist()))
    gold = _gold_check(lake)

    print()
    print(
        f"soak of sfcdc run --continuous: {seconds / 60:g} min at {generated / produced_for:.0f} "
        f"events/s ({generated} generated, {args.mix} mix), streams cut every "
        f"{args.cut_every} events, "
        f"{expirations} token expirations; {os.cpu_count()} cores, load "
        f"{os.getloadavg()[0]:.1f}; run exit code {code}; lake {disk_usage(lake) / 2**30:.1f} "
        f"GiB on disk ({lake if args.keep else 'removed at exit; --keep DIR keeps it'})"
    )
    print("events per object: published / bronze events (rows) / silver events / gold")
    equal = True
    for api in SILVER:
        rows = bronze_rows[api]
        in_bronze = len(bronze_ids[api])
        in_silver = silver_ids[api]
        g = gold.get(api)
        gold_text = (
            f"{g[2]} of {g[0]} records at their last change ({g[1]} rows)" if g else "no gold"
        )
        ok = published[api] == in_bronze == rows == in_silver and (
            g is None or g[0] == g[1] == g[2]
        )
        equal &= ok
        print(
            f"  {api:<17} {published[api]:>7} / {in_bronze:>7} ({rows}) / {in_silver:>7} / "
            f"{gold_text}  {'OK' if ok else 'MISMATCH'}"
        )
    print(f"  all layers equal: {'yes' if equal else 'NO'}")

    _print_memory(memory, warmup, args.windows)

    print(
        "Delta tables: active data files / data files on disk / JSON log entries / "
        f"checkpoints (maintenance every {args.maintain_every:g} s, retention "
        f"{args.retention_minutes:g} min)"
    )
    for layer in ("bronze", "silver", "gold"):
        base = lake / layer
        if not base.is_dir():
            continue
        for table in sorted(p for p in base.iterdir() if (p / "_delta_log").is_dir()):
            files, on_disk, entries, checkpoints = _delta_stats(table)
            print(
                f"  {layer}.{table.name:<28} {files:>6} {on_disk:>6} {entries:>7} {checkpoints:>4}"
            )

    _print_storage(storage)

    start = started + warmup
    end = started + produced_for
    windows = _freshness_by_window(events, watcher.seen, watcher.marks, start, end, args.windows)
    width = (end - start) / args.windows
    print(f"p95 freshness (s) per window of {width:.0f} s after a {warmup:g} s warm-up:")
    print("  window      " + "".join(f"{layer:>10}" for layer in ("bronze", "silver", "gold")))
    for w in range(args.windows):
        cells = []
        for layer in ("bronze", "silver", "gold"):
            values = windows[layer][w]
            cells.append(f"{_percentile(values, 0.95):10.2f}" if values else f"{'-':>10}")
        print(f"  {w * width:4.0f}-{(w + 1) * width:4.0f} s" + "".join(cells))
    return 0 if equal and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
