"""The ``sfcdc`` command. Each subcommand lives in ``pipelines/commands/<name>.py`` and exposes
``register(subparsers)``; this module only wires them together and configures logging.

``pip install sfcdc`` without extras has neither Spark nor delta-rs: ``sfcdc --help``,
``validate``, ``emulator`` and ``publish`` work, and a command that needs an extra says which
one (``pip install 'sfcdc[local]'``) instead of failing with an import traceback."""

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

__all__ = ["COMMANDS", "EXTRAS", "build_parser", "main", "missing_extra"]

# The packages of the extras (pyproject.toml), and the extra to install for each.
EXTRAS: dict[str, str] = {
    "pyspark": "local",
    "py4j": "local",
    "deltalake": "local",
    "pandas": "local",
    "delta": "spark",
}

# The commands, in the order `sfcdc --help` lists them; each is the module of its name under
# pipelines.commands (dashes as underscores) unless _MODULES names another.
COMMANDS: tuple[str, ...] = (
    "demo",
    "run",
    "validate",
    "status",
    "sql",
    "ingest",
    "poll",
    "silver",
    "gold",
    "streaming",
    "bootstrap",
    "onboard",
    "resync",
    "reconcile",
    "formulas",
    "maintain",
    "publish",
    "emulator",
    "delta-jars",
)
# `sfcdc streaming` is the Salesforce Streaming API's (CometD) command: pipelines.commands.cometd.
_MODULES: dict[str, str] = {"streaming": "cometd"}


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
        try:
            module = importlib.import_module(
                f"pipelines.commands.{_MODULES.get(name, name.replace('-', '_'))}"
            )
        except ModuleNotFoundError as exc:
            if missing_extra(exc) is None:
                raise
            _needs_extra(sub, name, exc)
            continue
        module.register(sub)
    return parser


def missing_extra(exc: ImportError) -> str | None:
    """The extra whose package ``exc`` failed to import, or ``None`` for another module."""
    name = (exc.name or "").split(".")[0]
    return EXTRAS.get(name)


def _extra_message(command: str, exc: ImportError) -> str:
    extra = missing_extra(exc)
    package = (exc.name or "").split(".")[0]
    hint = (
        " (the local engine and sfcdc sql; 'sfcdc[spark]' for the spark engine on plain Spark)"
        if extra == "local"
        else " (the spark engine on plain Spark)"
    )
    return (
        f"sfcdc {command} needs {package}, which is not installed: pip install "
        f"'sfcdc[{extra}]'{hint}"
    )


def _needs_extra(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, exc: ImportError
) -> None:
    """``name`` as a command that only says which extra it needs."""
    message = _extra_message(name, exc)
    parser = sub.add_parser(name, help=f"(needs pip install 'sfcdc[{missing_extra(exc)}]')")

    def handler(args: argparse.Namespace) -> int:
        print(message, file=sys.stderr)
        return 2

    # Its options are unknown here: main() lets them through.
    parser.set_defaults(handler=handler, needs_extra=True)


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
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "needs_extra", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.secrets = secrets
    _configure_logging(args.verbose, args.quiet)
    # Bars on a terminal, log lines otherwise (jobs, CI); -q shows neither.
    configure_progress("off" if args.quiet else "auto")
    try:
        result = args.handler(args)
    except SfcdcError as exc:
        print(f"sfcdc {args.command}: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if missing_extra(exc) is None:
            raise
        print(_extra_message(args.command, exc), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"sfcdc {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
