"""README's first steps, as a newcomer takes them: the ``sfcdc`` commands of its "Two commands"
section, in the order README gives them, run in a fresh working directory, each one's output
checked. Read from README, so the test follows it when it changes.

Before: ``sfcdc sql "... FROM gold.account ..."`` read ``conf/``'s empty lake (table not
found), ``sfcdc status --conf .sfcdc/demo/conf`` said FAIL on a fresh demo (the PushTopic
"behind by" the workload's simulated clock), and the demo printed a query that a one-shot
``sfcdc sql`` refused (``count_if``)."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipelines import cli
from pipelines.commands.demo import EXAMPLES, missing_tables
from pipelines.commands.sql import SqlShell, shell
from pipelines.session import engine_for
from pipelines.spec import load_conf
from tests.integration.cli.doc_queries import ROOT, comparable_rows

pytestmark = pytest.mark.integration

README = (ROOT / "README.md").read_text()
_SECTION = re.compile(r"^## Two commands\n(.*?)^## ", re.S | re.M)
_BLOCK = re.compile(r"```bash\n(.*?)```", re.S)
_ROWS = re.compile(r"^\((\d+) rows?\)$", re.M)


def quick_start() -> list[list[str]]:
    """The ``sfcdc`` commands of README's "Two commands" section, in order (those chained
    after a setup step with ``&&`` included)."""
    section = _SECTION.search(README)
    assert section is not None, "README has no '## Two commands' section"
    commands = []
    for block in _BLOCK.findall(section.group(1)):
        for line in block.splitlines():
            for part in line.split("&&"):
                words = shlex.split(part)
                if words[:1] == ["sfcdc"]:
                    commands.append(words[1:])
    return commands


@dataclass(frozen=True)
class Step:
    argv: list[str]
    code: int
    out: str
    err: str

    def __str__(self) -> str:
        return f"$ sfcdc {shlex.join(self.argv)}\n{self.out}{self.err}"


@dataclass(frozen=True)
class QuickStart:
    root: Path
    steps: tuple[Step, ...]


def _run(argv: list[str]) -> Step:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return Step(argv, code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def taken(tmp_path_factory: pytest.TempPathFactory) -> QuickStart:
    """README's quick start, taken in a directory of its own."""
    root = tmp_path_factory.mktemp("quick-start")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        steps = tuple(_run(argv) for argv in quick_start())
    return QuickStart(root, steps)


def test_readme_quick_start_runs_in_order(taken: QuickStart) -> None:
    assert [s.argv[0] for s in taken.steps] == ["demo", "sql", "sql", "status"], taken.steps
    for step in taken.steps:
        assert step.code == 0, step
        if step.argv[0] == "demo":
            assert "sfcdc demo: pipeline ran once" in step.out, step
            # The default workload has events for every object: every example ran.
            assert "(not run:" not in step.out, step
            assert len(_ROWS.findall(step.out)) == len(EXAMPLES), step
            assert "sfcdc status --conf .sfcdc/demo/conf" in step.out, step
        elif step.argv[0] == "sql":
            (count,) = _ROWS.findall(step.out)
            limit = re.search(r"\bLIMIT (\d+)\s*$", step.argv[-1])
            if limit is not None:
                assert int(count) == int(limit.group(1)), step
        else:
            health = re.search(r"^health at \S+: (\w+)$", step.out, re.M)
            assert health is not None and health.group(1) in ("OK", "WARN"), step
            objects = re.findall(r"^  (OK|WARN|FAIL) +(\S+): (.*)$", step.out, re.M)
            assert len(objects) == 6, step
            for state, name, text in objects:
                # A fresh demo is seconds behind, whatever clock its events were stamped with.
                behind = re.match(r"behind by ([\d,]+) s", text)
                assert behind is not None, f"{name}: {text}\n{step}"
                assert int(behind.group(1).replace(",", "")) < 600, f"{name}: {text}\n{step}"
                assert state != "FAIL", f"{name}: {text}\n{step}"


def test_without_conf_the_commands_point_at_the_demo_lake(taken: QuickStart) -> None:
    # README's Querying section, run in a checkout (conf/ beside .sfcdc/) right after the demo:
    # conf/'s lake is empty, and the answer says how to fill it or read the demo's.
    (query,) = re.findall(r'^sfcdc sql "(SELECT [^"]+ FROM gold\.account [^"]+)"$', README, re.M)
    shutil.copytree(ROOT / "conf", taken.root / "conf", dirs_exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(taken.root)
        sql = _run(["sql", query])
        status = _run(["status"])
    assert sql.code == 1, sql
    assert "`sfcdc sql --conf .sfcdc/demo/conf` reads it" in sql.err, sql
    assert "`sfcdc run --conf conf --once` fills it" in sql.err, sql
    assert status.code == 0, status
    assert status.out.startswith("note: the lake of conf/ at lake/ has no tables yet"), status
    assert "`sfcdc status --conf .sfcdc/demo/conf` reads it" in status.out, status


def _demo_conf(taken: QuickStart) -> Path:
    return taken.root / ".sfcdc" / "demo" / "conf"


def test_every_query_the_demo_prints_runs_as_printed_in_sfcdc_sql(taken: QuickStart) -> None:
    for example in EXAMPLES:
        step = _run(["sql", "--conf", str(_demo_conf(taken)), example.sql])
        assert step.code == 0, f"{example.title}\n{step}"
        assert _ROWS.search(step.out), step


@pytest.mark.spark
def test_the_demo_queries_give_the_same_rows_in_spark_sql(
    taken: QuickStart, few_partitions: object
) -> None:
    # The interactive prompt and the spark engine answer with Spark SQL.
    conf = load_conf(_demo_conf(taken))
    datafusion = SqlShell(engine_for(conf.pipeline.lake), arrow=True)
    spark_sql = shell(conf)
    for example in EXAMPLES:
        assert not missing_tables(example, datafusion), example.title
        ordered = re.search(r"\bORDER\s+BY\b", example.sql, re.IGNORECASE) is not None
        expected = comparable_rows(spark_sql.query(example.sql), ordered)
        assert comparable_rows(datafusion.query(example.sql), ordered) == expected, example.title
