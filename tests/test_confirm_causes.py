"""Causes from evidence, confirmed by experiment (``reprobisect.workflows.confirm``, issue 36 item 4).

``bisect repro`` used to say "PYTHONHASHSEED was unset, so the runs hashed strings
differently" whenever the data order differed and the variable was unset — also for a
shuffle seeded from the clock. Now a candidate cause is tested by re-running the pair with
it held fixed ("confirmed: ..." / "not this: ..."), or phrased as a question with its check.
The first tests are cheap (traces written through the writer API); the end-to-end ones run
real torch on CPU through the real CLI (slow: several probes each on a shared machine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from reprobisect.cli import main
from reprobisect.core.compare import compare_paths
from reprobisect.core.options import ProbeOptions
from reprobisect.core.hints import HOLD_VAR, cause_candidates
from reprobisect.render import render_comparison, render_repro, repro_json
from reprobisect.trace import TraceWriter, record_array
from reprobisect.workflows.confirm import Confirmation
from reprobisect.workflows.repro import run_repro

OLD_WORDING = "so the runs hashed strings differently"


# --------------------------------------------------------------------------- cheap: the hints and the candidates


def _trace(path: Path, *, env_vars=None, order=(0, 1), init=0, loss_bits=0.0, determinism=None, threads=2,
           seed=0) -> Path:
    """One step: an ``init`` record (weights from ``init``), a batch, an activation, a loss."""
    env = {"device": "cpu", "env_vars": env_vars or {}, "determinism": determinism or {},
           "torch": {"num_threads": threads, "devices": []}}
    w = np.random.default_rng(init).standard_normal((2, 2)).astype(np.float32)
    x = np.array(order, dtype=np.int64)
    with TraceWriter(path, command=["python", "train.py"], environment=env, seed=seed) as wr:
        wr.begin_step(0)
        for name, kind, a in (("w", "init", w), ("ids", "batch", x),
                              ("fc", "activation", w + np.float32(loss_bits)), ("loss", "loss", np.float32(1 + loss_bits))):
            wr.record(record_array(name, kind, a), a)
        wr.end_step({"loss": 1.0}, batch_ids=list(order))
    return path


def _read(p: Path):
    from reprobisect.trace import read_trace

    return read_trace(p)


def _candidates(a: Path, b: Path, **kw) -> list[str]:
    return [c.name for c in cause_candidates(_read(a), _read(b), compare_paths(a, b), **kw)]


def test_the_hashseed_hint_is_a_question_with_its_check(tmp_path):
    c = compare_paths(_trace(tmp_path / "a"), _trace(tmp_path / "b", order=(1, 0)))
    hints = [ln for ln in render_comparison(c).splitlines() if ln.startswith("hint:")]
    assert len(hints) == 1
    assert hints[0].startswith("hint: does string hashing decide the data order?")
    assert "check: export PYTHONHASHSEED=0" in hints[0]
    assert OLD_WORDING not in hints[0]


def test_candidates_follow_the_evidence(tmp_path):
    a, b = _trace(tmp_path / "a"), _trace(tmp_path / "b", order=(1, 0))
    # data order, hashing randomised: hashing first; the unseeded global RNGs after (reprobisect.core.hints.with_global_rngs)
    assert _candidates(a, b) == ["hashseed", "loader_seed", "numpy_seed", "random_seed"]
    h0 = {"PYTHONHASHSEED": "0"}
    assert _candidates(_trace(tmp_path / "c", env_vars=h0), _trace(tmp_path / "d", env_vars=h0, order=(1, 0))) \
        == ["loader_seed", "numpy_seed", "random_seed"]  # hashing was fixed: not a candidate
    # the initial parameters differ under one recorded seed: the record names the cause, nothing to test
    assert _candidates(_trace(tmp_path / "e", init=1), _trace(tmp_path / "f", init=2, order=(1, 0))) == []


def test_seeds_that_differ_under_randomised_hashing_are_tested_for_hash(tmp_path):
    """``torch.manual_seed(hash(name))``: the runs recorded different seeds; is hash() choosing them?"""
    a, b = _trace(tmp_path / "a", init=1, seed=11), _trace(tmp_path / "b", init=2, seed=22)
    found = cause_candidates(_read(a), _read(b), compare_paths(a, b), same_command=True)
    assert [c.name for c in found] == ["hashseed"]
    assert found[0].question == "does the seed come from string hashing (hash() of a str, PYTHONHASHSEED)?"
    h0 = {"PYTHONHASHSEED": "0"}
    c, d = _trace(tmp_path / "c", init=1, seed=11, env_vars=h0), _trace(tmp_path / "d", init=2, seed=22, env_vars=h0)
    assert _candidates(c, d, same_command=True) == []  # hashing was fixed: the seeds differ for another reason


def test_math_candidates_only_for_one_command_and_not_what_is_in_force(tmp_path):
    a, b = _trace(tmp_path / "a"), _trace(tmp_path / "b", loss_bits=1e-6)
    assert _candidates(a, b) == []  # between commits a math difference is the code
    assert _candidates(a, b, same_command=True) == ["one_thread", "deterministic", "numpy_seed", "random_seed"]
    det = {"deterministic_algorithms": True}
    c, d = _trace(tmp_path / "c", determinism=det, threads=1), _trace(tmp_path / "d", determinism=det, threads=1,
                                                                      loss_bits=1e-6)
    assert _candidates(c, d, same_command=True) == ["numpy_seed", "random_seed"]  # only the global RNGs are left


def test_confirmation_wording():
    common = dict(candidate="hashseed", held="PYTHONHASHSEED=0", question="does string hashing decide the data order?",
                  cause="string hashing decides the data order", fix="sorted()", outside="something outside the seeds",
                  check="PYTHONHASHSEED=0 bisect repro --runs 2 -- python t.py", original="step 0 · batch · ids")
    yes = Confirmation(agreed=True, runs=2, **common)
    assert yes and yes.text.startswith("confirmed: with PYTHONHASHSEED=0 the runs agree")
    no = Confirmation(agreed=False, first_difference="step 0 · batch · ids", runs=2, **common)
    assert not no and no.text.startswith("not this: still differs with PYTHONHASHSEED=0 (first difference again at "
                                         "step 0 · batch · ids); something outside the seeds")
    q = Confirmation(agreed=None, reason="not tried", **common)
    assert q.text == ("does string hashing decide the data order? check: PYTHONHASHSEED=0 bisect repro --runs 2 -- "
                      "python t.py (not tried)")


def test_confirm_max_is_validated_before_any_probe(tmp_path, capsys):
    assert main(["repro", "--confirm-max", "-1", "--", sys.executable, str(tmp_path / "none.py")]) == 2
    assert "--confirm-max" in capsys.readouterr().err


# --------------------------------------------------------------------------- the runner's switch


@pytest.mark.slow
def test_the_hold_switch_seeds_loaders_and_sets_determinism():
    code = textwrap.dedent("""
        import torch
        from reprobisect.runners import hold
        hold.activate_torch(None)
        a = torch.utils.data.DataLoader(list(range(16)), batch_size=4, shuffle=True)
        mine = torch.Generator().manual_seed(5)
        b = torch.utils.data.DataLoader(list(range(16)), batch_size=4, shuffle=True, generator=mine)
        print(a.generator is not None, b.generator is mine, torch.are_deterministic_algorithms_enabled(),
              torch.get_num_threads())
    """)
    env = {**os.environ, HOLD_VAR: "loader_seed,deterministic,one_thread"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["True", "True", "True", "1"]  # a user's own generator is left alone


# --------------------------------------------------------------------------- end to end: real torch, the real CLI

_LOOP = """
data = torch.randn(32, 4, generator=torch.Generator().manual_seed(1))
target = torch.randn(32, 1, generator=torch.Generator().manual_seed(2))
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data, target), batch_size=8, sampler=order)
for x, y in loader:
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
"""

SCRIPTS = {
    # the batch order follows a set of strings: string hashing decides it
    "hashed.py": "import torch\ntorch.manual_seed(0)\norder = [int(n[2:]) for n in {f'id{i}' for i in range(32)}]\n",
    # the shuffle is seeded from the clock and the pid: no seed the tool can hold fixes it
    "clock.py": ("import os, random, time, torch\ntorch.manual_seed(0)\norder = list(range(32))\n"
                 "random.Random(time.time_ns() ^ os.getpid()).shuffle(order)\n"),
    # no seed at all: the initialisation differs (the record shows it)
    "unseeded.py": "import torch\norder = list(range(32))\n",
    "deterministic.py": "import torch\ntorch.manual_seed(0)\norder = list(range(32))\n",
}


@pytest.fixture
def scripts(tmp_path, monkeypatch):
    """The scripts in ``tmp_path``, run with PYTHONHASHSEED unset (the test harness sets it to 0)."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    monkeypatch.chdir(tmp_path)
    for name, head in SCRIPTS.items():
        (tmp_path / name).write_text(head + _LOOP)
    return tmp_path


def _traces(out: Path) -> int:
    return sum(1 for p in out.iterdir() if (p / "manifest.json").exists())


def _repro(folder: Path, script: str, **kw) -> tuple[bool, str, dict, int]:
    """``run_repro`` over two runs of one step: (agree, its text, its JSON, the trace folders it made)."""
    out = folder / f"out-{script}"
    r = run_repro([sys.executable, script], ProbeOptions(steps=1, jobs=2, out=out, quiet=True), runs=2, confirm=True, **kw)
    return bool(r), render_repro(r), repro_json(r), _traces(out)


@pytest.mark.slow
def test_hash_ordered_data_is_confirmed_by_holding_the_hash_seed(scripts, capsys):
    agree, text, data, traces = _repro(scripts, "hashed.py")
    assert not agree
    assert "confirmed: with PYTHONHASHSEED=0 the runs agree" in text
    assert OLD_WORDING not in text
    assert traces == 4  # the pair, then the pair again with PYTHONHASHSEED=0: it agreed, nothing more tried
    assert [(c["candidate"], c["agreed"]) for c in data["causes"]] == [("hashseed", True)]


@pytest.mark.slow
def test_a_clock_seeded_shuffle_is_not_blamed_on_the_hash_seed(scripts, capsys):
    agree, text, data, traces = _repro(scripts, "clock.py")
    assert not agree
    assert OLD_WORDING not in text and "confirmed" not in text
    assert "not this: still differs with PYTHONHASHSEED=0 (first difference again at step 0 · batch" in text
    assert "something outside the seeds orders the data (the time, the pid" in text
    assert [(c["candidate"], c["agreed"]) for c in data["causes"]] == [
        ("hashseed", False), ("loader_seed", False), ("numpy_seed", False), ("random_seed", None)]
    assert traces == 8


@pytest.mark.slow
def test_an_unseeded_init_is_named_from_its_record_without_re_runs(scripts, capsys):
    agree, text, data, traces = _repro(scripts, "unseeded.py")
    assert not agree
    assert "hint: initial parameters differ: no seed was set" in text
    assert "PYTHONHASHSEED" not in "".join(ln for ln in text.splitlines() if ln.startswith(("hint:", "confirmed", "not this")))
    assert data["causes"] == [] and traces == 2


@pytest.mark.slow
def test_no_confirm_names_the_cause_as_a_question(scripts, capsys):
    out = scripts / "out"
    code = main(["repro", "--runs", "2", "--steps", "1", "--jobs", "2", "-o", str(out), "--no-confirm", "--",
                 sys.executable, "hashed.py"])
    text = capsys.readouterr().out
    assert code == 1 and _traces(out) == 2  # no re-run
    assert OLD_WORDING not in text and "confirmed" not in text
    hints = [ln for ln in text.splitlines() if ln.startswith("hint:")]
    assert hints and all("?" in h and "check:" in h for h in hints)
    assert any("does string hashing" in h and "PYTHONHASHSEED=0 bisect repro --runs 2 --" in h for h in hints)


@pytest.mark.slow
def test_confirm_max_caps_the_candidates_tried(scripts, capsys):
    agree, text, data, traces = _repro(scripts, "clock.py", confirm_max=1)
    assert not agree
    assert traces == 4
    assert [(c["candidate"], c["agreed"]) for c in data["causes"]] == [
        ("hashseed", False), ("loader_seed", None), ("numpy_seed", None), ("random_seed", None)]
    assert "(not tried: --confirm-max 1 reached)" in text


@pytest.mark.slow
def test_a_deterministic_script_costs_no_re_run(scripts, capsys):
    agree, text, data, traces = _repro(scripts, "deterministic.py")
    assert agree and traces == 2
    assert data["deterministic"] is True and data["causes"] == []


# --------------------------------------------------------------------------- seeds and envs

_SEEDED_CLOCK = """import argparse, os, random, time, torch
p = argparse.ArgumentParser(); p.add_argument("--seed", type=int, default=0)
torch.manual_seed(p.parse_args().seed)
order = list(range(32))
random.Random(time.time_ns() ^ os.getpid()).shuffle(order)
"""


@pytest.mark.slow
def test_seeds_does_not_credit_the_seed_with_a_clock_shuffle(scripts, capsys):
    """The data order differs between seeds 0 and 1, and between two runs of seed 0: not the seed's doing."""
    (scripts / "seeded_clock.py").write_text(_SEEDED_CLOCK + _LOOP)
    code = main(["seeds", "--steps", "1", "--jobs", "2", "--json", "--", sys.executable, "seeded_clock.py",
                 "--seed", "{seed}"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    assert data["components"]["data_order"]["status"] == "changed"
    control = data["control"]
    assert control["agreed"] is False and "data_order" in control["unstable"]
    assert control["text"].startswith("not (only) the seed: seed 0 run twice differs too (first difference at step 0")
    assert any(f.startswith("seed 0 does not repeat itself") for f in data["flags"])


@pytest.mark.slow
def test_envs_confirms_a_cause_besides_the_environment(scripts, capsys):
    """Threads 1 vs 2 'differ', but the data order follows string hashing: held fixed, the sides agree."""
    code = main(["envs", "--steps", "1", "--jobs", "2", "--a", "env.OMP_NUM_THREADS=1", "--b", "env.OMP_NUM_THREADS=2",
                 "--", sys.executable, "hashed.py"])
    text = capsys.readouterr().out
    assert code == 1  # the sides did differ, as measured
    assert "confirmed: with PYTHONHASHSEED=0 the runs agree" in text
    assert "the environment difference is not what makes the sides differ here" in text
    assert OLD_WORDING not in text
