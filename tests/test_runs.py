"""``bisect runs`` end to end: generated git histories, real torch probes on CPU, real worktrees.

Every repository comes from ``reprobisect.workflows.demo.build_demo_repo`` (a small MLP project
whose commits are known: which one changes numerics, which do not import). Probes cost
~2-3 s each (mostly ``import torch``), so the histories are short.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reprobisect.workflows.demo import build_demo_repo
from reprobisect.errors import ProbeError, UsageError
from reprobisect.core.options import ProbeOptions
from reprobisect.workflows.runs import RunsConfig, RunsResult, find_first_bad
from reprobisect.core.session import SessionLog

pytestmark = pytest.mark.torch

BISECT = [sys.executable, "-m", "reprobisect"]
CMD = ("python", "train.py", "--steps", "20", "--seed", "0")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout


def _dirty(repo: Path, sub: str = ".") -> dict:
    """Give the user's checkout an untracked file, a staged change and a stash; return a snapshot."""
    proj = repo / sub
    (repo / "notes.txt").write_text("my untracked notes\n")
    (proj / "README.md").write_text((proj / "README.md").read_text() + "\nlocal edit, stashed\n")
    _git(repo, "stash", "push", "-q", "-m", "user stash")
    (proj / "README.md").write_text((proj / "README.md").read_text() + "\nstaged edit\n")
    _git(repo, "add", "-A", str(proj / "README.md"))
    (proj / "model.py").write_text((proj / "model.py").read_text() + "\n# unstaged edit\n")
    return _snapshot(repo)


def _snapshot(repo: Path) -> dict:
    return {
        "head": _git(repo, "rev-parse", "HEAD"),
        "branch": _git(repo, "symbolic-ref", "-q", "HEAD"),
        "status": _git(repo, "status", "--porcelain", "--untracked-files=all", "--ignored"),
        "stash": _git(repo, "stash", "list"),
        "index": _git(repo, "diff", "--cached"),
        "worktree": _git(repo, "diff"),
        "notes": (repo / "notes.txt").read_text(),
        "worktrees": _git(repo, "worktree", "list", "--porcelain").count("worktree "),
    }


def _cwds_under(root: Path) -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if str(Path(os.readlink(proc / "cwd"))).startswith(str(root)):
                    out.append(int(proc.name))
            except OSError:
                continue
    return out


def _config(repo, *, sub: str = ".", **kw) -> RunsConfig:
    opts = kw.pop("options", ProbeOptions(jobs=2, quiet=True))
    return RunsConfig(repo=None, cwd=str(repo.path / sub), good=kw.pop("good", repo.good),
                      bad=kw.pop("bad", repo.bad), command=CMD, options=opts, **kw)


# --------------------------------------------------------------------------- bad input (no probes)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return build_demo_repo(tmp_path_factory.mktemp("small") / "repo", n_commits=4, culprit_at=2, broken_at=None)


def test_bad_input_is_one_clear_error(small, tmp_path):
    with pytest.raises(UsageError, match="unknown revision 'nope'"):
        find_first_bad(_config(small, good="nope"))
    with pytest.raises(UsageError, match="same commit"):
        find_first_bad(_config(small, good=small.bad))
    with pytest.raises(UsageError, match="not an ancestor.*swap"):
        find_first_bad(_config(small, good=small.bad, bad=small.good))
    with pytest.raises(UsageError, match="not a git repository"):
        find_first_bad(RunsConfig(cwd=str(tmp_path), good="a", bad="b", command=CMD))
    with pytest.raises(UsageError, match="training command after --"):
        find_first_bad(RunsConfig(repo=str(small.path), good=small.good, bad=small.bad, command=()))
    with pytest.raises(UsageError, match="--repeat"):
        find_first_bad(_config(small, repeat=0))
    assert not (small.path / ".git" / "reprobisect" / "sessions").exists() or not list(
        (small.path / ".git" / "reprobisect" / "sessions").iterdir()
    )


def test_cli_bad_input_exit_2_one_line(small, tmp_path):
    cases = [
        (["runs", "--good", "nope", "--bad", "HEAD", "--", *CMD], small.path, "unknown revision 'nope'"),
        (["runs", "--good", "HEAD", "--bad", "HEAD", "--", *CMD], small.path, "same commit"),
        (["runs", "--good", "HEAD~1", "--bad", "HEAD"], small.path, "training command after --"),
        (["runs", "--good", "a", "--bad", "b", "--", *CMD], tmp_path, "not a git repository"),
        (["runs", "--good", "HEAD~1", "--bad", "HEAD", "--terms", "x", "--", *CMD], small.path, "--terms"),
    ]
    for args, cwd, msg in cases:
        r = subprocess.run([*BISECT, *args], cwd=cwd, capture_output=True, text=True)
        assert r.returncode == 2, (args, r.stderr)
        assert msg in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_second_session_on_the_same_repository_is_refused(small):
    from reprobisect.vcs.git import session_lock

    log_dir = small.path / ".git" / "reprobisect" / "sessions"
    with session_lock(small.path):
        with pytest.raises(UsageError, match="another reprobisect session holds the lock"):
            find_first_bad(_config(small))
    assert not log_dir.exists() or not list(log_dir.iterdir())  # the holder's log is never replaced


def test_help_smoke():
    for name in ("runs", "demo"):
        r = subprocess.run([*BISECT, name, "--help"], capture_output=True, text=True)
        assert r.returncode == 0 and "--json" in r.stdout


# --------------------------------------------------------------------------- linear history


@pytest.fixture(scope="module")
def linear(tmp_path_factory):
    """8 commits, the numerics change at 5, a broken import at 2 (fixed at 3); the project
    lives in a subfolder and bisect runs from it (CMD must run from the same folder)."""
    repo = build_demo_repo(tmp_path_factory.mktemp("linear") / "repo", n_commits=8, culprit_at=5, broken_at=2, subdir="proj")
    before = _dirty(repo.path, "proj")
    result = find_first_bad(_config(repo, sub="proj"))
    return repo, before, result


def test_linear_names_culprit_and_first_divergence(linear):
    repo, _, r = linear
    assert isinstance(r, RunsResult) and r
    assert r.first_bad.hash == repo.culprit
    assert r.first_bad.subject.startswith("model: hoist the LayerNorm eps")
    assert "model.py" in r.first_bad.diffstat and r.first_bad.author and r.first_bad.date
    assert r.last_good.hash == repo.commits[repo.commits.index(repo.culprit) - 1]
    first = r.divergence["first"]
    assert (first["step"], first["kind"], first["name"], first["module"]) == (0, "activation", "net.1", "LayerNorm")
    assert first["origin"] is True
    # the re-check kept full tensors at that step: real magnitudes, not stats
    assert first["diff"]["max_abs"] and float(first["diff"]["max_abs"]) > 0
    assert r.recheck == "agreed"
    assert r.probes <= 3 + 2  # ceil(log2 8) + the skipped commit and slack
    assert r.runs >= r.probes + 2 + 2  # endpoints and re-checks ran too
    assert all(c != repo.culprit for c, _ in r.skipped)
    text = str(r)
    assert repo.culprit in text and "net.1 (LayerNorm)" in text and "re-check agreed" in text
    data = json.loads(json.dumps(r.to_json()))
    assert data["found"] and data["first_bad"]["hash"] == repo.culprit


def test_linear_leaves_user_checkout_untouched(linear):
    repo, before, _ = linear
    assert _snapshot(repo.path) == before


def test_linear_session_log_is_consistent(linear):
    repo, _, r = linear
    log = SessionLog.load(r.session_log)
    roles = [e.role for e in log]
    assert roles[:2] == ["endpoint", "endpoint"] and roles.count("recheck") == 2
    assert len(log.search_events()) == r.probes
    assert log.header["good"] == repo.good and log.header["command"] == list(CMD)


def test_second_run_is_served_from_cache(linear):
    repo, before, r1 = linear
    r2 = find_first_bad(_config(repo, sub="proj", recheck=False))
    assert r2.first_bad.hash == r1.first_bad.hash
    assert r2.runs == 0 and r2.cached >= r2.probes + 2
    assert _snapshot(repo.path) == before


@pytest.mark.slow
def test_resume_after_interrupt_gives_same_answer_with_fewer_probes(linear, tmp_path):
    repo, before, full = linear
    cache = tmp_path / "cache"
    seen = []

    def interrupt(ev):
        seen.append(ev)
        if ev.role == "search":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        find_first_bad(_config(repo, sub="proj", cache_dir=str(cache), recheck=False), on_event=interrupt)
    assert _snapshot(repo.path) == before
    log_path = next((cache / "sessions").iterdir())
    assert [e.role for e in SessionLog.load(log_path)] == ["endpoint", "endpoint", "search"]
    resumed = find_first_bad(_config(repo, sub="proj", cache_dir=str(cache), resume=True, recheck=False))
    assert resumed.first_bad.hash == full.first_bad.hash == repo.culprit
    assert resumed.resumed and resumed.cached >= 3
    # rounds count the replayed ones too (a resumed session never reports "0 rounds")
    assert resumed.replayed == 1 and resumed.rounds >= 1
    assert f"{resumed.rounds} rounds (resumed: 1 replayed from the session log)" in str(resumed)
    assert resumed.runs < full.runs - 2  # the full search's runs less its two re-checks
    # the log continues: the interrupted session's verdict is replayed, not re-probed
    events = SessionLog.load(log_path).search_events()
    assert events[0] == (seen[-1].point, seen[-1].verdict) and len(events) == resumed.probes
    assert _snapshot(repo.path) == before


def test_resume_without_a_session_is_one_line(small, tmp_path):
    with pytest.raises(UsageError, match="nothing to resume"):
        find_first_bad(_config(small, cache_dir=str(tmp_path / "c"), resume=True))


# --------------------------------------------------------------------------- merges, skips, crashes


@pytest.mark.slow
def test_culprit_on_a_side_branch(tmp_path):
    repo = build_demo_repo(tmp_path / "repo", n_commits=6, culprit_at=3, broken_at=None, culprit_on_branch=True)
    assert len(_git(repo.path, "rev-list", "--merges", "HEAD").split()) == 1
    r = find_first_bad(_config(repo, recheck=False))
    assert r and r.first_bad.hash == repo.culprit
    assert repo.culprit in repo.branch_commits
    assert r.divergence["first"]["name"] == "net.1"


def test_unbuildable_commit_next_to_culprit_gives_candidates(tmp_path):
    repo = build_demo_repo(tmp_path / "repo", n_commits=5, culprit_at=3, broken_at=2)
    assert repo.broken == (repo.commits[2],)
    before = _dirty(repo.path)
    r = find_first_bad(_config(repo))
    assert not r and r.first_bad is None
    assert {c.hash for c in r.candidates} == {repo.broken[0], repo.culprit}
    assert dict(r.skipped)[repo.broken[0]].startswith("probe could not test: skip")
    assert "could be any of" in str(r)
    assert _snapshot(repo.path) == before
    out = subprocess.run([*BISECT, "runs", "--good", repo.good, "--bad", repo.bad, "-q", "--json", "--", *CMD],
                         cwd=repo.path, capture_output=True, text=True)
    assert out.returncode == 1, out.stderr
    assert {c["hash"] for c in json.loads(out.stdout)["candidates"]} == {repo.broken[0], repo.culprit}


@pytest.mark.slow
def test_crash_with_check_finite(tmp_path):
    repo = build_demo_repo(tmp_path / "repo", n_commits=4, culprit_at=2, broken_at=None, culprit_kind="crash")
    r = find_first_bad(_config(repo, check="finite", recheck=False))
    assert r and r.first_bad.hash == repo.culprit
    assert "crashed" in r.reason and "step" in r.reason


def test_endpoint_refusal_names_the_flag_and_leaves_tree_untouched(tmp_path):
    repo = build_demo_repo(tmp_path / "repo", n_commits=3, culprit_at=99, broken_at=2, broken_fixed=False)
    assert repo.broken == repo.commits[2:]
    before = _dirty(repo.path)
    with pytest.raises(ProbeError, match=r"--bad .* does not probe bad: it could not be tested"):
        find_first_bad(_config(repo, options=ProbeOptions(jobs=1, quiet=True)))
    assert _snapshot(repo.path) == before
    r = subprocess.run([*BISECT, "runs", "--good", repo.broken[0], "--bad", repo.bad, "--", *CMD],
                       cwd=repo.path, capture_output=True, text=True)
    assert r.returncode == 2 and "--good" in r.stderr and "does not probe good" in r.stderr
    # without a terminal the progress comes as plain lines ("bisect runs (match): ..."); the error is one line
    said = [ln for ln in r.stderr.strip().splitlines() if not ln.startswith("bisect runs (")]
    assert len(said) == 1 and said[0].startswith("error: "), r.stderr
    assert _snapshot(repo.path) == before


# --------------------------------------------------------------------------- Ctrl-C on the real CLI


@pytest.mark.slow
def test_sigint_leaves_log_consistent_and_checkout_untouched(tmp_path):
    repo = build_demo_repo(tmp_path / "repo", n_commits=8, culprit_at=5, broken_at=None)
    before = _dirty(repo.path)
    sessions = repo.path / ".git" / "reprobisect" / "sessions"
    p = subprocess.Popen([*BISECT, "runs", "--good", repo.good, "--bad", repo.bad, "-q", "--", *CMD],
                         cwd=repo.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        logs = list(sessions.glob("*.jsonl")) if sessions.is_dir() else []
        if logs and len(logs[0].read_text().splitlines()) >= 3:  # header + both endpoints: a search probe runs
            break
        time.sleep(0.2)
    else:
        p.kill()
        pytest.fail("bisect runs never reached the search")
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert ("interrupted" in err or "aborted" in err) and "Traceback" not in err
    log = SessionLog.load(logs[0])
    assert [e.role for e in log][:2] == ["endpoint", "endpoint"]
    assert _snapshot(repo.path) == before  # includes: no worktree left registered
    # no probe process survives the interrupt (none runs inside this repository's worktrees)
    assert not [pid for pid in _cwds_under(repo.path)], "a probe survived Ctrl-C"
    # resuming from this log is covered by test_resume_after_interrupt_gives_same_answer_with_fewer_probes


# --------------------------------------------------------------------------- agrees with git bisect run


@pytest.mark.slow
def test_agrees_with_git_bisect_run_bisect_probe(linear, tmp_path):
    repo, _, r = linear
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo.path), str(clone)], check=True)
    ref = tmp_path / "ref"
    _git(clone, "checkout", "-q", repo.good)
    cap = subprocess.run([*BISECT, "capture", "-o", str(ref), "--", *CMD], cwd=clone / "proj", capture_output=True, text=True)
    assert cap.returncode == 0, cap.stderr
    _git(clone, "checkout", "-q", repo.bad)
    _git(clone, "bisect", "start", repo.bad, repo.good)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    probe = shlex.join([*BISECT, "probe", "--reference", str(ref), "-q", "--", *CMD])
    # git bisect run runs from the top of the tree; the command runs from the project folder
    run = subprocess.run(["git", "bisect", "run", "sh", "-c", f"cd proj && exec {probe}"],
                         cwd=clone, capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{repo.culprit} is the first bad commit" in run.stdout
    assert r.first_bad.hash == repo.culprit
    _git(clone, "bisect", "reset")


# --------------------------------------------------------------------------- --repeat: flaky commits are skipped


FLAKY_TRAIN = """import os
import torch

SCALE = {scale}
seed = 0
if {flaky}:  # this revision seeds from a counter: every other run differs
    # runs of one commit may run in parallel: take a ticket atomically (O_EXCL), not read-then-write
    n = 0
    while True:
        try:
            os.close(os.open(os.environ["FLAKY_COUNTER"] + "." + str(n), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            break
        except FileExistsError:
            n += 1
    seed = n % 2
torch.manual_seed(seed)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
with torch.no_grad():
    model[0].weight.mul_(SCALE)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
for _ in range(5):
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
"""


@pytest.mark.slow
def test_repeat_turns_a_flaky_commit_into_a_skip(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    commits = []
    for i, (scale, flaky) in enumerate([("1.0", False), ("1.0", False), ("1.0", True), ("1.5", False), ("1.5", False)]):
        (root / "train.py").write_text(FLAKY_TRAIN.format(scale=scale, flaky=flaky))
        (root / "notes.txt").write_text(f"{i}\n")
        _git(root, "add", "-A")
        _git(root, "commit", "-q", "-m", f"commit {i}")
        commits.append(_git(root, "rev-parse", "HEAD").strip())
    cfg = RunsConfig(cwd=str(root), good=commits[0], bad=commits[-1], command=("python", "train.py"), repeat=2,
                     env={"FLAKY_COUNTER": str(tmp_path / "counter")}, options=ProbeOptions(jobs=2, quiet=True))
    r = find_first_bad(cfg)
    skipped = dict(r.skipped)
    assert skipped.get(commits[2], "").startswith("flaky: bad 1, good 1 of 2 runs"), r.skipped
    assert {c.hash for c in r.candidates} == {commits[2], commits[3]}
    assert r.runs >= 2 * (2 + r.probes)  # every judgement ran twice


# --------------------------------------------------------------------------- terms: hunting the commit that fixed it


@pytest.mark.slow
def test_terms_find_the_commit_that_fixed_nonfinite_training(tmp_path):
    repo = build_demo_repo(tmp_path / "repo", n_commits=3, culprit_at=1, broken_at=None, culprit_kind="nan")
    root = repo.path
    train = root / "train.py"
    train.write_text(train.read_text().replace("LABEL_SMOOTHING = 1.0", "LABEL_SMOOTHING = 0.1"))
    _git(root, "commit", "-q", "-am", "train: sane label smoothing")
    fix = _git(root, "rev-parse", "HEAD").strip()
    (root / "README.md").write_text((root / "README.md").read_text() + "\nfixed NaN loss\n")
    _git(root, "commit", "-q", "-am", "docs: note the fix")
    cfg = RunsConfig(cwd=str(root), good=repo.culprit, bad="HEAD", command=CMD, check="finite",
                     terms=("broken", "fixed"), options=ProbeOptions(jobs=2, quiet=True))
    r = find_first_bad(cfg)
    assert r and r.first_bad.hash == fix
    assert r.recheck == "agreed"
    assert "first fixed commit" in str(r)
    # with the default terms the same endpoints are refused: --good does not probe good
    with pytest.raises(ProbeError, match="does not probe good"):
        find_first_bad(RunsConfig(cwd=str(root), good=repo.culprit, bad="HEAD", command=CMD, check="finite",
                                  options=ProbeOptions(jobs=2, quiet=True)))
