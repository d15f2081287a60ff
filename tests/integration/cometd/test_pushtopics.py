"""PushTopics on the emulator: notifications carry the query's fields with the record's full
current values, and NotifyForFields, the operation flags and the WHERE clause decide."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from ingest.emulator.server import Emulator
from tests.cometd_helpers import Bayeux, change_event

pytestmark = [pytest.mark.streaming_api, pytest.mark.integration]

ACC = "001000000000001AAA"
ACC2 = "001000000000002AAA"
ADDRESS = {
    "Street": "1 Main St",
    "City": "Paris",
    "State": None,
    "PostalCode": "75001",
    "Country": "France",
    "StateCode": None,
    "CountryCode": "FR",
    "Latitude": None,
    "Longitude": None,
    "GeocodeAccuracy": None,
}


def create(emu: Emulator, rid: str = ACC, **values: Any) -> None:
    body = {"Name": "Acme", "Industry": "Energy", "NumberOfEmployees": 50, **values}
    emu.append([change_event(emu, "Account", "CREATE", [rid], body, changed=list(body))])


def update(emu: Emulator, rid: str = ACC, *, nulled: tuple[str, ...] = (), **values: Any) -> None:
    emu.append(
        [change_event(emu, "Account", "UPDATE", [rid], values, changed=list(values), nulled=nulled)]
    )


def notifications(bayeux: Bayeux, channel: str) -> list[dict[str, Any]]:
    bayeux.handshake()
    reply = bayeux.subscribe(channel, -2)
    assert reply["successful"], reply
    return [m["data"] for m in bayeux.events() if m["channel"] == channel]


def topic(emu: Emulator, query: str, name: str = "Accts", **fields: Any) -> str:
    emu.streaming.create_push_topic(name, query, **fields)
    return f"/topic/{name}"


def test_created_updated_deleted_undeleted_carry_the_selected_fields(
    emu: Emulator, bayeux: Bayeux
) -> None:
    channel = topic(emu, "SELECT Id, Name, Industry FROM Account")
    create(emu)
    update(emu, NumberOfEmployees=60)  # not referenced: no notification
    update(emu, Industry="Banking")
    emu.append([change_event(emu, "Account", "DELETE", [ACC])])
    emu.append(
        [change_event(emu, "Account", "UNDELETE", [ACC], {"Name": "Acme", "Industry": "Banking"})]
    )
    got = notifications(bayeux, channel)
    assert [d["event"]["type"] for d in got] == ["created", "updated", "deleted", "undeleted"]
    assert [d["event"]["replayId"] for d in got] == [1, 2, 3, 4]
    assert got[0]["sobject"] == {"Id": ACC, "Name": "Acme", "Industry": "Energy"}
    # The update carries every selected field with its current value, not only the change.
    assert got[1]["sobject"] == {"Id": ACC, "Name": "Acme", "Industry": "Banking"}
    assert got[2]["sobject"] == {"Id": ACC}
    assert got[3]["sobject"] == {"Id": ACC, "Name": "Acme", "Industry": "Banking"}
    assert got[0]["event"]["createdDate"].endswith("Z")


@pytest.mark.parametrize(
    ("notify_for", "expected"),
    [
        # step 1 changes NumberOfEmployees (WHERE), 2 Industry (SELECT), 3 Phone (neither)
        ("All", [1, 2, 3]),
        ("Referenced", [1, 2]),
        ("Select", [2]),
        ("Where", [1]),
    ],
)
def test_notify_for_fields_decides_which_updates_notify(
    emu: Emulator, bayeux: Bayeux, notify_for: str, expected: list[int]
) -> None:
    channel = topic(
        emu,
        "SELECT Id, Industry FROM Account WHERE NumberOfEmployees > 10",
        NotifyForFields=notify_for,
        NotifyForOperationCreate=False,
    )
    create(emu)
    base = 1_735_689_600_000
    for step, values in enumerate(
        ({"NumberOfEmployees": 70}, {"Industry": "Banking"}, {"Phone": "+33 1 23 45 67 89"}), 1
    ):
        emu.append(
            [
                change_event(
                    emu,
                    "Account",
                    "UPDATE",
                    [ACC],
                    values,
                    changed=list(values),
                    commit_ms=base + step * 1000,
                )
            ]
        )
    got = notifications(bayeux, channel)
    steps = [int(d["event"]["createdDate"][17:19]) for d in got]
    assert steps == expected
    assert all(d["event"]["type"] == "updated" for d in got)


def test_where_clause_filters_on_current_values(emu: Emulator, bayeux: Bayeux) -> None:
    channel = topic(
        emu,
        "SELECT Id, Name FROM Account WHERE (Industry = 'energy' OR Industry IN ('Banking')) "
        "AND Name LIKE 'Ac%' AND NumberOfEmployees >= 50",
    )
    create(emu, ACC)
    create(emu, ACC2, Name="Zeta")  # LIKE fails
    update(emu, ACC, Name="Acme Two")  # still matches
    update(emu, ACC, NumberOfEmployees=5)  # WHERE field changed, no longer matches
    update(emu, ACC, Name="Acme Three")  # SELECT field changed but WHERE fails
    got = notifications(bayeux, channel)
    assert [(d["event"]["type"], d["sobject"]["Name"]) for d in got] == [
        ("created", "Acme"),
        ("updated", "Acme Two"),
    ]


def test_operation_flags_and_inactive_topics(emu: Emulator, bayeux: Bayeux) -> None:
    channel = topic(
        emu,
        "SELECT Id, Name FROM Account",
        NotifyForOperationCreate=False,
        NotifyForOperationDelete=False,
    )
    create(emu)
    update(emu, Name="Renamed")
    emu.append([change_event(emu, "Account", "DELETE", [ACC])])
    (topic_id,) = [r["Id"] for r in emu.streaming.push_topics.records()]
    emu.streaming.push_topics.update(topic_id, {"IsActive": False})
    emu.append([change_event(emu, "Account", "UNDELETE", [ACC], {"Name": "Renamed"})])
    got = notifications(bayeux, channel)
    assert [d["event"]["type"] for d in got] == ["updated"]


def test_address_parts_notify_the_parent_alone_does_not(emu: Emulator, bayeux: Bayeux) -> None:
    parts = topic(emu, "SELECT Id, BillingCity FROM Account", NotifyForOperationCreate=False)
    parent = topic(
        emu, "SELECT Id, BillingAddress FROM Account", name="Parent", NotifyForOperationCreate=False
    )
    create(emu, BillingAddress=ADDRESS)
    emu.append(
        [
            change_event(
                emu,
                "Account",
                "UPDATE",
                [ACC],
                {"BillingAddress": {**ADDRESS, "City": "Lyon"}},
                changed=["BillingAddress.City"],
            )
        ]
    )
    got = notifications(bayeux, parts)
    assert [d["sobject"] for d in got] == [{"Id": ACC, "BillingCity": "Lyon"}]
    other = Bayeux(emu)
    try:
        assert notifications(other, parent) == []
    finally:
        other.close()


def test_gap_events_update_state_without_notifying(emu: Emulator, bayeux: Bayeux) -> None:
    channel = topic(emu, "SELECT Id, Name FROM Account")
    create(emu)
    emu.append([change_event(emu, "Account", "GAP_UPDATE", [ACC])])
    update(emu, Name="After gap")
    got = notifications(bayeux, channel)
    assert [d["sobject"]["Name"] for d in got] == ["Acme", "After gap"]


def test_a_diff_the_record_state_cannot_apply_is_no_warning(
    emu: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    # An update whose long text is a diff against a value the emulator never saw (the
    # record was created before it started): the state keeps the field as it was. That is the
    # emulator's own bookkeeping, not something a user of sfcdc can act on, so `sfcdc -q`
    # shows nothing about it (it printed a WARNING line on every start).
    caplog.set_level(logging.DEBUG, logger="ingest.emulator")
    diff = "--- \n+++ 0000\n@@ -1,1 +1,1 @@\n-old\n+new"
    emu.append(
        [
            change_event(
                emu, "Account", "UPDATE", [ACC], {"Description": diff}, diffed=["Description"]
            )
        ]
    )
    assert emu.streaming.unapplied_diffs == 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert any("diff not applied" in r.getMessage() for r in caplog.records)
