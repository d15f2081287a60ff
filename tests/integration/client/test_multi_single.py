"""One subscription iterated in the consumer's own thread: ``on_idle`` keeps its rhythm while
the stream waits out a reconnect backoff, and can stop or fail the loop from there."""

from __future__ import annotations

import socket
import threading
import time

import grpc
import pytest

from ingest.client.multi import MultiSubscription
from ingest.client.retry import RetryPolicy
from ingest.client.subscriber import Subscription
from ingest.replay import Earliest

pytestmark = pytest.mark.integration

TOPIC = "/event/Order_Event__e"
# Long backoffs: without idle calls in between, the loop would sit in them for seconds.
SLOW_RETRY = RetryPolicy(max_attempts=50, initial_backoff=5.0, max_backoff=5.0)


# The whole backoff every time: full jitter would now and then draw one shorter than the idle
# calls these tests count, and the loop would resubscribe before they were done.
def _whole_backoff() -> float:
    return 1.0


def _closed_port_channel() -> grpc.Channel:
    # A port nothing listens on: every stream fails at once with UNAVAILABLE.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return grpc.insecure_channel(f"127.0.0.1:{port}")


def test_on_idle_runs_during_backoff_and_stops_the_loop() -> None:
    consumer = threading.get_ident()
    calls: list[int] = []

    def idle() -> bool:
        calls.append(threading.get_ident())
        return len(calls) >= 5

    with _closed_port_channel() as channel:
        sub = Subscription(channel, TOPIC, start=Earliest(), retry=SLOW_RETRY, rand=_whole_backoff)
        started = time.monotonic()
        items = list(MultiSubscription([sub], on_idle=idle, idle_interval=0.02))
        elapsed = time.monotonic() - started
    assert items == []
    assert len(calls) == 5 and set(calls) == {consumer}
    assert elapsed < 4.0, f"the loop waited out the backoff ({elapsed:.1f} s)"
    assert sub.closed


def test_a_failing_on_idle_during_backoff_raises_its_own_error() -> None:
    class Stop(Exception):
        pass

    def idle() -> bool:
        raise Stop("committer failed")

    with _closed_port_channel() as channel:
        sub = Subscription(channel, TOPIC, start=Earliest(), retry=SLOW_RETRY, rand=_whole_backoff)
        with pytest.raises(Stop, match="committer failed"):
            for _ in MultiSubscription([sub], on_idle=idle, idle_interval=0.02):
                pass
    assert sub.closed
