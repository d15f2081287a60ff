"""``replay.on_expired``: which policy a rejected replay id gets. A position sfcdc stored was
valid once, so its rejection means it expired; a configured ``replay_id`` may simply be wrong
and keeps ``on_corrupted``."""

from __future__ import annotations

import pytest

from pipelines.spec import ReplaySpec


@pytest.mark.parametrize(
    ("spec", "stored", "policy"),
    [
        (ReplaySpec(on_expired="rebootstrap"), True, "latest"),
        (ReplaySpec(on_expired="rebootstrap"), False, "latest"),
        (ReplaySpec(on_expired="rebootstrap", replay_id="hex:00ff"), True, "latest"),
        (ReplaySpec(on_expired="rebootstrap", replay_id="hex:00ff"), False, "fail"),
        (
            ReplaySpec(on_expired="rebootstrap", on_corrupted="earliest", replay_id="hex:01"),
            False,
            "earliest",
        ),
        (ReplaySpec(), True, "fail"),
        (ReplaySpec(on_corrupted="earliest"), True, "earliest"),
    ],
)
def test_the_policy_of_a_rejected_replay_id(spec: ReplaySpec, stored: bool, policy: str) -> None:
    assert spec.corrupted_policy(stored=stored) == policy


def test_the_spec_default_keeps_the_old_behaviour() -> None:
    assert ReplaySpec().on_expired == "on_corrupted"
