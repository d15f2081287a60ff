"""The Delta Lake jars of the ``spark`` engine, resolved once with Maven into a local folder.

A Spark session only runs Delta (``format("delta")``, ``DeltaTable``, ``MERGE``) with Delta's
jars on its class path. Databricks runtimes have them built in; plain Spark (a laptop, CI, a
self-managed cluster) does not, and fetching them with ``spark.jars.packages`` at every
session start needs the network each time. So sfcdc resolves them once, with Maven, into a
folder (:func:`jars_dir`), and :func:`pipelines.session.spark_session` points the session at
the files there: no download when Spark starts.

The Delta release is the one of the installed ``delta-spark`` package (the Python half of
Delta, pinned with pyspark in sfcdc's ``spark`` extra), so the Python API and the jars always
match. From Delta 4.1 the artifact names carry the Spark line (``delta-spark_4.1_2.13``);
before, only the Scala version (``delta-spark_2.13``).

Beside Delta, the folder holds Spark's own Avro module (``spark-avro``, the release of the
installed pyspark): ``from_avro`` is what a Spark engineer would decode Avro payloads with, and
``benchmarks/spark_native.py`` measures silver against it. The folder holds the jars and a
``manifest.json`` naming them and the artifacts they were resolved from; the Scala library is
left out (Spark ships its own, and two on one class path conflict)::

    sfcdc delta-jars              # -> build/delta-jars/delta-spark-4.1.0/*.jar
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from ingest.errors import ConfigError, LakeError

__all__ = [
    "JARS_ENV",
    "DeltaJars",
    "avro_artifact",
    "delta_artifact",
    "delta_version",
    "find_jars",
    "jars_dir",
    "resolve_jars",
]

# Where the jars live, overriding the default folder.
JARS_ENV = "SFCDC_DELTA_JARS"
SCALA_BINARY = "2.13"
_MANIFEST = "manifest.json"
# Provided by Spark itself: a second copy on the class path conflicts with Spark's.
_PROVIDED_GROUPS = ("org.scala-lang", "org.slf4j", "org.apache.logging.log4j")


@dataclass(frozen=True)
class DeltaJars:
    """Resolved jars of one Delta release: ``jars`` are absolute paths."""

    delta_version: str
    artifact: str
    folder: Path
    jars: tuple[Path, ...]

    @property
    def class_path(self) -> str:
        """The ``spark.jars`` value (comma-separated paths)."""
        return ",".join(str(j) for j in self.jars)


def delta_version() -> str:
    """The installed delta-spark release (the one the jars must match)."""
    try:
        return metadata.version("delta-spark")
    except metadata.PackageNotFoundError as exc:
        raise ConfigError(
            "the spark engine needs delta-spark: install sfcdc with the spark extra "
            '(pip install "sfcdc[spark]"), which pins the pyspark and delta-spark pair'
        ) from exc


def _minor(version: str) -> tuple[int, int]:
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError) as exc:
        raise ConfigError(f"cannot read a release number from {version!r}") from exc


def delta_artifact(delta: str, spark: str) -> str:
    """Maven coordinates (``group:artifact:version``) of delta-spark ``delta`` for Spark
    ``spark``."""
    if _minor(delta) >= (4, 1):
        major, minor = _minor(spark)
        return f"io.delta:delta-spark_{major}.{minor}_{SCALA_BINARY}:{delta}"
    return f"io.delta:delta-spark_{SCALA_BINARY}:{delta}"


# Spark releases whose spark-avro was never published to Maven Central, and the release of the
# same line that stands in (it loads and decodes on the Spark it replaces: benchmarks/
# spark_native.py runs it).
_AVRO_STAND_INS = {"4.1.0": "4.1.1"}


def avro_artifact(spark: str) -> str:
    """Maven coordinates of Spark's Avro module for Spark ``spark``."""
    return f"org.apache.spark:spark-avro_{SCALA_BINARY}:{_AVRO_STAND_INS.get(spark, spark)}"


def _spark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def _project_root() -> Path | None:
    """The checkout sfcdc runs from (it holds pyproject.toml), if any."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() else None


def jars_dir(environ: os._Environ[str] | dict[str, str] | None = None) -> Path:
    """The folder of resolved jars: ``$SFCDC_DELTA_JARS``, else ``build/delta-jars`` of the
    checkout (ignored by git), else ``~/.cache/sfcdc/delta-jars`` for an installed wheel."""
    env = os.environ if environ is None else environ
    if env.get(JARS_ENV):
        return Path(env[JARS_ENV]).expanduser().absolute()
    root = _project_root()
    if root is not None:
        return root / "build" / "delta-jars"
    return Path.home() / ".cache" / "sfcdc" / "delta-jars"


def _release_folder(base: Path, delta: str) -> Path:
    return base / f"delta-spark-{delta}"


def find_jars(base: Path | None = None, *, delta: str | None = None) -> DeltaJars:
    """The resolved jars of the installed Delta release; a :class:`ConfigError` saying how to
    resolve them when they are not there."""
    version = delta or delta_version()
    folder = _release_folder(base or jars_dir(), version)
    manifest = folder / _MANIFEST
    try:
        listed = json.loads(manifest.read_text(encoding="utf-8"))
        jars = tuple(folder / name for name in listed["jars"])
        artifact = str(listed["artifact"])
        artifacts = [str(a) for a in listed.get("artifacts", [artifact])]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"the Delta {version} jars are not resolved in {folder}: run `sfcdc delta-jars` "
            "once (it fetches them with Maven), or set "
            f"{JARS_ENV} to a folder where they were resolved"
        ) from exc
    avro = avro_artifact(_spark_version())
    if avro not in artifacts:
        raise ConfigError(
            f"{folder} was resolved without {avro}: run `sfcdc delta-jars --force` to resolve "
            "the jars again"
        )
    missing = [j.name for j in jars if not j.is_file()]
    if missing:
        raise ConfigError(
            f"{folder} lacks {', '.join(missing)} that its manifest lists: run "
            "`sfcdc delta-jars --force` to resolve them again"
        )
    return DeltaJars(version, artifact, folder, jars)


def _pom(artifacts: Sequence[str]) -> str:
    exclusions = "".join(
        f"<exclusion><groupId>{g}</groupId><artifactId>*</artifactId></exclusion>"
        for g in _PROVIDED_GROUPS
    )
    dependencies = ""
    for artifact in artifacts:
        group, name, version = artifact.split(":")
        dependencies += (
            f"<dependency><groupId>{group}</groupId><artifactId>{name}</artifactId>"
            f"<version>{version}</version><exclusions>{exclusions}</exclusions></dependency>"
        )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0">'
        "<modelVersion>4.0.0</modelVersion>"
        "<groupId>sfcdc</groupId><artifactId>delta-jars</artifactId><version>1</version>"
        f"<dependencies>{dependencies}</dependencies></project>\n"
    )


def _module(jar: str) -> str:
    """A jar without its version: ``spark-tags_2.13-4.1.0.jar`` -> ``spark-tags_2.13``."""
    return jar.removesuffix(".jar").rsplit("-", 1)[0]


def _spark_modules() -> set[str]:
    """The artifacts (any version) of the jars the installed pyspark ships."""
    import pyspark

    return {_module(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}


def resolve_jars(
    base: Path | None = None,
    *,
    delta: str | None = None,
    spark: str | None = None,
    force: bool = False,
    maven: Sequence[str] = ("mvn",),
) -> DeltaJars:
    """Resolve delta-spark and its runtime dependencies with Maven into the jars folder
    (nothing to do when they are there already, unless ``force``)."""
    version = delta or delta_version()
    folder = _release_folder(base or jars_dir(), version)
    if not force:
        try:
            return find_jars(base, delta=version)
        except ConfigError:
            pass
    if spark is None:
        spark = _spark_version()
    artifact = delta_artifact(version, spark)
    artifacts = [artifact, avro_artifact(spark)]
    if shutil.which(maven[0]) is None:
        raise ConfigError(
            f"resolving {artifact} needs Maven ({maven[0]!r} is not on PATH): install Maven "
            "3.8 or later, or copy the jars into "
            f"{folder} with a {_MANIFEST} listing them"
        )
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sfcdc-jars-", dir=folder.parent) as work:
        staging = Path(work)
        (staging / "pom.xml").write_text(_pom(artifacts), encoding="utf-8")
        out = staging / "jars"
        command = [
            *maven,
            "-B",
            "-q",
            "-f",
            str(staging / "pom.xml"),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={out}",
            "-DincludeScope=runtime",
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise LakeError(f"Maven could not resolve {artifact}:\n{tail}")
        names = sorted(p.name for p in out.glob("*.jar"))
        if not any(n.startswith("delta-spark") for n in names):
            raise LakeError(f"Maven resolved {artifact} but no delta-spark jar came out: {names}")
        # Spark's own jars hold what spark-avro depends on (Avro itself): a second copy of
        # them on the class path would conflict with Spark's.
        provided = _spark_modules()
        names = [n for n in names if _module(n) not in provided]
        for extra in {p.name for p in out.glob("*.jar")} - set(names):
            (out / extra).unlink()
        (out / _MANIFEST).write_text(
            json.dumps({"artifact": artifact, "artifacts": artifacts, "jars": names}, indent=2)
            + "\n",
            encoding="utf-8",
        )
        if folder.exists():
            shutil.rmtree(folder)
        out.rename(folder)
    return find_jars(base, delta=version)
