"""`sfcdc emulator serve` as a user runs it: a separate process that serves a seeded workload,
reachable with the documented credentials, stopped cleanly by SIGINT."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import pytest

from ingest.pubsub import pb2, pb2_grpc

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]


def _start(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[str], dict[str, object]]:
    conn = tmp_path / "emulator.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipelines.cli",
            "emulator",
            "serve",
            "--port",
            "0",
            "--events",
            "300",
            "--platform-events",
            "20",
            "--connection-file",
            str(conn),
            *extra,
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # The file exists from the moment the writer opens it, empty until it has written the
    # document (indented JSON, a newline last): wait for the whole of it, however long a
    # loaded machine keeps the writer from its write.
    deadline = time.monotonic() + 60
    while not (text := conn.read_text() if conn.exists() else "").endswith("}\n"):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"emulator did not start:\n{proc.communicate()[0]}")
        time.sleep(0.1)
    return proc, json.loads(text)


def _token(info: dict[str, object], verify: object) -> str:
    resp = httpx.post(
        f"{info['http_url']}/services/oauth2/token",
        data={
            "grant_type": "client_credentials",
            "client_id": info["client_id"],
            "client_secret": info["client_secret"],
        },
        verify=verify,  # type: ignore[arg-type]
    )
    resp.raise_for_status()
    return str(resp.json()["access_token"])


def _metadata(info: dict[str, object], token: str) -> tuple[tuple[str, str], ...]:
    return (
        ("accesstoken", token),
        ("instanceurl", str(info["instance_url"])),
        ("tenantid", str(info["org_id"])),
    )


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    return out


def test_serve_prints_connection_details_serves_events_and_stops_on_sigint(tmp_path: Path) -> None:
    proc, info = _start(tmp_path, "--truth-file", str(tmp_path / "truth.json"))
    try:
        assert "/data/AccountChangeEvent" in info["topics"]  # type: ignore[operator]
        token = _token(info, verify=True)
        with grpc.insecure_channel(str(info["grpc_target"])) as channel:
            stub = pb2_grpc.PubSubStub(channel)
            md = _metadata(info, token)
            topic = stub.GetTopic(
                pb2.TopicRequest(topic_name="/event/Order_Shipped__e"), metadata=md
            )
            assert topic.can_publish and topic.schema_id
            responses = stub.Subscribe(
                iter(
                    [
                        pb2.FetchRequest(
                            topic_name="/event/Order_Shipped__e",
                            replay_preset=pb2.EARLIEST,
                            num_requested=100,
                        )
                    ]
                ),
                metadata=md,
            )
            # 20 explicit platform events, plus those the workload mix emits on its own.
            received = []
            for response in responses:
                received.extend(response.events)
                if len(received) >= 20:
                    break
            responses.cancel()
            assert len(received) >= 20
            assert {e.event.schema_id for e in received} == {topic.schema_id}
            assert len({e.replay_id for e in received}) == len(received)
    finally:
        out = _stop(proc)
    assert "serving; Ctrl-C stops" in out and "sfcdc emulator: stopped" in out
    truth = json.loads((tmp_path / "truth.json").read_text())
    assert truth, "the ground truth was exported on exit"


def test_serve_with_tls_is_reachable_only_with_verification_against_its_ca(tmp_path: Path) -> None:
    proc, info = _start(tmp_path, "--tls", "--cert-dir", str(tmp_path / "certs"))
    try:
        assert info["tls"] and info["ca_file"]
        ca = Path(str(info["ca_file"]))
        token = _token(info, verify=ssl.create_default_context(cafile=str(ca)))
        creds = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
        with grpc.secure_channel(str(info["grpc_target"]), creds) as channel:
            stub = pb2_grpc.PubSubStub(channel)
            info_ = stub.GetTopic(
                pb2.TopicRequest(topic_name="/data/AccountChangeEvent"),
                metadata=_metadata(info, token),
            )
            assert info_.schema_id
        with pytest.raises(httpx.ConnectError):
            httpx.post(f"{info['http_url']}/services/oauth2/token", data={}, verify=True)
    finally:
        _stop(proc)


def test_bad_managed_subscription_option_is_a_clear_error(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.cli",
            "emulator",
            "serve",
            "--port",
            "0",
            "--managed",
            "nonsense",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--managed 'nonsense': expected NAME=TOPIC[:EARLIEST|LATEST]" in result.stderr


def test_serve_answers_queries_for_its_records_across_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "state"

    def count(info: dict[str, object]) -> int:
        resp = httpx.get(
            f"{info['http_url']}/services/data/v62.0/queryAll",
            params={"q": "SELECT COUNT() FROM Account"},
            headers={"Authorization": f"Bearer {_token(info, verify=True)}"},
        )
        resp.raise_for_status()
        return int(resp.json()["totalSize"])

    proc, info = _start(tmp_path, "--state-dir", str(state))
    try:
        before = count(info)
    finally:
        _stop(proc)
    assert before > 0
    (tmp_path / "emulator.json").unlink()
    # Started again on the same directory, it serves the logged events and the same records.
    proc, info = _start(tmp_path, "--state-dir", str(state))
    try:
        assert count(info) == before
    finally:
        out = _stop(proc)
    assert "initial workload not appended" in out or "restored" in out
