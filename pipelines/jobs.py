"""The entry point of the Databricks jobs: the ``sfcdc`` command, failing the task on error.

``sfcdc`` returns its exit status, which a console script hands to ``sys.exit``. A Databricks
Python wheel task calls the entry point function itself and fails only when it raises, so a
command that stops on a configuration error would otherwise count as a successful run (and a
continuous job would not back off). ``sfcdc-job`` raises :class:`SystemExit` with the status
instead; the arguments are the same as ``sfcdc``'s.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipelines.cli import main as cli_main

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    """Run ``sfcdc`` with ``argv`` (default: the process arguments); raise ``SystemExit`` with
    its status when it is not 0."""
    status = cli_main(argv)
    if status:
        raise SystemExit(status)
