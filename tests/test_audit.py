"""bisect audit: real probes of examples/audit/train.py (tiny torch), real git, real DVC, junitparser."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reprobisect.core.options import ProbeOptions
from reprobisect.errors import UsageError
from reprobisect.render.audit import audit_json
from reprobisect.workflows.audit import load_audit_config, run_audit
from reprobisect.workflows.audit.reports import write_junit

TRAIN = Path(__file__).resolve().parents[1] / "examples" / "audit" / "train.py"
OPTS = ProbeOptions(jobs=2, quiet=True)

NIGHTLY = """
name: nightly
steps: 2
command: python train.py --steps 4
checks:
  - {name: det, check: repro}
  - {name: nondet, check: repro, env: {AUDIT_UNSEEDED: "1"}}
  - {name: gold, check: golden, golden: goldens/gold, noise_runs: 1}
  - {name: noisy, check: golden, golden: goldens/noisy, env: {AUDIT_NOISE: "1e-6"}}
"""


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def _repo(tmp: Path) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    shutil.copy(TRAIN, tmp / "train.py")
    _git(tmp, "init", "-q", "-b", "main")
    _git(tmp, "config", "user.email", "a@b.c")
    _git(tmp, "config", "user.name", "audit test")
    (tmp / ".gitignore").write_text(".bisect-audit/\n.bisect-audit.sqlite\n")
    _git(tmp, "add", "-A")
    _git(tmp, "commit", "-qm", "good")
    return tmp


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    d = tmp_path_factory.mktemp("nightly")
    shutil.copy(TRAIN, d / "train.py")
    (d / "nightly.yaml").write_text(NIGHTLY)
    cfg = load_audit_config(d / "nightly.yaml")
    # the golden of 'noisy' is calibrated from 3 noisy runs; 'gold' from one (it is deterministic)
    up = run_audit(cfg, OPTS, update_golden=True)
    assert up and [c.name for c in up.checks] == ["gold", "noisy"]
    res = run_audit(cfg, OPTS)
    # the same golden checked after an environment change (its own config: its own history)
    (d / "changed.yaml").write_text("steps: 2\ncommand: python train.py --steps 4\nchecks:\n"
                                    "  - {name: gold, check: golden, golden: goldens/gold, env: {AUDIT_LR: '0.2'}}\n"
                                    "  - {name: resumable, check: resume}\n")
    changed = run_audit(load_audit_config(d / "changed.yaml"), OPTS)
    return d, res, audit_json(res), audit_json(changed)


def test_junit_fails_exactly_the_nondeterministic_check(night):
    from junitparser import Error, Failure, JUnitXml

    d, res, doc, _ = night
    path = write_junit(doc, d / "audit.xml")
    xml = JUnitXml.fromfile(str(path))
    cases = {c.name: c for suite in xml for c in suite}
    assert set(cases) == {"det", "nondet", "gold", "noisy"}
    assert all(c.classname == "nightly" for c in cases.values())
    failing = {n for n, c in cases.items() if any(isinstance(r, Failure) for r in c.result)}
    assert failing == {"nondet"}
    assert not any(isinstance(r, Error) for c in cases.values() for r in c.result)
    assert "first divergence at step 0" in cases["nondet"].result[0].message
    assert res.exit_code == 1


def test_environment_change_names_the_divergence(night):
    from junitparser import Error, Failure, JUnitXml

    d, _, _, doc = night
    assert doc["exit_code"] == 1 and doc["name"] == "changed"
    c = doc["checks"][0]
    assert c["verdict"] == "diverged" and not c["passed"]
    assert c["first_divergence"]["step"] == 0 and c["first_divergence"]["stage"] == "param"
    assert "param '0.weight'" in c["line"]
    r = doc["checks"][1]  # no bisect resume here: inconclusive, never a pass
    assert r["verdict"] == "inconclusive" and "needs bisect resume" in r["line"]
    cases = {c.name: c for suite in JUnitXml.fromfile(str(write_junit(doc, d / "changed.xml"))) for c in suite}
    assert isinstance(cases["gold"].result[0], Failure) and "param '0.weight'" in cases["gold"].result[0].message
    assert isinstance(cases["resumable"].result[0], Error)


def test_tiers_bitwise_and_within_noise(night):
    _, _, doc, _ = night
    v = {c["name"]: c["verdict"] for c in doc["checks"]}
    assert v["det"] == "bitwise" and v["gold"] == "bitwise"
    noisy = next(c for c in doc["checks"] if c["name"] == "noisy")
    assert noisy["verdict"] == "within-noise" and noisy["passed"], noisy["line"]
    assert noisy["noise"]["tensors"] > 0 and noisy["noise"]["runs"] == 3
    assert doc["kind"] == "reprobisect.audit" and doc["version"] == 1


def test_change_larger_than_noise_diverges(night):
    from reprobisect.workflows.audit.golden import judge

    d, res, _, _ = night
    # a run 10^4 times noisier than the calibrated band: diverged, never within-noise
    trace = next(c for c in res.checks if c.name == "noisy").traces["b"]
    big = d / "big"
    env = {**os.environ, "AUDIT_NOISE": "1e-2"}
    subprocess.run([sys.executable, "-m", "reprobisect", "capture", "-q", "-o", str(big), "--steps", "2",
                    "--full-steps", "0,1,2", "--", "python", "train.py", "--steps", "4"], cwd=d, env=env, check=True,
                   capture_output=True)
    tier, _, _ = judge(d / "goldens" / "noisy", str(big))
    assert tier == "diverged"
    assert judge(d / "goldens" / "noisy", trace)[0] == "within-noise"


@pytest.mark.parametrize("text, key", [
    ("checks: [{name: a, check: nope, command: x}]", "'check'"),
    ("checks: [{name: a, check: repro, command: x, colour: red}]", "'colour'"),
    ("checks: [{name: a, check: repro}]", "'command'"),
    ("checks: [{name: a, check: repro, command: x}, {name: a, check: repro, command: x}]", "'name'"),
    ("steps: three\nchecks: [{name: a, check: repro, command: x}]", "'steps'"),
    ("checks: [{name: a, check: golden, command: x}]", "'golden'"),
])
def test_bad_config_is_one_line(tmp_path, text, key):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(UsageError, match=key):
        load_audit_config(p)


def test_bad_config_cli_exit_2(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("checks: [{name: a, check: nope, command: x}]")
    r = subprocess.run([sys.executable, "-m", "reprobisect", "audit", str(p)], capture_output=True, text=True)
    assert r.returncode == 2
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and "'check'" in lines[0] and "repro" in lines[0], lines
    assert not (tmp_path / ".bisect-audit.sqlite").exists()


@pytest.mark.slow
def test_two_nights_history_and_auto_bisect_names_planted_commit(tmp_path):
    repo = _repo(tmp_path / "repo")
    (repo / "audit.yaml").write_text("name: code\nrepo: .\nsteps: 2\ncommand: python train.py --steps 4\n"
                                     "checks:\n  - {name: gold, check: golden, golden: goldens/gold, noise_runs: 1}\n")
    cfg = load_audit_config(repo / "audit.yaml")
    assert run_audit(cfg, OPTS, update_golden=True)
    first = run_audit(cfg, OPTS)
    assert first and first.checks[0].verdict == "bitwise"
    src = (repo / "train.py").read_text().replace('"AUDIT_LR", "0.1"', '"AUDIT_LR", "0.15"')
    (repo / "train.py").write_text(src)
    _git(repo, "commit", "-qam", "planted: raise the learning rate")
    planted = _git(repo, "rev-parse", "HEAD")
    (repo / "notes.txt").write_text("docs\n")
    _git(repo, "add", "notes.txt")
    _git(repo, "commit", "-qm", "docs only")
    before = _git(repo, "status", "--porcelain")
    second = run_audit(cfg, OPTS)
    c = second.checks[0]
    assert c.verdict == "diverged"
    assert c.culprit is not None and c.culprit.commit == planted, c.culprit
    doc = audit_json(second)
    assert doc["checks"][0]["culprit"]["commit"] == planted
    assert [n["verdict"] for n in doc["history"]] == ["bitwise", "diverged"]
    assert doc["checks"][0]["history"] == {"last_pass": first.started, "failing_nights": 1, "nights": 2}
    assert _git(repo, "status", "--porcelain") == before  # the user's checkout untouched
    assert _git(repo, "rev-parse", "HEAD") != planted and len(_git(repo, "worktree", "list").splitlines()) == 1


@pytest.mark.slow
def test_golden_remote_round_trip_with_dvc(tmp_path):
    repo = _repo(tmp_path / "repo")
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=repo, check=True, env=env)
    remote = tmp_path / "remote"
    (repo / "audit.yaml").write_text(f"name: dvc\nrepo: .\ngolden_remote: {remote}\nsteps: 1\n"
                                     "command: python train.py --steps 2\n"
                                     "checks:\n  - {name: gold, check: golden, golden: goldens/gold, noise_runs: 1}\n")
    cfg = load_audit_config(repo / "audit.yaml")
    assert run_audit(cfg, OPTS, update_golden=True)
    assert (repo / "goldens" / "gold.dvc").is_file() and any(remote.rglob("*"))
    shutil.rmtree(repo / "goldens" / "gold")
    shutil.rmtree(repo / ".dvc" / "cache")
    res = run_audit(cfg, OPTS)  # pulls the golden from the remote first
    assert res.checks[0].verdict == "bitwise", res.checks[0].line
    assert json.loads((repo / "goldens" / "gold" / "noise.json").read_text())["runs"] == 1


def test_cli_writes_junit_and_json_one_case_per_check(tmp_path):
    from junitparser import Error, JUnitXml

    (tmp_path / "r.yaml").write_text("name: cli\ncommand: python train.py\n"
                                     "checks:\n  - {name: r1, check: resume}\n  - {name: r2, check: resume}\n")
    r = subprocess.run([sys.executable, "-m", "reprobisect", "audit", str(tmp_path / "r.yaml"),
                        "--junit", str(tmp_path / "a.xml"), "--json", str(tmp_path / "a.json")],
                       capture_output=True, text=True)
    assert r.returncode == 1, r.stderr  # inconclusive is never a pass
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["kind"] == "reprobisect.audit" and [c["verdict"] for c in doc["checks"]] == ["inconclusive"] * 2
    cases = [c for s in JUnitXml.fromfile(str(tmp_path / "a.xml")) for c in s]
    assert [c.name for c in cases] == ["r1", "r2"] and all(isinstance(c.result[0], Error) for c in cases)
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temp files
    assert (tmp_path / ".bisect-audit.sqlite").is_file()


def test_html_report_of_the_night(night):
    from reprobisect.workflows.audit.reports import write_html

    d, _, doc, _ = night
    out = write_html(doc, d / "audit.html")
    text = out.read_text()
    assert "nondet" in text and "diverged" in text


def test_shipped_example_config_is_valid():
    cfg = load_audit_config(Path(__file__).resolve().parents[1] / "configs" / "audit-example.yaml")
    assert [c.check for c in cfg.checks] == ["repro", "golden", "seeds", "envs"]
    assert all((cfg.folder / c.command[1]).resolve().is_file() for c in cfg.checks)  # commands run from its folder
