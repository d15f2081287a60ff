"""Real object storage for the local engine's tests: an S3-compatible server (moto's server
mode, which honours ``If-None-Match`` conditional puts, so commits are put-if-absent) and
Azurite (Azure Blob Storage, from npm), each started once per test session on loopback.

A test asks for ``object_lake`` (parametrised ``s3`` / ``azure``): a :class:`ObjectLake` with
a fresh folder of its own in the store, and the ``lake:`` YAML that points sfcdc at it, its
credentials as secret references to environment variables this process sets (subprocesses
inherit them).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
AZURITE = ROOT / "tests" / "interop" / "npm" / "node_modules" / ".bin" / "azurite-blob"
# Azurite's documented development account (public, the same in every installation).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
S3_KEY_ENV = "SFCDC_TEST_S3_ACCESS_KEY_ID"
S3_SECRET_ENV = "SFCDC_TEST_S3_SECRET_ACCESS_KEY"
AZURE_KEY_ENV = "SFCDC_TEST_AZURE_ACCOUNT_KEY"
BUCKET = "lake"

__all__ = ["AZURITE", "ObjectLake", "ObjectServer", "start_azurite", "start_s3"]


@dataclass(frozen=True)
class ObjectServer:
    """A running store: ``scheme`` (s3, az), its endpoint, and the ``storage:`` YAML."""

    kind: str
    endpoint: str
    storage_yaml: str
    env: dict[str, str]

    def lake(self, name: str | None = None) -> ObjectLake:
        folder = name or uuid.uuid4().hex[:12]
        scheme = "s3" if self.kind == "s3" else "az"
        return ObjectLake(self, f"{scheme}://{BUCKET}/{folder}")


@dataclass(frozen=True)
class ObjectLake:
    """A folder of an :class:`ObjectServer` to hold one test's lake."""

    server: ObjectServer
    location: str

    def yaml(self, engine: str = "local") -> str:
        """The ``lake:`` section (flow style, one line) of this lake."""
        return (
            f"{{engine: {engine}, location: '{self.location}', "
            f"storage: {self.server.storage_yaml}}}"
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on port {port} within 60 s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    # A test's store: nothing in it outlives the session.
    process.kill()
    process.wait(timeout=30)


def start_s3(tmp: Path) -> Iterator[ObjectServer]:
    """moto's S3 server on a free loopback port, with the lake's bucket."""
    import boto3

    port = _free_port()
    log = (tmp / "moto.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_for_port(port, process, "the S3 server")
        endpoint = f"http://127.0.0.1:{port}"
        env = {S3_KEY_ENV: "sfcdc-test", S3_SECRET_ENV: "sfcdc-test-secret"}
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=env[S3_KEY_ENV],
            aws_secret_access_key=env[S3_SECRET_ENV],
            region_name="us-east-1",
        )
        client.create_bucket(Bucket=BUCKET)
        storage = (
            f"{{endpoint: '{endpoint}', region: us-east-1, allow_http: true, "
            f"access_key_id: {{env: {S3_KEY_ENV}}}, "
            f"secret_access_key: {{env: {S3_SECRET_ENV}}}}}"
        )
        yield ObjectServer("s3", endpoint, storage, env)
    finally:
        _stop(process)
        log.close()


def start_azurite(tmp: Path) -> Iterator[ObjectServer]:
    """Azurite's blob service on a free loopback port, with the lake's container."""
    from azure.storage.blob import BlobServiceClient

    if not AZURITE.exists() or shutil.which("node") is None:
        if os.environ.get("CI"):
            raise RuntimeError(f"Azurite is not installed ({AZURITE}); run npm ci")
        pytest.skip("Azurite is not installed (npm ci --prefix tests/interop/npm)")
    port = _free_port()
    log = (tmp / "azurite.log").open("wb")
    process = subprocess.Popen(
        [
            str(AZURITE),
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(port),
            "--location",
            str(tmp / "azurite"),
            "--skipApiVersionCheck",
            "--loose",
            "--silent",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_for_port(port, process, "Azurite")
        endpoint = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
        env = {AZURE_KEY_ENV: AZURITE_KEY}
        service = BlobServiceClient(
            account_url=endpoint,
            credential={"account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY},
        )
        service.create_container(BUCKET)
        storage = (
            f"{{endpoint: '{endpoint}', allow_http: true, account_name: {AZURITE_ACCOUNT}, "
            f"account_key: {{env: {AZURE_KEY_ENV}}}}}"
        )
        yield ObjectServer("azure", endpoint, storage, env)
    finally:
        _stop(process)
        log.close()
