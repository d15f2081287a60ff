"""The ``salesforce`` data source's options, checked once into a frozen value.

Connection settings come either from a ``pipeline.yml`` (``pipeline`` = its path) or from
options named like its keys (``connection.source``, ``connection.emulator.grpc_port``,
``connection.salesforce.auth.client_secret`` ...), read by the same spec parser, so secret
references (``{env: NAME}``, ``{secret: {scope: ..., key: ...}}``) work as in the file and
a secret is never an option value. Option values are never echoed in messages: one of them
may be meant for a secret key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from ingest.client import CorruptedReplayPolicy
from ingest.errors import ConfigError
from pipelines.spark_source.offsets import TopicOffset, parse_starting
from pipelines.spec.connection import ConnectionSpec
from pipelines.spec.load import load_conf, load_pipeline, parse_override, pipeline_from_overrides

__all__ = ["Decode", "SourceOptions", "parse_options"]

Decode = Literal["raw", "silver"]

_CONNECTION = "connection."
_KEYS = {
    "pipeline": "path of a pipeline.yml whose connection section is used",
    "topic": "one topic or several, comma-separated (/data/AccountChangeEvent)",
    "startingreplay": "earliest, latest, or a stored replay id in base64",
    "oncorrupted": "fail, earliest or latest: what a rejected stored replay id does",
    "decode": "raw (bronze columns) or silver (decoded columns)",
    "replaygaps": "raw reads: log (default) or rows (a replay_gap column and a row per gap)",
    "maxeventspertrigger": "events per micro-batch at most (all topics together)",
    "maxwaitseconds": "how long one micro-batch waits for its first events",
    "batchidleseconds": "a batch read ends after this many seconds without an event",
    "maxevents": "a batch read ends after this many events (all topics together)",
    "numrequested": "flow-control window per topic (1-100)",
}
_SHOWN = "the salesforce source options"


@dataclass(frozen=True)
class SourceOptions:
    """What a read asks for. ``connection`` is the parsed ``connection:`` section;
    ``starting`` the per-topic position a new query starts at."""

    connection: ConnectionSpec
    topics: tuple[str, ...]
    starting: Mapping[str, TopicOffset]
    on_corrupted: CorruptedReplayPolicy
    decode: Decode
    max_events_per_trigger: int
    max_wait_seconds: float
    batch_idle_seconds: float
    max_events: int
    num_requested: int
    gap_rows: bool = False


def _number(options: Mapping[str, str], key: str, default: float, *, integer: bool) -> Any:
    raw = options.get(key)
    if raw is None or str(raw).strip() == "":
        return int(default) if integer else default
    try:
        value: float = int(raw) if integer else float(raw)
    except ValueError:
        kind = "a whole number" if integer else "a number"
        raise ConfigError(f"{_SHOWN}: {key} must be {kind} (got {raw!r})") from None
    if value <= 0:
        raise ConfigError(f"{_SHOWN}: {key} must be > 0 (got {raw!r})")
    return value


def _topics(raw: str | None) -> tuple[str, ...]:
    topics = tuple(t.strip() for t in (raw or "").split(",") if t.strip())
    if not topics:
        raise ConfigError(
            f"{_SHOWN}: topic is required: one topic such as /data/AccountChangeEvent, or "
            "several separated by commas"
        )
    bad = [t for t in topics if not t.startswith("/")]
    if bad:
        raise ConfigError(
            f"{_SHOWN}: topic must be paths such as /data/AccountChangeEvent (got {bad})"
        )
    if len(set(topics)) != len(topics):
        raise ConfigError(f"{_SHOWN}: topic names a topic twice (got {list(topics)})")
    return topics


def parse_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Check ``options`` (keys case-insensitive, as Spark passes them). Unknown keys are
    errors listing the valid ones. ``startingReplay`` defaults to ``latest`` for streaming
    reads and ``earliest`` for batch reads, unless ``pipeline``'s defaults name one."""
    lowered = {str(k).lower(): v for k, v in options.items()}
    unknown = sorted(k for k in lowered if k not in _KEYS and not k.startswith(_CONNECTION))
    if unknown:
        valid = ", ".join(sorted(_KEYS))
        raise ConfigError(
            f"{_SHOWN}: unknown option(s) {unknown}; valid options are {valid}, and "
            "connection.<key path> for any key of pipeline.yml's connection section"
        )
    overrides = [
        parse_override(f"{k}={v}") for k, v in sorted(lowered.items()) if k.startswith(_CONNECTION)
    ]
    replay_start: str | None = None
    on_corrupted: str = "fail"
    if "pipeline" in lowered:
        path = Path(lowered["pipeline"])
        # connection.* options then override the file's keys, as `--set` does for commands
        # (a deployment's connection.source, say); the conf directory is loaded as a whole.
        pipeline = (
            load_conf(path.parent, overrides=overrides).pipeline
            if overrides
            else load_pipeline(path)
        )
        connection = pipeline.connection
        replay = pipeline.defaults.replay
        replay_start = replay.start if replay.start in ("earliest", "latest") else None
        on_corrupted = replay.on_corrupted
    else:
        # Option names are lower-cased by Spark; pipeline.yml's connection keys are
        # lower-case already.
        connection = pipeline_from_overrides(overrides, base=Path.cwd(), shown=_SHOWN).connection
    if connection.source == "emulator" and connection.emulator.mode != "external":
        raise ConfigError(
            f"{_SHOWN}: the emulator must run outside the query (connection.emulator.mode "
            "external, with its grpc_port and http_port): Spark reads in several processes, "
            "and each would start an emulator of its own"
        )
    topics = _topics(lowered.get("topic"))
    starting_text = lowered.get("startingreplay") or replay_start
    if starting_text is None:
        starting_text = "latest" if streaming else "earliest"
    try:
        start = parse_starting(starting_text)
    except ValueError as exc:
        raise ConfigError(f"{_SHOWN}: startingReplay {exc}") from None
    policy = (lowered.get("oncorrupted") or on_corrupted).strip().lower()
    if policy not in ("fail", "earliest", "latest"):
        raise ConfigError(
            f"{_SHOWN}: onCorrupted must be 'fail', 'earliest' or 'latest' (got {policy!r})"
        )
    decode = (lowered.get("decode") or "raw").strip().lower()
    if decode not in ("raw", "silver"):
        raise ConfigError(f"{_SHOWN}: decode must be 'raw' or 'silver' (got {decode!r})")
    if decode == "silver" and len(topics) != 1:
        raise ConfigError(
            f"{_SHOWN}: decode=silver reads one object's topic per query (got {len(topics)} "
            "topics); read raw events of several topics, or one query per object"
        )
    gaps = (lowered.get("replaygaps") or ("rows" if decode == "silver" else "log")).strip().lower()
    if gaps not in ("log", "rows"):
        raise ConfigError(f"{_SHOWN}: replayGaps must be 'log' or 'rows' (got {gaps!r})")
    if decode == "silver" and gaps == "log":
        raise ConfigError(
            f"{_SHOWN}: decode=silver always records a replay gap as a row (_cdc_error_kind "
            "replay_gap); replayGaps=log applies to raw reads only"
        )
    num_requested = _number(lowered, "numrequested", 100, integer=True)
    if num_requested > 100:
        raise ConfigError(f"{_SHOWN}: numRequested must be at most 100 (got {num_requested})")
    return SourceOptions(
        connection=connection,
        topics=topics,
        starting=dict.fromkeys(topics, start),
        on_corrupted=cast(CorruptedReplayPolicy, policy),
        decode=cast(Decode, decode),
        max_events_per_trigger=_number(lowered, "maxeventspertrigger", 10_000, integer=True),
        max_wait_seconds=_number(lowered, "maxwaitseconds", 0.5, integer=False),
        batch_idle_seconds=_number(lowered, "batchidleseconds", 2.0, integer=False),
        max_events=_number(lowered, "maxevents", 10_000_000, integer=True),
        num_requested=num_requested,
        gap_rows=gaps == "rows",
    )
