"""The options every command that reads ``conf/`` shares: ``--conf DIR`` and ``--set KEY=VALUE``.

``--set`` replaces a key of ``pipeline.yml`` for one run (repeatable), which is how a job says
what differs between deployments without a second copy of ``conf/``::

    sfcdc gold --conf conf/ --set lake.engine=spark --set lake.catalog=main \\
        --set lake.schemas.gold=sales_gold
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ingest.auth import SecretResolver
from ingest.errors import ConfigError
from pipelines.connect import secret_resolver
from pipelines.spec.conf import Conf
from pipelines.spec.load import load_conf, parse_override

__all__ = [
    "METRICS_PORT_KEY",
    "add_conf_options",
    "add_metrics_option",
    "conf_from_args",
    "secrets_from_args",
]

# The pipeline.yml key `--metrics-port` replaces.
METRICS_PORT_KEY = "ops.prometheus.port"


def _override(text: str) -> tuple[str, Any]:
    try:
        return parse_override(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_conf_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--conf`` and the repeatable ``--set`` to a subcommand's parser."""
    parser.add_argument(
        "--conf", type=Path, default=Path("conf"), help="configuration directory (default: conf)"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        type=_override,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="replace a pipeline.yml key for this run, e.g. lake.catalog=main (repeatable; the "
        "value is read as YAML and validated like the file)",
    )


def _port(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number (got {text!r})") from None


def add_metrics_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--metrics-port`` (the Prometheus endpoint; it replaces ``ops.prometheus.port``)."""
    parser.add_argument(
        "--metrics-port",
        type=_port,
        metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics while running (replaces "
        f"{METRICS_PORT_KEY}; ops.prometheus.host is the interface)",
    )


def conf_from_args(args: argparse.Namespace) -> Conf:
    """The configuration the parsed ``--conf``, ``--set`` (and ``--metrics-port``) options
    describe."""
    overrides = list(getattr(args, "overrides", ()))
    port = getattr(args, "metrics_port", None)
    if port is not None:
        overrides.append((METRICS_PORT_KEY, port))
    return load_conf(args.conf, overrides=tuple(overrides))


def secrets_from_args(args: argparse.Namespace) -> SecretResolver:
    """The resolver :func:`pipelines.cli.main` was given for secret references, or one that
    reads environment variables."""
    secrets: SecretResolver | None = getattr(args, "secrets", None)
    return secrets if secrets is not None else secret_resolver()
