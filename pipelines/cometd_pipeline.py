"""The Streaming API source end to end: landing, silver and gold of the channels of a
``conf/``, on a connection that is already open.

- :func:`land_streams` lands the enabled channels (:class:`~pipelines.bronze.cometd.
  CometdLanding`) with the token manager and CA of an open
  :class:`~pipelines.connect.Source`;
- :func:`landing_streams_beside` lands them in a thread while a continuous Pub/Sub landing
  runs (``sfcdc run --continuous``, ``sfcdc ingest --with-streams``);
- :func:`run_cometd_pass` runs the channels' silver, then gold;
- :func:`push_topic_provisioner` makes the PushTopics an in-process emulator must know before
  it generates its workload (passed to :func:`~pipelines.connect.connect` as ``on_start``),
  so the workload's record changes produce notifications.

``sfcdc streaming`` (:mod:`pipelines.commands.cometd`) and ``sfcdc run --once`` use them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from ingest.auth import TokenManager
from ingest.client import TlsSettings
from ingest.cometd.setup import ensure_push_topic
from ingest.rest import RestClient
from pipelines.bronze.cometd import CometdLanding
from pipelines.bronze.cometd_setup import push_topic_settings
from pipelines.bronze.landing_state import LandingResult
from pipelines.gold.cometd import run_cometd_gold
from pipelines.gold.job import GoldResult
from pipelines.ops.recorder import recorder_for
from pipelines.silver.cometd_job import (
    CometdSilverResult,
    run_cometd_silver,
    select_streams,
)
from pipelines.spec.conf import Conf

if TYPE_CHECKING:
    from pipelines.engines.base import LakeEngine
    from pipelines.ops.recorder import OpsRecorder
    from pipelines.ops.table import CommitRecord

__all__ = [
    "CometdPassResult",
    "cometd_landing",
    "land_streams",
    "land_topics_and_streams",
    "landing_streams_beside",
    "push_topic_provisioner",
    "run_cometd_pass",
]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CometdPassResult:
    """One silver pass and one gold pass over the Streaming API channels."""

    silver: CometdSilverResult
    gold: GoldResult
    seconds: float


def cometd_landing(
    conf: Conf,
    *,
    engine: LakeEngine,
    tokens: TokenManager,
    ca_file: Path | str | None,
    streams: Sequence[str] | None = None,
    ops: OpsRecorder | None = None,
) -> CometdLanding:
    """The landing of the enabled channels (or the ``streams`` named) of ``conf``."""
    return CometdLanding(
        engine,
        select_streams(conf, streams),
        tokens=tokens,
        ca_file=ca_file,
        streaming=conf.pipeline.streaming_api,
        ingest=conf.pipeline.ingest,
        ops=ops,
    )


def land_streams(
    conf: Conf,
    *,
    engine: LakeEngine,
    tokens: TokenManager,
    ca_file: Path | str | None,
    once: bool = False,
    duration: float | None = None,
    streams: Sequence[str] | None = None,
    started: Callable[[CometdLanding], Callable[[], None] | None] | None = None,
    ops: OpsRecorder | None = None,
) -> LandingResult:
    """Land the enabled channels (or the ``streams`` named) of ``conf``; ``started`` is
    called with the landing before it runs (the function it may return, once it stopped);
    ``ops`` receives its commit records."""
    landing = cometd_landing(
        conf, engine=engine, tokens=tokens, ca_file=ca_file, streams=streams, ops=ops
    )
    finish = started(landing) if started is not None else None
    try:
        return landing.run(once=once, duration=duration)
    finally:
        if finish is not None:
            finish()


@contextlib.contextmanager
def landing_streams_beside(
    conf: Conf,
    *,
    engine: Callable[[], LakeEngine],
    tokens: TokenManager,
    ca_file: Path | str | None,
    logger: logging.Logger | None = None,
) -> Iterator[None]:
    """Land ``conf``'s enabled channels in a thread while the block runs (the block runs the
    Pub/Sub landing). When the block ends, the channels' landing commits its open batches and
    the thread is joined. ``engine`` makes the channels' own engine, and their commit records
    have their own recorder: another thread writes through the Pub/Sub landing's.

    A failure of the channels does not stop the Pub/Sub topics: it is logged and recorded in
    the commits table for each channel at once, and raised when the block ends."""
    log = logger or _log
    own = engine()
    ops = recorder_for(own, conf, logger=log)
    lock = threading.Lock()
    stopping = threading.Event()
    running: list[CometdLanding] = []
    failure: list[BaseException] = []

    def started(landing: CometdLanding) -> None:
        with lock:
            running.append(landing)
            if stopping.is_set():
                landing.stop("the Pub/Sub landing stopped")

    def work() -> None:
        try:
            land_streams(conf, engine=own, tokens=tokens, ca_file=ca_file, started=started, ops=ops)
        except BaseException as exc:  # raised in the calling thread when the block ends
            failure.append(exc)
            log.error("streaming api: landing the channels failed (Pub/Sub goes on): %s", exc)
            for spec in conf.enabled_streams():
                ops.error("bronze", exc, topic=spec.key)
            ops.flush()

    thread = threading.Thread(target=work, name="sfcdc-streaming-landing", daemon=True)
    thread.start()
    try:
        yield
    finally:
        with lock:
            stopping.set()
            for landing in running:
                landing.stop("the Pub/Sub landing stopped")
        thread.join()
    if failure:
        raise failure[0]


_Result = TypeVar("_Result")


def land_topics_and_streams(
    conf: Conf,
    land_topics: Callable[[], _Result],
    *,
    streams: bool,
    once: bool,
    engine: LakeEngine,
    make_engine: Callable[[], LakeEngine],
    tokens: TokenManager,
    ca_file: Path | str | None,
    ops: OpsRecorder,
    logger: logging.Logger | None = None,
    streams_after: Callable[[], bool] = lambda: True,
) -> tuple[_Result, LandingResult | None]:
    """Run ``land_topics`` (the Pub/Sub landing) and, with ``streams``, land the channels
    too: beside it in a thread (:func:`landing_streams_beside`, on an engine ``make_engine``
    makes), or once it is done with ``once`` (on ``engine``, recording through ``ops``) unless
    ``streams_after`` says no. Returns both results (``None`` when the channels did not
    land after the topics)."""
    beside: contextlib.AbstractContextManager[None] = (
        landing_streams_beside(
            conf, engine=make_engine, tokens=tokens, ca_file=ca_file, logger=logger
        )
        if streams and not once
        else contextlib.nullcontext()
    )
    with beside:
        result = land_topics()
    if not (streams and once and streams_after()):
        return result, None
    channels = land_streams(conf, engine=engine, tokens=tokens, ca_file=ca_file, once=True, ops=ops)
    return result, channels


def run_cometd_pass(
    engine: LakeEngine,
    conf: Conf,
    *,
    streams: Sequence[str] | None = None,
    clock: Callable[[], float] = time.monotonic,
    on_commit: Callable[[CommitRecord], object] | None = None,
) -> CometdPassResult:
    """Silver, then gold, of the enabled channels (or the ``streams`` named); ``on_commit``
    receives their commit records."""
    started = clock()
    silver = run_cometd_silver(engine, conf, streams=streams, on_commit=on_commit)
    gold = run_cometd_gold(engine, conf, streams=streams, on_commit=on_commit)
    return CometdPassResult(silver, gold, clock() - started)


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
