"""`sfcdc onboard`: the object file of a topic, from the schema the source serves (the
in-process emulator of the repository's conf/), equal to the file shipped for it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipelines import cli

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


def test_onboard_prints_the_object_file_of_a_topic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "emulator"
    code = cli.main(
        [
            "onboard",
            "/data/Invoice__ChangeEvent",
            "--conf",
            str(ROOT / "conf"),
            "--set",
            f"connection.emulator.state_dir={state}",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    first, _, body = out.partition("\n\n")
    assert first == "conf/objects/invoice.yml:"
    shipped = (ROOT / "conf" / "objects" / "invoice.yml").read_text()
    assert yaml.safe_load(body) == yaml.safe_load(shipped)
    assert not state.exists() or not any(state.rglob("*.log")), "onboarding wrote no events"
    code = cli.main(["onboard", "/data/ChangeEvents", "--conf", str(ROOT / "conf")])
    assert code != 0
