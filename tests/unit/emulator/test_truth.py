from __future__ import annotations

from pathlib import Path

import pytest

from ingest.emulator.truth import GroundTruth
from tests.unit.emulator.conftest import Run

ADDRESS = ("Street", "City", "Latitude")


def truth_with_a_record() -> GroundTruth:
    truth = GroundTruth(org_id="00D000000000062EAA")
    truth.register("Widget", ["Name", "Address", "Notes", "Count"], {"Address": ADDRESS})
    truth.create(
        "Widget",
        "a0C000000000001AAA",
        {"Name": "w", "Address": {"Street": "1 Main St", "City": "Paris"}, "Count": 3},
        event_id="e-create",
    )
    return truth


def test_create_fills_every_field_and_normalizes_compounds() -> None:
    truth = truth_with_a_record()
    record = truth.record("Widget", "a0C000000000001AAA")
    assert dict(record) == {
        "Name": "w",
        "Address": {"Street": "1 Main St", "City": "Paris", "Latitude": None},
        "Notes": None,
        "Count": 3,
    }
    truth.create("Widget", "a0C000000000002AAA", {"Name": "v", "Address": {}}, event_id="e2")
    assert truth.record("Widget", "a0C000000000002AAA")["Address"] is None


def test_update_changes_named_fields_and_compound_children_one_by_one() -> None:
    truth = truth_with_a_record()
    rid = "a0C000000000001AAA"
    truth.update("Widget", rid, {"Address.City": "Lyon", "Notes": "n"}, event_id="e-u1")
    assert truth.record("Widget", rid)["Address"] == {
        "Street": "1 Main St",
        "City": "Lyon",
        "Latitude": None,
    }
    truth.update("Widget", rid, {"Address.Street": None, "Address.City": None}, event_id="e-u2")
    assert truth.record("Widget", rid)["Address"] is None, "all children null -> null compound"
    truth.update("Widget", rid, {"Address.Latitude": 48.8}, event_id="e-u3")
    assert truth.record("Widget", rid)["Address"] == {
        "Street": None,
        "City": None,
        "Latitude": 48.8,
    }
    assert truth.record("Widget", rid)["Notes"] == "n"
    assert truth.resync("Widget").record_ids == frozenset()


def test_delete_keeps_values_undelete_restores_the_given_image() -> None:
    truth = truth_with_a_record()
    rid = "a0C000000000001AAA"
    before = dict(truth.record("Widget", rid))
    truth.delete("Widget", rid, event_id="e-d")
    assert truth.deleted("Widget") == {rid} and truth.live("Widget") == frozenset()
    assert truth.is_deleted("Widget", rid) and not truth.is_deleted("Widget", "a0C0000000000")
    assert dict(truth.record("Widget", rid)) == before
    with pytest.raises(ValueError, match="UPDATE of deleted Widget"):
        truth.update("Widget", rid, {"Count": 4}, event_id="x")
    with pytest.raises(ValueError, match="DELETE of deleted Widget"):
        truth.delete("Widget", rid, event_id="x")
    truth.undelete("Widget", rid, {**before, "Count": 9}, event_id="e-u")
    assert truth.record("Widget", rid)["Count"] == 9 and not truth.deleted("Widget")
    assert not truth.is_deleted("Widget", rid)
    with pytest.raises(ValueError, match="not deleted"):
        truth.undelete("Widget", rid, before, event_id="x")


def test_gap_events_mark_records_until_a_full_image() -> None:
    truth = truth_with_a_record()
    rid = "a0C000000000001AAA"
    truth.update("Widget", rid, {"Count": 5}, event_id="gap-1", gap=True)
    truth.update("Widget", rid, {"Count": 6}, event_id="u-2")
    truth.delete("Widget", rid, event_id="gap-2", gap=True)
    expectation = truth.resync("Widget")
    assert expectation.record_ids == {rid}
    assert expectation.gap_event_ids[rid] == ("gap-1", "gap-2")
    assert not expectation.full_resync
    truth.undelete("Widget", rid, dict(truth.record("Widget", rid)), event_id="u-3")
    assert truth.resync("Widget").record_ids == frozenset()
    truth.create("Widget", "a0C000000000003AAA", {"Name": "g"}, event_id="gap-3", gap=True)
    assert truth.resync("Widget").gap_event_ids["a0C000000000003AAA"] == ("gap-3",)


def test_overflow_and_wildcard() -> None:
    truth = truth_with_a_record()
    truth.create("Widget", "a0C000000000002AAA", {"Name": "v", "Notes": "x"}, event_id="c2")
    truth.delete("Widget", "a0C000000000002AAA", event_id="d2")
    truth.overflow("Widget", {"a0C000000000001AAA": {"Count": 100}}, event_id="ov")
    expectation = truth.resync("Widget")
    assert expectation.full_resync and expectation.overflow_event_ids == ("ov",)
    assert expectation.overflow_record_ids == {"a0C000000000001AAA"}
    assert expectation.unknowable == {"a0C000000000001AAA"}
    assert truth.record("Widget", "a0C000000000001AAA")["Count"] == 100
    changed = truth.null_everywhere("Widget", "Notes")
    assert changed == ("a0C000000000002AAA",), "deleted records are converted too"
    assert truth.record("Widget", "a0C000000000002AAA")["Notes"] is None
    with pytest.raises(ValueError, match="not a scalar field"):
        truth.null_everywhere("Widget", "Address")


def test_new_fields_appear_as_null_everywhere() -> None:
    truth = truth_with_a_record()
    truth.delete("Widget", "a0C000000000001AAA", event_id="d")
    truth.register(
        "Widget", ["Name", "Kind", "Address", "Notes", "Count", "Tier"], {"Address": ADDRESS}
    )
    assert truth.fields("Widget") == ("Name", "Kind", "Address", "Notes", "Count", "Tier")
    record = truth.record("Widget", "a0C000000000001AAA")
    assert record["Kind"] is None and record["Tier"] is None


def test_bad_calls_say_what_is_wrong() -> None:
    truth = truth_with_a_record()
    with pytest.raises(ValueError, match="already exists"):
        truth.create("Widget", "a0C000000000001AAA", {}, event_id="x")
    with pytest.raises(ValueError, match=r"unknown fields \['Colour'\]"):
        truth.create("Widget", "a0C000000000009AAA", {"Colour": "red"}, event_id="x")
    with pytest.raises(ValueError, match=r"'Name.First' is not a child"):
        truth.update("Widget", "a0C000000000001AAA", {"Name.First": "x"}, event_id="x")
    with pytest.raises(ValueError, match="unknown compound children"):
        truth.update("Widget", "a0C000000000001AAA", {"Address": {"Planet": "x"}}, event_id="x")
    with pytest.raises(ValueError, match="UPDATE of unknown Widget"):
        truth.update("Widget", "a0C00000000000XAAA", {}, event_id="x")
    with pytest.raises(KeyError, match=r"no entity 'Gadget'.*Widget"):
        truth.records("Gadget")
    with pytest.raises(ValueError, match="expected a ground truth with format"):
        GroundTruth.from_json('{"format": "other"}')


def test_views_are_read_only_and_snapshots_independent(run: Run) -> None:
    truth = run.workload.truth
    entity = "Account"
    rid = next(iter(truth.records(entity)))
    with pytest.raises(TypeError):
        truth.records(entity)[rid]["Name"] = "changed"  # type: ignore[index]
    copy = truth.snapshot()
    assert copy == truth and copy is not truth
    mine = truth_with_a_record()
    frozen = mine.snapshot()
    mine.update("Widget", "a0C000000000001AAA", {"Address.City": "Nice"}, event_id="u")
    assert frozen.record("Widget", "a0C000000000001AAA")["Address"]["City"] == "Paris"
    assert frozen != mine


def test_json_round_trip_is_exact(run: Run, tmp_path: Path) -> None:
    truth = run.workload.truth
    path = truth.export_json(tmp_path / "truth.json")
    loaded = GroundTruth.load_json(path)
    assert loaded == truth
    assert loaded.to_json() == truth.to_json()
    assert loaded.org_id == truth.org_id == run.workload.org_id
    for entity in truth.entities:
        assert loaded.resync(entity) == truth.resync(entity)
        assert loaded.deleted(entity) == truth.deleted(entity)
    text = truth.to_json()
    assert "NaN" not in text and '"format": "sfcdc.ground-truth/1"' in text
