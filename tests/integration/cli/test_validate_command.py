"""`sfcdc validate`: a summary of what would run, or every problem with its file and key."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipelines import cli

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]


def _copy_conf(tmp_path: Path) -> Path:
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    return conf


def test_the_shipped_conf_is_valid_and_summarised(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["validate", "--conf", str(_copy_conf(tmp_path))])
    out = capsys.readouterr().out
    assert code == 0
    assert "valid; 5 of 5 objects enabled" in out
    assert "in-process emulator" in out
    assert "Account" in out and "/data/AccountChangeEvent -> bronze.account_change_event" in out
    assert "Order_Shipped__e" in out and "platform event: no gold" in out


def test_bad_yaml_names_the_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = _copy_conf(tmp_path)
    (conf / "objects" / "contact.yml").write_text("object: Contact\nkind: [change_events\n")
    code = cli.main(["validate", "--conf", str(conf)])
    err = capsys.readouterr().err
    assert code == 2
    assert "objects/contact.yml" in err
    assert "line" in err


def test_every_problem_is_reported_at_once_with_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = _copy_conf(tmp_path)
    (conf / "objects" / "account.yml").write_text(
        "object: Account\nkind: change_events\nreplay:\n  start: yesterday\n"
    )
    pipeline = (conf / "pipeline.yml").read_text()
    (conf / "pipeline.yml").write_text(pipeline.replace("max_attempts:", "max_attemps:"))
    code = cli.main(["validate", "--conf", str(conf)])
    err = capsys.readouterr().err
    assert code == 2
    assert "2 configuration problems" in err
    assert "objects/account.yml: replay.start" in err and "'yesterday'" in err
    assert "pipeline.yml: ingest.retry.max_attemps: unknown key" in err


def test_a_missing_conf_directory_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["validate", "--conf", str(tmp_path / "nowhere")])
    assert code == 2
    assert "nowhere does not exist" in capsys.readouterr().err


def test_a_table_name_with_a_trailing_newline_is_named_with_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = _copy_conf(tmp_path)
    (conf / "objects" / "account.yml").write_text(
        'object: Account\nkind: change_events\ntables:\n  silver: "account\\n"\n'
    )
    code = cli.main(["validate", "--conf", str(conf)])
    err = capsys.readouterr().err
    assert code == 2
    assert "1 configuration problem" in err
    assert "objects/account.yml: tables.silver: must be a SQL identifier" in err
    assert "(got 'account\\n')" in err


# A 'billion laughs' file: nine levels of nine aliases each, 9**9 strings once expanded.
_ALIAS_BOMB = "".join(
    [
        "object: Contact\nkind: change_events\n",
        'l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n',
        *(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]\n" for i in range(1, 10)),
    ]
)


@pytest.mark.timeout(60)
def test_an_alias_bomb_is_refused_quickly_with_the_file_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = _copy_conf(tmp_path)
    (conf / "objects" / "contact.yml").write_text(_ALIAS_BOMB)
    code = cli.main(["validate", "--conf", str(conf)])
    err = capsys.readouterr().err
    assert code == 2
    assert "1 configuration problem" in err
    assert (
        "objects/contact.yml: line 4, column 10: YAML alias *l0: aliases are not supported" in err
    )
