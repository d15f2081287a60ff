"""Stopping a long-running command cleanly on SIGINT or SIGTERM (``sfcdc run``,
``sfcdc streaming``)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

__all__ = ["stop_on_signals"]


@contextlib.contextmanager
def stop_on_signals(stop: Callable[[str], None]) -> Iterator[None]:
    """While inside, SIGINT and SIGTERM call ``stop`` with the signal's name; a second signal
    acts as it normally would (stopping at any instant is safe). Only in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[signal.Signals, Any] = {}

    def handle(signum: int, _frame: FrameType | None) -> None:
        stop(f"received {signal.Signals(signum).name}")
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, handle)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
