"""A fold pauses Python's cycle collector and always turns it back on."""

from __future__ import annotations

import gc

import pytest

from pipelines.gold.folding import _collector_paused


def test_the_collector_is_off_during_a_fold_and_back_on_after_it() -> None:
    assert gc.isenabled()
    with _collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_fold_that_fails_turns_the_collector_back_on() -> None:
    with pytest.raises(ZeroDivisionError), _collector_paused():
        1 / 0
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    try:
        with _collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
