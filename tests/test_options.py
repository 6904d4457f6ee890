"""The shared options (issue 11): one road from flags and config files to a ``Tolerance``,
executors registered by name with their own config, one exit-code table."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from reprobisect.cli import main
from reprobisect.cli.options import build_options, probe_options
from reprobisect.core.compare import Tolerance
from reprobisect.core.options import ProbeOptions
from reprobisect.core.session import cache_key
from reprobisect.errors import UsageError
from reprobisect.executors import EXECUTORS, executor_for, executor_kind
from reprobisect.executors.local import LocalExecutor
from reprobisect.executors.ray import RayConfig
from reprobisect.exitcodes import ExitCode

# --------------------------------------------------------------------------- one Tolerance


def test_from_flags_is_the_one_road_and_validates_once():
    assert Tolerance.from_flags() is None
    assert Tolerance.from_flags("default") == Tolerance(mode="default")
    assert Tolerance.from_flags(atol=1e-5) == Tolerance(mode="explicit", atol=1e-5)
    only = Tolerance.from_flags(overrides=["grad/*=1e-5,1e-4"])
    assert only.mode == "auto" and only.overrides == (("grad/*", (1e-5, 1e-4)),)
    assert only.resolved("bitwise").mode == "bitwise" and only.resolved("bitwise").overrides == only.overrides
    assert Tolerance.from_flags(overrides={"param/*": "bitwise"}).overrides == (("param/*", "bitwise"),)
    for kw, match in [({"tolerance": "loose"}, "unknown tolerance 'loose'"),
                      ({"tolerance": "default", "atol": 1.0}, "not both"),
                      ({"atol": float("nan")}, "--atol must be a finite number"),
                      ({"rtol": -1.0}, "--rtol must be >= 0"),
                      ({"overrides": ["grad/*"]}, "GLOB=ATOL,RTOL")]:
        with pytest.raises(UsageError, match=match):
            Tolerance.from_flags(**kw)


def test_override_from_flags_and_config_give_the_same_options(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("tolerance: default\noverrides:\n  grad/*: 1e-5,1e-4\n")
    from_file = build_options({}, cfg)
    from_flags = build_options({"tolerance": "default", "override": ("grad/*=1e-5,1e-4",)})
    assert from_file.tolerance == from_flags.tolerance == Tolerance(mode="default", overrides={"grad/*": (1e-5, 1e-4)})
    cfg.write_text("override: ['grad/*=1e-5,1e-4']\n")
    assert build_options({}, cfg).tolerance.overrides == from_flags.tolerance.overrides
    # a tolerance on the command line replaces the file's (flags win), never mixed into "not both"
    cfg.write_text("tolerance: default\n")
    assert build_options({"atol": 1e-3}, cfg).tolerance == Tolerance(mode="explicit", atol=1e-3)
    cfg.write_text("override: {'grad/*': tight}\n")
    with pytest.raises(UsageError, match="tolerance override 'grad/\\*'"):
        build_options({}, cfg)


def test_session_key_is_canonical_and_matches_the_old_form():
    """Keys of session logs written before (tolerance 'bitwise' or {'atol', 'rtol'}) still match."""
    bitwise = ProbeOptions().tolerance_for("bitwise")
    assert cache_key(tolerance=bitwise, steps=3) == cache_key(tolerance="bitwise", steps=3)
    explicit = build_options({"atol": 1e-5}).tolerance_for("bitwise")
    assert cache_key(tolerance=explicit) == cache_key(tolerance={"atol": 1e-5, "rtol": 0.0})
    a = build_options({"override": ("grad/*=1e-5,1e-4", "param/*=bitwise")}).tolerance_for("bitwise")
    b = Tolerance(mode="bitwise", overrides=[("grad/*", "1e-5, 1e-4"), ("param/*", "BITWISE")])
    assert cache_key(tolerance=a) == cache_key(tolerance=b) != cache_key(tolerance=bitwise)
    swapped = Tolerance(mode="bitwise", overrides=[("param/*", "bitwise"), ("grad/*", (1e-5, 1e-4))])
    assert cache_key(tolerance=swapped) != cache_key(tolerance=a)  # first match wins: order is part of it
    json.dumps(a.canonical())


_NOISY = textwrap.dedent(
    """
    import time, torch
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Linear(4, 1)
            self.noisy = torch.nn.Identity()
        def forward(self, x):
            # nondeterministic, but only in this discarded activation (a clock-seeded jitter)
            g = torch.Generator().manual_seed(time.time_ns() % 2**31)
            self.noisy(x + 1e-6 * torch.rand(1, generator=g))
            return self.body(x)
    torch.manual_seed(0)
    m = M()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        opt.zero_grad(); m(x).pow(2).mean().backward(); opt.step()
    """
)


@pytest.mark.slow
def test_override_changes_a_probing_commands_verdict_as_it_does_compares(tmp_path, monkeypatch, capsys):
    (tmp_path / "t.py").write_text(_NOISY)
    monkeypatch.chdir(tmp_path)
    cmd = ["--steps", "2", "--full-steps", "0,1", "-q", "--", sys.executable, "t.py"]  # tensors kept: measured
    rule = "activation/*noisy*=1e-3,0"
    # --no-confirm: the two runs only (the confirming re-runs would add their traces to out/)
    assert main(["repro", "--runs", "2", "--no-confirm", "-o", "out", *cmd]) == ExitCode.DIFFER
    assert "NOT deterministic" in capsys.readouterr().out
    assert main(["repro", "--runs", "2", "--override", rule, *cmd]) == ExitCode.OK
    assert "deterministic: 2 runs identical" in capsys.readouterr().out
    # (a config file's override gives the same options: test_override_from_flags_and_config_...)
    traces = sorted(p.parent for p in (tmp_path / "out").glob("*/manifest.json"))
    assert len(traces) == 2
    a, b = map(str, traces)
    assert main(["compare", a, b]) == ExitCode.DIFFER
    assert main(["compare", a, b, "--override", rule]) == ExitCode.OK


# --------------------------------------------------------------------------- executors


def test_executor_choices_and_flags_come_from_the_registry():
    @click.command()
    @probe_options
    def cmd(options):
        click.echo(repr(options.executor_config))

    r = CliRunner().invoke(cmd, ["--help"])
    assert "[" + "|".join(EXECUTORS) + "]" in r.output
    for kind in EXECUTORS.values():
        for flag in kind.flags:
            assert flag.flag in r.output
    r = CliRunner().invoke(cmd, ["--executor", "ray", "--address", "auto", "--placement", "spread"])
    assert r.exit_code == 0 and "RayConfig(address='auto'" in r.output and "placement='spread'" in r.output
    r = CliRunner().invoke(cmd, ["--executor", "k8s"])
    assert r.exit_code == 2 and "'k8s' is not one of" in r.output
    with pytest.raises(UsageError, match="unknown executor 'k8s'; use --executor local or --executor ray"):
        executor_kind("k8s")


def test_each_executor_gets_only_its_own_settings(tmp_path):
    """Ray's settings live in RayConfig; the local executor is never handed them."""
    opts = build_options({"ray.address": "auto", "ray.gpus_per_probe": 1.0, "jobs": 2})
    assert opts.executor == "local" and opts.executor_config is None
    with executor_for(opts) as ex:
        assert isinstance(ex, LocalExecutor) and ex.max_parallel == 2
    with pytest.raises(TypeError):
        LocalExecutor(address="auto")  # a foreign option is an error, not silently dropped
    assert RayConfig(gpus_per_probe=1).executor_kwargs(30.0) == {
        "address": None, "gpus_per_probe": 1, "cpus_per_probe": 1.0, "placement": None, "timeout": 30.0}
    with pytest.raises(UsageError, match="--gpus-per-probe must be a finite number"):
        build_options({"executor": "ray", "ray.gpus_per_probe": float("nan")})


# --------------------------------------------------------------------------- exit codes


def test_one_exit_code_table_and_probe_codes_abort_git_bisect():
    signal_codes = {128 + s.value for s in signal.Signals}
    assert ExitCode.PROBE_INTERNAL not in signal_codes  # 129 was SIGHUP's
    for code in (ExitCode.PROBE_USAGE, ExitCode.PROBE_INTERNAL):
        assert 128 <= code <= 255 and code != ExitCode.SKIP  # git bisect run aborts on these
    assert (ExitCode.HANGUP, ExitCode.INTERRUPTED, ExitCode.TERMINATED) == (
        128 + signal.SIGHUP, 128 + signal.SIGINT, 128 + signal.SIGTERM)
    assert len(set(ExitCode)) == len(list(ExitCode))


def test_the_docs_document_every_exit_code():
    usage = (Path(__file__).resolve().parents[1] / "docs" / "usage.md").read_text()
    section = usage.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    for code in ExitCode:
        assert f"`{int(code)}`" in section, code


def test_commands_return_their_code_and_no_command_exits_itself():
    root = Path(__file__).resolve().parents[1] / "reprobisect"
    for path in (root / "cli" / "commands").glob("*.py"):
        text = path.read_text()
        assert "click.exceptions.Exit" not in text and "sys.exit" not in text, path.name


def test_no_module_outside_the_cli_imports_click():
    root = Path(__file__).resolve().parents[1] / "reprobisect"
    r = subprocess.run(["grep", "-rlE", r"^\s*(import click|from click)", str(root), "--include=*.py"],
                       capture_output=True, text=True)
    offenders = [p for p in r.stdout.split() if "/reprobisect/cli/" not in p]
    assert offenders == []


def test_the_other_tables_agree_with_the_one_table():
    """Until probe.py, outcome.py and capture.py read ``reprobisect.exitcodes`` themselves
    (issue 11, the "probe" part), their codes must be the table's."""
    from reprobisect.core.outcome import LAUNCH_EXIT
    from reprobisect.core.verdict import Verdict
    from reprobisect.exitcodes import LaunchExit
    from reprobisect.workflows.capture import EXIT_CODES

    assert {k: int(v) for k, v in LAUNCH_EXIT.items()} == {m.name.lower(): int(m) for m in LaunchExit}
    assert {v: Verdict(v, "r").exit_code for v in ("good", "bad", "skip")} == {
        "good": ExitCode.OK, "bad": ExitCode.DIFFER, "skip": ExitCode.SKIP}
    assert set(EXIT_CODES.values()) <= {ExitCode.OK, ExitCode.DIFFER, ExitCode.SKIP}
