"""CLI smoke tests: the command list, every command's --help, --version, unbuilt commands, no framework at start-up."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from reprobisect import __version__
from reprobisect.cli import COMMANDS, main

DESIGNED = ["capture", "compare", "runs", "probe", "repro", "resume", "seeds", "envs", "doctor", "audit", "report", "demo"]
"""Every command --help lists; each one works (a command is listed the day it is built)."""
BISECT = Path(sys.executable).with_name("bisect")


def _cmd() -> list[str]:
    return [str(BISECT)] if BISECT.exists() else [sys.executable, "-m", "reprobisect"]


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "Usage: bisect" in out
    listed = re.findall(r"^  (\w+) ", out.split("Commands:")[1], re.M)
    assert listed == DESIGNED
    for name in DESIGNED:
        assert COMMANDS[name][1].split()[0] in out


@pytest.mark.parametrize("name", DESIGNED)
def test_every_command_help_exits_0(name, capsys):
    assert main([name, "--help"]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert f"Usage: bisect {name}" in out


def test_version(capsys):
    assert main(["--version"]) == 0
    assert __version__ in capsys.readouterr().out


def test_unknown_command_is_a_usage_error(capsys):
    assert main(["frobnicate"]) == 2
    assert capsys.readouterr().err == "error: no such command 'frobnicate' for bisect; see bisect --help\n"


def test_every_listed_command_is_built(capsys):
    for name in DESIGNED:  # no stubs: each listed command's module loads and has a command
        assert callable(importlib.import_module(COMMANDS[name][0]).command), name


def test_console_script_runs_and_imports_no_framework(tmp_path):
    r = subprocess.run([*_cmd(), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "compare" in r.stdout
    r = subprocess.run([*_cmd(), "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and __version__ in r.stdout
    probe = (
        "import sys\n"
        "from reprobisect.cli import main\n"
        "import reprobisect.core.compare, reprobisect.render, reprobisect.cli.commands.compare\n"
        "code = main(['compare', '--help'])\n"
        "heavy = sorted(m for m in ('torch', 'tensorflow', 'lightning', 'keras', 'ray', 'jax') if m in sys.modules)\n"
        "print('heavy:', heavy)\n"
        "sys.exit(code)\n"
    )
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "heavy: []" in r.stdout


def test_library_error_is_one_line_without_traceback(tmp_path):
    r = subprocess.run([*_cmd(), "compare", str(tmp_path / "a"), str(tmp_path / "b")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2
    assert r.stderr == f"error: no trace at '{tmp_path / 'a'}' (no such file or folder); check the path\n"


def test_global_debug_flag_is_documented_and_accepted(capsys):
    assert main(["--help"]) == 0
    assert "--debug" in capsys.readouterr().out
    assert main(["--debug", "compare", "--help"]) == 0
    assert "--trust-trace" in capsys.readouterr().out
