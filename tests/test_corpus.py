"""The peer corpus (examples/corpus/) through the real commands: capture, repro, compare, runs.

The tool was right on its own examples and wrong on public-style training code. Each
script in examples/corpus/ imitates one public style (nanoGPT, minGPT, word_language_model,
Lightning, an ignored-data project, an unseeded loop); these tests run each one the way a
user would (``python -m reprobisect ...`` subprocesses, ``--json`` where offered) and assert
what a careful user expects:

- ``capture`` ends ``ok`` with a complete trace and the expected number of training steps,
  and evaluation (estimate_loss, eval callbacks, Lightning's sanity check, validation and
  test) is not mixed into the training steps;
- ``repro`` agrees for every seeded script (each is bitwise deterministic on CPU when run
  as plain python: see test_scripts_are_deterministic_as_plain_python);
- two captures that differ only in evaluation settings agree; two that differ in a training
  hyperparameter (lr, seed) diverge at step 0 where that change first acts;
- ``runs --link data`` finds the commit that changed training in a project whose data git
  ignores, and without ``--link`` the error names the missing path and the flag;
- an unseeded script diverges at step 0 and the answer says no seed was set, without
  blaming PYTHONHASHSEED.

Expensive work is shared: one capture per (script, arguments), module-scoped, 3 steps.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from reprobisect.trace.reader import read_trace

pytestmark = [pytest.mark.slow, pytest.mark.torch]

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "examples" / "corpus"
PYTHON = sys.executable
BISECT = [PYTHON, "-m", "reprobisect"]
STEPS = 3
TIMEOUT = 300

# Kinds a training step's forward/backward chain is made of: evaluation forwards counted as
# training would add records of these kinds to some steps and not to others.
CHAIN = ("batch", "input", "activation", "output", "loss", "grad")

# Per script: its file, base arguments, --steps when not STEPS, a change to evaluation only,
# a change to training, and the kinds that training change may first show as at step 0
# ("init" where parameters before the first step get a kind of their own).
SCRIPTS = {
    "gpt_compile": dict(
        file="gpt_compile.py",
        # compiled on CPU, the embedding's backward adds in a thread-dependent order: two runs
        # differ in its gradient's last bits (bisect repro finds it); deterministic mode fixes that
        args=["--deterministic", "1"],
        eval_change=["--eval_iters", "3"],
        train_change=["--learning_rate", "0.01"],
        first_kinds=("param",),
    ),
    "mingpt_trainer": dict(
        file="mingpt_trainer.py",
        args=[],
        eval_change=["--eval_batch_size", "5"],
        train_change=["--seed", "1"],
        first_kinds=("batch", "init", "param"),
    ),
    "lstm_sgd": dict(
        file="lstm_sgd.py",
        args=[],
        eval_change=["--eval_batch_size", "3"],
        train_change=["--lr", "2.0"],
        first_kinds=("param",),
    ),
    # max_steps 3 under --steps 5: the script ends by itself, so trainer.test runs too
    "lightning_valtest": dict(
        file="lightning_valtest.py",
        args=["--max_steps", "3"],
        steps=5,
        eval_change=["--limit_val_batches", "3", "--val_batch_size", "4"],
        train_change=["--seed", "8"],
        first_kinds=("batch", "init", "param"),
    ),
}


# -- helpers -------------------------------------------------------------------------------
def _env(**extra: str | None) -> dict[str, str]:
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env or _env(), capture_output=True, text=True, timeout=TIMEOUT)


def _json(proc: subprocess.CompletedProcess) -> dict:
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(
            f"exit {proc.returncode}, stdout is not JSON:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
        ) from None


def _say(proc: subprocess.CompletedProcess) -> str:
    """What a failed command said: its outcome in one line when it printed one as JSON."""
    try:
        outcome = json.loads(proc.stdout).get("outcome") or {}
    except (json.JSONDecodeError, AttributeError):
        outcome = {}
    if outcome.get("status"):
        return f"exit {proc.returncode}: {outcome['status']}: {outcome.get('detail')}"
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"


def _chain_keys(step) -> set[tuple[str, str]]:
    return {(r.kind, r.name) for r in step.records if r.kind in CHAIN}


def _first(result: dict) -> dict | None:
    """The first divergence of a compare/repro JSON answer (None when they agree)."""
    if "comparisons" in result:  # repro: one comparison per extra run
        firsts = [c.get("first") for c in result["comparisons"] if c.get("first")]
        return firsts[0] if firsts else None
    return result.get("first")


class Captures:
    """``bisect capture`` once per (script, arguments); every test reads the same traces.

    The first ``get`` starts every capture the module reads (each script as is, with its
    evaluation change and with its training change), two side by side: a capture spends much of
    its life importing torch on one core, so the other core records the next one meanwhile. The
    compiled script's first capture goes first and its other two last, so that they find the
    inductor cache warm (two cold compiles at once would each pay for it)."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root, self.env, self.done = root, env, {}

    def _capture(self, name: str, extra: tuple[str, ...]) -> tuple[subprocess.CompletedProcess, Path]:
        spec = SCRIPTS[name]
        out = self.root / f"{name}-{'-'.join(extra).replace('.', '_') or 'base'}.trace"
        argv = [*BISECT, "capture", "-o", str(out), "--steps", str(spec.get("steps", STEPS)), "--json",
                "--", "python", str(CORPUS / spec["file"]), *spec["args"], *extra]
        return _run(argv, self.root, self.env), out

    def _start_all(self) -> None:
        keys = [(n, x) for n, spec in SCRIPTS.items() for x in ((), tuple(spec["eval_change"]), tuple(spec["train_change"]))]
        keys.sort(key=lambda k: 0 if k == ("gpt_compile", ()) else 2 if k[0] == "gpt_compile" else 1)
        pool = ThreadPoolExecutor(max_workers=2)
        self.done = {k: pool.submit(self._capture, *k) for k in keys}
        pool.shutdown(wait=False)

    def get(self, name: str, extra: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, Path]:
        if not self.done:
            self._start_all()
        key = (name, extra)
        if key not in self.done:  # not one of the module's usual captures: recorded here, once
            self.done[key] = Future()
            self.done[key].set_result(self._capture(*key))
        return self.done[key].result()


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """The working directory every corpus command runs in (scripts write only under it)."""
    return tmp_path_factory.mktemp("corpus")


@pytest.fixture(scope="module")
def env(work: Path) -> dict[str, str]:
    # one inductor cache for every compiled run: only the first pays the cold compile
    return _env(TORCHINDUCTOR_CACHE_DIR=str(work / "inductor-cache"))


@pytest.fixture(scope="module")
def captures(work: Path, env: dict[str, str]) -> Captures:
    return Captures(work, env)


# -- the scripts themselves ------------------------------------------------------------------
_LOSS = re.compile(r"loss (-?[0-9.]+(?:e[-+]?[0-9]+)?)\b")


def _losses(text: str) -> list[str]:
    """Training losses the scripts print with 9 significant digits (float32 round-trip)."""
    return [m.group(1) for line in text.splitlines() if "val" not in line and "test" not in line
            for m in _LOSS.finditer(line)]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_scripts_are_deterministic_as_plain_python(name, work, env):
    """Without reprobisect: same seed, same training losses bit for bit (printed with 9
    significant digits, a float32 round-trip), whatever the evaluation settings. The premise
    of every repro / eval-only assertion below."""
    spec = SCRIPTS[name]
    short = {"gpt_compile": ["--max_iters", "3", "--compile", "0"], "mingpt_trainer": ["--max_iters", "3"],
             "lstm_sgd": ["--epochs", "2"], "lightning_valtest": []}[name]
    base = [PYTHON, str(CORPUS / spec["file"]), *spec["args"], *short]
    # two runs, the second with other evaluation settings: equal losses show both
    with ThreadPoolExecutor(max_workers=2) as pool:  # side by side: each mostly imports torch on one core
        runs = list(pool.map(lambda argv: _run(argv, work, env), [base, [*base, *spec["eval_change"]]]))
    for r in runs:
        assert r.returncode == 0, _say(r)
    losses = [_losses(r.stdout) for r in runs]
    assert len(losses[0]) >= 3, runs[0].stdout
    assert losses[0] == losses[1]


# -- capture ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_capture_is_ok_with_every_training_step(name, captures):
    proc, out = captures.get(name)
    result = _json(proc)
    assert proc.returncode == 0 and result["outcome"]["status"] == "ok", _say(proc)
    trace = read_trace(out)
    assert trace.complete
    assert [s.step for s in trace] == [0, 1, 2]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_evaluation_is_not_recorded_as_training(name, captures):
    """estimate_loss at iter 0 (gpt), the eval callback after step 0 (minGPT), evaluate()
    at the end of an epoch (LSTM: an epoch is 2 batches), Lightning's sanity check before
    step 0 and validation after step 1: none of their batches or forwards may sit in a
    training step, so every step holds the same training chain."""
    proc, out = captures.get(name)
    assert proc.returncode == 0, _say(proc)
    steps = list(read_trace(out))
    keys = [_chain_keys(s) for s in steps]
    for s, k in zip(steps[1:], keys[1:]):
        extra = sorted((k ^ keys[0]))[:6]
        assert k == keys[0], f"step {s.step} holds other records than step 0 (an evaluation pass counted as training?): {extra}"


def test_lightning_sanity_check_validation_and_test_are_recorded_apart(captures):
    """Lightning runs a sanity check (2 validation batches) before step 0, validation after
    step 1 and trainer.test after the last step: the trace says so, as evaluation (its
    phases named, e.g. in a step's scalars), while the training steps stay 0, 1, 2."""
    proc, out = captures.get("lightning_valtest")
    assert proc.returncode == 0, _say(proc)
    trace = read_trace(out)
    assert [s.step for s in trace] == [0, 1, 2]
    said = json.dumps([s.scalars for s in trace]) + (out / "manifest.json").read_text()
    for phase in ("sanity", "validation", "test"):
        assert phase in said, f"no evaluation record names the {phase} phase"


# -- repro -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_repro_agrees_for_seeded_scripts(name, work, env):
    spec = SCRIPTS[name]
    proc = _run([*BISECT, "repro", "--json", "-q", "--steps", str(spec.get("steps", STEPS)),
                 "--", "python", str(CORPUS / spec["file"]), *spec["args"]], work, env)
    result = _json(proc)
    assert proc.returncode == 0 and result["deterministic"] is True, (_first(result), _say(proc))


# -- compare -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_captures_differing_only_in_evaluation_agree(name, captures, work, env):
    """The headline false verdict: an evaluation setting is not a training divergence."""
    (pa, a), (pb, b) = captures.get(name), captures.get(name, tuple(SCRIPTS[name]["eval_change"]))
    assert pa.returncode == 0 and pb.returncode == 0, (_say(pa), _say(pb))
    proc = _run([*BISECT, "compare", "--json", str(a), str(b)], work, env)
    result = _json(proc)
    assert proc.returncode == 0, f"diverged on an evaluation-only change: {_first(result)}"


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_captures_differing_in_training_diverge_at_step_0(name, captures, work, env):
    spec = SCRIPTS[name]
    (pa, a), (pb, b) = captures.get(name), captures.get(name, tuple(spec["train_change"]))
    assert pa.returncode == 0 and pb.returncode == 0, (_say(pa), _say(pb))
    proc = _run([*BISECT, "compare", "--json", str(a), str(b)], work, env)
    result = _json(proc)
    assert proc.returncode == 1, _say(proc)
    first = _first(result)
    assert first is not None and (first.get("step") or 0) <= 0, first
    assert first["kind"] in spec["first_kinds"], first


# -- sentinel detail ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["lstm_sgd", "mingpt_trainer", "lightning_valtest"])
def test_a_sentinel_capture_agrees_with_a_full_one_and_holds_its_gradient_norm(name, captures, work, env):
    """``capture --detail sentinel`` of a hand-written SGD loop, a minGPT-style trainer (which
    clips) and Lightning with validation and test: the same training steps as the full capture
    of the same run, ``compare`` agrees on what both hold, and the gradient norm before
    clipping is the full capture's, bit for bit, where the native kernel took both."""
    from reprobisect import native

    spec = SCRIPTS[name]
    pf, full = captures.get(name)
    sent = work / f"{name}-sentinel.trace"
    ps = _run([*BISECT, "capture", "-o", str(sent), "--steps", str(spec.get("steps", STEPS)), "--detail", "sentinel",
               "--json", "--", "python", str(CORPUS / spec["file"]), *spec["args"]], work, env)
    assert pf.returncode == 0 and ps.returncode == 0, (_say(pf), _say(ps))
    s, f = read_trace(sent), read_trace(full)
    assert s.detail == "sentinel" and [x.step for x in s] == [x.step for x in f]
    proc = _run([*BISECT, "compare", "--json", str(sent), str(full)], work, env)
    assert proc.returncode == 0, _first(_json(proc))
    norms = [(a.scalars.get("grad_norm"), b.scalars.get("grad_norm")) for a, b in zip(s, f)]
    assert all(isinstance(a, float) and a > 0 for a, _ in norms), norms
    if native.kernel() is not None:
        assert all(a == b for a, b in norms), norms


# -- data git ignores: bisect runs --link ------------------------------------------------------
def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def data_repo(tmp_path_factory, env) -> tuple[Path, str, str]:
    """C1 (LR 0.05), a commit that changes no numerics, C2 (LR 0.08); data/train.npy ignored."""
    repo = tmp_path_factory.mktemp("ignored-data")
    for f in ("train.py", "make_data.py", ".gitignore"):
        shutil.copy(CORPUS / "ignored_data" / f, repo / f)
    _git(repo, "init", "-q")
    made = _run([PYTHON, "make_data.py"], repo, env)
    assert made.returncode == 0, _say(made)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "train on data/train.npy")
    assert "data/train.npy" not in _git(repo, "ls-files"), "the data must stay out of git"
    c1 = _git(repo, "rev-parse", "HEAD")
    (repo / "README.md").write_text("Run make_data.py first.\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "readme")
    text = (repo / "train.py").read_text()
    assert "LR = 0.05\n" in text
    (repo / "train.py").write_text(text.replace("LR = 0.05\n", "LR = 0.08\n"))
    _git(repo, "commit", "-qam", "raise the learning rate")
    return repo, c1, _git(repo, "rev-parse", "HEAD")


def test_ignored_data_script_captures_and_repros(data_repo, env):
    repo = data_repo[0]
    proc = _run([*BISECT, "capture", "-o", str(repo.parent / "ignored.trace"), "--steps", str(STEPS), "--json",
                 "--", "python", "train.py"], repo, env)
    assert proc.returncode == 0 and _json(proc)["outcome"]["status"] == "ok", _say(proc)
    assert [s.step for s in read_trace(repo.parent / "ignored.trace")] == [0, 1, 2]
    proc = _run([*BISECT, "repro", "--json", "-q", "--steps", str(STEPS), "--", "python", "train.py"], repo, env)
    assert proc.returncode == 0 and _json(proc)["deterministic"] is True, _say(proc)


def test_runs_with_link_finds_the_commit_that_changed_training(data_repo, env):
    repo, c1, c2 = data_repo
    proc = _run([*BISECT, "runs", "--good", c1, "--bad", c2, "--link", "data", "--json", "-q", "--steps", str(STEPS),
                 "--", "python", "train.py"], repo, env)
    result = _json(proc)
    assert proc.returncode == 0 and result["found"], _say(proc)
    assert result["first_bad"]["hash"].startswith(c2[:7]) or c2.startswith(result["first_bad"]["hash"])
    assert _git(repo, "status", "--porcelain") == "", "the user's checkout must be untouched"


def test_runs_without_link_names_the_missing_path_and_link(data_repo, env):
    repo, c1, c2 = data_repo
    proc = _run([*BISECT, "runs", "--good", c1, "--bad", c2, "-q", "--steps", str(STEPS),
                 "--", "python", "train.py"], repo, env)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, _say(proc)
    assert "data/train.npy" in text or "'data'" in text, _say(proc)
    assert "--link" in text, _say(proc)
    assert "Traceback (most recent call last)" not in proc.stderr, _say(proc)


def _eval_history(tmp_path_factory, edits) -> tuple[Path, str, list[str]]:
    """A repository of mingpt_trainer.py: the first commit, then one commit per edit."""
    repo = tmp_path_factory.mktemp("eval-history")
    shutil.copy(CORPUS / "mingpt_trainer.py", repo / "train.py")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "trainer")
    good, commits = _git(repo, "rev-parse", "HEAD"), []
    text = (repo / "train.py").read_text()
    for old, new, msg in edits:
        assert old in text, old
        text = text.replace(old, new)
        (repo / "train.py").write_text(text)
        _git(repo, "commit", "-qam", msg)
        commits.append(_git(repo, "rev-parse", "HEAD"))
    return repo, good, commits


def _runs(repo: Path, good: str, env) -> tuple[subprocess.CompletedProcess, dict]:
    proc = _run([*BISECT, "runs", "--good", good, "--bad", "HEAD", "--json", "-q", "--steps", str(STEPS),
                 "--", "python", "train.py"], repo, env)
    return proc, _json(proc)


def _is(commit: str, result: dict) -> bool:
    h = result["first_bad"]["hash"]
    return commit.startswith(h) or h.startswith(commit[:7])


EVAL_BATCH = ('"--eval_batch_size", type=int, default=16', '"--eval_batch_size", type=int, default=5', "eval batch 5")
EVAL_EVERY_STEP = ('"--eval_interval", type=int, default=2', '"--eval_interval", type=int, default=1', "eval every step")
RAISE_LR = ('"--lr", type=float, default=5e-3', '"--lr", type=float, default=1e-2', "raise the lr")


def test_runs_never_blames_a_commit_that_only_changed_evaluation(tmp_path_factory, env):
    """The false verdict of issue 9, as a user meets it: between the good and the bad commit
    one commit changes only evaluation (its batch size), one changes training (the learning
    rate): `bisect runs` names the training commit."""
    repo, good, (_, lr_commit) = _eval_history(tmp_path_factory, [EVAL_BATCH, RAISE_LR])
    proc, result = _runs(repo, good, env)
    assert proc.returncode == 0 and result["found"] and _is(lr_commit, result), _say(proc)
    assert _git(repo, "status", "--porcelain") == ""


def test_runs_names_evaluation_that_really_changes_training_and_says_why(tmp_path_factory, env):
    """Evaluating every step instead of every other one really changes training in this
    style of trainer: each evaluation builds a DataLoader iterator, which draws its base
    seed from the global RNG, so the dropout masks of the training steps after it move.
    The honest answer names that commit, and its hint names evaluation and the generator."""
    repo, good, (every_step, _) = _eval_history(tmp_path_factory, [EVAL_EVERY_STEP, RAISE_LR])
    proc, result = _runs(repo, good, env)
    assert proc.returncode == 0 and result["found"] and _is(every_step, result), _say(proc)
    hints = " ".join(result["divergence"].get("hints", []))
    assert "evaluation before step" in hints and "generator" in hints, _say(proc)


# -- no seed ---------------------------------------------------------------------------------
def test_unseeded_repro_says_no_seed_was_set(work):
    """As a user runs it: PYTHONHASHSEED not exported, which must not be blamed (the
    initial weights differ, and string hashing has nothing to do with that)."""
    env = _env(PYTHONHASHSEED=None)
    proc = _run([*BISECT, "repro", "--steps", str(STEPS), "--", "python", str(CORPUS / "unseeded.py")], work, env)
    assert proc.returncode == 1, _say(proc)
    text = proc.stdout + proc.stderr
    assert re.search(r"DIVERGED at step 0\b|first divergence:\s*\n\s*step 0\b|initial param", text, re.I), _say(proc)
    said = text.replace("PYTHONHASHSEED", "").replace("unseeded.py", "")
    no_seed = r"no seed|not seeded|unseeded|never seed|seed (?:was|is) (?:never|not) (?:set|called)|without (?:a )?seed"
    assert re.search(no_seed, said, re.I), f"the answer should say no seed was set:\n{text}"
    blame = [line for line in text.splitlines() if "PYTHONHASHSEED" in line
             and re.search(r"hint|cause|because|likely|rule out|try", line, re.I)]
    assert not blame, f"PYTHONHASHSEED blamed for an unseeded initialization: {blame}"
