"""bisect audit: real probes of examples/audit/train.py (tiny torch), real git, real DVC, junitparser."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from reprobisect.core.options import ProbeOptions
from reprobisect.errors import UsageError
from reprobisect.render.audit import audit_json
from reprobisect.workflows.audit import load_audit_config, run_audit
from reprobisect.workflows.audit.reports import write_junit

TRAIN = Path(__file__).resolve().parents[1] / "examples" / "audit" / "train.py"
RESUME_TRAIN = Path(__file__).resolve().parents[1] / "examples" / "resume" / "train.py"
OPTS = ProbeOptions(jobs=2, quiet=True)

NIGHTLY = """
name: nightly
steps: 2
command: python train.py --steps 4
checks:
  - {name: det, check: repro}
  - {name: nondet, check: repro, env: {AUDIT_UNSEEDED: "1"}}
  - {name: gold, check: golden, golden: goldens/gold, noise_runs: 1}
  # noise 1e-5: the float32 loss moves by many ulps; at 1e-6 one repeat often left it
  # bit-identical at every step, and a band without the loss failed the next noisy run
  - {name: noisy, check: golden, golden: goldens/noisy, noise_runs: 2, env: {AUDIT_NOISE: "1e-5"}}
  - {name: lr, check: golden, golden: goldens/gold, env: {AUDIT_LR: "0.2"}}
  - {name: loud, check: golden, golden: goldens/noisy, env: {AUDIT_NOISE: "1e-1"}}
  - {name: tol, check: repro, env: {AUDIT_NOISE: "1e-7"}, tolerance: {atol: 1e-4, rtol: 0}}
  - {name: seeds, check: seeds, command: "python train.py --steps 4 --seed {seed}"}
  - {name: threads, check: envs, a: env.OMP_NUM_THREADS=1, b: env.OMP_NUM_THREADS=2}
  - {name: resumable, check: resume, command: "python resume_env.py --total 4 --ckpt ok.pt",
     steps: 4, at: 2, resume_args: "--resume ok.pt", env: {RESUME_ENV: "1"}}
  - {name: forgetful, check: resume, command: "python resume_train.py --total 4 --ckpt bug.pt --bug scheduler",
     steps: 4, at: 1, resume_args: [--resume, bug.pt]}
"""
"""Night 1, all checks, up to two at once (``jobs=2``): each check's env reaches only its
own probes (gold/lr/noisy/nondet run beside checks without their env)."""

CODE = """
name: code
repo: .
steps: 2
command: python train.py --steps 4
checks:
  - {name: gold, check: golden, golden: goldens/gold}
  - {name: lr, check: golden, golden: goldens/gold, env: {AUDIT_LR: "0.2"}}
"""
"""Three checks of the nightly one, run one after another (``jobs=1``) for two nights around
a planted commit: the second night's diverged golden is bisected by itself."""

SEQUENTIAL = ProbeOptions(jobs=1, quiet=True)


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def _repo(tmp: Path) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    shutil.copy(TRAIN, tmp / "train.py")
    shutil.copy(RESUME_TRAIN, tmp / "resume_train.py")
    (tmp / "resume_env.py").write_text(  # runs only with the check's env: it reaches all three runs
        "import os, runpy, sys\n"
        "if os.environ.get('RESUME_ENV') != '1':\n    sys.exit('RESUME_ENV is not set')\n"
        "runpy.run_path('resume_train.py', run_name='__main__')\n")
    _git(tmp, "init", "-q", "-b", "main")
    _git(tmp, "config", "user.email", "a@b.c")
    _git(tmp, "config", "user.name", "audit test")
    (tmp / ".gitignore").write_text(".bisect-audit/\n.bisect-audit.sqlite\n*.pt\n")
    _git(tmp, "add", "-A")
    _git(tmp, "commit", "-qm", "good")
    return tmp


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    d = _repo(tmp_path_factory.mktemp("nightly") / "repo")
    (d / "nightly.yaml").write_text(NIGHTLY)
    cfg = load_audit_config(d / "nightly.yaml")
    # the golden of 'noisy' is calibrated from 2 noisy runs; 'gold' from one (it is deterministic)
    up = run_audit(cfg, OPTS, update_golden=True)
    assert up and [c.name for c in up.checks] == ["gold", "noisy", "lr", "loud"], [c.line for c in up.checks]
    assert "shares the golden recorded by 'gold'" in up.checks[2].line
    res = run_audit(cfg, OPTS)
    (d / "code.yaml").write_text(CODE)
    code = load_audit_config(d / "code.yaml")
    seq = run_audit(code, SEQUENTIAL)  # code night 1: passes on the good commit
    original = (d / "train.py").read_text()
    (d / "train.py").write_text(original.replace('"AUDIT_LR", "0.1"', '"AUDIT_LR", "0.15"'))
    _git(d, "commit", "-qam", "planted: raise the learning rate")
    planted = _git(d, "rev-parse", "HEAD")
    (d / "notes.txt").write_text("docs\n")
    _git(d, "add", "notes.txt")
    _git(d, "commit", "-qm", "docs only")
    before = _git(d, "status", "--porcelain")
    second = run_audit(code, OPTS)  # code night 2, checks at once: diverged, bisected by itself
    after = (_git(d, "status", "--porcelain"), _git(d, "rev-parse", "HEAD"), _git(d, "worktree", "list"))
    (d / "train.py").write_text(original)  # the other tests run the good train.py
    return SimpleNamespace(d=d, res=res, doc=audit_json(res), seq=seq, second=second, planted=planted,
                           before=before, after=after)


def test_junit_fails_exactly_the_nondeterministic_check(night):
    from junitparser import Error, Failure, JUnitXml

    path = write_junit(night.doc, night.d / "audit.xml")
    xml = JUnitXml.fromfile(str(path))
    cases = {c.name: c for suite in xml for c in suite}
    assert list(cases) == ["det", "nondet", "gold", "noisy", "lr", "loud", "tol", "seeds", "threads",
                           "resumable", "forgetful"]  # config order, though checks ran two at once
    assert all(c.classname == "nightly" for c in cases.values())
    failing = {n for n, c in cases.items() if any(isinstance(r, Failure) for r in c.result)}
    assert failing == {"nondet", "lr", "loud", "forgetful"}, {c["name"]: c["line"] for c in night.doc["checks"]}
    errors = {n for n, c in cases.items() if any(isinstance(r, Error) for r in c.result)}
    assert not errors, {c["name"]: c["line"] for c in night.doc["checks"]}
    assert "first divergence at step 0" in cases["nondet"].result[0].message
    assert "learning rate / scheduler" in cases["forgetful"].result[0].message
    assert night.res.exit_code == 1


def test_environment_change_names_the_divergence(night):
    # 'lr' is the golden of 'gold' with AUDIT_LR changed by its env (and run beside checks without it)
    c = next(c for c in night.doc["checks"] if c["name"] == "lr")
    assert c["verdict"] == "diverged" and not c["passed"]
    assert c["first_divergence"]["step"] == 0 and c["first_divergence"]["stage"] == "param"
    assert "param '0.weight'" in c["line"]


def test_tiers_bitwise_and_within_noise(night):
    doc = night.doc
    v = {c["name"]: c["verdict"] for c in doc["checks"]}
    assert v["det"] == "bitwise" and v["gold"] == "bitwise"
    noisy = next(c for c in doc["checks"] if c["name"] == "noisy")
    assert noisy["verdict"] == "within-noise" and noisy["passed"], noisy["line"]
    assert noisy["noise"]["tensors"] > 0 and noisy["noise"]["runs"] == 2
    assert doc["kind"] == "audit" and doc["version"] == 1 and doc["verdict"] == "diverged" and doc["exit_code"] == 1


def test_tolerance_repro_is_within_noise(night):
    tol = next(c for c in night.doc["checks"] if c["name"] == "tol")
    assert tol["verdict"] == "within-noise" and tol["passed"], tol["line"]
    assert "agree within tolerance" in tol["line"] and "0.0001" in tol["line"]


def test_seeds_and_envs_checks(night):
    by = {c["name"]: c for c in night.doc["checks"]}
    seeds, threads = by["seeds"], by["threads"]
    assert seeds["verdict"] == "bitwise" and seeds["passed"], seeds["line"]
    assert "follows the seed" in seeds["line"] and "init" in seeds["line"]
    assert threads["verdict"] in ("bitwise", "within-noise") and threads["passed"], threads["line"]
    assert "env.OMP_NUM_THREADS=1 and env.OMP_NUM_THREADS=2" in threads["line"]


def test_parallel_checks_match_sequential_ones(night):
    # code.yaml's first night ran gold and lr one after another; the nightly
    # night ran the same checks (same env each) two at once, beside others
    seq = {c.name: c.verdict for c in night.seq.checks}
    par = {c.name: c.verdict for c in night.res.checks}
    assert seq == {"gold": "bitwise", "lr": "diverged"}
    assert seq == {n: par[n] for n in seq}


def test_change_larger_than_noise_diverges(night):
    from reprobisect.workflows.audit.golden import judge

    by = {c.name: c for c in night.res.checks}
    # 'loud' runs 10^4 times noisier than the band 'noisy' calibrated: diverged, never within-noise
    assert by["loud"].verdict == "diverged" and "outside the golden's noise band" in by["loud"].line, by["loud"].line
    assert judge(night.d / "goldens" / "noisy", by["loud"].traces["b"])[0] == "diverged"
    assert judge(night.d / "goldens" / "noisy", by["noisy"].traces["b"])[0] == "within-noise"


def test_resume_checks_name_the_forgotten_component(night):
    by = {c["name"]: c for c in night.doc["checks"]}
    ok, bug = by["resumable"], by["forgetful"]
    assert ok["verdict"] == "bitwise" and ok["passed"], ok["line"]
    assert "resumed after step 1" in ok["line"] and "steps 2..3" in ok["line"]
    # 'forgetful' leaves the scheduler out of its checkpoint: resumed after step 0, its StepLR decays a step late
    assert bug["verdict"] == "diverged" and not bug["passed"], bug["line"]
    assert bug["first_divergence"]["stage"] == "learning rate / scheduler" and bug["first_divergence"]["step"] >= 2
    # each run worked in its own copy of the config's folder (issue 36): nothing was left in it
    assert not (night.d / "ok.pt").exists() and not (night.d / "bug.pt").exists()
    assert set(bug["traces"]) == {"uninterrupted", "interrupted", "resumed"}  # never an a/b pair: steps do not align


def test_two_nights_history_and_auto_bisect_names_planted_commit(night):
    first, second = night.seq, night.second
    assert first.checks[0].verdict == "bitwise"
    c = second.checks[0]
    assert c.verdict == "diverged"
    assert c.culprit is not None and c.culprit.commit == night.planted, c.culprit
    assert second.checks[1].verdict == "diverged" and second.checks[1].culprit is None  # never passed: nothing to bisect
    doc = audit_json(second)
    assert doc["checks"][0]["culprit"]["commit"] == night.planted
    assert [n["verdict"] for n in doc["history"] if n["check"] == "gold"] == ["bitwise", "diverged"]
    assert doc["checks"][0]["history"] == {"last_pass": first.started, "failing_nights": 1, "nights": 2}
    status, head, worktrees = night.after
    assert status == night.before  # the user's checkout untouched
    assert head != night.planted and len(worktrees.splitlines()) == 1


@pytest.mark.parametrize("text, key", [
    ("checks: [{name: a, check: nope, command: x}]", "'check'"),
    ("checks: [{name: a, check: repro, command: x, colour: red}]", "'colour'"),
    ("checks: [{name: a, check: repro}]", "'command'"),
    ("checks: [{name: a, check: repro, command: x}, {name: a, check: repro, command: x}]", "'name'"),
    ("steps: three\nchecks: [{name: a, check: repro, command: x}]", "'steps'"),
    ("checks: [{name: a, check: golden, command: x}]", "'golden'"),
    ("checks: [{name: a, check: resume, command: x, steps: 4}]", "'resume_args'"),
    ("checks: [{name: a, check: resume, command: x, steps: 4, at: 4, resume_args: --resume c}]", "'at'"),
    ("checks: [{name: a, check: resume, command: x, steps: 1, resume_args: --resume c}]", "'steps'"),
    ("checks: [{name: a, check: resume, command: x, steps: 4, resume_args: ''}]", "'resume_args'"),
    ("checks: [{name: a, check: repro, command: x, at: 2}]", "'at'"),
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
                                     "checks:\n  - {name: r1, check: resume, steps: 2, resume_args: --resume c.pt}\n"
                                     "  - {name: r2, check: resume, steps: 2, resume_args: --resume c.pt}\n")
    r = subprocess.run([sys.executable, "-m", "reprobisect", "audit", str(tmp_path / "r.yaml"),
                        "--junit", str(tmp_path / "a.xml"), "--json", str(tmp_path / "a.json")],
                       capture_output=True, text=True)
    assert r.returncode == 1, r.stderr  # inconclusive is never a pass
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["kind"] == "audit" and [c["verdict"] for c in doc["checks"]] == ["inconclusive"] * 2
    assert doc["verdict"] == "inconclusive" and doc["exit_code"] == r.returncode
    cases = [c for s in JUnitXml.fromfile(str(tmp_path / "a.xml")) for c in s]
    assert [c.name for c in cases] == ["r1", "r2"] and all(isinstance(c.result[0], Error) for c in cases)
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temp files
    assert all((tmp_path / f).stat().st_mode & 0o044 == 0o044 for f in ("a.xml", "a.json"))  # readable by CI's uploader
    assert (tmp_path / ".bisect-audit.sqlite").is_file()


def test_html_report_of_the_night(night):
    from reprobisect.workflows.audit.reports import write_html

    out = write_html(night.doc, night.d / "audit.html")
    text = out.read_text()
    assert "nondet" in text and "diverged" in text


def test_shipped_example_config_is_valid():
    cfg = load_audit_config(Path(__file__).resolve().parents[1] / "configs" / "audit-example.yaml")
    assert [c.check for c in cfg.checks] == ["repro", "golden", "seeds", "envs"]
    assert all((cfg.folder / c.command[1]).resolve().is_file() for c in cfg.checks)  # commands run from its folder


@pytest.mark.slow
def test_ray_executor_started_once_for_the_night(night, monkeypatch):
    pytest.importorskip("ray")
    from reprobisect.executors import ray as ray_executor
    from reprobisect.executors.ray import RayConfig

    made = []
    real_init = ray_executor.RayExecutor.__init__

    def counted(self, *a, **kw):
        made.append(kw.get("address"))
        real_init(self, *a, **kw)

    monkeypatch.setattr(ray_executor.RayExecutor, "__init__", counted)
    (night.d / "ray.yaml").write_text("name: ray\nsteps: 2\ncommand: python train.py --steps 4\nchecks:\n"
                                      "  - {name: gold, check: golden, golden: goldens/gold}\n"
                                      "  - {name: lr, check: golden, golden: goldens/gold, env: {AUDIT_LR: '0.2'}}\n")
    opts = ProbeOptions(executor="ray", executor_config=RayConfig(), jobs=2, quiet=True)
    res = run_audit(load_audit_config(night.d / "ray.yaml"), opts)
    assert made == [None]  # one local Ray instance for both checks, not one per check
    assert [(c.name, c.verdict) for c in res.checks] == [("gold", "bitwise"), ("lr", "diverged")], \
        [c.line for c in res.checks]


def test_probe_env_travels_in_the_options_not_the_process(tmp_path, monkeypatch):
    from reprobisect.executors import Borrowed, executor_for
    from reprobisect.workflows.repro import spec_for

    monkeypatch.delenv("AUDIT_LR", raising=False)
    opts = ProbeOptions(env={"AUDIT_LR": "0.2", "A": "1"})
    spec = spec_for(["python", "train.py"], opts, key="k", workdir=tmp_path, env={"A": "2"})
    assert spec.env == {"AUDIT_LR": "0.2", "A": "2"}  # the spec's own env wins over the options'
    assert "AUDIT_LR" not in os.environ
    with pytest.raises(UsageError, match="probe env"):
        ProbeOptions(env={"A": 1})
    with executor_for(ProbeOptions(out=tmp_path / "out")) as ex:
        with executor_for(ProbeOptions(shared_executor=ex)) as lent:
            assert isinstance(lent, Borrowed) and lent.max_parallel == ex.max_parallel
        assert not ex._closed  # the borrower's close leaves the owner's executor open
    assert ex._closed


def test_executor_that_cannot_start_makes_every_check_inconclusive(tmp_path):
    pytest.importorskip("ray")
    from reprobisect.executors.ray import RayConfig

    (tmp_path / "a.yaml").write_text("name: down\ncommand: python train.py\n"
                                     "checks:\n  - {name: r1, check: repro}\n  - {name: g1, check: resume, steps: 2, resume_args: -r}\n")
    opts = ProbeOptions(executor="ray", executor_config=RayConfig(address="127.0.0.1:9"), quiet=True)
    res = run_audit(load_audit_config(tmp_path / "a.yaml"), opts)
    assert [c.verdict for c in res.checks] == ["inconclusive", "inconclusive"] and res.exit_code == 1
    assert all("ray executor could not start" in c.line for c in res.checks), [c.line for c in res.checks]
    assert [n.verdict for n in res.history] == ["inconclusive", "inconclusive"]  # the night is still kept
