"""The README is a front page, and every complete ``bisect`` command in it and in docs/ runs.

"Runs" as far as the command line goes: each one is parsed by the real click command (no
probe runs), and what follows ``--`` must be exactly the training command (a misspelt flag
before it would be taken into it). Mentions of a command (``bisect runs``, ``bisect report
--html``) and synopses with placeholders (``--steps N``, ``CMD``, ``[--json F]``) are not
commands to run and are left out.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from test_cluster_files import _parse

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_PLACEHOLDER = re.compile(r"\.\.\.|[|\[\]<>{}]")


def _commands(page: Path) -> list[str]:
    text = page.read_text()
    found = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("bisect "):
                found.append(line.split("  #", 1)[0].strip())
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    found += re.findall(r"`(bisect [^`]+)`", prose)
    return found


def _complete(command: str) -> bool:
    """A command to run, not a mention (``bisect runs``) nor a synopsis (``--steps N``)."""
    if _PLACEHOLDER.search(command.replace("{seed}", "0")):
        return False
    if any(re.fullmatch(r"[A-Z]+", word) for word in re.split(r"[\s='\"]+", command)):
        return False  # a synopsis: --steps N, CMD, ARGS
    tokens = shlex.split(command)
    return len(tokens) > 3 or "--" in tokens


def _all() -> list[tuple[str, str]]:
    return [(p.relative_to(ROOT).as_posix(), c) for p in PAGES for c in _commands(p) if _complete(c)]


@pytest.mark.parametrize("page,command", _all(), ids=lambda v: v if v.endswith(".md") else None)
def test_every_complete_command_in_the_readme_and_docs_parses(page, command):
    _parse(command)


def test_the_pages_hold_commands_to_check():
    pages = {p for p, _ in _all()}
    assert "README.md" in pages and len(_all()) >= 30, sorted(pages)


def test_a_misspelt_command_in_a_page_would_fail():
    with pytest.raises(Exception):
        _parse("bisect capture -o run.trace --step 3 -- python train.py")


def test_the_readme_is_a_front_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 100
    first_block = re.search(r"```bash\n(.*?)```", readme, re.S).group(1)
    assert [ln.split()[0] for ln in first_block.strip().splitlines()] == ["./scripts/demo.sh", "./scripts/test.sh"]
    assert "docs/README.md" in readme and "| try it | `bisect demo` |" in readme


def test_every_docs_page_is_in_the_index_and_every_link_resolves():
    index = (ROOT / "docs" / "README.md").read_text()
    for page in (ROOT / "docs").glob("*.md"):
        if page.name != "README.md":
            assert f"({page.name})" in index, page.name
    for page in PAGES + [ROOT / "docs" / "README.md"]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.name} links to {target}"
