"""README.md: the two commands as CI runs them, the Python examples executed with their printed
output compared, and every ``sfcdc`` command line accepted by the command's parser."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from pipelines.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
FIRST = 'python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[dev]" && sfcdc demo'
SECOND = "python -m pytest"
# Commands the README describes that other parts of the product register; their lines are
# checked once the parser knows them.
PLANNED = {"run", "demo", "sql", "status", "validate", "bootstrap", "resync"}

BLOCK_RE = re.compile(r"```(\w+)\n(.*?)```", re.S)


def _blocks(lang: str) -> list[str]:
    return [body for kind, body in BLOCK_RE.findall(README) if kind == lang]


def test_the_two_commands_come_first_as_ci_runs_them() -> None:
    bash = _blocks("bash")
    assert bash[0].strip() == FIRST
    assert bash[1].strip() == SECOND
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"\n{SECOND}\n" in ci
    assert README.index("## Two commands") < README.index("## How it works")


def _examples() -> list[tuple[str, str]]:
    """Each python block with the text block that follows it (its expected output)."""
    pairs = []
    matches = list(BLOCK_RE.finditer(README))
    for this, following in zip(matches, [*matches[1:], None], strict=True):
        if this.group(1) != "python":
            continue
        assert following is not None and following.group(1) == "text", (
            "every README python example is followed by its output in a ```text block"
        )
        pairs.append((this.group(2), following.group(2)))
    return pairs


@pytest.mark.parametrize("example", _examples(), ids=lambda e: e[0].splitlines()[-1][:40])
def test_python_examples_print_what_the_readme_shows(
    example: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, expected = example
    monkeypatch.chdir(ROOT)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    assert out.getvalue() == expected


def _command_lines() -> list[str]:
    lines = []
    for block in _blocks("bash"):
        for raw in block.splitlines():
            command = raw.split("  #", 1)[0]
            lines.extend(
                part.strip() for part in command.split("&&") if part.strip().startswith("sfcdc ")
            )
    return lines


def test_the_readme_shows_every_layer_command() -> None:
    shown = {shlex.split(line)[1] for line in _command_lines()}
    assert {"ingest", "silver", "gold", "run", "demo", "sql"} <= shown


@pytest.mark.parametrize("line", _command_lines())
def test_every_sfcdc_line_parses(line: str) -> None:
    argv = shlex.split(line)[1:]
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    if argv[0] not in sub.choices:  # type: ignore[operator]
        assert argv[0] in PLANNED, f"README shows an unknown command: {line}"
        pytest.skip(f"`sfcdc {argv[0]}` is not registered on this branch yet")
    args = parser.parse_args(argv)
    assert args.command == argv[0]


@pytest.mark.parametrize(
    "page", ["README.md", "docs/operations.md", "docs/databricks.md", "docs/querying.md"]
)
def test_links_point_at_files_that_exist(page: str) -> None:
    path = ROOT / page
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", path.read_text()):
        if not target.startswith("http"):
            assert (path.parent / target).exists(), f"{page}: {target}"
