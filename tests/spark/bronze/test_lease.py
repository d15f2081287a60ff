"""Topic leases in the Delta table ``bronze.sfcdc_leases`` on both engines: a second holder is
refused naming the first, a lease left unrenewed (a killed process on another host) is taken
over after it expires, the old holder then learns it lost it, and a released lease is free at
once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from ingest.errors import LeaseHeldError
from pipelines.bronze.lease import LeaseHolder, LeaseStore
from pipelines.engines import LakeEngine

TOPICS = ["/data/AccountChangeEvent", "/event/Order_Shipped__e"]


def _holder(
    engine: LakeEngine, now: list[float], *, host: str, pid: int, lost: list[LeaseHeldError]
) -> LeaseHolder:
    return LeaseHolder(
        LeaseStore(engine, clock=lambda: now[0]),
        TOPICS,
        seconds=600.0,  # the renewing thread stays idle: the test renews by hand
        on_lost=lost.append,
        host=host,
        pid=pid,
    )


def test_a_lease_is_refused_while_held_and_taken_over_after_it_expires(
    lake_engine: LakeEngine,
) -> None:
    now = [1_800_000_000.0]
    lost: list[LeaseHeldError] = []
    first = _holder(lake_engine, now, host="driver-a", pid=4242, lost=lost)
    first.acquire()
    try:
        second = _holder(lake_engine, now, host="driver-b", pid=777, lost=lost)
        with pytest.raises(LeaseHeldError) as refused:
            second.acquire()
        message = str(refused.value)
        assert "host driver-a, pid 4242" in message
        assert "since 2027-01-15T08:00:00+00:00" in message
        assert "until 2027-01-15T08:10:00+00:00" in message
        assert second.held == {}

        # The first holder renews on time: still refused later.
        now[0] += 300
        assert first.renew()
        now[0] += 400
        with pytest.raises(LeaseHeldError, match="pid 4242"):
            second.acquire()

        # It stops renewing (killed): after expiry the lease is taken over.
        now[0] += 601
        second.acquire()
        assert set(second.held) == set(TOPICS)
        # The old holder's next renewal finds a newer generation: it lost the lease.
        assert not first.renew()
        assert lost and "taken over by another landing (host driver-b, pid 777" in str(lost[0])

        # A released lease is free at once.
        second.release()
        third = _holder(lake_engine, now, host="driver-c", pid=1, lost=lost)
        third.acquire()
        assert set(third.held) == set(TOPICS)
        third.release()
    finally:
        first.release()


def _race(holders: list[LeaseHolder]) -> list[str]:
    """Each holder acquires in its own thread, all at once: "held" or the refusal's text."""
    start = threading.Barrier(len(holders))
    outcomes = [""] * len(holders)

    def take(n: int) -> None:
        start.wait()
        try:
            holders[n].acquire()
            outcomes[n] = "held"
        except LeaseHeldError as exc:
            outcomes[n] = str(exc)

    threads = [threading.Thread(target=take, args=(n,)) for n in range(len(holders))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return outcomes


@pytest.mark.append_parts
def test_two_landings_taking_the_same_leases_at_once_get_them_once(
    make_engine: Callable[..., LakeEngine], tmp_path: Path
) -> None:
    """Two landings (each with its own engine over one lake, as two processes would) both
    read the leases free, then both commit the next generation of every topic: Delta lets one
    commit through and refuses the other (a concurrent transaction of the same app ids), so
    exactly one holds the leases, and the other names the holder or the race."""
    now = [1_800_000_000.0]
    lost: list[LeaseHeldError] = []
    engines = [make_engine(tmp_path / "lake") for _ in range(2)]
    for attempt in range(3):
        holders = [
            _holder(engines[n], now, host=f"driver-{attempt}-{n}", pid=100 + n, lost=lost)
            for n in range(2)
        ]
        outcomes = _race(holders)
        assert sorted(o == "held" for o in outcomes) == [False, True], outcomes
        winner = outcomes.index("held")
        assert set(holders[winner].held) == set(TOPICS)
        assert holders[1 - winner].held == {}
        assert "another landing" in outcomes[1 - winner]
        holders[winner].release()
    assert not lost
