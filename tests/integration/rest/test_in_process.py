"""The REST side of an in-process emulator started from ``conf/``: TLS with the emulator's
own CA, a login through the spec's credentials, and records of the workload it generated."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ingest.errors import RestError
from pipelines.commands.bootstrap import open_rest
from pipelines.spec import load_conf

pytestmark = pytest.mark.integration


def test_open_rest_reads_the_generated_workload_over_tls(tmp_path: Path) -> None:
    conf_dir = tmp_path / "conf"
    (conf_dir / "objects").mkdir(parents=True)
    (conf_dir / "pipeline.yml").write_text(
        textwrap.dedent(
            f"""\
            connection:
              emulator:
                mode: in_process
                tls: {{enabled: true}}
                workload: {{events: 120, platform_events: 0}}
            lake: {{engine: local, location: {tmp_path / "lake"}}}
            """
        )
    )
    (conf_dir / "objects" / "account.yml").write_text("object: Account\nkind: change_events\n")
    conf = load_conf(conf_dir)
    with open_rest(conf) as (source, rest):
        assert source.emulator is not None
        assert source.tokens.current().instance_url.startswith("https://")
        records = list(rest.query_all("SELECT Id, IsDeleted, Phone FROM Account"))
        assert records, "the generated workload created no account"
        assert all(r["attributes"]["type"] == "Account" for r in records)
        with pytest.raises(RestError, match="MALFORMED_QUERY"):
            list(rest.query("SELECT Id FROM Account LIMIT 1"))
