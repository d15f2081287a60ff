"""Topic leases in the Delta table ``bronze.sfcdc_leases`` on both engines: a second holder is
refused naming the first, a lease left unrenewed (a killed process on another host) is taken
over after it expires, the old holder then learns it lost it, and a released lease is free at
once."""

from __future__ import annotations

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
