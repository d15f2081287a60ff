"""The daemon that forks the Python workers of a local session (``spark.python.daemon.module``):
pyspark's own daemon, started after Spark's archives are taken off the import path.

Spark puts ``pyspark.zip``, the py4j archive and its core jar (all under ``SPARK_HOME``) on the
path of its Python workers, and a worker calls ``importlib.invalidate_caches()`` for every
task, which makes Python read the directory of every archive on the path again: some 6,700
entries, about a fifth of a second of each task. A pyspark installed as a package (a local
session's) imports without them, so they are dropped before pyspark is first imported, and
the workers the daemon forks inherit the shorter path. When pyspark or py4j would not import
without them, or pyspark would then come from another installation than ``SPARK_HOME`` (a
Spark distribution beside a pip-installed pyspark), the path stays as it is.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path

__all__ = ["DAEMON_MODULE", "spark_archives"]

DAEMON_MODULE = "pipelines.worker_daemon"


def spark_archives(path: Sequence[str], spark_home: str | None) -> list[str]:
    """The entries of ``path`` that are files (zip archives, jars) inside ``spark_home``."""
    if not spark_home:
        return []
    home = Path(spark_home).resolve()
    return [
        entry
        for entry in path
        if entry and Path(entry).is_file() and Path(entry).resolve().is_relative_to(home)
    ]


def _drop_archives() -> None:
    home = os.environ.get("SPARK_HOME")
    archives = spark_archives(sys.path, home)
    if not home or not archives:
        return
    original = list(sys.path)
    sys.path[:] = [entry for entry in sys.path if entry not in archives]
    pyspark = find_spec("pyspark")
    if (
        pyspark is None
        or pyspark.origin is None
        or not Path(pyspark.origin).resolve().is_relative_to(Path(home).resolve())
        or find_spec("py4j") is None
    ):
        sys.path[:] = original
        return
    for entry in archives:
        sys.path_importer_cache.pop(entry, None)


def main() -> None:
    _drop_archives()
    # pyspark's daemon reads the worker module from sys.argv and serves until Spark stops it.
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
