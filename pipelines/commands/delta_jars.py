"""``sfcdc delta-jars``: resolve the Delta Lake jars the ``spark`` engine loads, with Maven.

::

    sfcdc delta-jars [--dest DIR] [--force]

Run once after installing ``sfcdc[spark]``: the jars of the installed delta-spark release and
their runtime dependencies land in ``build/delta-jars`` of the checkout (or
``$SFCDC_DELTA_JARS``, or ``~/.cache/sfcdc/delta-jars`` for an installed wheel); local Spark
sessions of the spark engine then load them from there, with no download at start.
Databricks runtimes have Delta built in and need none of this.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pipelines.delta_jars import jars_dir, resolve_jars

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    """Add ``delta-jars`` to the ``sfcdc`` command."""
    parser = subparsers.add_parser(
        "delta-jars",
        help="resolve the Delta Lake jars of the spark engine with Maven (once)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument(
        "--dest",
        type=Path,
        default=None,
        help=f"folder of resolved jars (default: {jars_dir()})",
    )
    parser.add_argument(
        "--force", action="store_true", help="resolve again even when the jars are there"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Resolve the jars and say where they are."""
    jars = resolve_jars(args.dest, force=args.force)
    print(f"Delta {jars.delta_version} ({jars.artifact}): {len(jars.jars)} jars in {jars.folder}")
    for jar in jars.jars:
        print(f"  {jar.name}")
    return 0
