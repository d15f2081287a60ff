"""The ``gold:`` section of the spec: defaults, inheritance from ``defaults.gold``, strict
validation of ``sequence_by`` and ``scd2.track``, and the published JSON Schema."""

from __future__ import annotations

import textwrap
from pathlib import Path

import jsonschema
import pytest
import yaml

from ingest.errors import ConfigError
from pipelines.spec import (
    DEFAULT_SEQUENCE_BY,
    GoldSpec,
    ObjectSpec,
    PipelineSpec,
    Scd2Spec,
    load_conf,
)
from pipelines.spec.schema import json_schema

ACCOUNT = "object: Account\nkind: change_events\n"


def write_conf(root: Path, pipeline: str, account: str) -> Path:
    conf = root / "conf"
    (conf / "objects").mkdir(parents=True)
    (conf / "pipeline.yml").write_text(textwrap.dedent(pipeline))
    (conf / "objects" / "account.yml").write_text(ACCOUNT + textwrap.dedent(account))
    return conf


def problems(root: Path, pipeline: str = "", account: str = "") -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_conf(write_conf(root, pipeline, account))
    return info.value.problems


def test_defaults() -> None:
    gold = GoldSpec()
    assert gold.deletes == "soft"
    assert (
        gold.sequence_by
        == DEFAULT_SEQUENCE_BY
        == (
            "_cdc_commit_timestamp",
            "_cdc_commit_number",
            "_cdc_transaction_key",
            "_cdc_sequence_number",
            "_cdc_bronze_batch_id",
            "_cdc_bronze_batch_seq",
        )
    )
    assert gold.scd2 == Scd2Spec(enabled=False, track="all")
    assert ObjectSpec(api_name="Account", kind="change_events").gold == gold


def test_objects_inherit_defaults_gold_key_by_key(tmp_path: Path) -> None:
    conf = load_conf(
        write_conf(
            tmp_path,
            """\
            defaults:
              gold:
                deletes: hard
                scd2: {track: [Phone, Rating]}
            """,
            """\
            gold:
              sequence_by: [_cdc_commit_timestamp, LastModifiedDate]
              scd2: {enabled: true}
            """,
        )
    )
    (account,) = conf.objects
    assert account.gold == GoldSpec(
        deletes="hard",
        sequence_by=("_cdc_commit_timestamp", "LastModifiedDate"),
        scd2=Scd2Spec(enabled=True, track=("Phone", "Rating")),
    )


def test_bad_gold_sections_report_every_problem(tmp_path: Path) -> None:
    found = problems(
        tmp_path,
        account="""\
        gold:
          deletes: purge
          sequence_by: [_cdc_commit_timestamp, _cdc_commit_timestamp, 7, "bad name"]
          scd2: {enabled: yes please, track: everything}
        """,
    )
    assert found == [
        "conf/objects/account.yml: gold.deletes: must be one of 'soft', 'hard' (got 'purge')",
        "conf/objects/account.yml: gold.sequence_by[1]: '_cdc_commit_timestamp' is listed twice",
        "conf/objects/account.yml: gold.sequence_by[2]: must be a non-empty string (got 7, an int)",
        "conf/objects/account.yml: gold.sequence_by[3]: must be a string matching "
        "^[A-Za-z_][A-Za-z0-9_]*$ (got 'bad name')",
        "conf/objects/account.yml: gold.scd2.enabled: must be true or false "
        "(got 'yes please', a str)",
        "conf/objects/account.yml: gold.scd2.track: must be a list of strings or one of 'all' "
        "(got 'everything')",
    ]


def test_sequence_by_must_not_be_empty(tmp_path: Path) -> None:
    assert problems(tmp_path, account="gold: {sequence_by: []}\n") == [
        "conf/objects/account.yml: gold.sequence_by: must be a non-empty list of strings "
        "(got [], a list)"
    ]


def test_json_schema_accepts_what_the_loader_accepts() -> None:
    schema = json_schema(ObjectSpec)
    good = yaml.safe_load(
        ACCOUNT + "gold: {deletes: hard, sequence_by: [a, b], scd2: {enabled: true, track: all}}"
    )
    jsonschema.validate(good, schema)
    jsonschema.validate(yaml.safe_load(ACCOUNT + "gold: {scd2: {track: [Phone]}}"), schema)
    for bad in (
        "gold: {sequence_by: []}",
        "gold: {sequence_by: [a, a]}",
        "gold: {scd2: {track: some}}",
        "gold: {deletes: purge}",
        "gold: {merge: true}",
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(yaml.safe_load(ACCOUNT + bad), schema)
    pipeline = json_schema(PipelineSpec)
    gold_default = pipeline["$defs"]["GoldSpec"]["properties"]["sequence_by"]["default"]
    assert gold_default == list(DEFAULT_SEQUENCE_BY)
