"""First contact with a source that cannot be reached: ``sfcdc ingest --once`` and ``sfcdc
streaming ingest --once`` stop within ``ingest.retry.first_contact_seconds`` (set short here;
10 s by default) naming the address and the cause, instead of retrying for minutes with
warnings that said only ``AUTH_UNAVAILABLE``; no secret appears anywhere."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.server import Emulator, EmulatorConfig
from pipelines.cli import main

pytestmark = pytest.mark.integration

SECRET = "s3cr3t-never-shown"
RETRY = (
    "  retry: {initial_backoff_seconds: 0.2, max_backoff_seconds: 1, first_contact_seconds: 2}\n"
)
# Well within the minutes a retrying landing would take, with room for a machine so busy that
# starting the command alone takes seconds (first_contact_seconds is 2 here).
SOON = 45


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _conf(root: Path, connection: str, objects: dict[str, str]) -> str:
    conf = root / "conf"
    (conf / "objects").mkdir(parents=True)
    (conf / "pipeline.yml").write_text(
        f"connection:\n{connection}lake:\n  location: {root / 'lake'}\ningest:\n{RETRY}"
    )
    for name, text in objects.items():
        (conf / "objects" / f"{name}.yml").write_text(text)
    return str(conf)


@pytest.fixture
def login_only() -> Iterator[Emulator]:
    """An emulator whose OAuth endpoint answers but whose instance URL (REST, CometD) is a
    port nobody listens on."""
    dead = f"http://127.0.0.1:{_closed_port()}"
    with Emulator(default_catalogue(), EmulatorConfig(instance_url=dead)) as running:
        yield running


def _run(
    argv: list[str], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> tuple[int, str, float]:
    started = time.monotonic()
    code = main(argv)
    seconds = time.monotonic() - started
    out, err = capsys.readouterr()
    text = "\n".join([out, err, *(r.getMessage() for r in caplog.records)])
    assert SECRET not in text
    return code, err, seconds


def test_an_unreachable_login_url_fails_fast_naming_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("SFCDC_TEST_SECRET", SECRET)
    conf = _conf(
        tmp_path,
        "  source: salesforce\n"
        "  salesforce:\n"
        f"    pubsub_endpoint: 127.0.0.1:{_closed_port()}\n"
        "    auth:\n"
        "      type: client_credentials\n"
        "      login_url: https://login.sfcdc-test.invalid\n"
        "      client_id: sfcdc-test\n"
        "      client_secret: {env: SFCDC_TEST_SECRET}\n",
        {"account": "object: Account\nkind: change_events\n"},
    )
    code, err, seconds = _run(["ingest", "--conf", conf, "--once"], capsys, caplog)
    assert code == 2
    assert seconds < SOON
    assert "the first connection failed" in err
    assert "https://login.sfcdc-test.invalid/services/oauth2/token" in err
    assert "ConnectError" in err
    warned = [m for m in (r.getMessage() for r in caplog.records) if "failed: AUTH_UN" in m]
    assert warned and all("login.sfcdc-test.invalid" in w for w in warned)


def test_a_refused_pubsub_endpoint_fails_fast_naming_it(
    tmp_path: Path,
    login_only: Emulator,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = _closed_port()
    conf = _conf(
        tmp_path,
        "  emulator:\n"
        "    mode: external\n"
        f"    grpc_port: {port}\n"
        f"    http_port: {login_only.http_port}\n",
        {"account": "object: Account\nkind: change_events\n"},
    )
    code, err, seconds = _run(["ingest", "--conf", conf, "--once"], capsys, caplog)
    assert code == 2
    assert seconds < SOON
    assert "the first connection failed" in err
    assert f"127.0.0.1:{port}" in err and "refused" in err.lower(), err


def test_an_unreachable_cometd_endpoint_fails_fast_naming_it(
    tmp_path: Path,
    login_only: Emulator,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    login_only.streaming.create_channel("/u/Alerts")
    conf = _conf(
        tmp_path,
        "  emulator:\n"
        "    mode: external\n"
        f"    grpc_port: {login_only.grpc_port}\n"
        f"    http_port: {login_only.http_port}\n",
        {"alerts": "kind: streaming_api\nchannel: /u/Alerts\n"},
    )
    code, err, seconds = _run(["streaming", "ingest", "--conf", conf, "--once"], capsys, caplog)
    assert code == 2
    assert seconds < SOON
    assert "the first connection failed" in err
    assert f"{login_only.instance_url}/cometd/62.0" in err and "ConnectError" in err, err
