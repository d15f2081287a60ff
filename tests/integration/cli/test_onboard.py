"""Onboarding an object from the schema the configured source serves (the in-process
emulator, over a socket)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ingest.errors import ConfigError, SfcdcError
from pipelines.onboard import onboard
from pipelines.spec import load_conf

pytestmark = pytest.mark.integration
CONF = Path(__file__).resolve().parents[3] / "conf"


@pytest.fixture
def conf_dir(tmp_path: Path) -> Path:
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "objects" / "invoice.yml").unlink()
    return conf


def test_onboard_writes_a_file_that_loads_with_the_rest(conf_dir: Path) -> None:
    path = onboard(conf_dir, "/data/Invoice__ChangeEvent")
    assert path == conf_dir / "objects" / "invoice.yml"
    conf = load_conf(conf_dir)
    invoice = conf.object("Invoice__c")
    assert (invoice.kind, invoice.topic, invoice.tables.gold) == (
        "change_events",
        "/data/Invoice__ChangeEvent",
        "invoice",
    )
    # Only the schema was read: the pipeline's emulator state directory was not created.
    state_dir = conf.pipeline.connection.emulator.state_dir
    assert state_dir is not None
    assert not Path(state_dir).exists()


def test_an_object_already_configured_is_kept(conf_dir: Path) -> None:
    before = (conf_dir / "objects" / "account.yml").read_text()
    with pytest.raises(ConfigError, match=r"Account is already configured in .*account\.yml"):
        onboard(conf_dir, "/data/AccountChangeEvent")
    assert (conf_dir / "objects" / "account.yml").read_text() == before


def test_a_file_that_breaks_the_configuration_is_removed(conf_dir: Path) -> None:
    # Invoice's derived tables are `invoice`; another object already writing them makes the
    # new file invalid.
    (conf_dir / "objects" / "contact.yml").write_text(
        "object: Contact\nkind: change_events\ntables:\n  silver: invoice\n  gold: invoice\n"
    )
    with pytest.raises(ConfigError) as info:
        onboard(conf_dir, "/data/Invoice__ChangeEvent")
    assert "invoice" in "\n".join(info.value.problems)
    assert not (conf_dir / "objects" / "invoice.yml").exists()


def test_a_channel_has_no_schema_to_onboard_from(conf_dir: Path) -> None:
    with pytest.raises(ConfigError, match="channel of several objects"):
        onboard(conf_dir, "/data/ChangeEvents")


def test_a_topic_the_org_does_not_have_writes_nothing(conf_dir: Path) -> None:
    before = sorted(p.name for p in (conf_dir / "objects").iterdir())
    with pytest.raises(SfcdcError, match="topic does not exist"):
        onboard(conf_dir, "/data/CaseChangeEvent")
    assert sorted(p.name for p in (conf_dir / "objects").iterdir()) == before


def test_an_object_without_change_events_is_proposed_as_polled(tmp_path: Path) -> None:
    from ingest.emulator.catalogue import default_catalogue
    from ingest.emulator.formulas import DEFAULT_FORMULAS
    from ingest.emulator.server import Emulator, EmulatorConfig
    from tests.integration.rest.oracle import write_conf

    catalogue = default_catalogue()
    catalogue.add_formulas(DEFAULT_FORMULAS)
    catalogue.disable_change_events("Opportunity")
    with Emulator(catalogue, EmulatorConfig()) as emulator:
        conf_dir = write_conf(tmp_path, emulator, {"account": "Account"}, start="earliest")
        # Change Data Capture is on for Contact: its change events.
        contact = onboard(conf_dir, "Contact")
        assert contact == conf_dir / "objects" / "contact.yml"
        assert "kind: change_events" in contact.read_text()
        # Off for Opportunity: read by polls, from its describe; its formulas suggested.
        path = onboard(conf_dir, "Opportunity")
        assert path == conf_dir / "objects" / "opportunity.yml"
        text = path.read_text()
        assert "has no change events" in text and "StageName (picklist)" in text
        assert "Formula fields, in gold when refreshed: Weighted_Amount__c, Is_Big_Deal__c" in text
        conf = load_conf(conf_dir)
        opportunity = conf.object("Opportunity")
        assert (opportunity.kind, opportunity.tables.bronze) == ("polled", "opportunity_polled")
        assert (opportunity.poll.every, opportunity.poll.lookback) == (900.0, 300.0)
        assert opportunity.formulas.refresh_every == 86400.0
        # An object the org does not have at all: neither.
        with pytest.raises(SfcdcError):
            onboard(conf_dir, "Case")
        assert not (conf_dir / "objects" / "case.yml").exists()
