"""Creating the Spark session sfcdc runs in.

On Databricks the session already exists and is passed in by the job; locally sfcdc starts a
Spark local-mode session with settings chosen for the pipeline (UTC, Arrow, few shuffle
partitions). Library code never creates a session itself: it receives one.

:func:`session_for` is what the commands use: the active session when there is one (a
cluster, a notebook, ``spark-submit``), else a local session; with ``lake.engine: spark`` that
session loads Delta Lake from the jars :mod:`pipelines.delta_jars` resolved (no download at
start). Each lake gets its own Spark warehouse and Derby home (under ``<location>/.spark``),
so two pipelines, or two test runs, on one machine never share them. With ``SPARK_REMOTE`` set
(``sc://host:port``) and no active session, the commands run over Spark Connect instead.

A local session can also serve Spark Connect clients from its own JVM
(:func:`serve_connect`, when it was started with :data:`CONNECT_SERVICE_CONF`): the tests and
benchmarks run the spark engine over Spark Connect that way, without a second driver.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.worker_daemon import DAEMON_MODULE

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipelines.engines.base import LakeEngine
    from pipelines.spec.models import LakeSpec

__all__ = [
    "CONNECT_SERVICE_CONF",
    "DELTA_SESSION_CONF",
    "JAVA_OPTIONS_ENV",
    "LOCAL_SESSION_CONF",
    "PYTHON_ENV",
    "connect_session",
    "engine_for",
    "local_session",
    "serve_connect",
    "session_for",
    "spark_dirs",
    "use_this_python",
]

LOCAL_SESSION_CONF: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # Salesforce timestamps are UTC epoch milliseconds; never let the host zone leak in.
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "20000",
    "spark.sql.shuffle.partitions": "4",
    # Delta's VACUUM lists a table's directories in this many tasks (10,000 by default, which
    # takes minutes on two cores); a local session's tables are on one disk.
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "4",
    "spark.sql.adaptive.enabled": "true",
    "spark.default.parallelism": "4",
    "spark.driver.memory": "4g",
    # Silver rows have more than Spark's default 100 fields (nested ones included); above that
    # Spark stops generating code for a query and interprets it, several times slower.
    "spark.sql.codegen.maxFields": "1000",
    # Writes of the local engine are collected to the driver (it is the executor too);
    # silver.max_rows_per_commit bounds one write, not this.
    "spark.driver.maxResultSize": "0",
    "spark.python.worker.reuse": "true",
    # Kryo instead of Java serialization for what Spark serializes itself: the blocks a
    # Python streaming source hands to the JVM (MEMORY_AND_DISK_SER) go through it, and Java
    # serialization of 50k-row micro-batches cost about 40% of their time.
    "spark.serializer": "org.apache.spark.serializer.KryoSerializer",
}

# Delta Lake in a plain Spark session (Databricks sets these itself).
DELTA_SESSION_CONF: Mapping[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # A local session's tables are read by one machine: Delta's default of 50 partitions to
    # rebuild a table's state from its log turns every snapshot into 50 tiny tasks.
    "spark.databricks.delta.snapshotPartitions": "2",
}

# Where a local session serves Spark Connect (serve_connect): loopback only, on a port the
# system picks (several sessions on one machine, e.g. test workers, never collide).
CONNECT_SERVICE_CONF: Mapping[str, str] = {
    "spark.connect.grpc.binding.address": "127.0.0.1",
    "spark.connect.grpc.binding.port": "0",
}

# Arrow's per-access bounds and null checks cost a tenth of the JVM's time when it turns wide
# rows into Arrow for Python (silver); Spark alone writes and reads those buffers.
_JVM_OPTIONS = "-Darrow.enable_unsafe_memory_access=true -Darrow.enable_null_check_for_get=false"


# More options for the JVM of a local session (its driver), from the environment: for
# example ``-XX:TieredStopAtLevel=1``, which starts short runs (tests, one-off commands) a
# quarter faster on a small machine and makes long ones slower.
JAVA_OPTIONS_ENV = "SFCDC_SPARK_JAVA_OPTIONS"


def spark_dirs(root: str | Path) -> tuple[Path, Path]:
    """``(warehouse, derby home)`` of a session working for the lake at ``root``."""
    base = Path(root).expanduser().absolute() / ".spark"
    return base / "warehouse", base / "derby"


# The environment variables PySpark takes the Python workers' interpreter from in local mode
# (pyspark 4.1 reads PYSPARK_PYTHON when the context starts, else runs `python3` from PATH;
# spark.pyspark.python alone does not reach them).
PYTHON_ENV = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")


def use_this_python(environ: MutableMapping[str, str] = os.environ) -> None:
    """Make a local session's Python workers run this interpreter: the one sfcdc is installed
    in, also when its virtualenv is not activated (a cron job or a service calling
    ``.venv/bin/sfcdc``, where ``python3`` on PATH is another Python, without pyarrow). A value
    the user set is kept."""
    for name in PYTHON_ENV:
        environ.setdefault(name, sys.executable)


def _python_workers() -> dict[str, str]:
    """Spark's Python workers must run this interpreter (the one sfcdc is installed in, even
    when its virtualenv is not activated: ``python3`` on PATH may be another) and import this
    copy of sfcdc (a checkout run with ``python -m`` is not on their path otherwise), forked
    by a daemon that keeps Spark's archives off their path (:mod:`pipelines.worker_daemon`)."""
    root = str(Path(__file__).resolve().parent.parent)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    return {
        "spark.pyspark.python": sys.executable,
        "spark.executorEnv.PYTHONPATH": os.pathsep.join([root, *paths]),
        "spark.python.daemon.module": DAEMON_MODULE,
    }


def local_session_conf(
    *,
    delta: bool = False,
    workdir: str | Path | None = None,
    conf: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The settings :func:`local_session` starts a session with. The warehouse and Derby home
    are ``workdir``'s (each lake's, for a command), so two runs over two lakes never share a
    metastore."""
    warehouse, derby = spark_dirs(workdir or Path.home() / ".cache" / "sfcdc")
    settings: dict[str, str] = {
        **LOCAL_SESSION_CONF,
        "spark.sql.warehouse.dir": str(warehouse),
        "spark.driver.extraJavaOptions": " ".join(
            [f"-Dderby.system.home={derby}", _JVM_OPTIONS, os.environ.get(JAVA_OPTIONS_ENV, "")]
        ).strip(),
        **_python_workers(),
    }
    if delta:
        from pipelines.delta_jars import find_jars

        settings.update(DELTA_SESSION_CONF)
        settings["spark.jars"] = find_jars().class_path
    settings.update(conf or {})
    return settings


def local_session(
    app_name: str = "sfcdc",
    *,
    cores: int | str = "*",
    conf: Mapping[str, str] | None = None,
    delta: bool = False,
    workdir: str | Path | None = None,
) -> SparkSession:
    """Return a local-mode Spark session (the existing one if a session is already active).

    ``delta``: load Delta Lake from the resolved jars (:func:`pipelines.delta_jars.find_jars`;
    a :class:`~ingest.errors.ConfigError` says how to resolve them when missing). ``workdir``:
    the folder whose ``.spark`` holds the session's warehouse and Derby home (default: the
    user's cache folder).
    """
    from pyspark.sql import SparkSession

    settings = local_session_conf(delta=delta, workdir=workdir, conf=conf)
    use_this_python()
    builder = SparkSession.builder.master(f"local[{cores}]").appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def serve_connect(session: SparkSession) -> str:
    """Start Spark Connect's service inside the JVM of the classic ``session`` (once; it serves
    until the session stops) and return its ``sc://`` URL. Its clients' sessions share the
    driver, its settings (Delta's extension and catalog included) and its catalog. The
    session must have been started with :data:`CONNECT_SERVICE_CONF` (loopback, a free
    port)."""
    jvm: Any = session._jvm
    package = jvm.org.apache.spark.sql.connect.service
    service = getattr(getattr(package, "SparkConnectService$"), "MODULE$")
    if not service.started():
        service.start(session.sparkContext._jsc.sc())
    return f"sc://127.0.0.1:{int(service.localPort())}"


def connect_session(url: str) -> SparkSession:
    """A new Spark Connect session with the server at ``url`` (``sc://host:port``). Unlike
    ``SparkSession.builder.remote(url)``, it leaves the process's mode alone: a process that
    also runs a classic session keeps building classic columns."""
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    session: Any = RemoteSession.builder.remote(url).create()  # the same API as a classic one
    return session  # type: ignore[no-any-return]


def session_for(lake: LakeSpec, *, environ: Mapping[str, str] = os.environ) -> SparkSession:
    """The session a command runs ``lake`` with: the active one (Databricks, a notebook,
    ``spark-submit``, a Spark Connect client), else a Spark Connect session with the server
    ``SPARK_REMOTE`` names, else a local session, with Delta Lake for the spark engine."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if "DATABRICKS_RUNTIME_VERSION" in environ:
        return SparkSession.builder.getOrCreate()
    remote = environ.get("SPARK_REMOTE", "")
    if remote.startswith("sc://"):
        return SparkSession.builder.remote(remote).getOrCreate()
    return local_session(delta=lake.engine == "spark", workdir=lake.location)


def engine_for(
    lake: LakeSpec,
    *,
    sql: bool = False,
    write: bool = False,
    environ: Mapping[str, str] = os.environ,
) -> LakeEngine:
    """The lake engine a command runs ``lake`` with. The local engine needs no Spark session
    (``sql``: it gets one, to answer Spark SQL); the spark engine gets :func:`session_for`'s.
    ``auto`` is the spark engine on Databricks or in an active session that has Delta Lake,
    else the local engine. ``write``: the command writes the lake, so a folder it cannot
    write raises :class:`~ingest.errors.LakeError` at once, naming it and the cause."""
    engine = _engine_for(lake, sql=sql, environ=environ)
    if write:
        engine.ensure_writable()
    return engine


def _engine_for(lake: LakeSpec, *, sql: bool, environ: Mapping[str, str]) -> LakeEngine:
    from pipelines.engines import local_engine, make_engine

    choice = lake.engine
    if choice == "auto":
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        remote = environ.get("SPARK_REMOTE", "").startswith("sc://")
        if "DATABRICKS_RUNTIME_VERSION" not in environ and active is None and not remote:
            choice = "local"
    if choice == "local":
        return local_engine(lake, session_for(lake, environ=environ) if sql else None)
    return make_engine(lake, session_for(lake, environ=environ), environ=environ)
