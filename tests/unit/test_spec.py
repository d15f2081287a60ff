"""The YAML spec: defaults, derived names, and strict validation reporting every problem."""

from __future__ import annotations

import textwrap
from pathlib import Path

import jsonschema
import pytest

from ingest.auth import EnvSecrets, StaticSecrets
from ingest.errors import ConfigError
from ingest.replay import After, Earliest, ReplayId
from pipelines.spec import (
    ClientCredentialsAuth,
    Conf,
    EnvRef,
    JwtBearerAuth,
    ObjectSpec,
    PipelineSpec,
    ScopeRef,
    SoapLoginAuth,
    StaticTokenAuth,
    TablesSpec,
    default_tables,
    default_topic,
    is_identifier,
    load_conf,
    load_object,
    load_pipeline,
    parse_byte_size,
    parse_duration,
    parse_topic,
    snake_case,
)
from pipelines.spec.load import object_kinds
from pipelines.spec.schema import json_schema

ACCOUNT = "object: Account\nkind: change_events\n"
KINDS = ", ".join(map(repr, object_kinds()))


def write_conf(
    root: Path, pipeline: str | None = "", objects: dict[str, str] | None = None
) -> Path:
    conf = root / "conf"
    (conf / "objects").mkdir(parents=True)
    if pipeline is not None:
        (conf / "pipeline.yml").write_text(textwrap.dedent(pipeline))
    for name, text in (objects if objects is not None else {"account": ACCOUNT}).items():
        (conf / "objects" / f"{name}.yml").write_text(textwrap.dedent(text))
    return conf


def problems_of(conf: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_conf(conf)
    return info.value.problems


def only_problem(conf: Path) -> str:
    problems = problems_of(conf)
    assert len(problems) == 1, problems
    return problems[0]


# ------------------------------------------------------------------------------ happy paths


def test_minimal_conf_gets_defaults_and_derived_names(tmp_path: Path) -> None:
    conf = load_conf(write_conf(tmp_path))
    assert isinstance(conf, Conf)
    assert conf.pipeline == PipelineSpec(
        lake=conf.pipeline.lake,
        connection=conf.pipeline.connection,
    )
    assert conf.pipeline.connection.source == "emulator"
    assert conf.pipeline.lake.engine == "auto"
    assert conf.pipeline.lake.location == str((tmp_path / "lake").resolve())
    assert conf.pipeline.defaults.batching.max_events == 50_000
    assert conf.pipeline.defaults.batching.max_bytes == 16 * 1024 * 1024
    assert conf.pipeline.defaults.batching.max_age_seconds == 5.0
    assert conf.pipeline.ingest.num_requested == 100
    (account,) = conf.objects
    assert account.api_name == "Account"
    assert account.topic == "/data/AccountChangeEvent"
    assert account.tables == TablesSpec(
        bronze="account_change_event", silver="account", gold="account"
    )
    assert account.replay.start == "earliest"
    assert account.replay.on_corrupted == "fail"
    assert account.enabled is True
    assert conf.object_files["Account"].name == "account.yml"


@pytest.mark.parametrize(
    ("api_name", "kind", "topic", "bronze", "table"),
    [
        ("Account", "change_events", "/data/AccountChangeEvent", "account_change_event", "account"),
        (
            "Invoice__c",
            "change_events",
            "/data/Invoice__ChangeEvent",
            "invoice__change_event",
            "invoice",
        ),
        (
            "OpportunityLineItem",
            "change_events",
            "/data/OpportunityLineItemChangeEvent",
            "opportunity_line_item_change_event",
            "opportunity_line_item",
        ),
        (
            "ns__Shipment_Line__c",
            "change_events",
            "/data/ns__Shipment_Line__ChangeEvent",
            "ns__shipment_line__change_event",
            "ns__shipment_line",
        ),
        (
            "Order_Shipped__e",
            "platform_event",
            "/event/Order_Shipped__e",
            "order_shipped__e",
            "order_shipped",
        ),
        (
            "BatchApexErrorEvent",
            "platform_event",
            "/event/BatchApexErrorEvent",
            "batch_apex_error_event",
            "batch_apex_error_event",
        ),
    ],
)
def test_derived_topic_and_tables(api_name: str, kind, topic: str, bronze: str, table: str) -> None:
    assert default_topic(api_name, kind) == topic
    assert default_tables(api_name, topic) == TablesSpec(bronze=bronze, silver=table, gold=table)
    built = ObjectSpec(api_name=api_name, kind=kind)
    assert built.topic == topic
    assert built.tables == TablesSpec(bronze=bronze, silver=table, gold=table)
    assert parse_topic(topic).entity == api_name


def test_snake_case_keeps_underscores_and_splits_acronyms() -> None:
    assert snake_case("ChangeEvents") == "change_events"
    assert snake_case("Sales__chn") == "sales__chn"
    assert snake_case("HTTPRequestLog") == "http_request_log"
    assert snake_case("Account2Contact") == "account2_contact"


def test_object_overrides_merge_key_by_key_with_the_pipeline_defaults(tmp_path: Path) -> None:
    conf_dir = write_conf(
        tmp_path,
        """
        defaults:
          replay: {start: latest, on_corrupted: earliest}
          batching: {max_events: 1000, max_bytes: 2MB, max_age_seconds: 0.5}
        """,
        {
            "account": ACCOUNT + "batching: {max_events: 10}\n",
            "contact": "object: Contact\nkind: change_events\nreplay: {on_corrupted: fail}\n",
        },
    )
    conf = load_conf(conf_dir)
    account, contact = conf.object("Account"), conf.object("Contact")
    assert account.batching.max_events == 10
    assert account.batching.max_bytes == 2_000_000
    assert account.batching.max_age_seconds == 0.5
    assert account.replay.start == "latest"
    assert contact.replay.start == "latest"
    assert contact.replay.on_corrupted == "fail"
    assert contact.batching.max_events == 1000


def test_silver_compound_fields_default_to_struct_and_objects_override_them(
    tmp_path: Path,
) -> None:
    conf = load_conf(
        write_conf(
            tmp_path,
            "defaults: {silver: {compound_fields: flattened, max_rows_per_commit: 2000}}\n",
            {
                "account": ACCOUNT + "silver: {compound_fields: struct}\n",
                "contact": "object: Contact\nkind: change_events\n",
            },
        )
    )
    assert conf.object("Account").silver.compound_fields == "struct"
    assert conf.object("Contact").silver.compound_fields == "flattened"
    assert conf.object("Account").silver.max_rows_per_commit == 2000
    assert ObjectSpec(api_name="Lead", kind="change_events").silver.compound_fields == "struct"


def test_silver_compound_fields_must_be_struct_or_flattened(tmp_path: Path) -> None:
    conf = write_conf(tmp_path, objects={"account": ACCOUNT + "silver: {compound_fields: flat}\n"})
    assert only_problem(conf) == (
        "conf/objects/account.yml: silver.compound_fields: must be one of 'struct', 'flattened' "
        "(got 'flat')"
    )


def test_explicit_names_and_shared_channel(tmp_path: Path) -> None:
    conf = load_conf(
        write_conf(
            tmp_path,
            "lake: {table_prefix: sf_, schemas: {gold: curated}}\n",
            {
                "account": ACCOUNT + "topic: /data/ChangeEvents\ntables: {gold: customer}\n",
                "contact": "object: Contact\nkind: change_events\ntopic: /data/ChangeEvents\n",
                "lead": "object: Lead\nkind: change_events\nenabled: false\n",
                "order": "object: Order_Shipped__e\nkind: platform_event\n",
            },
        )
    )
    assert conf.object("Account").tables == TablesSpec(
        bronze="change_events", silver="account", gold="customer"
    )
    assert conf.pipeline.lake.table_name("customer") == "sf_customer"
    by_topic = conf.objects_by_topic()
    assert list(by_topic) == ["/data/ChangeEvents", "/event/Order_Shipped__e"]
    assert [o.api_name for o in by_topic["/data/ChangeEvents"]] == ["Account", "Contact"]
    assert "/data/LeadChangeEvent" in conf.objects_by_topic(include_disabled=True)
    topics = {t.topic: t for t in conf.topics()}
    assert topics["/data/ChangeEvents"].kind == "change_event_channel"
    assert topics["/data/ChangeEvents"].bronze_table == "change_events"
    assert topics["/event/Order_Shipped__e"].kind == "platform_event"
    assert [o.api_name for o in conf.enabled_objects()] == [
        "Account",
        "Contact",
        "Order_Shipped__e",
    ]
    with pytest.raises(KeyError, match="no object 'Nope'"):
        conf.object("Nope")


def test_salesforce_connection_with_secret_references(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("SFCDC_SECRET", raising=False)  # unresolvable references are fine here
    conf = load_conf(
        write_conf(
            tmp_path,
            """
            connection:
              source: salesforce
              salesforce:
                auth:
                  type: client_credentials
                  login_url: https://acme.my.salesforce.com
                  client_id: 3MVG9-public-id
                  client_secret: {secret: {scope: sfcdc, key: client-secret}}
                tls: {ca_file: certs/proxy.pem}
            """,
        )
    )
    sf = conf.pipeline.connection.salesforce
    assert sf is not None
    assert sf.pubsub_endpoint == "api.pubsub.salesforce.com:7443"
    assert sf.auth == ClientCredentialsAuth(
        login_url="https://acme.my.salesforce.com",
        client_id="3MVG9-public-id",
        client_secret=ScopeRef("sfcdc", "client-secret"),
    )
    assert sf.tls.verify is True
    assert sf.tls.ca_file == str((tmp_path / "certs" / "proxy.pem").resolve())


def test_secret_references_are_the_types_the_resolvers_take(tmp_path: Path) -> None:
    conf = load_conf(
        write_conf(
            tmp_path,
            _sf(
                """
                type: client_credentials
                login_url: https://acme.my.salesforce.com
                client_id: {env: SF_ID}
                client_secret: {secret: {scope: sfcdc, key: client-secret}}
                """
            ),
        )
    )
    sf = conf.pipeline.connection.salesforce
    assert sf is not None and isinstance(sf.auth, ClientCredentialsAuth)
    assert isinstance(sf.auth.client_id, EnvRef) and isinstance(sf.auth.client_secret, ScopeRef)
    resolver = StaticSecrets({"SF_ID": "3MVG9", ("sfcdc", "client-secret"): "s3cr3t"})
    assert resolver.resolve(sf.auth.client_id).reveal() == "3MVG9"
    assert resolver.resolve(sf.auth.client_secret).reveal() == "s3cr3t"
    assert EnvSecrets({"SF_ID": "from-env"}).resolve(sf.auth.client_id).reveal() == "from-env"


@pytest.mark.parametrize(
    ("auth", "expected"),
    [
        (
            "{type: jwt_bearer, login_url: 'https://login.salesforce.com', client_id: {env: ID},"
            " username: etl@acme.com, private_key: {env: KEY}}",
            JwtBearerAuth(
                login_url="https://login.salesforce.com",
                client_id=EnvRef("ID"),
                username="etl@acme.com",
                private_key=EnvRef("KEY"),
            ),
        ),
        (
            "{type: soap_login, login_url: 'https://test.salesforce.com', username: u,"
            " password: {env: PW}}",
            SoapLoginAuth(
                login_url="https://test.salesforce.com", username="u", password=EnvRef("PW")
            ),
        ),
        (
            "{type: static_token, access_token: {env: TOKEN},"
            " instance_url: 'https://acme.my.salesforce.com'}",
            StaticTokenAuth(
                access_token=EnvRef("TOKEN"), instance_url="https://acme.my.salesforce.com"
            ),
        ),
    ],
)
def test_auth_flows_parse_into_their_models(tmp_path: Path, auth: str, expected: object) -> None:
    conf = load_conf(
        write_conf(
            tmp_path, f"connection:\n  source: salesforce\n  salesforce:\n    auth: {auth}\n"
        )
    )
    assert conf.pipeline.connection.salesforce is not None
    assert conf.pipeline.connection.salesforce.auth == expected


def test_empty_pipeline_file_means_all_defaults(tmp_path: Path) -> None:
    conf_dir = write_conf(tmp_path, "# nothing set\n")
    assert load_conf(conf_dir).pipeline.lake.schemas.gold == "gold"
    assert load_pipeline(conf_dir / "pipeline.yml").ingest.retry.max_attempts == 10


def test_load_object_alone(tmp_path: Path) -> None:
    path = tmp_path / "x.yml"
    path.write_text("object: Invoice__c\nkind: change_events\n")
    assert load_object(path).tables.gold == "invoice"


@pytest.mark.parametrize(
    ("text", "expected"),
    [(1024, 1024), ("64MiB", 64 * 1024**2), ("64 MB", 64_000_000), ("1.5GiB", 1536 * 1024**2)],
)
def test_byte_sizes(text: int | str, expected: int) -> None:
    assert parse_byte_size(text) == expected


def test_byte_size_rejects_unknown_units() -> None:
    with pytest.raises(ValueError, match=r"units B, kB, KB, MB, GB, KiB, MiB, GiB; got '64 Mb'"):
        parse_byte_size("64 Mb")


@pytest.mark.parametrize(
    ("topic", "kind", "entity"),
    [
        ("/data/ChangeEvents", "change_event_channel", None),
        ("/data/Sales__chn", "change_event_channel", None),
        ("/data/AccountChangeEvent", "change_events", "Account"),
        ("/data/Invoice__ChangeEvent", "change_events", "Invoice__c"),
        ("/event/Order_Shipped__e", "platform_event", "Order_Shipped__e"),
        ("/event/LoginEventStream", "platform_event", "LoginEventStream"),
        ("/event/Orders__chn", "platform_event_channel", None),
    ],
)
def test_topic_formats(topic: str, kind: str, entity: str | None) -> None:
    info = parse_topic(topic)
    assert (info.kind, info.entity) == (kind, entity)


@pytest.mark.parametrize(
    "topic",
    ["/data/Account", "data/AccountChangeEvent", "/topic/X", "/event/", "/data/changeevents", ""],
)
def test_invalid_topics(topic: str) -> None:
    with pytest.raises(ValueError, match="must be a Pub/Sub topic name"):
        parse_topic(topic)


def test_identifier_rule() -> None:
    assert is_identifier("gold_2")
    assert is_identifier("_x")
    bad_names = ("2gold", "gold-x", "gold.account", "a b", "x`", "", "a" * 256, None)
    for bad in (*bad_names, "account\n", "account\r\n", "\naccount"):
        assert not is_identifier(bad), repr(bad)


def test_a_topic_with_a_trailing_newline_is_not_a_topic() -> None:
    with pytest.raises(ValueError, match="must be a Pub/Sub topic name"):
        parse_topic("/data/AccountChangeEvent\n")


# Python's `$` also matches before a final newline, so a pattern checked with re.match lets
# "account\n" through to the SQL the engines write. Each checked string key must refuse it.
@pytest.mark.parametrize(
    ("pipeline", "account", "key"),
    [
        ("", ACCOUNT + 'tables: {silver: "account\\n"}\n', "objects/account.yml: tables.silver"),
        ("", ACCOUNT + 'tables: {bronze: "acc\\n"}\n', "objects/account.yml: tables.bronze"),
        ("", 'object: "Account\\n"\nkind: change_events\n', "objects/account.yml: object"),
        (
            "",
            ACCOUNT + 'topic: "/data/AccountChangeEvent\\n"\n',
            "objects/account.yml: topic",
        ),
        (
            "",
            ACCOUNT + 'managed_subscription: "Acc_Sub\\n"\n',
            "objects/account.yml: managed_subscription",
        ),
        ('lake: {schemas: {gold: "gold\\n"}}\n', ACCOUNT, "pipeline.yml: lake.schemas.gold"),
        ('lake: {catalog: "main\\n"}\n', ACCOUNT, "pipeline.yml: lake.catalog"),
        ('lake: {table_prefix: "sf_\\n"}\n', ACCOUNT, "pipeline.yml: lake.table_prefix"),
    ],
)
def test_a_trailing_newline_is_refused_with_file_and_key(
    tmp_path: Path, pipeline: str, account: str, key: str
) -> None:
    conf = write_conf(tmp_path, pipeline, {"account": account})
    problems = problems_of(conf)
    assert any(p.startswith(f"conf/{key}: must be") and "\\n'" in p for p in problems), problems


_STATIC = "type: static_token\naccess_token: {env: T}\ninstance_url: https://a.my.salesforce.com"
_SOAP = (
    "type: soap_login\nlogin_url: https://login.salesforce.com\nusername: u\npassword: {env: P}\n"
)


@pytest.mark.parametrize(
    ("auth", "extra", "key"),
    [
        (_STATIC, '    tenant_id: "00D000000000001AAA\\n"\n', "tenant_id"),
        (_STATIC, '    pubsub_endpoint: "api.pubsub.salesforce.com:7443\\n"\n', "pubsub_endpoint"),
        (_SOAP + 'api_version: "62.0\\n"', "", "auth.api_version"),
        (
            _SOAP.replace("https://login.salesforce.com", '"https://login.salesforce.com\\n"'),
            "",
            "auth.login_url",
        ),
    ],
)
def test_salesforce_keys_with_a_trailing_newline_are_refused(
    tmp_path: Path, auth: str, extra: str, key: str
) -> None:
    conf = write_conf(tmp_path, _sf(auth, extra))
    problem = only_problem(conf)
    assert problem.startswith(f"conf/pipeline.yml: connection.salesforce.{key}: must be"), problem


def test_a_secret_reference_with_a_trailing_newline_is_refused(tmp_path: Path) -> None:
    auth = (
        'type: static_token\naccess_token: {env: "SF_TOKEN\\n"}\n'
        "instance_url: https://a.my.salesforce.com"
    )
    conf = write_conf(tmp_path, _sf(auth))
    problem = only_problem(conf)
    assert problem.startswith(
        "conf/pipeline.yml: connection.salesforce.auth.access_token.env: must be"
    ), problem


# ---------------------------------------------------------------------------- validation


def test_problem_format_matches_the_documented_one(tmp_path: Path) -> None:
    conf = write_conf(tmp_path, objects={"account": ACCOUNT + "replay: {start: yesterday}\n"})
    assert only_problem(conf) == (
        "conf/objects/account.yml: replay.start: must be one of 'earliest', 'latest' "
        "(got 'yesterday')"
    )


def test_every_problem_of_every_file_is_reported_at_once(tmp_path: Path) -> None:
    conf = write_conf(
        tmp_path,
        """
        lake:
          engine: spark
          engin: local
          schemas: {gold: "gold; DROP TABLE x"}
        defaults:
          batching: {max_events: '50k', max_bytes: 10}
        ingest:
          num_requested: 101
          retry: {max_attempts: 3, max_attempts: 4,
                  initial_backoff_seconds: 5, max_backoff_seconds: 1}
        """,
        {
            "account": ACCOUNT + "replay: {strat: latest}\n",
            "broken": "object: Broken\nkind: [change_events\n",
            "nameless": "kind: change_events\n",
        },
    )
    problems = problems_of(conf)
    expected = [
        "conf/pipeline.yml: ingest.retry.max_attempts: duplicate key (first at line 10, column 11,"
        " again at line 10, column 28); YAML would silently keep the last one",
        "conf/pipeline.yml: lake.engin: unknown key; valid keys are 'catalog', "
        "'direct_writes', 'engine', 'location', 'schemas', 'storage', 'table_prefix' (did you "
        "mean 'engine'?)",
        "conf/pipeline.yml: lake.schemas.gold: must be a SQL identifier: letters, digits and '_',"
        " not starting with a digit (got 'gold; DROP TABLE x')",
        "conf/pipeline.yml: defaults.batching.max_events: must be an integer (got '50k', a str)",
        "conf/pipeline.yml: defaults.batching.max_bytes: must be at least 1024 (got 10)",
        "conf/pipeline.yml: ingest.num_requested: must be at most 100 (got 101)",
        "conf/pipeline.yml: ingest.retry.max_backoff_seconds: must be at least "
        "initial_backoff_seconds (5) (got 1)",
        "conf/objects/account.yml: replay.strat: unknown key; valid keys are 'on_corrupted', "
        "'on_expired', 'replay_id', 'start' (did you mean 'start'?)",
        "conf/objects/broken.yml: line 3, column 1: invalid YAML: while parsing a flow sequence "
        "expected ',' or ']', but got '<stream end>'",
        "conf/objects/nameless.yml: object: required key is missing (API name of the object or "
        "platform event: Account, Invoice__c, Order_Shipped__e.)",
    ]
    assert problems == expected


def test_malformed_yaml_names_line_and_column(tmp_path: Path) -> None:
    conf = write_conf(tmp_path, "lake:\n  engine: local\n engine: spark\n")
    problem = only_problem(conf)
    assert problem.startswith("conf/pipeline.yml: line 3, column 2: invalid YAML:")


def alias_bomb(levels: int = 9) -> str:
    """'Billion laughs': each level lists the previous one nine times, 9**levels leaves."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.timeout(60)
def test_an_alias_bomb_is_refused_without_expanding_it(tmp_path: Path) -> None:
    conf = write_conf(tmp_path, objects={"account": ACCOUNT, "bomb": ACCOUNT + alias_bomb()})
    with pytest.raises(ConfigError) as info:
        load_conf(conf)
    assert info.value.problems == [
        "conf/objects/bomb.yml: line 4, column 10: YAML alias *l0: aliases are not supported in "
        "configuration files (they can expand a small file into billions of values); write the "
        "value out, or put what objects share under defaults in pipeline.yml"
    ]


def test_an_alias_in_pipeline_yml_is_refused_with_its_line(tmp_path: Path) -> None:
    conf = write_conf(
        tmp_path, "lake: {catalog: &cat main, schemas: {gold: *cat}}\n", {"account": ACCOUNT}
    )
    problem = only_problem(conf)
    assert problem.startswith("conf/pipeline.yml: line 1, column 44: YAML alias *cat:"), problem


def test_several_documents_in_one_file_are_rejected(tmp_path: Path) -> None:
    conf = write_conf(tmp_path, objects={"account": ACCOUNT + "---\n" + ACCOUNT})
    assert "expected a single document" in only_problem(conf)


def test_non_mapping_documents_are_rejected(tmp_path: Path) -> None:
    conf = write_conf(tmp_path, "- lake\n", {"account": "Account\n"})
    assert problems_of(conf) == [
        "conf/pipeline.yml: must be a mapping of keys to values (got ['lake'], a list)",
        "conf/objects/account.yml: must be a mapping of keys to values (got 'Account', a str)",
    ]


def test_empty_object_file(tmp_path: Path) -> None:
    conf = write_conf(tmp_path, objects={"account": ACCOUNT, "blank": "# todo\n"})
    assert only_problem(conf) == (
        "conf/objects/blank.yml: is empty; an object file needs at least 'object' and 'kind'"
    )


def test_missing_pipeline_and_missing_objects(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"pipeline\.yml is missing"):
        load_conf(write_conf(tmp_path / "a", pipeline=None))
    assert problems_of(write_conf(tmp_path / "b", objects={})) == [
        "conf/objects: no object files (*.yml); add one per Salesforce object or platform event"
    ]
    with pytest.raises(ConfigError, match="does not exist"):
        load_conf(tmp_path / "nowhere")


def test_unknown_top_level_keys_list_the_valid_ones(tmp_path: Path) -> None:
    conf = write_conf(tmp_path, objects={"account": ACCOUNT + "tabels: {gold: x}\n"})
    assert only_problem(conf) == (
        "conf/objects/account.yml: tabels: unknown key; valid keys are 'batching', 'enabled', "
        "'formulas', 'gold', 'health', 'kind', 'managed_subscription', 'num_requested', "
        "'object', 'poll', 'replay', 'silver', 'tables', 'topic' (did you mean 'tables'?)"
    )


def test_wrong_types(tmp_path: Path) -> None:
    conf = write_conf(
        tmp_path,
        "connection: {emulator: {seed: 1.5, tls: {enabled: 'yes'}}}\n",
        {"account": ACCOUNT + "enabled: 1\nbatching: {max_age_seconds: true}\n"},
    )
    assert problems_of(conf) == [
        "conf/pipeline.yml: connection.emulator.seed: must be an integer (got 1.5, a float)",
        "conf/pipeline.yml: connection.emulator.tls.enabled: must be true or false "
        "(got 'yes', a str)",
        "conf/objects/account.yml: enabled: must be true or false (got 1, an int)",
        "conf/objects/account.yml: batching.max_age_seconds: must be a number (got true, a bool)",
    ]


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (
            "object: Account\nkind: change_events\ntopic: /data/Account\n",
            "topic: must be a Pub/Sub topic name, one of /event/<Name>__e, /event/<Name>, "
            "/event/<Name>__chn, /data/ChangeEvents, /data/<Object>ChangeEvent, "
            "/data/<Object>__ChangeEvent, /data/<Name>__chn (got '/data/Account')",
        ),
        (
            "object: Account\nkind: change_events\ntopic: /data/ContactChangeEvent\n",
            "topic: '/data/ContactChangeEvent' carries Contact, not Account; use "
            "'/data/AccountChangeEvent' or a channel shared by several objects",
        ),
        (
            "object: Account\nkind: platform_event\ntopic: /data/AccountChangeEvent\n",
            "topic: a platform_event object needs a /event/... topic (got "
            "'/data/AccountChangeEvent', a change events topic)",
        ),
        (
            "object: Order_Shipped__e\nkind: change_events\n",
            "kind: Order_Shipped__e is a platform event (__e); its kind is platform_event "
            "(got 'change_events')",
        ),
        (
            "object: Invoice__c\nkind: platform_event\n",
            "kind: Invoice__c is a custom object (__c); its kind is change_events "
            "(got 'platform_event')",
        ),
        (
            "object: Account\nkind: change_events\ntables: {gold: 'account`; DROP TABLE x; --'}\n",
            "tables.gold: must be a SQL identifier: letters, digits and '_', not starting with a "
            "digit (got 'account`; DROP TABLE x; --')",
        ),
        (
            "object: Account\nkind: change_events\ntables: {silver: " + "s" * 256 + "}\n",
            "tables.silver: must be at most 255 characters (got 256)",
        ),
        (
            "object: Account Name\nkind: change_events\n",
            "object: must be a Salesforce API name such as 'Account', 'Invoice__c' or "
            "'Order_Shipped__e' (got 'Account Name')",
        ),
        (
            "object: Account\nkind: cdc\n",
            # The kinds come from the spec's own models, whatever kinds they grow.
            f"kind: must be one of {KINDS} (got 'cdc')",
        ),
        (
            "kind: streaming-api\nchannel: /topic/InvoiceUpdates\n",
            f"kind: must be one of {KINDS} (got 'streaming-api') (did you mean 'streaming_api'?)",
        ),
        (
            "object: Lead\nkind: polled\ntopic: /data/LeadChangeEvent\n",
            "topic: a polled object has no subscription: it is read by queries on "
            "SystemModstamp (leave topic out, or use kind change_events where Change Data "
            "Capture is on)",
        ),
        (
            "object: Lead\nkind: polled\nnum_requested: 10\n",
            "num_requested: a polled object has no subscription: it is read by queries on "
            "SystemModstamp (leave num_requested out, or use kind change_events where Change "
            "Data Capture is on)",
        ),
        (
            "object: Account\nkind: change_events\npoll: {every: 5m}\n",
            "poll: applies to kind polled only (this object is change_events)",
        ),
        (
            "object: Order_Shipped__e\nkind: platform_event\nformulas: {refresh_every: 1h}\n",
            "formulas: a platform event has no formula fields (it has no records)",
        ),
        (
            "object: Order_Shipped__e\nkind: polled\n",
            "kind: Order_Shipped__e is a platform event (__e); its kind is platform_event "
            "(got 'polled')",
        ),
        (
            "object: Lead\nkind: polled\npoll: {every: 0s, lookback: soon}\n",
            "poll.every: must be greater than 0 (got 0)",
        ),
        (
            "object: Lead\nkind: polled\npoll: {lookback: soon}\n",
            "poll.lookback: must be seconds or a duration such as '90s', '15m', '24h' or '7d' "
            "(units ms, s, m, h, d; got 'soon')",
        ),
        (
            "object: Lead\nkind: polled\nformulas: {refresh_every: -1}\n",
            "formulas.refresh_every: must be greater than 0 (got -1)",
        ),
    ],
)
def test_object_rules(tmp_path: Path, obj: str, message: str) -> None:
    conf = write_conf(tmp_path, objects={"thing": obj})
    problems = problems_of(conf)
    assert f"conf/objects/thing.yml: {message}" in problems, problems


def test_a_polled_object_has_no_topic_and_a_schedule(tmp_path: Path) -> None:
    conf = load_conf(
        write_conf(
            tmp_path,
            objects={
                "account": ACCOUNT + "formulas: {refresh_every: 24h}\n",
                "lead": "object: Lead\nkind: polled\npoll: {every: 15m, lookback: 90s}\n",
                "invoice": "object: Invoice__c\nkind: polled\n",
            },
        )
    )
    lead, invoice = conf.object("Lead"), conf.object("Invoice__c")
    assert (lead.poll.every, lead.poll.lookback, lead.poll.api) == (900.0, 90.0, "auto")
    assert (invoice.poll.every, invoice.poll.lookback) == (900.0, 300.0)
    assert lead.topic == "polled:Lead" and lead.tables == TablesSpec(
        bronze="lead_polled", silver="lead", gold="lead"
    )
    assert invoice.tables.bronze == "invoice_polled" and invoice.formulas.refresh_every is None
    assert conf.object("Account").formulas.refresh_every == 86400.0
    # No subscription: the topics are the change event objects'.
    assert [t.topic for t in conf.topics()] == ["/data/AccountChangeEvent"]
    assert [o.api_name for o in conf.polled_objects()] == ["Invoice__c", "Lead"]
    assert [parse_duration(v) for v in (90, "90s", "15m", "1.5h", "7d", "250ms")] == [
        90.0,
        90.0,
        900.0,
        5400.0,
        604800.0,
        0.25,
    ]


def test_prefix_counts_towards_the_identifier_limit(tmp_path: Path) -> None:
    conf = write_conf(
        tmp_path,
        "lake: {table_prefix: " + "p" * 60 + "}\n",
        {"a": ACCOUNT + "tables: {gold: " + "g" * 200 + "}\n"},
    )
    assert only_problem(conf) == (
        "conf/objects/a.yml: tables.gold: with lake.table_prefix the name must be at most 255 "
        "characters (got 260)"
    )


def test_two_objects_cannot_share_a_silver_or_gold_table(tmp_path: Path) -> None:
    conf = write_conf(
        tmp_path,
        objects={
            "account": ACCOUNT,
            "customer": "object: Customer__c\nkind: change_events\ntables: {gold: account}\n",
        },
    )
    assert only_problem(conf) == (
        "conf/objects/customer.yml: tables.gold: table gold.account is already the gold table of "
        "Account (conf/objects/account.yml); give one of them another name"
    )


def test_layers_sharing_a_schema_must_not_collide(tmp_path: Path) -> None:
    conf = write_conf(tmp_path, "lake: {schemas: {bronze: sf, silver: sf, gold: sf}}\n")
    assert only_problem(conf) == (
        "conf/objects/account.yml: tables.gold: table sf.account is already the silver table of "
        "Account (conf/objects/account.yml); give one of them another name"
    )


def test_same_object_twice(tmp_path: Path) -> None:
    conf = write_conf(
        tmp_path, objects={"a": ACCOUNT, "b": ACCOUNT + "tables: {silver: a2, gold: a2}\n"}
    )
    problems = problems_of(conf)
    assert "conf/objects/b.yml: object: Account is already configured in conf/objects/a.yml" in (
        problems
    )


def test_objects_on_one_topic_must_agree(tmp_path: Path) -> None:
    channel = "kind: change_events\ntopic: /data/ChangeEvents\n"
    conf = write_conf(
        tmp_path,
        objects={
            "a": "object: Account\n" + channel,
            "b": "object: Contact\n" + channel + "replay: {start: latest}\ntables: {bronze: cdc}\n",
        },
    )
    assert problems_of(conf) == [
        "conf/objects/b.yml: tables.bronze: objects sharing topic /data/ChangeEvents share one "
        "subscription and bronze table, so tables.bronze must equal that of Account "
        "(conf/objects/a.yml)",
        "conf/objects/b.yml: replay: objects sharing topic /data/ChangeEvents share one "
        "subscription and bronze table, so replay must equal that of Account (conf/objects/a.yml)",
    ]


def test_two_topics_cannot_land_in_one_bronze_table(tmp_path: Path) -> None:
    conf = write_conf(
        tmp_path,
        objects={
            "a": ACCOUNT + "tables: {bronze: cdc}\n",
            "b": "object: Contact\nkind: change_events\ntables: {bronze: cdc}\n",
        },
    )
    assert only_problem(conf) == (
        "conf/objects/b.yml: tables.bronze: table bronze.cdc already lands topic "
        "/data/AccountChangeEvent (conf/objects/a.yml); each topic needs its own bronze table"
    )


# ------------------------------------------------------------------------ connection rules


SF = """
connection:
  source: salesforce
  salesforce:
    auth:
{auth}
"""


def _sf(auth: str, extra: str = "") -> str:
    body = "\n".join("      " + line for line in textwrap.dedent(auth).strip().splitlines())
    return SF.format(auth=body) + extra


def test_literal_secret_is_an_error_that_does_not_echo_the_value(tmp_path: Path) -> None:
    conf = write_conf(
        tmp_path,
        _sf(
            """
            type: client_credentials
            login_url: https://acme.my.salesforce.com
            client_id: abc
            client_secret: s3cr3t-hunter2
            """
        ),
    )
    with pytest.raises(ConfigError) as info:
        load_conf(conf)
    assert info.value.problems == [
        "conf/pipeline.yml: connection.salesforce.auth.client_secret: must be a secret reference,"
        " {env: NAME} or {secret: {scope: ..., key: ...}} (got a literal value, a str); secret "
        "values never go in YAML"
    ]
    assert "s3cr3t-hunter2" not in str(info.value)
    assert "s3cr3t-hunter2" not in repr(info.value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{env: 1BAD}", "client_secret.env: must be a string matching"),
        ("{secret: {scope: sfcdc}}", "client_secret.secret.key: required key is missing"),
        ("{env: A, secret: {scope: s, key: k}}", "got a mapping with keys 'env', 'secret'"),
        ("{vault: x}", "got a mapping with keys 'vault'"),
        ("{secret: {scope: s, key: k, kee: x}}", "client_secret.secret.kee: unknown key"),
        ("{secret: [s, k]}", "client_secret.secret: must be a mapping"),
        ("", "(got null, a NoneType)"),
    ],
)
def test_secret_reference_format_is_checked(tmp_path: Path, value: str, message: str) -> None:
    conf = write_conf(
        tmp_path,
        _sf(
            f"""
            type: client_credentials
            login_url: https://acme.my.salesforce.com
            client_id: abc
            client_secret: {value}
            """
        ),
    )
    problem = only_problem(conf)
    assert message in problem, problem


@pytest.mark.parametrize(
    ("auth", "missing"),
    [
        (
            "type: client_credentials\nlogin_url: https://a.my.salesforce.com",
            ["client_id", "client_secret"],
        ),
        (
            "type: jwt_bearer\nlogin_url: https://login.salesforce.com",
            ["client_id", "username", "private_key"],
        ),
        (
            "type: username_password\nlogin_url: https://login.salesforce.com",
            ["client_id", "client_secret", "username", "password"],
        ),
        (
            "type: refresh_token\nlogin_url: https://login.salesforce.com",
            ["client_id", "refresh_token"],
        ),
        ("type: soap_login", ["login_url", "username", "password"]),
        ("type: static_token", ["access_token", "instance_url"]),
    ],
)
def test_each_auth_type_requires_its_keys(tmp_path: Path, auth: str, missing: list[str]) -> None:
    problems = problems_of(write_conf(tmp_path, _sf(auth)))
    reported = [p.split(": ")[1].removeprefix("connection.salesforce.auth.") for p in problems]
    assert reported == missing, problems


def test_auth_keys_of_another_type_are_unknown(tmp_path: Path) -> None:
    conf = write_conf(
        tmp_path,
        _sf(
            """
            type: static_token
            access_token: {env: T}
            instance_url: https://acme.my.salesforce.com
            login_url: https://login.salesforce.com
            """
        ),
    )
    assert only_problem(conf) == (
        "conf/pipeline.yml: connection.salesforce.auth.login_url: unknown key; valid keys are "
        "'access_token', 'instance_url', 'type'"
    )


def test_auth_type_must_be_known(tmp_path: Path) -> None:
    assert only_problem(write_conf(tmp_path, _sf("type: saml"))) == (
        "conf/pipeline.yml: connection.salesforce.auth.type: must be one of 'client_credentials', "
        "'jwt_bearer', 'username_password', 'refresh_token', 'soap_login', 'static_token' "
        "(got 'saml')"
    )


def test_client_credentials_needs_my_domain(tmp_path: Path) -> None:
    conf = write_conf(
        tmp_path,
        _sf(
            """
            type: client_credentials
            login_url: https://login.salesforce.com
            client_id: abc
            client_secret: {env: S}
            """
        ),
    )
    assert "for client_credentials; Salesforce rejects this flow on login.salesforce.com" in (
        only_problem(conf)
    )


def test_tls_verification_may_only_be_disabled_for_the_emulator(tmp_path: Path) -> None:
    auth = """
        type: static_token
        access_token: {env: T}
        instance_url: https://acme.my.salesforce.com
        """
    conf = write_conf(tmp_path / "sf", _sf(auth, "    tls: {verify: false}\n"))
    assert only_problem(conf) == (
        "conf/pipeline.yml: connection.salesforce.tls.verify: may only be false for the emulator "
        "(connection.emulator.tls.verify); Salesforce is always reached over verified TLS "
        "(got false)"
    )
    emulator = load_conf(
        write_conf(
            tmp_path / "emu", "connection: {emulator: {tls: {enabled: true, verify: false}}}\n"
        )
    )
    assert emulator.pipeline.connection.emulator.tls.verify is False


def test_salesforce_source_needs_its_section(tmp_path: Path) -> None:
    assert only_problem(write_conf(tmp_path, "connection: {source: salesforce}\n")) == (
        "conf/pipeline.yml: connection.salesforce: required when connection.source is 'salesforce'"
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("    pubsub_endpoint: api.pubsub.salesforce.com\n", "must be host:port"),
        (
            "    pubsub_endpoint: api.pubsub.salesforce.com:99999\n",
            "port must be between 1 and 65535",
        ),
        ("    tenant_id: 12345\n", "must be a string (got 12345, an int)"),
        ("    tenant_id: 001000000000000AAA\n", "must be an org id starting with 00D"),
    ],
)
def test_salesforce_endpoint_and_tenant(tmp_path: Path, extra: str, message: str) -> None:
    auth = "type: static_token\naccess_token: {env: T}\ninstance_url: https://a.my.salesforce.com"
    problem = only_problem(write_conf(tmp_path, _sf(auth, extra)))
    assert message in problem, problem


# --------------------------------------------------------------------------- JSON Schema


def test_generated_schemas_are_valid_draft_2020_12() -> None:
    for root in (PipelineSpec, ObjectSpec):
        schema = json_schema(root)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["additionalProperties"] is False


def test_schema_and_loader_agree_on_examples() -> None:
    pipeline = jsonschema.Draft202012Validator(json_schema(PipelineSpec))
    obj = jsonschema.Draft202012Validator(json_schema(ObjectSpec))
    good_pipeline = {
        "connection": {
            "source": "salesforce",
            "salesforce": {
                "auth": {
                    "type": "jwt_bearer",
                    "login_url": "https://login.salesforce.com",
                    "client_id": {"env": "ID"},
                    "username": "etl@acme.com",
                    "private_key": {"secret": {"scope": "sfcdc", "key": "jwt-key"}},
                },
            },
        },
        "defaults": {"batching": {"max_bytes": "32MiB"}},
    }
    assert list(pipeline.iter_errors(good_pipeline)) == []
    bad = [
        {"connection": {"source": "salesforce"}},
        {"connection": {"salesforce": {"auth": {"type": "static_token"}}}},
        {"lake": {"engin": "local"}},
        {"ingest": {"num_requested": 101}},
        {"defaults": {"batching": {"max_bytes": "64 Mb"}}},
        {
            "connection": {
                "salesforce": {
                    "tls": {"verify": False},
                    "auth": {
                        "type": "static_token",
                        "access_token": {"env": "T"},
                        "instance_url": "https://a.my.salesforce.com",
                    },
                }
            }
        },
        {
            "connection": {
                "salesforce": {
                    "auth": {
                        "type": "static_token",
                        "access_token": "literal",
                        "instance_url": "https://a.my.salesforce.com",
                    }
                }
            }
        },
    ]
    for doc in bad:
        assert list(pipeline.iter_errors(doc)), doc
    assert list(obj.iter_errors({"object": "Account", "kind": "change_events"})) == []
    assert list(obj.iter_errors({"object": "Account"}))
    assert list(
        obj.iter_errors({"object": "Account", "kind": "change_events", "tables": {"gold": "a-b"}})
    )


@pytest.mark.parametrize(
    "name",
    [
        "pipelines.spec",
        "pipelines.spec.connection",
        "pipelines.spec.fields",
        "pipelines.spec.load",
        "pipelines.spec.models",
        "pipelines.spec.schema",
        "pipelines.spec.sections",
    ],
)
def test_public_api_is_curated(name: str) -> None:
    import importlib

    module = importlib.import_module(name)
    # ruff (RUF022) keeps __all__ sorted; here: nothing private, nothing missing, no repeats
    assert len(set(module.__all__)) == len(module.__all__)
    for symbol in module.__all__:
        assert not symbol.startswith("_")
        assert hasattr(module, symbol), f"{name}.__all__ names missing {symbol}"


@pytest.mark.parametrize(
    "name",
    [
        "pipelines.spec.connection",
        "pipelines.spec.load",
        "pipelines.spec.models",
        "pipelines.spec.sections",
    ],
)
def test_spec_reexports_what_its_modules_export(name: str) -> None:
    # Callers import the configuration from pipelines.spec alone, wherever a model lives.
    import importlib

    import pipelines.spec

    module = importlib.import_module(name)
    missing = [symbol for symbol in module.__all__ if symbol not in pipelines.spec.__all__]
    assert missing == [], f"pipelines.spec does not re-export {missing} from {name}"
    for symbol in module.__all__:
        assert getattr(pipelines.spec, symbol) is getattr(module, symbol)


def test_yaml_is_parsed_in_exactly_one_module() -> None:
    import ast

    root = Path(__file__).resolve().parents[2]
    importers = []
    for package in ("ingest", "pipelines"):
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                if any(name.split(".")[0] == "yaml" for name in names):
                    importers.append(str(path.relative_to(root)))
    assert importers == ["pipelines/spec/load.py"]


def test_external_emulator_needs_its_ports_and_ca(tmp_path: Path) -> None:
    conf = write_conf(
        tmp_path,
        "connection: {emulator: {mode: external, grpc_port: 0, tls: {enabled: true}}}\n",
    )
    assert problems_of(conf) == [
        "conf/pipeline.yml: connection.emulator.grpc_port: required for an external emulator: "
        "the port it listens on (got 0)",
        "conf/pipeline.yml: connection.emulator.http_port: required for an external emulator: "
        "the port it listens on (got 0)",
        "conf/pipeline.yml: connection.emulator.tls.ca_file: required for an external emulator "
        "serving TLS: its CA certificate (ca.pem in the emulator's certificate directory)",
    ]
    unverified = write_conf(
        tmp_path / "b",
        "connection: {emulator: {mode: external, grpc_port: 1, http_port: 2,"
        " tls: {enabled: true, verify: false}}}\n",
    )
    assert "tls.verify: must be true for an external emulator" in only_problem(unverified)


def test_external_emulator_with_credentials(tmp_path: Path) -> None:
    conf = load_conf(
        write_conf(
            tmp_path,
            """
            connection:
              emulator:
                mode: external
                host: 127.0.0.1
                grpc_port: 7443
                http_port: 8443
                client_id: etl-client
                client_secret: {env: EMU_SECRET}
                tls: {enabled: true, ca_file: certs/ca.pem}
            """,
        )
    )
    emulator = conf.pipeline.connection.emulator
    assert emulator.mode == "external"
    assert (emulator.grpc_port, emulator.http_port) == (7443, 8443)
    assert emulator.client_id == "etl-client" and emulator.client_secret == EnvRef("EMU_SECRET")
    assert emulator.tls.ca_file == str((tmp_path / "certs" / "ca.pem").resolve())
    default = load_conf(write_conf(tmp_path / "d")).pipeline.connection.emulator
    assert default.mode == "in_process" and default.client_secret is None


def test_managed_subscription_is_per_topic(tmp_path: Path) -> None:
    conf = load_conf(
        write_conf(
            tmp_path,
            objects={
                "account": ACCOUNT + "managed_subscription: Account_Bronze\n",
                "order": "object: Order_Shipped__e\nkind: platform_event\n",
            },
        )
    )
    topics = {t.topic: t for t in conf.topics()}
    assert topics["/data/AccountChangeEvent"].managed_subscription == "Account_Bronze"
    assert topics["/event/Order_Shipped__e"].managed_subscription is None
    assert conf.pipeline.ingest.maintain_every_commits == 100

    shared = write_conf(
        tmp_path / "shared",
        objects={
            "account": ACCOUNT + "topic: /data/ChangeEvents\nmanaged_subscription: Cdc\n",
            "contact": "object: Contact\nkind: change_events\ntopic: /data/ChangeEvents\n",
            "order": "object: Order_Shipped__e\nkind: platform_event\nmanaged_subscription: Cdc\n",
        },
    )
    assert problems_of(shared) == [
        "conf/objects/contact.yml: managed_subscription: objects sharing topic /data/ChangeEvents "
        "share one subscription and bronze table, so managed_subscription must equal that of "
        "Account (conf/objects/account.yml)",
        "conf/objects/order.yml: managed_subscription: Cdc already serves topic "
        "/data/ChangeEvents (conf/objects/account.yml); a managed subscription follows one "
        "topic, so /event/Order_Shipped__e needs its own",
    ]
    bad = write_conf(tmp_path / "bad", objects={"account": ACCOUNT + "managed_subscription: 9x\n"})
    assert "managed_subscription: must be a developer name" in only_problem(bad)


def test_batches_are_at_most_a_gibibyte(tmp_path: Path) -> None:
    conf = write_conf(tmp_path, "defaults: {batching: {max_bytes: 2GiB}}\n")
    assert only_problem(conf) == (
        "conf/pipeline.yml: defaults.batching.max_bytes: must be at most 1073741824 "
        "(got 2147483648)"
    )


def test_per_object_subscription_settings(tmp_path: Path) -> None:
    conf = load_conf(
        write_conf(
            tmp_path,
            "ingest: {num_requested: 50}\n",
            objects={
                "account": ACCOUNT + "num_requested: 5\nreplay: {replay_id: AAAAAAAABnc=}\n",
                "contact": "object: Contact\nkind: change_events\n"
                "replay: {replay_id: '0000000000000677', start: latest}\n"
                "managed_subscription: Contact_Sub\n",
                "order": "object: Order_Shipped__e\nkind: platform_event\n"
                "replay: {replay_id: 'hex:ab12'}\n",
            },
        )
    )
    topics = {t.topic: t for t in conf.topics()}
    account = topics["/data/AccountChangeEvent"]
    assert account.num_requested == 5
    assert account.replay.start_position() == After(ReplayId(bytes.fromhex("0000000000000677")))
    contact = topics["/data/ContactChangeEvent"]
    assert contact.num_requested is None and contact.managed_subscription == "Contact_Sub"
    # Base64 and hex of the same id start at the same place; replay_id wins over start.
    assert contact.replay.start_position() == account.replay.start_position()
    order = topics["/event/Order_Shipped__e"].replay.start_position()
    assert order == After(ReplayId(b"\xab\x12"))
    assert conf.pipeline.ingest.num_requested == 50
    default = load_conf(write_conf(tmp_path / "d")).topics()[0]
    assert default.replay.start_position() == Earliest() and default.num_requested is None


@pytest.mark.parametrize(
    ("account", "problem"),
    [
        ("num_requested: 0\n", "num_requested: must be at least 1 (got 0)"),
        ("num_requested: 101\n", "num_requested: must be at most 100 (got 101)"),
        ("replay: {replay_id: 'not base64!'}\n", "replay.replay_id: must be a replay id"),
        ("replay: {replay_id: 'hex:0g'}\n", "replay.replay_id: must be a replay id"),
        ("replay: {replay_id: ''}\n", "replay.replay_id: must be a replay id"),
    ],
)
def test_per_object_subscription_settings_are_validated(
    tmp_path: Path, account: str, problem: str
) -> None:
    text = only_problem(write_conf(tmp_path, objects={"account": ACCOUNT + account}))
    assert text.startswith(f"conf/objects/account.yml: {problem}"), text


def test_objects_sharing_a_topic_agree_on_num_requested(tmp_path: Path) -> None:
    shared = write_conf(
        tmp_path,
        objects={
            "account": ACCOUNT + "topic: /data/ChangeEvents\nnum_requested: 10\n",
            "contact": "object: Contact\nkind: change_events\ntopic: /data/ChangeEvents\n",
        },
    )
    assert only_problem(shared) == (
        "conf/objects/contact.yml: num_requested: objects sharing topic /data/ChangeEvents "
        "share one subscription and bronze table, so num_requested must equal that of Account "
        "(conf/objects/account.yml)"
    )
