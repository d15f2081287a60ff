"""Fixtures shared by every test layer.

Tests that touch tables ask for ``lake_engine`` (or ``make_engine`` / ``engine_name``) and
run once per lake engine: ``local`` (delta-rs) and ``spark`` (delta-spark), the latter
marked ``spark_engine`` so ``python -m pytest -m spark_engine`` runs exactly those. Tests that
make their engines with ``make_engine`` (and run no command through ``lake_kind``) run a third
time, ``spark_connect``: the spark engine over Spark Connect (marked ``spark_connect``).

Spark Connect's service runs inside the shared session's JVM (one server per worker, no second
driver): the ``spark_connect`` fixture is a Connect session of that server, and a test that
asks for it runs as a Spark Connect process does (``pyspark.sql.functions`` builds Connect
columns, the active session is the Connect one, and ``SPARK_REMOTE`` points subprocesses at the
same server).

One local Spark session serves the whole run (starting one costs seconds); tests that need it
ask for the ``spark`` fixture and are marked ``spark``. Unit tests never start a JVM. The
session loads Delta Lake from the jars ``sfcdc delta-jars`` resolves (resolved here on first
use), so the ``spark`` lake engine runs on real delta-spark tables; its warehouse and Derby
home live in a folder of this run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pipelines.session import CONNECT_SERVICE_CONF

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipelines.engines import LakeEngine


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    from pipelines.delta_jars import resolve_jars
    from pipelines.session import local_session

    # Python workers must run the interpreter (and virtualenv) that runs the tests, and import
    # this checkout's packages even when it is not pip-installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    root = str(Path(__file__).resolve().parent.parent)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([root, *[p for p in paths if p != root]])

    resolve_jars()  # a no-op once `sfcdc delta-jars` has run (.ci/run runs it)
    session = local_session(
        "sfcdc-tests",
        cores=2,
        conf={"spark.driver.memory": "2g", **CONNECT_SERVICE_CONF},
        delta=True,
        workdir=tmp_path_factory.mktemp("spark"),
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_connect_url(spark: SparkSession) -> str:
    """The ``sc://`` URL of the Spark Connect service this worker's session serves."""
    from pipelines.session import serve_connect

    return serve_connect(spark)


@pytest.fixture(scope="session")
def _connect_session(spark_connect_url: str) -> Iterator[SparkSession]:
    from pipelines.session import connect_session

    session = connect_session(spark_connect_url)
    yield session
    session.stop()


@pytest.fixture
def spark_connect(
    _connect_session: SparkSession, spark_connect_url: str, monkeypatch: pytest.MonkeyPatch
) -> SparkSession:
    """A Spark Connect session with Delta Lake, the active session of a test that runs as a
    Spark Connect process does; the process's classic mode comes back after the test."""
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    monkeypatch.setenv("SPARK_REMOTE", spark_connect_url)
    RemoteSession._set_default_and_active_session(_connect_session)  # type: ignore[arg-type]
    return _connect_session


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests only talk to servers on loopback; a proxy from the environment must not intercept.
    for key in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


# ----------------------------------------------------------------------- object storage


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One S3-compatible server (moto) per test session, on loopback."""
    from tests.object_storage import start_s3

    yield from start_s3(tmp_path_factory.mktemp("s3"))


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One Azurite blob service per test session, on loopback."""
    from tests.object_storage import start_azurite

    yield from start_azurite(tmp_path_factory.mktemp("azurite"))


@pytest.fixture(params=["s3", "azure"])
def object_lake(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh lake folder on each object store (the local engine's lake there); the store's
    credentials are in this process's environment, where the lake's YAML references them."""
    server = request.getfixturevalue("s3_server" if request.param == "s3" else "azurite")
    for key, value in server.env.items():
        monkeypatch.setenv(key, value)
    return server.lake()


# ------------------------------------------------------------------------- lake engines

ENGINE_NAMES = ("local", "spark")


def engine_params(*, connect: bool = False) -> list[Any]:
    """The engine names tests run on; the spark one is marked ``spark_engine`` and
    ``spark`` (it uses the shared session). ``connect``: the spark engine over Spark Connect
    too (``spark_connect``, marked ``spark_connect`` and ``spark``)."""
    params = [
        pytest.param("local", id="local"),
        pytest.param("spark", id="spark", marks=[pytest.mark.spark_engine, pytest.mark.spark]),
    ]
    if connect:
        marks = [pytest.mark.spark_connect, pytest.mark.spark]
        params.append(pytest.param("spark_connect", id="spark_connect", marks=marks))
    return params


def _parametrized_by_the_test(metafunc: pytest.Metafunc, name: str) -> bool:
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", ())
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        if name in names:
            return True
    return False


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``engine_name`` runs each test once per lake engine; tests that make their engines
    with ``make_engine`` and run no command through ``lake_kind`` (whose subprocesses start
    drivers of their own) also run over Spark Connect. Tests marked ``append_parts`` run the
    classic session's spark engine once more, with its one-commit append of parts on. A test
    that parametrizes ``engine_name`` itself (``indirect``, with :func:`engine_params`' cases)
    picks its own cases."""
    names = metafunc.fixturenames
    if "engine_name" not in names or _parametrized_by_the_test(metafunc, "engine_name"):
        return
    connect = "make_engine" in names and "lake_kind" not in names
    params = engine_params(connect=connect)
    if metafunc.definition.get_closest_marker("append_parts") is None:
        metafunc.parametrize("engine_name", params, indirect=True)
        return
    cases = [pytest.param(p.values[0], False, id=p.id, marks=p.marks) for p in params]
    spark = next(p for p in params if p.id == "spark")
    cases.insert(2, pytest.param("spark", True, id="spark-one-commit", marks=spark.marks))
    metafunc.parametrize(("engine_name", "one_commit_appends"), cases, indirect=True)


@pytest.fixture
def engine_name(request: pytest.FixtureRequest) -> str:
    """Each test that asks for it runs once per lake engine (see pytest_generate_tests)."""
    return str(request.param)


@pytest.fixture
def one_commit_appends(request: pytest.FixtureRequest) -> bool:
    """Whether the classic session's spark engine commits several parts at once
    (``SparkEngine(one_commit_appends=True)``); on for tests marked ``append_parts``' second
    spark run."""
    return bool(getattr(request, "param", False))


EngineFactory = Callable[..., "LakeEngine"]


@pytest.fixture
def make_engine(
    engine_name: str, one_commit_appends: bool, request: pytest.FixtureRequest
) -> EngineFactory:
    """``make_engine(location, **options)``: an engine of this test's kind over the lake at
    ``location`` (the spark engine keeps its tables there as Delta directories, as the
    local engine does, so either reads the other's lake)."""
    from pipelines.engines import SparkEngine
    from pipelines.engines.local import LocalEngine

    def make(location: Path | str, **options: Any) -> LakeEngine:
        if engine_name == "spark":
            session = request.getfixturevalue("spark")
            options.setdefault("one_commit_appends", one_commit_appends)
            return SparkEngine(session, location=location, **options)
        if engine_name == "spark_connect":
            session = request.getfixturevalue("spark_connect")
            return SparkEngine(session, location=location, **options)
        return LocalEngine(location=location, **options)

    return make


@pytest.fixture
def lake_engine(make_engine: EngineFactory, tmp_path: Path) -> LakeEngine:
    """An engine of this test's kind over a fresh lake under ``tmp_path``."""
    return make_engine(tmp_path / "lake")


@pytest.fixture
def lake_kind(engine_name: str, request: pytest.FixtureRequest) -> str:
    """This test's engine as a ``lake.engine`` value for the conf files it writes; for the
    spark engine the shared session is started, so commands run in this process use it
    (commands run in a subprocess start their own)."""
    if engine_name == "spark":
        request.getfixturevalue("spark")
    return engine_name


# ----------------------------------------------------------------- balancing the workers

# Rough cost of one test by marker, in tens of seconds: a slow spark-engine test kills and
# restarts Spark drivers for minutes (a slow Spark Connect case, cut to what Connect adds, for
# one to three), another spark-engine test runs Delta jobs on a JVM, a unit test takes
# milliseconds.
_COST = (
    (("slow", "spark_engine"), 50.0),
    (("slow", "spark_connect"), 15.0),
    (("slow",), 8.0),
    (("spark_engine",), 6.0),
    (("spark_connect",), 6.0),
    (("spark",), 2.0),
    (("integration",), 0.5),
)


def _cost(item: pytest.Item) -> float:
    marked = {m.name for m in item.iter_markers()}
    return next((c for names, c in _COST if marked.issuperset(names)), 0.01)


# Where a test's spark-engine case lands events from the emulator through the spark engine
# (seconds per Delta commit on two cores, minutes per test): the engine seam it crosses is
# tested directly under tests/spark, and the same test's local-engine case runs the landing,
# silver, gold and command logic. Two stay in the default run on the spark engine: the
# first-run tables test (what it checks is what each engine creates) and the console script
# run from a virtualenv that is not activated (a spark-engine run by nature).
LONG_ON_SPARK = tuple(
    f"tests/integration/{layer}/" for layer in ("bronze", "silver", "gold", "cometd", "rest", "cli")
)
DEFAULT_ON_SPARK = (
    "tests/integration/cli/test_first_run_tables.py",
    "tests/integration/cli/test_unactivated_venv.py",
)
# The gold fold's batch-size equivalence is the engine's fold, not its tables: its local case
# stays in the default run, its classic spark cases (minutes of MERGEs each) are long.
LONG_ON_SPARK_TESTS = ("tests/spark/gold/test_batch_sizes.py",)
# No Spark Connect case is long: the default run (what CI runs) has every ``spark_connect``
# test, so ``python -m pytest -m spark_connect`` runs nothing the default run leaves out. The
# Connect cases of the slow tests are cut to what Connect adds, about six worker-minutes
# together: the gold oracle (silver, gold and the drain over Connect, a smaller stream, one
# kill), the demo inside a Connect session next to a classic one, the Spark source's kill loop
# (two kills) and one batch-size case (hard deletes, SCD2 and steps).


def pytest_itemcollected(item: pytest.Item) -> None:
    """Which tests are ``long``, left out of the default run (``python -m pytest -m long`` runs
    them): a ``slow`` test on the classic spark engine or of the Spark source (it starts a
    Spark driver in a subprocess again and again), and the classic spark-engine case of an
    integration test of a layer or command (:data:`LONG_ON_SPARK`,
    :data:`LONG_ON_SPARK_TESTS`). Spark Connect cases never are."""
    if item.get_closest_marker("spark_connect") is not None:
        return
    spark_engine = item.get_closest_marker("spark_engine") is not None
    if (
        item.get_closest_marker("slow")
        and (spark_engine or item.get_closest_marker("spark_source"))
    ) or (
        spark_engine
        and item.nodeid.startswith(LONG_ON_SPARK + LONG_ON_SPARK_TESTS)
        and not item.nodeid.startswith(DEFAULT_ON_SPARK)
    ):
        item.add_marker(pytest.mark.long)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist's ``worksteal`` each of n workers first gets a contiguous nth of
    the collection and steals from the end of the others' queues when idle. So that no worker
    ends the run alone on a long test that came late in its queue, the modules (kept whole:
    module fixtures are set up once) are dealt out by cost, heaviest first, one deal per
    worker, and each worker's share ends with cheap modules, which are what gets stolen.
    Without xdist the order stays as collected."""
    workerinput = getattr(config, "workerinput", None)
    workers = int(workerinput["workercount"]) if workerinput else 1
    if workers < 2 or len(items) < 2 * workers:
        return
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    costs = {name: sum(_cost(i) for i in group) for name, group in modules.items()}
    cheap_limit = 1.0
    heavy = sorted((n for n in modules if costs[n] > cheap_limit), key=lambda n: -costs[n])
    cheap = [n for n in modules if costs[n] <= cheap_limit]
    deals: list[list[str]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for name in heavy:
        i = loads.index(min(loads))
        deals[i].append(name)
        loads[i] += costs[name]
    # worksteal hands worker k the next len(rest) // (workers - k) items: fill each deal with
    # cheap modules up to that boundary, so it never starts on the next deal's heavy ones.
    remaining = len(items)
    queue = list(cheap)
    for k, deal in enumerate(deals):
        share = remaining // (workers - k)
        count = sum(len(modules[n]) for n in deal)
        while queue and (count < share or k == workers - 1):
            name = queue.pop(0)
            deal.append(name)
            count += len(modules[name])
        remaining -= count
    items[:] = [item for deal in deals for name in deal for item in modules[name]]
