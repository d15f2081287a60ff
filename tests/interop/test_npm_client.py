"""The npm ``salesforce-pubsub-api-client``, unmodified, against the emulator over a socket.

``tests/interop/npm/pubsub_client.mjs`` logs in with OAuth client credentials at the
emulator's HTTPS endpoint, reads change events from the earliest one (decoding their
bitmaps its own way), publishes a platform event, then, as a new client, resumes after a
replay id it stored: the client keeps replay ids as numbers and sends them back as 8 bytes.
It prints what it saw as JSON lines; this test checks them against the emulator's log.

The npm packages come from ``npm ci --prefix tests/interop/npm`` (``.ci/run`` does it). Without
node or the packages the test is skipped locally and fails when ``CI`` is set.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastavro
import pytest

from ingest.decoding import field_names
from ingest.emulator.catalogue import default_catalogue
from ingest.emulator.eventlog import LoggedEvent
from ingest.emulator.server import DEFAULT_CLIENT, Emulator, EmulatorConfig
from ingest.emulator.workload import Workload
from ingest.schema import EventSchema

pytestmark = [pytest.mark.interop, pytest.mark.integration, pytest.mark.timeout(300)]

NPM_DIR = Path(__file__).resolve().parent / "npm"
SCRIPT = NPM_DIR / "pubsub_client.mjs"
PACKAGE = "salesforce-pubsub-api-client"
TOPIC = "/data/AccountChangeEvent"
PUBLISH_TOPIC = "/event/Order_Shipped__e"
COUNT = 60
RESUME_INDEX = 9
RESUME_COUNT = 20


def _node() -> str:
    """The node binary, with the pinned client installed; skip or fail (under CI) if not."""
    node = shutil.which("node")
    pinned = json.loads((NPM_DIR / "package.json").read_text())["dependencies"][PACKAGE]
    installed = NPM_DIR / "node_modules" / PACKAGE / "package.json"
    if node is None:
        why = "node is not on PATH"
    elif not installed.is_file():
        why = "the npm packages are not installed (npm ci --prefix tests/interop/npm)"
    elif json.loads(installed.read_text())["version"] != pinned:
        why = f"{PACKAGE} {pinned} is pinned but another version is installed (npm ci again)"
    else:
        return node
    if os.environ.get("CI"):
        pytest.fail(f"{why}; CI runs the interop tests, so they must not be skipped")
    pytest.skip(why)


@pytest.fixture(scope="module")
def emulator() -> Iterator[Emulator]:
    catalogue = default_catalogue()
    emu = Emulator(catalogue, EmulatorConfig(tls=True, keepalive_interval=1.0))
    emu.start()
    emu.append(Workload(catalogue, seed=11).events(600))
    try:
        yield emu
    finally:
        emu.close()


@pytest.fixture(scope="module")
def run(emulator: Emulator) -> dict[str, list[dict[str, Any]]]:
    """Run the script once; its JSON lines grouped by phase."""
    node = _node()
    assert len(emulator.log(TOPIC)) >= RESUME_INDEX + 1 + RESUME_COUNT
    assert emulator.ca_cert_path is not None
    config = {
        "endpoint": emulator.grpc_target,
        "loginUrl": emulator.http_url,
        "clientId": DEFAULT_CLIENT.client_id,
        "clientSecret": DEFAULT_CLIENT.client_secret,
        "topic": TOPIC,
        "count": COUNT,
        "resumeIndex": RESUME_INDEX,
        "resumeCount": RESUME_COUNT,
        "publishTopic": PUBLISH_TOPIC,
        "publishPayload": {
            "CreatedDate": 1_700_000_000_000,
            "CreatedById": "005000000000001AAA",
            "Order_Number__c": {"string": "O-INTEROP-1"},
            "Account_Id__c": None,
            "Shipped_At__c": {"long": 1_700_000_000_000},
            "Carrier__c": {"string": "UPS"},
            "Weight_Kg__c": {"double": 2.5},
            "Express__c": {"boolean": True},
            "Delivery_Date__c": None,
        },
        "timeoutMs": 60_000,
    }
    env = {
        **os.environ,
        "SFCDC_INTEROP": json.dumps(config),
        # The client's HTTPS login (undici) trusts Node's roots plus these.
        "NODE_EXTRA_CA_CERTS": str(emulator.ca_cert_path),
    }
    done = subprocess.run(
        [node, str(SCRIPT)],
        cwd=NPM_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    phases: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        phases.setdefault(line["phase"], []).append(line)
    assert done.returncode == 0 and "done" in phases, (
        f"node exited {done.returncode}: {phases.get('error')}\n{done.stderr[-4000:]}"
    )
    return phases


def _counter(replay_id: bytes) -> str:
    # How the client reads a replay id: its first 8 bytes as a big-endian unsigned number.
    return str(int.from_bytes(replay_id[:8], "big"))


def _decoded(emulator: Emulator, logged: LoggedEvent) -> tuple[EventSchema, dict[str, Any]]:
    schema = emulator.catalogue.schema(logged.schema_id)
    record = fastavro.schemaless_reader(io.BytesIO(logged.payload), schema.parsed)
    assert isinstance(record, dict)
    return schema, record


def _as_the_client_reads(bitmap: list[str], schema: EventSchema) -> list[str]:
    # The client reads nested `P-0x..` elements only when the list has more than one element,
    # so a bitmap made of one nested element (an address cleared, nothing else nulled) reads
    # as no field at all. Everything else it expands as sfcdc does.
    if len(bitmap) == 1 and not bitmap[0].lower().startswith("0x"):
        return []
    return sorted(field_names(bitmap, schema))


def _expected(emulator: Emulator, logged: LoggedEvent) -> dict[str, Any]:
    schema, record = _decoded(emulator, logged)
    header = record["ChangeEventHeader"]
    bitmaps = ("changedFields", "nulledFields", "diffFields")
    return {
        "id": logged.event_id,
        "schemaId": logged.schema_id,
        "replayId": _counter(logged.replay_id),
        "changeType": header["changeType"],
        "recordIds": header["recordIds"],
        **{key: _as_the_client_reads(header[key], schema) for key in bitmaps},
    }


def _seen(line: dict[str, Any]) -> dict[str, Any]:
    keys = ("id", "schemaId", "replayId", "changeType", "recordIds")
    seen = {key: line[key] for key in keys}
    for key in ("changedFields", "nulledFields", "diffFields"):
        seen[key] = sorted(line[key])
    return seen


def test_subscribe_decodes_events_and_bitmaps_as_sfcdc_does(
    emulator: Emulator, run: dict[str, list[dict[str, Any]]]
) -> None:
    log = emulator.log(TOPIC)[:COUNT]
    got = run["subscribe"]
    assert [line["id"] for line in got] == [e.event_id for e in log]
    assert [_seen(line) for line in got] == [_expected(emulator, e) for e in log]
    # The sample exercises what the client decodes: updates with changed, nulled and
    # compound-field (Parent.Child) names.
    assert any(line["changeType"] == "UPDATE" for line in got)
    assert any(line["nulledFields"] for line in got)
    assert any("." in name for line in got for name in line["changedFields"])


def test_publish_returns_the_replay_id_and_correlation_key_of_the_stored_event(
    emulator: Emulator, run: dict[str, list[dict[str, Any]]]
) -> None:
    (published,) = run["publish"]
    matches = [
        e for e in emulator.log(PUBLISH_TOPIC) if _counter(e.replay_id) == published["replayId"]
    ]
    assert len(matches) == 1
    logged = matches[0]
    assert logged.event_id == published["correlationKey"]
    _, record = _decoded(emulator, logged)
    assert record["Order_Number__c"] == "O-INTEROP-1"
    assert record["Carrier__c"] == "UPS" and record["Express__c"] is True


def test_subscribe_from_a_stored_replay_id_resumes_right_after_it(
    emulator: Emulator, run: dict[str, list[dict[str, Any]]]
) -> None:
    log = emulator.log(TOPIC)
    resumed = run["resume"]
    assert {line["storedReplayId"] for line in resumed} == {_counter(log[RESUME_INDEX].replay_id)}
    expected = log[RESUME_INDEX + 1 : RESUME_INDEX + 1 + RESUME_COUNT]
    assert [line["id"] for line in resumed] == [e.event_id for e in expected]
    assert [line["replayId"] for line in resumed] == [_counter(e.replay_id) for e in expected]
