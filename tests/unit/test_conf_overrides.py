"""``--set KEY=VALUE``: pipeline.yml keys replaced for one run and validated like the file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ingest.errors import ConfigError
from pipelines.cli import build_parser, main
from pipelines.commands.conf_options import conf_from_args
from pipelines.spec import load_conf, parse_override

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("lake.catalog=main", ("lake.catalog", "main")),
        ("ingest.num_requested=50", ("ingest.num_requested", 50)),
        ("lake.catalog=null", ("lake.catalog", None)),
        ("lake.table_prefix=", ("lake.table_prefix", "")),
        ("connection.source = salesforce", ("connection.source", "salesforce")),
        (
            "connection.salesforce.auth.client_secret={env: SF_SECRET}",
            ("connection.salesforce.auth.client_secret", {"env": "SF_SECRET"}),
        ),
    ],
)
def test_parse_override_reads_the_value_as_yaml(text: str, expected: tuple[str, object]) -> None:
    assert parse_override(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lake.catalog", "got 'lake.catalog' without ="),
        ("=main", "got ''"),
        ("lake..catalog=main", "got 'lake..catalog'"),
        ("lake.cat-alog=main", "got 'lake.cat-alog'"),
    ],
)
def test_parse_override_rejects_malformed_keys(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match="expects KEY=VALUE") as info:
        parse_override(text)
    assert message in str(info.value)


def test_a_value_that_is_not_yaml_is_not_echoed() -> None:
    with pytest.raises(ConfigError) as info:
        parse_override("connection.salesforce.auth.client_secret={s3cr3t")
    assert "s3cr3t" not in str(info.value)
    assert "connection.salesforce.auth.client_secret" in str(info.value)


@pytest.mark.timeout(60)
def test_an_alias_in_a_set_value_is_refused() -> None:
    bomb = "[" + ", ".join(["&a [x, x, x]"] + ["*a"] * 8) + "]"
    with pytest.raises(ConfigError, match=r"--set lake\.catalog: YAML aliases are not supported"):
        parse_override(f"lake.catalog={bomb}")


def test_overrides_replace_keys_and_keep_the_rest() -> None:
    overrides = [
        parse_override(text)
        for text in (
            "lake.engine=spark",
            "lake.catalog=main",
            "lake.schemas.bronze=sfcdc_bronze",
            "lake.schemas.gold=sfcdc_gold",
        )
    ]
    lake = load_conf(CONF, overrides=overrides).pipeline.lake
    assert (lake.engine, lake.catalog) == ("spark", "main")
    assert (lake.schemas.bronze, lake.schemas.silver, lake.schemas.gold) == (
        "sfcdc_bronze",
        "silver",
        "sfcdc_gold",
    )
    # The file itself is untouched: the next load without overrides sees the shipped values.
    assert load_conf(CONF).pipeline.lake.engine == "local"


def test_overrides_can_add_a_section_the_file_leaves_out(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "pipeline.yml").write_text("connection:\n  source: emulator\n")
    loaded = load_conf(conf, overrides=[parse_override("defaults.gold.deletes=hard")])
    assert {o.gold.deletes for o in loaded.objects} == {"hard"}


def test_bad_overrides_are_reported_with_the_files_problems() -> None:
    overrides = [
        parse_override(text)
        for text in ("lake.catalog=bad-name", "lake.engine.kind=x", "lake.engin=spark")
    ]
    with pytest.raises(ConfigError) as info:
        load_conf(CONF, overrides=overrides)
    problems = "\n".join(info.value.problems)
    assert "with --set lake.catalog, lake.engine.kind, lake.engin" in problems
    assert "lake.catalog: must be a SQL identifier" in problems
    assert "(got 'bad-name')" in problems
    assert "lake.engine.kind: --set cannot set a key inside lake.engine" in problems
    assert "lake.engin: unknown key" in problems
    assert "did you mean 'engine'" in problems


def test_a_literal_secret_set_on_the_command_line_is_refused_unechoed() -> None:
    overrides = [
        parse_override(text)
        for text in (
            "connection.source=salesforce",
            "connection.salesforce.auth.type=client_credentials",
            "connection.salesforce.auth.login_url=https://example.my.salesforce.com",
            "connection.salesforce.auth.client_id=abc",
            "connection.salesforce.auth.client_secret=hunter2hunter2",
        )
    ]
    with pytest.raises(ConfigError) as info:
        load_conf(CONF, overrides=overrides)
    text = str(info.value) + "\n".join(info.value.problems)
    assert "connection.salesforce.auth.client_secret" in text
    assert "hunter2" not in text


@pytest.mark.parametrize("command", ["ingest", "silver", "gold"])
def test_every_lake_command_takes_conf_and_set(command: str) -> None:
    args = build_parser().parse_args(
        [command, "--conf", str(CONF), "--set", "lake.catalog=main", "--set", "lake.engine=spark"]
    )
    assert args.overrides == [("lake.catalog", "main"), ("lake.engine", "spark")]
    conf = conf_from_args(args)
    assert conf.pipeline.lake.catalog == "main"


def test_a_malformed_set_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["gold", "--set", "lake.catalog"])
    assert info.value.code == 2
    assert "--set expects KEY=VALUE" in capsys.readouterr().err


def test_an_invalid_override_stops_the_command_before_any_work(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["-q", "gold", "--conf", str(CONF), "--set", "lake.schemas.gold=gold-tables"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("sfcdc gold: ")
    assert "lake.schemas.gold: must be a SQL identifier" in err
