"""What `sfcdc emulator serve --events N` appends, and that its help says so."""

from __future__ import annotations

import argparse

from pipelines.cli import build_parser
from pipelines.commands.emulator import serve


def _serve_help() -> str:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    emulator = subparsers.choices["emulator"]
    actions = next(a for a in emulator._actions if isinstance(a, argparse._SubParsersAction))
    return " ".join(actions.choices["serve"].format_help().split())


def test_events_counts_the_workload_mix_platform_events_included() -> None:
    args = build_parser().parse_args(
        ["emulator", "serve", "--port", "0", "--events", "300", "--platform-events", "0"]
    )
    run = serve(args)
    try:
        logs = {t.name: len(run.emulator.log(t.name)) for t in run.emulator.catalogue}
    finally:
        run.emulator.close()
    change = sum(
        n for name, n in logs.items() if name.startswith("/data/") and "ChangeEvents" not in name
    )
    platform = sum(n for name, n in logs.items() if name.startswith("/event/"))
    # --platform-events 0, yet the workload's own publish calls are among the 300.
    assert platform > 0
    assert change + platform >= 300


def test_the_help_says_what_events_counts() -> None:
    text = _serve_help()
    assert "change events to append" not in text
    assert (
        "--events EVENTS workload events to append (change events and the platform events" in text
    )
    assert "--platform-events PLATFORM_EVENTS platform events appended on top of --events" in text
