"""The Streaming API source end to end: landing, silver and gold of the channels of a
``conf/``, on a connection that is already open.

- :func:`land_streams` lands the enabled channels (:class:`~pipelines.bronze.streaming.
  StreamingLanding`) with the token manager and CA of an open
  :class:`~pipelines.connect.Source`;
- :func:`run_streaming_pass` runs the channels' silver, then gold;
- :func:`push_topic_provisioner` makes the PushTopics an in-process emulator must know before
  it generates its workload (passed to :func:`~pipelines.connect.connect` as ``on_start``),
  so the workload's record changes produce notifications.

``sfcdc streaming`` (:mod:`pipelines.commands.streaming`) and ``sfcdc run --once`` use them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ingest.auth import TokenManager
from ingest.client import TlsSettings
from ingest.rest import RestClient
from ingest.streaming.setup import ensure_push_topic
from pipelines.bronze.landing import LandingResult
from pipelines.bronze.streaming import StreamingLanding
from pipelines.bronze.streaming_setup import push_topic_settings
from pipelines.gold.job import GoldResult
from pipelines.gold.streaming import run_streaming_gold
from pipelines.silver.streaming_job import (
    StreamingSilverResult,
    run_streaming_silver,
    select_streams,
)
from pipelines.spec import Conf

if TYPE_CHECKING:
    from pipelines.engines import LakeEngine

__all__ = [
    "StreamingPassResult",
    "land_streams",
    "push_topic_provisioner",
    "run_streaming_pass",
]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamingPassResult:
    """One silver pass and one gold pass over the Streaming API channels."""

    silver: StreamingSilverResult
    gold: GoldResult
    seconds: float


def land_streams(
    conf: Conf,
    *,
    engine: LakeEngine,
    tokens: TokenManager,
    ca_file: Path | str | None,
    once: bool = False,
    duration: float | None = None,
    streams: Sequence[str] | None = None,
    started: Callable[[StreamingLanding], Callable[[], None] | None] | None = None,
) -> LandingResult:
    """Land the enabled channels (or the ``streams`` named) of ``conf``; ``started`` is
    called with the landing before it runs (the function it may return, once it stopped)."""
    landing = StreamingLanding(
        engine,
        select_streams(conf, streams),
        tokens=tokens,
        ca_file=ca_file,
        streaming=conf.pipeline.streaming_api,
        ingest=conf.pipeline.ingest,
    )
    finish = started(landing) if started is not None else None
    try:
        return landing.run(once=once, duration=duration)
    finally:
        if finish is not None:
            finish()


def run_streaming_pass(
    engine: LakeEngine,
    conf: Conf,
    *,
    streams: Sequence[str] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> StreamingPassResult:
    """Silver, then gold, of the enabled channels (or the ``streams`` named)."""
    started = clock()
    silver = run_streaming_silver(engine, conf, streams=streams)
    gold = run_streaming_gold(engine, conf, streams=streams)
    return StreamingPassResult(silver, gold, clock() - started)


def push_topic_provisioner(
    conf: Conf, *, logger: logging.Logger | None = None
) -> Callable[[TokenManager, Path | None], None] | None:
    """What :func:`~pipelines.connect.connect` calls once an in-process emulator serves:
    the PushTopics sfcdc manages are made before the workload is generated (``None`` when the
    configuration has none)."""
    managed = [
        s
        for s in conf.enabled_streams()
        if s.pushtopic is not None and s.pushtopic.manage == "create_or_update"
    ]
    if not managed:
        return None
    log = logger or _log
    version = f"v{conf.pipeline.streaming_api.api_version}"

    def provision(tokens: TokenManager, ca_file: Path | None) -> None:
        with RestClient(
            tokens, api_version=version, tls=TlsSettings(ca_file=ca_file), logger=log
        ) as rest:
            for spec in managed:
                assert spec.push_topic_name is not None
                ensure_push_topic(rest, spec.push_topic_name, push_topic_settings(spec), logger=log)

    return provision
