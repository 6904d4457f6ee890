"""``bisect resume`` against resume code written apart from its own examples
(``examples/resume/independent/``): nanoGPT-style, a Trainer class, Lightning's ``ckpt_path``,
a sampler generator, a save before ``optimizer.step()``, a fresh optimizer, a CUDA-only RNG
save, a checkpoint every 2 steps, a StatefulDataLoader. Each runs once through the CLI with
``--json`` (two at a time, each in its own folder: the three runs of one share checkpoints)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("torchdata")
pytest.importorskip("lightning")

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "examples" / "resume" / "independent"

CASES = {
    # name: (steps, at, resume args, script and its args) -> (verdict, component, first differing step, says)
    "nanogpt": ((8, 4, "--init_from resume", "nanogpt_style.py --max_iters 8"),
                ("diverged", "data order", 4, "input at step 0")),
    "nanogpt_odd": ((8, 3, "--init_from resume", "nanogpt_style.py --max_iters 8"),  # last save after step 1
                    ("diverged", "data order", 2, "restarted from a checkpoint saved after step 1")),
    "trainer": ((8, 5, "--resume-from state.pt", "trainer_class.py --max-steps 8"),
                ("bitwise", None, None, "drew and discarded 1 batch(es)")),
    "lightning": ((8, 4, "--ckpt-path ckpt/last.ckpt", "lightning_shuffle.py --steps 8"),
                  ("diverged", "data order", 4, "re-seeded generator")),
    "sampler": ((8, 4, "--load run.ckpt", "sampler_generator.py --steps 8"),
                ("diverged", "data order", 4, "earlier epoch's shuffle replayed")),
    "save_before_step": ((8, 4, "--continue", "save_before_step.py -n 8"),
                         ("diverged", "checkpoint", 4, "one update behind")),
    "fresh_optimizer": ((8, 4, "--from-checkpoint ck/state.pt", "fresh_optimizer.py --iters 8"),
                        ("diverged", "optimizer state", 4, "differs while the gradients agree")),
    "rng_dropout": ((8, 5, "--restore snap.pt", "rng_dropout.py --total-steps 8"),
                    ("diverged", "RNG", 5, "Dropout")),
    "every_two_steps": ((8, 5, "--resume checkpoints/last.pt", "every_two_steps.py --steps 8"),
                        ("bitwise", None, None, "redid step 4")),
    "stateful": ((8, 4, "--restart-from sdl.ckpt", "stateful_loader.py --num-steps 8"), ("bitwise", None, None, "")),
    "stateful_generator": ((8, 4, "--restart-from sdl.ckpt", "stateful_loader.py --num-steps 8 --generator"),
                           ("diverged", "data order", 6, "batch IDs")),  # torchdata 0.11: the next epoch's shuffle
}


def _run(name: str, folder: Path) -> tuple[int, dict, str]:
    (steps, at, resume_args, cmd), _ = CASES[name]
    folder.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "reprobisect", "resume", "--quiet", "--json", "--steps", str(steps),
                        "--at", str(at), "--resume-args", resume_args, "--", "python", *str(HERE / cmd).split(" ")],
                       cwd=folder, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        doc = {}
    return p.returncode, doc, p.stderr[-2000:]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("independent")
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(_run, name, root / name) for name in CASES}
        return {name: f.result() for name, f in futures.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_independent_resume_code_gets_the_right_verdict_and_component(results, name):
    rc, doc, err = results[name]
    verdict, component, step, says = CASES[name][1]
    assert doc, err
    f = doc["finding"] or {}
    assert (doc["resume_verdict"], f.get("component"), f.get("step")) == (verdict, component, step), doc
    assert rc == doc["exit_code"] == (0 if verdict == "bitwise" else 1)
    assert says in json.dumps(doc), doc
    assert [r["status"] for r in doc["runs"]] == ["ok", "ok", "ok"]
