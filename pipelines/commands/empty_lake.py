"""What a command that reads a lake says when the lake has no tables yet.

``sfcdc demo`` keeps its configuration and its lake apart from ``conf/``'s (under
:data:`DEMO_DIR`). The next command a newcomer runs after the demo, without ``--conf``, reads
``conf/``'s lake, which stays empty until ``sfcdc run`` fills it: instead of a bare "table not
found", ``sfcdc sql`` and ``sfcdc status`` say which lake they read and the two ways on.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from pipelines.spec.conf import Conf

__all__ = ["DEMO_DIR", "empty_lake_note", "shown_path"]

# Where `sfcdc demo` writes its conf/ and lake/ unless told otherwise (--dir).
DEMO_DIR = Path(".sfcdc/demo")


def shown_path(path: Path) -> str:
    """``path`` relative to the working directory when it is below it, as a user types it."""
    with contextlib.suppress(ValueError):
        return str(Path(path).absolute().relative_to(Path.cwd()))
    return str(path)


def empty_lake_note(conf: Conf, command: str) -> str:
    """The note for ``sfcdc <command>`` on ``conf``'s lake when it has no tables: where the
    lake is, how to fill it, and (when the demo's lake is there) how to read that instead."""
    lake = conf.pipeline.lake
    where = (
        f"in catalog {lake.catalog}" if lake.catalog else f"at {shown_path(Path(lake.location))}/"
    )
    conf_dir = shown_path(conf.conf_dir)
    note = (
        f"the lake of {conf_dir}/ {where} has no tables yet: `sfcdc run --conf {conf_dir} "
        "--once` fills it"
    )
    demo = DEMO_DIR / "conf"
    if (demo / "pipeline.yml").is_file() and demo.resolve() != Path(conf.conf_dir).resolve():
        note += f"; `sfcdc demo` keeps its own lake: `sfcdc {command} --conf {demo}` reads it"
    return note
