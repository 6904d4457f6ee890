"""The framework corpus scripts through every command: DDP under torchrun, a job script, Keras fit, GradientTape.

examples/corpus/ holds ddp_torchrun.py (DDP + DistributedSampler under torchrun), job.sh (a
cluster job script around mingpt_trainer.py), keras_fit.py (Keras 3 ``model.fit``) and
tf_tape.py (a ``tf.GradientTape`` loop on ``tf.data``). test_corpus.py runs the torch
scripts through the commands; this file runs these four the way a user would
(``python -m reprobisect ... --json`` subprocesses) and asserts what a careful user expects:

- ``capture`` ends ``ok`` with the steps asked for (on every rank for DDP);
- ``repro`` agrees for the seeded scripts;
- ``compare`` of a changed training hyperparameter diverges at step 0 where it acts, and for
  DDP names the rank (``step · rank · stage · tensor``);
- ``seeds`` maps the components sensibly (what the script's seed drives is ``changed``);
- ``envs`` with a variable that changes nothing agrees;
- ``probe`` reads a multi-rank reference;
- ``runs`` over a real git history names the commit (for DDP: the commit and the rank; issue 13).

What tests/test_tensorflow.py already covers for Keras (repro eager, unseeded dropout and
sample order, a Keras history under ``runs``) is not repeated. Cheap on purpose: 2 steps,
one capture per (script, arguments) shared module-wide, ``-j 2`` where probes are mostly
start-up latency (which also puts two torchrun probes, each with its own port, side by side).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from reprobisect.trace import ranks
from reprobisect.trace.reader import read_trace

pytestmark = [pytest.mark.slow, pytest.mark.torch]

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "examples" / "corpus"
PYTHON = sys.executable
BISECT = [PYTHON, "-m", "reprobisect"]
STEPS = "2"
TIMEOUT = 300
HAS_TF = importlib.util.find_spec("tensorflow") is not None
needs_tf = pytest.mark.skipif(not HAS_TF, reason="needs TensorFlow")

DDP = ["python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "ddp_torchrun.py"]
# per script: the command (run in a folder holding the corpus files), and a training change
COMMANDS = {
    "ddp": (DDP, ["--lr", "0.1"]),
    "job": (["bash", "job.sh"], ["--seed", "1"]),
    "keras": (["python", "keras_fit.py"], ["--lr", "0.02"]),
    "tape": (["python", "tf_tape.py"], ["--lr", "0.1"]),
}
# what the change may first show as at step 0
FIRST_KINDS = {"ddp": ("param",), "job": ("batch", "init", "param"), "keras": ("param",), "tape": ("param",)}


def _env(**extra: str) -> dict[str, str]:
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra)
    return env


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT)


def _bisect(cwd: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    proc = _run([*BISECT, *args], cwd)
    try:
        return proc, json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"exit {proc.returncode}, stdout is not JSON:\n{proc.stdout[-3000:]}\n"
                             f"stderr:\n{proc.stderr[-3000:]}") from None


def _say(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def _needs(name: str) -> None:
    if name in ("keras", "tape") and not HAS_TF:
        pytest.skip("needs TensorFlow")


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A folder holding the corpus files the commands run (they write only under it)."""
    d = tmp_path_factory.mktemp("corpus-frameworks")
    for f in ("ddp_torchrun.py", "job.sh", "mingpt_trainer.py", "keras_fit.py", "tf_tape.py"):
        shutil.copy(CORPUS / f, d / f)
    return d


class Captures:
    """``bisect capture`` once per (script, arguments); every test reads the same traces.

    The first ``get`` starts every capture the module reads (each script with and without its
    training change), two side by side: a capture spends most of its life importing a framework
    on one core, so the other core records the next one meanwhile."""

    def __init__(self, root: Path) -> None:
        self.root, self.done = root, {}

    def _capture(self, name: str, extra: tuple[str, ...]) -> tuple[subprocess.CompletedProcess, dict, Path]:
        out = self.root / f"{name}-{'-'.join(extra).replace('.', '_') or 'base'}.trace"
        proc, res = _bisect(self.root, "capture", "-o", str(out), "--steps", STEPS, "--json", "--",
                            *COMMANDS[name][0], *extra)
        return proc, res, out

    def _start_all(self) -> None:
        keys = [(n, x) for n in COMMANDS if HAS_TF or n not in ("keras", "tape") for x in ((), tuple(COMMANDS[n][1]))]
        pool = ThreadPoolExecutor(max_workers=2)
        self.done = {k: pool.submit(self._capture, *k) for k in keys}
        pool.shutdown(wait=False)

    def get(self, name: str, extra: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, dict, Path]:
        _needs(name)
        if not self.done:
            self._start_all()
        key = (name, extra)
        if key not in self.done:  # not one of the module's usual captures: recorded here, once
            self.done[key] = Future()
            self.done[key].set_result(self._capture(*key))
        return self.done[key].result()


@pytest.fixture(scope="module")
def captures(work: Path) -> Captures:
    return Captures(work)


# -- capture -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["job", "keras", "tape"])
def test_capture_is_ok_with_the_steps_asked_for(name, captures):
    proc, res, out = captures.get(name)
    assert proc.returncode == 0 and res["outcome"]["status"] == "ok", _say(proc)
    assert not ranks.is_multi_rank(out)
    trace = read_trace(out)
    assert trace.complete and [s.step for s in trace] == [0, 1]


def test_ddp_capture_is_ok_with_the_steps_on_every_rank(captures):
    proc, res, out = captures.get("ddp")
    assert proc.returncode == 0 and res["outcome"]["status"] == "ok", _say(proc)
    assert ranks.is_multi_rank(out)
    shards = ranks.open_ranks(out)
    assert sorted(shards) == [0, 1]
    for r, trace in shards.items():
        assert trace.complete and [s.step for s in trace] == [0, 1], r
    top = json.loads((out / "manifest.json").read_text())
    assert top["world_size"] == 2 and [r["steps"] for r in top["ranks"]] == [2, 2]


# -- compare -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_changed_training_hyperparameter_diverges_at_step_0(name, captures, work):
    (pa, _, a), (pb, _, b) = captures.get(name), captures.get(name, tuple(COMMANDS[name][1]))
    assert pa.returncode == 0 and pb.returncode == 0, (_say(pa), _say(pb))
    proc, res = _bisect(work, "compare", "--json", str(a), str(b))
    assert proc.returncode == 1, _say(proc)
    first = res["first"]
    assert first is not None and (first.get("step") or 0) == 0 and first["kind"] in FIRST_KINDS[name], first
    if name == "ddp":  # the lr acts on every rank: the lowest names it, the other differs too
        assert first["rank"] == 0 and first["differ_ranks"] == [1], first
        text = _run([*BISECT, "compare", str(a), str(b)], work)
        assert re.search(r"step 0 · rank 0 · param · module\.0\.weight", text.stdout), _say(text)


# -- probe (git bisect run) ---------------------------------------------------------------------
def test_probe_against_a_ddp_reference_is_good_for_the_same_command_and_bad_for_another(captures, work):
    """``bisect probe`` reads a multi-rank reference: the same torchrun command matches it
    (exit 0, another rendezvous port is no difference); the job script's reference is not
    matched by a run with another seed (exit 1)."""
    pa, _, a = captures.get("ddp")
    assert pa.returncode == 0, _say(pa)
    proc, res = _bisect(work, "probe", "--json", "--reference", str(a), "--steps", STEPS, "--", *COMMANDS["ddp"][0])
    assert proc.returncode == 0 and res["probe_verdict"]["verdict"] == "good", _say(proc)
    pj, _, j = captures.get("job")
    assert pj.returncode == 0, _say(pj)
    proc, res = _bisect(work, "probe", "--json", "--reference", str(j), "--steps", STEPS, "--", "bash", "job.sh", "--seed", "1")
    assert proc.returncode == 1 and res["probe_verdict"]["verdict"] == "bad", _say(proc)
    assert res["probe_verdict"]["comparison"]["first"]["step"] == 0, res["probe_verdict"]["comparison"]["first"]


# -- repro -------------------------------------------------------------------------------------
def _fixed_port_ddp() -> list[str]:
    """The DDP command as job scripts write it: the rendezvous port fixed on the command line."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    return ["torchrun", "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", port, "ddp_torchrun.py"]


@pytest.mark.parametrize("name", ["ddp", "job", "tape"])  # keras: test_tensorflow's repro tests
def test_repro_agrees_for_a_seeded_script(name, work):
    """For DDP with its port fixed in the command and -j 2: the run that finds the port taken
    runs again once the other ended (before: "cannot judge determinism ... ended infra")."""
    _needs(name)
    cmd = _fixed_port_ddp() if name == "ddp" else COMMANDS[name][0]
    proc, res = _bisect(work, "repro", "--json", "-q", "--steps", STEPS, "--runs", "2", "-j", "2", "--", *cmd)
    assert proc.returncode == 0 and res["deterministic"] is True, _say(proc)
    assert all(r["outcome"]["status"] == "ok" for r in res["runs"]), res["runs"]


# -- seeds -------------------------------------------------------------------------------------
def _seeds(work: Path, name: str, *extra: str) -> dict:
    _needs(name)
    proc, res = _bisect(work, "seeds", "--json", "-q", "--steps", STEPS, "-j", "2", "--seeds", "0,1", "--",
                        *COMMANDS[name][0], *extra, "--seed", "{seed}")
    assert proc.returncode in (0, 1) and res.get("components"), _say(proc)
    return {k: v["status"] for k, v in res["components"].items()}


def test_seeds_of_the_ddp_script_drive_its_init_and_sampler(work):
    got = _seeds(work, "ddp")
    assert got["init"] == "changed" and got["data_order"] == "changed" and got["loss"] == "changed", got
    assert got["dropout"] == "absent", got  # the model has none


def test_seeds_through_a_job_script_drive_the_trainer(work):
    got = _seeds(work, "job")
    assert got["init"] == "changed" and got["data_order"] == "changed" and got["loss"] == "changed", got


@needs_tf
def test_seeds_of_the_tape_loop_drive_init_and_the_shuffle(work):
    got = _seeds(work, "tape")
    assert got["init"] == "changed" and got["data_order"] == "changed" and got["dropout"] == "absent", got


@needs_tf
def test_seeds_of_keras_fit_in_graph_mode_do_not_call_its_dropout_absent(work):
    got = _seeds(work, "keras")
    assert got["data_order"] == "changed", got  # the global seed drives fit's shuffle
    assert got["dropout"] == "unknown", got  # graph mode records no layer outputs: unknown, never "absent"


# -- envs --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_envs_with_a_variable_that_changes_nothing_agree(name, work):
    _needs(name)
    proc, res = _bisect(work, "envs", "--json", "-q", "--steps", STEPS, "-j", "2",
                        "--a", "env.CORPUS_NOTE=a", "--b", "env.CORPUS_NOTE=b", "--", *COMMANDS[name][0])
    assert proc.returncode == 0 and res["agree"] is True, _say(proc)
    assert [r["outcome"]["status"] for r in res["runs"]] == ["ok", "ok"], res["runs"]


# -- runs over a real history ------------------------------------------------------------------
def _history(root: Path, files: dict[str, str], edit: tuple[str, str, str]) -> tuple[Path, str, str]:
    """base (the files) -> a commit that changes no numerics -> the edit -> HEAD."""
    repo = root
    for dst, src in files.items():
        shutil.copy(CORPUS / src, repo / dst)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "train")
    good = _git(repo, "rev-parse", "HEAD")
    (repo / "NOTES.md").write_text("how to launch\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "notes")
    path, old, new = edit
    text = (repo / path).read_text()
    assert old in text, old
    (repo / path).write_text(text.replace(old, new))
    _git(repo, "commit", "-qam", "the change")
    return repo, good, _git(repo, "rev-parse", "HEAD")


def _named(commit: str, res: dict) -> bool:
    h = (res.get("first_bad") or {}).get("hash") or "-"
    return commit.startswith(h) or h.startswith(commit[:7])


def test_runs_over_a_history_of_a_ddp_script_names_the_commit_and_the_rank(tmp_path):
    """Issue 13's test: the learning rate of a DDP script changes in one commit of three.
    The command fixes its rendezvous port, as job scripts do, and two probes start at once
    (-j 2): the one that finds the port taken is retried alone (before: a skipped commit,
    or a "crashed" bad one, and no answer)."""
    repo, good, bad = _history(tmp_path, {"train.py": "ddp_torchrun.py"},
                               ("train.py", '"--lr", type=float, default=0.05', '"--lr", type=float, default=0.08'))
    cmd = [*_fixed_port_ddp()[:-1], "train.py"]
    proc, res = _bisect(repo, "runs", "--good", good, "--bad", "HEAD", "--json", "-q", "--steps", STEPS, "-j", "2",
                        "--", *cmd)
    assert proc.returncode == 0 and res["found"] and _named(bad, res), _say(proc)
    first = res["divergence"]["first"]
    assert first["step"] == 0 and first["rank"] == 0 and first["differ_ranks"] == [1], first
    assert re.search(r"step 0 · rank 0 · ", res["divergence_text"]), res["divergence_text"]
    assert _git(repo, "status", "--porcelain") == "", "the user's checkout must be untouched"


def test_runs_over_a_history_of_a_job_script_names_the_commit_that_changed_its_arguments(tmp_path):
    """The job script itself changes (it passes a seed now): the trainer is the same file."""
    repo, good, bad = _history(tmp_path, {"job.sh": "job.sh", "mingpt_trainer.py": "mingpt_trainer.py"},
                               ("job.sh", '"$@"\n', '--seed 5 "$@"\n'))
    proc, res = _bisect(repo, "runs", "--good", good, "--bad", "HEAD", "--json", "-q", "--steps", STEPS, "-j", "2",
                        "--", "bash", "job.sh")
    assert proc.returncode == 0 and res["found"] and _named(bad, res), _say(proc)
    assert res["divergence"]["first"]["step"] == 0, res["divergence"]["first"]
    assert _git(repo, "status", "--porcelain") == ""


# -- a rendezvous port already taken -----------------------------------------------------------
def test_a_fixed_rendezvous_port_already_in_use_is_infra_not_a_crash(work):
    """Two probes at once (--jobs 2) of a command with --master_port fixed: one of them cannot
    bind. Before: ``crashed`` (a "bad" commit, then "flaky" on re-check in ``bisect runs``);
    it says nothing about the code, so it is ``infra`` (retried, never evidence) and names the fix."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = str(held.getsockname()[1])
        proc, res = _bisect(work, "capture", "-o", str(work / "busy.trace"), "--steps", STEPS, "--json", "--",
                            "torchrun", "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", port,
                            "ddp_torchrun.py")
    out = res["outcome"]
    assert proc.returncode != 0 and out["status"] == "infra", _say(proc)
    assert f"port {port} was already in use" in out["detail"] and "--jobs 1" in out["detail"], out
