"""The ``sfcdc`` command. Each subcommand lives in ``pipelines/commands/<name>.py`` and exposes
``register(subparsers)``; this module only wires them together and configures logging."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ingest.errors import SfcdcError
from pipelines.progress import configure as configure_progress

if TYPE_CHECKING:
    from ingest.auth import SecretResolver

__all__ = ["COMMANDS", "build_parser", "main"]

# Module names under pipelines.commands, in the order `sfcdc --help` lists them.
COMMANDS: tuple[str, ...] = (
    "demo",
    "run",
    "validate",
    "status",
    "sql",
    "ingest",
    "silver",
    "gold",
    "streaming",
    "bootstrap",
    "onboard",
    "resync",
    "maintain",
    "publish",
    "emulator",
    "delta-jars",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sfcdc",
        description="Salesforce Change Data Capture and platform events into Delta Lake.",
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module = importlib.import_module(f"pipelines.commands.{name.replace('-', '_')}")
        module.register(sub)
    return parser


def _configure_logging(verbose: int, quiet: bool) -> None:
    level = logging.WARNING if quiet else logging.DEBUG if verbose > 1 else logging.INFO
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if verbose < 2:
        for noisy in ("py4j", "httpx", "httpcore", "urllib3"):
            logging.getLogger(noisy).setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None, *, secrets: SecretResolver | None = None) -> int:
    """Run ``sfcdc`` with ``argv`` (default: the process arguments) and return its exit status.

    ``secrets`` resolves the configuration's secret references for the commands that log in
    (default: environment variables only); Databricks entry points pass one that reads secret
    scopes with ``dbutils``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.secrets = secrets
    _configure_logging(args.verbose, args.quiet)
    # Bars on a terminal, log lines otherwise (jobs, CI); -q shows neither.
    configure_progress("off" if args.quiet else "auto")
    try:
        result = args.handler(args)
    except SfcdcError as exc:
        print(f"sfcdc {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"sfcdc {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
