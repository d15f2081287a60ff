"""Progress of long work: a bar with rate and ETA on a terminal, log lines everywhere else.

Code doing long work reports it; it never decides how progress is shown::

    from pipelines.progress import progress

    with progress(total=len(ids), unit="records", label="resync Account") as bar:
        for chunk in chunks:
            write(chunk)
            bar.advance(len(chunk))

``total`` may be ``None`` when the amount is not known yet (a stream's backlog, a query whose
size comes with its first page, a Bulk API job still running): the bar then shows the count
and the rate, and ``bar.total = n`` fills in the total, and the ETA, once it is known.
:meth:`Progress.advance` is thread-safe and cheap (call it per chunk or per batch, not per
record); leaving the ``with`` block finishes the work, also on an exception.

How progress is shown is chosen once per process by its entry point (:func:`configure`), as
logging is: ``bar`` draws `rich <https://rich.readthedocs.io>`_ bars on a terminal; ``log``
(the default, for jobs, CI and notebooks) writes an INFO line through :mod:`logging` every
``interval`` seconds while work goes on and a last one when it ends; ``off`` shows nothing.
``sfcdc`` picks ``bar`` when its standard error is a terminal, else ``log`` (``-q``: off).
Work that ends within ``delay`` seconds shows nothing in either mode, so the many short
passes of a continuous run stay quiet.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO, Any, Literal, Protocol

__all__ = [
    "LogReporter",
    "Mode",
    "NullReporter",
    "Progress",
    "Reporter",
    "RichReporter",
    "configure",
    "current_reporter",
    "describe",
    "progress",
]

Mode = Literal["auto", "bar", "log", "off"]
_log = logging.getLogger(__name__)


class Progress:
    """One piece of work: how much of ``total`` (``None``: unknown) is done, in ``unit``.

    Made by :func:`progress`; the reporter it was made with shows it."""

    def __init__(
        self,
        *,
        total: float | None,
        unit: str,
        label: str,
        reporter: Reporter,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if total is not None and total < 0:
            raise ValueError(f"total must be >= 0 or None (got {total})")
        self.label = label
        self.unit = unit
        self._total = total
        self._completed = 0.0
        self._reporter = reporter
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self.started = monotonic()
        self.finished: float | None = None
        # Private to the reporter showing this work.
        self.state: Any = None

    @property
    def total(self) -> float | None:
        return self._total

    @total.setter
    def total(self, value: float | None) -> None:
        if value is not None and value < 0:
            raise ValueError(f"total must be >= 0 or None (got {value})")
        with self._lock:
            self._total = value
        self._reporter.updated(self)

    @property
    def completed(self) -> float:
        return self._completed

    def advance(self, amount: float = 1) -> None:
        """``amount`` more units are done."""
        with self._lock:
            self._completed += amount
        self._reporter.updated(self)

    @property
    def elapsed(self) -> float:
        end = self.finished if self.finished is not None else self._monotonic()
        return max(0.0, end - self.started)

    @property
    def rate(self) -> float | None:
        """Units per second since the work started (``None`` before a measurable time)."""
        elapsed = self.elapsed
        return self._completed / elapsed if elapsed > 1e-6 else None

    @property
    def eta(self) -> float | None:
        """Seconds left at the rate so far (``None`` without a total or a rate)."""
        rate = self.rate
        if self._total is None or not rate:
            return None
        return max(0.0, (self._total - self._completed) / rate)

    def finish(self) -> None:
        if self.finished is None:
            self.finished = self._monotonic()
            self._reporter.finished(self)


class Reporter(Protocol):
    """Shows work: told when it starts, moves and ends (from any thread)."""

    def started(self, work: Progress) -> None: ...

    def updated(self, work: Progress) -> None: ...

    def finished(self, work: Progress) -> None: ...


def _amount(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:,.1f}"


def _seconds(value: float) -> str:
    if value < 60:
        return f"{value:.0f} s"
    minutes, seconds = divmod(int(value), 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def describe(work: Progress) -> str:
    """One line: ``label: done/total unit (pct), rate, ETA`` (what the log lines say)."""
    done = _amount(work.completed)
    total = work.total
    if total is not None:
        pct = 100.0 * work.completed / total if total else 100.0
        amount = f"{done}/{_amount(total)} {work.unit} ({pct:.0f}%)"
    else:
        amount = f"{done} {work.unit}"
    parts = [amount]
    rate = work.rate
    if rate is not None:
        parts.append(f"{_amount(rate)} {work.unit}/s")
    if work.finished is not None:
        parts.append(f"done in {_seconds(work.elapsed)}")
    else:
        eta = work.eta
        parts.append(f"ETA {_seconds(eta)}" if eta is not None else f"{_seconds(work.elapsed)}")
    return f"{work.label}: {', '.join(parts)}"


class NullReporter:
    """Shows nothing."""

    def started(self, work: Progress) -> None:
        pass

    def updated(self, work: Progress) -> None:
        pass

    def finished(self, work: Progress) -> None:
        pass


class LogReporter:
    """An INFO line per piece of work every ``interval`` seconds while it moves, and one when
    it ends if it lasted at least ``delay`` seconds."""

    def __init__(
        self,
        *,
        interval: float = 10.0,
        delay: float = 2.0,
        logger: logging.Logger | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds (got {interval})")
        self._interval = interval
        self._delay = delay
        self._log = logger or _log
        self._monotonic = monotonic
        self._lock = threading.Lock()

    def started(self, work: Progress) -> None:
        work.state = work.started

    def updated(self, work: Progress) -> None:
        now = self._monotonic()
        with self._lock:
            due = now - work.state >= self._interval
            if due:
                work.state = now
        if due:
            self._log.info("%s", describe(work))

    def finished(self, work: Progress) -> None:
        if work.elapsed >= self._delay:
            self._log.info("%s", describe(work))


class RichReporter:
    """``rich`` bars on ``stream`` (a terminal): one line per piece of work that has lasted
    ``delay`` seconds, with its count, rate, ETA and elapsed time. The display runs while such
    work goes on; finished bars stay on screen above whatever is printed next."""

    def __init__(self, *, stream: IO[str] | None = None, delay: float = 0.5) -> None:
        from rich.console import Console

        self._console = Console(file=stream, stderr=stream is None)
        self._delay = delay
        self._lock = threading.Lock()
        self._display: Any = None
        self._shown: list[Progress] = []

    def _columns(self) -> tuple[Any, ...]:
        from rich.progress import BarColumn, ProgressColumn, TextColumn, TimeElapsedColumn
        from rich.text import Text

        class Amount(ProgressColumn):
            def render(self, task: Any) -> Text:
                done = _amount(task.completed)
                total = "?" if task.total is None else _amount(task.total)
                return Text(f"{done}/{total} {task.fields['unit']}")

        class Rate(ProgressColumn):
            # The rate and ETA since the work started, as the log lines give them.
            def render(self, task: Any) -> Text:
                rate, eta = task.fields.get("rate"), task.fields.get("eta")
                text = "" if rate is None else f"{_amount(rate)} {task.fields['unit']}/s"
                if eta is not None and not task.finished:
                    text += f", ETA {_seconds(eta)}"
                return Text(text, style="progress.data.speed")

        return (
            TextColumn("{task.description}"),
            BarColumn(),
            Amount(),
            Rate(),
            TimeElapsedColumn(),
        )

    def started(self, work: Progress) -> None:
        timer = threading.Timer(self._delay, self._show, args=(work,))
        timer.daemon = True
        work.state = {"timer": timer, "task": None}
        timer.start()

    def _show(self, work: Progress) -> None:
        from rich.progress import Progress as RichProgress

        with self._lock:
            if work.finished is not None or work.state["task"] is not None:
                return
            if self._display is None:
                self._display = RichProgress(*self._columns(), console=self._console)
                self._display.start()
                self._shown = []
            work.state["task"] = self._display.add_task(
                work.label,
                total=work.total,
                completed=work.completed,
                unit=work.unit,
                rate=work.rate,
                eta=work.eta,
            )
            self._shown.append(work)

    def updated(self, work: Progress) -> None:
        with self._lock:
            task = work.state["task"] if work.state else None
            if task is not None and self._display is not None:
                self._display.update(
                    task,
                    total=work.total,
                    completed=work.completed,
                    rate=work.rate,
                    eta=work.eta,
                )

    def finished(self, work: Progress) -> None:
        with self._lock:
            state = work.state or {}
            timer = state.get("timer")
            if timer is not None:
                timer.cancel()
            task = state.get("task")
            if task is None or self._display is None:
                return
            total = work.total if work.total is not None else work.completed
            self._display.update(task, total=total, completed=work.completed, rate=work.rate)
            self._display.stop_task(task)
            if all(w.finished is not None for w in self._shown):
                self._display.stop()
                self._display = None
                self._shown = []


# The reporter progress() uses unless given one (configure() replaces it).
_current: dict[str, Reporter] = {"reporter": LogReporter()}


def configure(
    mode: Mode = "auto",
    *,
    stream: IO[str] | None = None,
    interval: float = 10.0,
    delay: float | None = None,
) -> Reporter:
    """Choose how this process shows progress (entry points only; libraries never call it).

    ``auto`` draws bars when ``stream`` (default: standard error) is a terminal, and logs
    otherwise; ``SFCDC_PROGRESS`` in the environment (``bar``, ``log``, ``off``) overrides
    ``auto``. ``interval``: seconds between log lines; ``delay``: work shorter than this shows
    nothing (default 0.5 s for bars, 2 s for log lines)."""
    if mode == "auto":
        forced = os.environ.get("SFCDC_PROGRESS", "").strip().lower()
        if forced in ("bar", "log", "off"):
            mode = forced  # type: ignore[assignment]
        else:
            import sys

            target = stream if stream is not None else sys.stderr
            terminal = bool(getattr(target, "isatty", lambda: False)())
            mode = "bar" if terminal and os.environ.get("TERM") != "dumb" else "log"
    chosen: Reporter
    if mode == "bar":
        chosen = RichReporter(stream=stream, delay=0.5 if delay is None else delay)
    elif mode == "log":
        chosen = LogReporter(interval=interval, delay=2.0 if delay is None else delay)
    elif mode == "off":
        chosen = NullReporter()
    else:
        raise ValueError(f"progress mode must be auto, bar, log or off (got {mode!r})")
    _current["reporter"] = chosen
    return chosen


def current_reporter() -> Reporter:
    """The reporter :func:`progress` uses now."""
    return _current["reporter"]


@contextlib.contextmanager
def progress(
    *, total: float | None = None, unit: str = "items", label: str, reporter: Reporter | None = None
) -> Iterator[Progress]:
    """Report a piece of work while the ``with`` block runs (see the module docstring);
    ``reporter`` defaults to the one :func:`configure` chose."""
    shown_by = reporter if reporter is not None else _current["reporter"]
    work = Progress(total=total, unit=unit, label=label, reporter=shown_by)
    shown_by.started(work)
    try:
        yield work
    finally:
        work.finish()
