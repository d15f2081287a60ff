"""Installing the sfcdc wheel on a Databricks LTS runtime replaces none of the runtime's packages.

Each file under ``constraints/`` lists the Python libraries a runtime ships (its release notes'
table, as ``name==version``). pip resolves sfcdc's requirements for the runtime's Python
against it, installing nothing: the resolution must succeed and must not pick, for any package
the runtime has, another version than the runtime's. The stubs in ``ingest/pubsub`` then run a
call over gRPC on the runtime's protobuf and grpcio, which are older than the ones development
installs. Both need the package index.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name
from packaging.version import Version

pytestmark = pytest.mark.network

ROOT = Path(__file__).resolve().parents[2]
RUNTIMES = sorted((ROOT / "constraints").glob("databricks-*.txt"))
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")
_PYTHON = re.compile(r"\bPython (\d+\.\d+)\b")
_PIP_ENV = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        match = _PIN.match(line.strip())
        if match:
            pins[canonicalize_name(match[1])] = match[2]
    return pins


def _python(path: Path) -> str:
    match = _PYTHON.search(path.read_text().splitlines()[0])
    assert match, f"{path.name}: the first line must name the runtime's Python (Python 3.x)"
    return match[1]


def _pip(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, **_PIP_ENV},
        check=False,
    )


def test_every_constraints_file_names_its_runtime_and_pins_its_core_packages() -> None:
    assert len(RUNTIMES) >= 2, "constraints/ holds the two newest Databricks LTS runtimes"
    for path in RUNTIMES:
        assert path.read_text().startswith("# Databricks Runtime "), path.name
        _python(path)
        assert {"grpcio", "protobuf", "pyarrow", "numpy", "pyyaml"} <= _pins(path).keys()


@pytest.mark.parametrize("constraints", RUNTIMES, ids=lambda path: path.stem)
def test_the_requirements_resolve_to_the_runtime_s_own_packages(
    constraints: Path, tmp_path: Path
) -> None:
    report = tmp_path / "report.json"
    result = _pip(
        "install",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        f"--report={report}",
        f"--constraint={constraints}",
        f"--python-version={_python(constraints)}",
        "--only-binary=:all:",
        str(ROOT),
        cwd=tmp_path,
    )
    assert result.returncode == 0, (
        f"sfcdc's requirements do not resolve on {constraints.stem}:\n{result.stderr[-4000:]}"
    )
    resolved = {
        canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    pins = _pins(constraints)
    replaced = {
        name: f"runtime {pins[name]}, resolved {version}"
        for name, version in resolved.items()
        if name in pins and Version(version) != Version(pins[name])
    }
    assert not replaced, f"installing sfcdc would replace runtime packages: {replaced}"
    # The comparison bites only if the runtime's packages are among the resolved ones.
    assert {"grpcio", "protobuf", "pyarrow", "numpy", "cryptography"} <= resolved.keys()


_ROUND_TRIP = textwrap.dedent(
    """
    from concurrent import futures

    import google.protobuf
    import grpc

    from ingest.pubsub import pb2, pb2_grpc


    class PubSub(pb2_grpc.PubSubServicer):
        def GetTopic(self, request, context):
            return pb2.TopicInfo(topic_name=request.topic_name, schema_id="s1", can_subscribe=True)


    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb2_grpc.add_PubSubServicer_to_server(PubSub(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            info = pb2_grpc.PubSubStub(channel).GetTopic(
                pb2.TopicRequest(topic_name="/data/AccountChangeEvent"), timeout=10
            )
    finally:
        server.stop(None)
    assert (info.topic_name, info.schema_id, info.can_subscribe) == (
        "/data/AccountChangeEvent", "s1", True
    ), info
    print(google.protobuf.__version__, grpc.__version__)
    """
)


@pytest.mark.parametrize(
    "pins",
    sorted({(_pins(path)["protobuf"], _pins(path)["grpcio"]) for path in RUNTIMES}),
    ids=lambda pins: f"protobuf{pins[0]}-grpcio{pins[1]}",
)
def test_the_stubs_run_on_the_runtime_s_protobuf_and_grpcio(
    pins: tuple[str, str], tmp_path: Path
) -> None:
    protobuf, grpcio = pins
    target = tmp_path / "site"
    result = _pip(
        "install",
        "--quiet",
        "--only-binary=:all:",
        f"--target={target}",
        f"protobuf=={protobuf}",
        f"grpcio=={grpcio}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    # -S: nothing from this environment's site-packages (newer protobuf and grpcio) is visible.
    run = subprocess.run(
        [sys.executable, "-S", "-c", _ROUND_TRIP],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(ROOT)])},
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stdout.split() == [protobuf, grpcio]
