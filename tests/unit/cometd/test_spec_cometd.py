"""Object files of ``kind: streaming_api``: what they derive, every problem reported at once
with its file and key, and the demo's PushTopic file."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ingest.emulator.catalogue import default_catalogue
from ingest.errors import ConfigError
from pipelines.cometd_pipeline import push_topic_provisioner
from pipelines.commands.demo import EXAMPLES
from pipelines.commands.demo import write_conf as write_demo_conf
from pipelines.spec import load_conf

pytestmark = pytest.mark.streaming_api

ACCOUNT = "object: Account\nkind: change_events\n"
PUSHTOPIC = """\
kind: streaming_api
channel: /topic/InvoiceUpdates
pushtopic:
  manage: create_or_update
  query: SELECT Id, Name, Amount__c FROM Invoice__c
gold: {deletes: hard}
"""


def _conf(root: Path, objects: dict[str, str]) -> Path:
    conf = root / "conf"
    (conf / "objects").mkdir(parents=True)
    (conf / "pipeline.yml").write_text("")
    for name, text in objects.items():
        (conf / "objects" / f"{name}.yml").write_text(textwrap.dedent(text))
    return conf


def _problems(conf: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_conf(conf)
    return info.value.problems


def test_a_pushtopic_file_derives_object_tables_and_key(tmp_path: Path) -> None:
    conf = load_conf(_conf(tmp_path, {"account": ACCOUNT, "invoice_updates": PUSHTOPIC}))
    (spec,) = conf.enabled_streams()
    assert spec.api_name == "Invoice__c"
    assert spec.key == "streaming:/topic/InvoiceUpdates"
    assert spec.push_topic_name == "InvoiceUpdates"
    assert spec.selected_fields() == ("Name", "Amount__c")
    assert (spec.tables.bronze, spec.tables.silver, spec.tables.gold) == (
        "streaming_invoice_updates",
        "invoice_updates",
        "invoice_updates",
    )
    assert spec.gold.deletes == "hard"
    assert spec.has_gold
    assert [o.api_name for o in conf.objects] == ["Account"]  # the Pub/Sub side is apart


def test_every_problem_names_its_file_and_key(tmp_path: Path) -> None:
    conf = _conf(
        tmp_path,
        {
            "account": ACCOUNT,
            "bad_channel": "kind: streaming_api\nchannel: /topics/X\n",
            "no_pushtopic": "kind: streaming_api\nchannel: /topic/NoTopic\n",
            "no_id": """\
                kind: streaming_api
                channel: /topic/NoId
                pushtopic:
                  manage: create_or_update
                  query: SELECT Name FROM Account
                  notify_for: All
                """,
            "existing": "kind: streaming_api\nchannel: /topic/Old\npushtopic: {manage: existing}\n",
            "news": "kind: streaming_api\nchannel: /u/News\nobject: Account\n"
            "pushtopic: {manage: existing}\n",
            "news_again": "kind: streaming_api\nchannel: /u/News\ntables: {bronze: other_news, "
            "silver: other_news}\n",
            "clash": "kind: streaming_api\nchannel: /u/Clash\ntables: {silver: account}\n",
        },
    )
    problems = _problems(conf)
    expected = [
        "conf/objects/bad_channel.yml: channel: must be a Streaming API channel, one of "
        "/topic/<PushTopic name>, /u/<StreamingChannel name>, /event/<Name>__e, "
        "/data/<Object>ChangeEvent, /data/<Object>__ChangeEvent (got '/topics/X')",
        "conf/objects/clash.yml: tables.silver: table silver.account is already used by "
        "conf/objects/account.yml; set tables.silver to another name",
        "conf/objects/existing.yml: object: required when pushtopic.query is left out: the "
        "object whose describe types the silver columns",
        "conf/objects/news.yml: pushtopic: only a /topic/ channel has a PushTopic (got channel "
        "'/u/News'); remove the section",
        "conf/objects/news.yml: object: a generic channel (/u/...) carries text payloads, not an "
        "object's records; remove the key (got 'Account')",
        "conf/objects/news_again.yml: channel: /u/News is already landed by conf/objects/news.yml",
        "conf/objects/no_id.yml: pushtopic.notify_for: unknown key; valid keys are "
        "'api_version', 'description', 'manage', 'notify_for_fields', "
        "'notify_for_operation_create', 'notify_for_operation_delete', "
        "'notify_for_operation_undelete', 'notify_for_operation_update', 'query' (did you mean "
        "'notify_for_fields'?)",
        "conf/objects/no_id.yml: pushtopic.query: must select Id (got SELECT Name)",
        "conf/objects/no_pushtopic.yml: pushtopic: required for a /topic/ channel: say whether "
        "sfcdc manages the PushTopic (pushtopic: {manage: create_or_update, query: SELECT ...}) "
        "or uses an existing one (pushtopic: {manage: existing})",
    ]
    assert problems == expected


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("SELECT Id, Account.Name FROM Contact", "no relationship fields"),
        ("SELECT Id, Name FROM Account LIMIT 5", "cannot use LIMIT"),
        ("SELECT Id, Name, name FROM Account", "selects name twice"),
        ("UPDATE Account", "must be SELECT Id, <fields> FROM <Object>"),
    ],
)
def test_queries_sfcdc_cannot_land_are_refused_at_their_key(
    tmp_path: Path, query: str, says: str
) -> None:
    text = "kind: streaming_api\nchannel: /topic/T\npushtopic:\n  manage: create_or_update\n"
    conf = _conf(tmp_path, {"t": text + f"  query: {query}\n"})
    (problem,) = _problems(conf)
    assert problem.startswith("conf/objects/t.yml: pushtopic.query: ")
    assert says in problem


def test_channels_disagreeing_on_the_replay_policy_are_refused(tmp_path: Path) -> None:
    conf = _conf(
        tmp_path,
        {
            "a": "kind: streaming_api\nchannel: /u/A\nreplay: {on_corrupted: latest}\n",
            "b": "kind: streaming_api\nchannel: /u/B\nreplay: {on_corrupted: earliest}\n",
        },
    )
    (problem,) = _problems(conf)
    assert problem.startswith("conf/objects/b.yml: replay.on_corrupted: ")
    assert "must equal that of conf/objects/a.yml ('latest'; got 'earliest')" in problem


def test_the_demo_lands_one_pushtopic_on_fields_the_emulator_has(tmp_path: Path) -> None:
    conf = load_conf(write_demo_conf(tmp_path, events=10, seed=1))
    (spec,) = conf.enabled_streams()
    assert spec.channel_kind == "pushtopic"
    assert spec.pushtopic is not None and spec.pushtopic.manage == "create_or_update"
    assert push_topic_provisioner(conf) is not None  # made before the workload runs
    # The query's fields are Invoice__c fields of the emulator, so its changes notify.
    topic = default_catalogue().topic_for_entity(spec.api_name or "")
    assert topic.current_schema is not None
    known = {f["name"] for f in topic.current_schema.parsed["fields"]}
    assert set(spec.selected_fields() or ()) <= known
    # One of the demo's queries reads its gold table next to the change events'.
    assert any(f"gold.{spec.tables.gold}" in e.sql for e in EXAMPLES)


def test_the_conf_readme_example_is_a_valid_pushtopic_file(tmp_path: Path) -> None:
    readme = (Path(__file__).resolve().parents[3] / "conf" / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in readme.split("```yaml\n")[1:]]
    (example,) = [b for b in blocks if "kind: streaming_api" in b]
    conf = load_conf(_conf(tmp_path, {"invoice_updates": example}))
    (spec,) = conf.enabled_streams()
    assert (spec.api_name, spec.tables.bronze, spec.tables.gold) == (
        "Invoice__c",
        "streaming_invoice_updates",
        "invoice_updates",
    )


def test_the_real_org_example_of_the_streaming_api_page_loads(tmp_path: Path) -> None:
    page = (Path(__file__).resolve().parents[3] / "docs" / "streaming-api.md").read_text()
    section = page.split("### A real org", 1)[1].split("\n### ", 1)[0]
    conf = tmp_path / "conf"
    (conf / "objects").mkdir(parents=True)
    files = 0
    for block in section.split("```yaml\n")[1:]:
        text = block.split("```", 1)[0]
        name = text.splitlines()[0].removeprefix("# ")
        (tmp_path / name).write_text(text)
        files += 1
    assert files == 6
    loaded = load_conf(conf)
    assert loaded.pipeline.connection.source == "salesforce"
    assert [o.api_name for o in loaded.objects] == ["Account"]
    assert sorted(s.channel for s in loaded.enabled_streams()) == [
        "/data/ContactChangeEvent",
        "/event/Order_Shipped__e",
        "/topic/InvoiceUpdates",
        "/u/Alerts",
    ]
