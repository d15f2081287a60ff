"""Whether a lake on a local file system can be written, asked before a command writes.

A lake on a read-only file system (or in a folder the user may not write) fails deep inside a
Delta commit otherwise: a first run with an exception chain from the lease table's creation, a
later one with delta-rs' runtime panicking while the process exits, or a refused lease commit
that reads like another landing holding the topic. One small file created and removed in the
lake's folder says it at once, with the folder and the operating system's reason.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from ingest.errors import LakeError

__all__ = ["check_writable"]


def check_writable(location: Path) -> None:
    """Raise :class:`~ingest.errors.LakeError` naming ``location`` and the cause when files
    cannot be created in it (it is made when missing, as the first table would make it)."""
    probe = location / f".sfcdc-write-check-{uuid.uuid4().hex}"
    try:
        location.mkdir(parents=True, exist_ok=True)
        with probe.open("xb"):
            pass
        probe.unlink()
    except OSError as exc:
        refused = exc.filename if isinstance(exc.filename, str) else str(location)
        where = "" if refused == str(probe) else f" at {refused}"
        raise LakeError(
            f"the lake at {location} cannot be written: {exc.strerror or exc}{where}; sfcdc "
            "writes its tables, checkpoints and leases there: give lake.location a folder this "
            "user can write"
        ) from None
