"""The emulator's Bayeux endpoint: sessions, cookies, replay, retention, channels of every
kind, the guide's error replies, and the faults tests inject."""

from __future__ import annotations

import time

import httpx
import pytest

from ingest.emulator.server import Emulator
from tests.cometd_helpers import Bayeux, change_event
from tests.emulator_helpers import FakeClock

# Raw protocol exchanges: sessions are made, expired and revoked on purpose.
pytestmark = [pytest.mark.streaming_api, pytest.mark.integration, pytest.mark.leaves_sessions]

ACC = "001000000000001AAA"


def make_account(emu: Emulator, name: str = "Acme", rid: str = ACC) -> None:
    emu.append([change_event(emu, "Account", "CREATE", [rid], {"Name": name}, changed=["Name"])])


def test_handshake_sets_the_browser_cookie_and_offers_long_polling(bayeux: Bayeux) -> None:
    reply = bayeux.handshake()
    assert reply["successful"] and reply["supportedConnectionTypes"] == ["long-polling"]
    assert reply["ext"] == {"replay": True, "payload.format": True}
    assert "BAYEUX_BROWSER" in bayeux.http.cookies
    first = bayeux.connect()[-1]
    assert first["successful"] and first["advice"]["reconnect"] == "retry"


def test_requests_without_the_cookie_are_refused(emu: Emulator, bayeux: Bayeux) -> None:
    bayeux.handshake()
    bayeux.http.cookies.clear()
    reply = bayeux.connect()[-1]
    assert reply["error"].startswith("400::Client ") and "BAYEUX_BROWSER" in reply["error"]


@pytest.mark.parametrize(
    ("version", "error"),
    [
        ("", "400::API version in the URI is mandatory"),
        ("22.0", "400::Unsupported API version. Only API versions '23.0' and above"),
    ],
)
def test_api_version_errors(emu: Emulator, version: str, error: str) -> None:
    client = Bayeux(emu, version=version)
    try:
        response = client.post({"channel": "/meta/handshake", "id": "1"})
        assert response.status_code == 400
        assert response.json()[0]["error"].startswith(error)
    finally:
        client.close()


def test_handshake_denials_carry_the_failure_reason(emu: Emulator) -> None:
    for token, reason in (
        ("", "401::Request requires authentication"),
        ("00Dx!bad", "401::Authentication invalid"),
    ):
        client = Bayeux(emu, token=token)
        reply = client.handshake()
        client.close()
        assert reply["error"] == "403::Handshake denied"
        assert reply["ext"]["sfdc"]["failureReason"] == reason
        assert reply["advice"] == {"reconnect": "none"}
    emu.faults.deny_handshakes("403::To protect all customers ... simultaneous connections ...")
    client = Bayeux(emu)
    assert "simultaneous" in client.handshake()["ext"]["sfdc"]["failureReason"]
    client.close()


def test_subscribe_errors(emu: Emulator, bayeux: Bayeux) -> None:
    emu.streaming.create_channel("/u/Alerts")
    bayeux.handshake()
    assert bayeux.subscribe("").get("error") == "400::Channel name not specified"
    assert bayeux.subscribe("topic/X")["error"].startswith("400::Channel subscriptions must start")
    assert bayeux.subscribe("/topic/Nope")["error"] == (
        "400::The channel you requested to subscribe to does not exist /topic/Nope"
    )
    assert bayeux.subscribe("/u/Nope")["error"] == "404::Unknown channel"
    assert bayeux.subscribe("/u/alerts")["error"] == "404::channel names may not vary only by case"
    assert bayeux.subscribe("/u/Alerts", 99)["error"].startswith(
        "400::The replayId 99 you provided"
    )
    emu.faults.deny_subscribes("403::Organization total events daily limit exceeded")
    assert bayeux.subscribe("/u/Alerts")["error"].endswith("daily limit exceeded")
    published = bayeux.send({"channel": "/u/Alerts", "clientId": bayeux.client_id, "data": {}})
    assert published[0]["error"] == "403::Restricted channel"


def test_unknown_client_and_missing_handshake(emu: Emulator, bayeux: Bayeux) -> None:
    assert bayeux.connect()[-1]["error"] == "403::Client has not completed handshake"
    bayeux.handshake()
    emu.streaming.expire_session()
    reply = bayeux.connect()[-1]
    assert reply["error"] == "403::Unknown client"
    assert reply["advice"] == {"reconnect": "handshake", "interval": 0}


def test_sessions_expire_after_the_reconnect_deadline(
    emu: Emulator, bayeux: Bayeux, clock: FakeClock
) -> None:
    bayeux.handshake()
    bayeux.connect()
    clock.advance(100)  # an idle reply allows 110 s
    assert bayeux.connect()[-1]["successful"]
    make_account(emu)
    emu.streaming.create_push_topic("Accts", "SELECT Id, Name FROM Account")
    assert bayeux.subscribe("/data/AccountChangeEvent", -2)["successful"]
    assert len(bayeux.connect()) == 2  # one event and the connect reply
    clock.advance(41)  # after events only 40 s
    assert bayeux.connect()[-1]["error"] == "403::Unknown client"


def test_revoked_tokens_end_connected_clients_with_401(emu: Emulator, bayeux: Bayeux) -> None:
    bayeux.handshake()
    emu.faults.expire_tokens()
    reply = bayeux.connect()[-1]
    assert reply["error"] == "401::Authentication invalid"
    assert reply["advice"]["reconnect"] == "none"
    other = Bayeux(emu)
    other.handshake()
    emu.streaming.revoke(other.client_id)
    assert other.connect()[-1]["error"] == "401::Authentication invalid"
    other.close()


def test_oversized_requests_get_413(emu: Emulator, bayeux: Bayeux) -> None:
    bayeux.handshake()
    big = {
        "channel": "/meta/subscribe",
        "clientId": bayeux.client_id,
        "subscription": "/u/" + "x" * 40_000,
    }
    response = bayeux.post(big)
    assert response.status_code == 413
    assert response.json()[0]["error"] == "413::Maximum Request Size Exceeded"


def test_batch_size_and_replay_positions(emu: Emulator, bayeux: Bayeux) -> None:
    channel_id = emu.streaming.create_channel("/u/Alerts")
    emu.streaming.push(channel_id, *[f"m{i}" for i in range(5)])
    emu.streaming.batch_size = 2
    bayeux.handshake()
    bayeux.subscribe("/u/Alerts", -2)
    sizes = [len(bayeux.connect()) - 1 for _ in range(4)]
    assert sizes[:3] == [2, 2, 1]
    other = Bayeux(emu)
    other.handshake()
    other.subscribe("/u/Alerts", 3)
    got = other.events()
    assert [m["data"]["event"]["replayId"] for m in got] == [4, 5]
    assert [m["data"]["payload"] for m in got] == ["m3", "m4"]
    other.handshake()
    other.subscribe("/u/Alerts", -1)
    emu.streaming.push(channel_id, "fresh")
    assert [m["data"]["payload"] for m in other.events()] == ["fresh"]
    other.close()


def test_retention_24_hours_for_generic_72_for_bus_channels(
    emu: Emulator, clock: FakeClock
) -> None:
    channel_id = emu.streaming.create_channel("/u/Alerts")
    emu.streaming.push(channel_id, "old")
    make_account(emu, "Old Co")
    clock.advance(25 * 3600)
    emu.streaming.push(channel_id, "new")
    bayeux = Bayeux(emu)  # a token issued now (tokens live two hours)
    bayeux.handshake()
    bayeux.subscribe("/u/Alerts", -2)
    bayeux.subscribe("/data/AccountChangeEvent", -2)
    got = bayeux.events()
    assert [m["data"]["payload"] for m in got if m["channel"] == "/u/Alerts"] == ["new"]
    assert len([m for m in got if m["channel"] == "/data/AccountChangeEvent"]) == 1
    assert bayeux.subscribe("/u/Alerts", 0)["error"].startswith("400::The replayId 0")
    assert bayeux.subscribe("/u/Alerts", 1)["successful"]  # the newest expired id: the edge
    clock.advance(48 * 3600)
    later = Bayeux(emu)
    later.handshake()
    later.subscribe("/data/AccountChangeEvent", -2)
    assert later.events(connects=1) == []
    later.close()
    bayeux.close()


def test_platform_and_change_events_as_json(emu: Emulator, bayeux: Bayeux) -> None:
    from ingest.emulator.workload import Workload

    workload = Workload(emu.catalogue, seed=3)
    emu.append(workload.platform_events(2))
    make_account(emu)
    bayeux.handshake()
    bayeux.subscribe("/event/Order_Shipped__e", -2)
    bayeux.subscribe("/data/ChangeEvents", -2)
    got = bayeux.events()
    pe = [m["data"] for m in got if m["channel"] == "/event/Order_Shipped__e"]
    ce = [m["data"] for m in got if m["channel"] == "/data/ChangeEvents"]
    logged = emu.log("/event/Order_Shipped__e")
    assert [d["event"]["replayId"] for d in pe] == [e.position for e in logged]
    assert [d["event"]["EventUuid"] for d in pe] == [e.event_id for e in logged]
    assert pe[0]["schema"] == logged[0].schema_id
    assert pe[0]["payload"]["CreatedDate"].endswith("Z")
    header = ce[0]["payload"]["ChangeEventHeader"]
    assert header["changeType"] == "CREATE" and header["recordIds"] == [ACC]
    assert header["changedFields"] == ["Name"]
    assert ce[0]["payload"]["Name"] == "Acme"


def test_generic_push_to_users_and_subscribers(emu: Emulator, bayeux: Bayeux) -> None:
    token = emu.issue_token()
    http = httpx.Client(
        base_url=emu.http_url, headers={"Authorization": f"Bearer {token.access_token}"}
    )
    created = http.post("/services/data/v62.0/sobjects/StreamingChannel", json={"Name": "/u/Team"})
    assert created.status_code == 201
    cid = created.json()["id"]
    bayeux.handshake()
    bayeux.subscribe("/u/Team", -1)
    assert http.get(f"/services/data/v62.0/sobjects/StreamingChannel/{cid}/push").json() == {
        "OnlineUserIds": [token.user_id],
        "ChannelName": "/u/Team",
    }
    pushed = http.post(
        f"/services/data/v62.0/sobjects/StreamingChannel/{cid}/push",
        json={
            "pushEvents": [
                {"payload": "all", "userIds": []},
                {"payload": "someone else", "userIds": ["005000000000009AAA"]},
            ]
        },
    ).json()
    assert pushed == [
        {"fanoutCount": -1, "userOnlineStatus": {}},
        {"fanoutCount": 0, "userOnlineStatus": {"005000000000009AAA": False}},
    ]
    assert [m["data"]["payload"] for m in bayeux.events()] == ["all"]
    too_long = http.post(
        f"/services/data/v62.0/sobjects/StreamingChannel/{cid}/push",
        json={"pushEvents": [{"payload": "x" * 3001, "userIds": []}]},
    )
    assert too_long.status_code == 400 and too_long.json()[0]["errorCode"] == "STRING_TOO_LONG"
    http.close()


def test_dropped_long_poll_closes_the_connection(emu: Emulator, bayeux: Bayeux) -> None:
    bayeux.handshake()
    bayeux.connect()
    emu.faults.drop_polls(1)
    with pytest.raises(httpx.HTTPError):
        bayeux.connect()
    assert bayeux.connect()[-1]["successful"]


def test_a_connect_is_held_no_longer_than_its_advice_asks(emu: Emulator, bayeux: Bayeux) -> None:
    emu.streaming.poll_timeout = 30.0
    bayeux.handshake()
    assert bayeux.subscribe("/data/AccountChangeEvent", -1)["successful"]
    bayeux.connect()  # the first connect is answered at once
    started = time.monotonic()
    reply = bayeux.send(
        {
            "channel": "/meta/connect",
            "clientId": bayeux.client_id,
            "connectionType": "long-polling",
            "advice": {"timeout": 200},
            "id": "7",
        }
    )
    assert time.monotonic() - started < 5.0
    assert [m["channel"] for m in reply] == ["/meta/connect"] and reply[0]["successful"]


def test_sessions_left_open_are_those_that_expire_or_remain(
    emu: Emulator, clock: FakeClock
) -> None:
    assert emu.streaming.sessions_left_open() == 0
    clients = [Bayeux(emu) for _ in range(4)]
    for client in clients:
        client.handshake()
    closed, abandoned, revoked, remaining = clients
    closed.close()  # /meta/disconnect
    emu.streaming.revoke(revoked.client_id)
    assert revoked.connect()[-1]["error"] == "401::Authentication invalid"  # the server ends it
    assert emu.streaming.sessions_left_open() == 2  # still open: abandoned and remaining
    assert remaining.connect()[-1]["successful"]  # an empty reply: 110 s to come back
    clock.advance(41)
    # `abandoned` expired without a disconnect (40 s after its handshake); `remaining` is
    # still open.
    assert emu.streaming.sessions_left_open() == 2
    assert emu.streaming.bayeux.abandoned == 1
    remaining.close()
    assert emu.streaming.sessions_left_open() == 1
    emu.streaming.expire_session()  # sessions the server ends itself are not left open
    assert emu.streaming.sessions_left_open() == 1
    for client in (abandoned, revoked):
        client.http.close()
