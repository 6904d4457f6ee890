"""Lightning in depth, with real Lightning on CPU under the launcher: manual optimization (a
GAN's two optimizers), gradient accumulation, the sanity check, the bounded stop at
``--steps`` with a logger and ModelCheckpoint running, the Trainer's state per step
(``scalars["lightning"]``) and a ``trainer.fit(ckpt_path=...)`` resume.

Five Lightning runs in all, shared through module-scoped fixtures (the corpus scripts
``lightning_manual.py`` and ``lightning_resume.py``).
"""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from reprobisect.runners.lightning import fingerprint_state
from reprobisect.trace import read_trace

CORPUS = Path(__file__).resolve().parent.parent / "examples" / "corpus"


def _launch(cwd: Path, trace: str, steps: int, script: str, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "reprobisect.runners.launch", "--trace", trace, "--steps", str(steps), "--",
         str(CORPUS / script), *args],
        cwd=cwd, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


# -- the fingerprint of a state_dict: no Lightning needed ---------------------------------


def test_fingerprint_state_is_stable_and_content_sensitive() -> None:
    a = {"b": 1, "a": {"x": np.arange(3), "y": [1.5, float("nan")]}}
    same = {"a": {"y": [1.5, float("nan")], "x": np.arange(3)}, "b": 1}  # another key order
    assert fingerprint_state(a) == fingerprint_state(same)
    assert len(fingerprint_state(a)) == 16 and int(fingerprint_state(a), 16) >= 0
    assert fingerprint_state(a) != fingerprint_state({**a, "b": 2})
    assert fingerprint_state(a) != fingerprint_state({"b": 1, "a": {"x": np.arange(1, 4), "y": [1.5, float("nan")]}})
    # an object is named by its type, never by a repr holding its address
    assert fingerprint_state({"o": object()}) == fingerprint_state({"o": object()})


# -- manual optimization -----------------------------------------------------------------


@pytest.fixture(scope="module")
def gan(tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = tmp_path_factory.mktemp("gan")
    pytest.importorskip("lightning")
    proc = _launch(d, "gan.trace", 4, "lightning_manual.py", "--max_steps", "100")
    return read_trace(d / "gan.trace"), proc


@pytest.mark.slow
def test_manual_optimization_each_opt_step_is_a_step(gan: Any) -> None:
    """A GAN's discriminator and generator updates are two steps, as they are two of
    Lightning's global steps; each step's parameters are those of the optimizer that
    stepped, its loss the loss that optimizer's backward started from."""
    trace, proc = gan
    assert trace.manifest.outcome["status"] == "ok"
    assert "global step 4" in proc.stdout  # the fit returned after --steps 4 optimizer steps
    assert "Traceback" not in proc.stderr
    assert trace.manifest.environment["lightning"]["automatic_optimization"] is False
    assert [s.step for s in trace.steps] == [0, 1, 2, 3]
    light = [s.scalars["lightning"] for s in trace.steps]
    assert [(x["global_step"], x["batch_idx"], x["epoch"]) for x in light] == [(0, 0, 0), (1, 0, 0), (2, 1, 0), (3, 1, 0)]
    for s in trace.steps:
        who = "discriminator" if s.step % 2 == 0 else "generator"
        params = {r.name for r in s.records if r.kind == "param"}
        grads = {r.name for r in s.records if r.kind == "grad"}
        assert params and grads == params and all(n.startswith(who + ".") for n in params), (s.step, params)
        assert s.scalars["no_gradients"] is False and s.scalars["lr"] == [0.01]
        assert [r.name for r in s.records if r.kind == "loss"] == ["loss"]
    # the batch trains in its training_step's first optimizer step; batch_idx names it for both
    assert len(trace.steps[0].batch_ids) == 16 and not trace.steps[1].batch_ids
    assert trace.steps[0].scalars["loss"] != trace.steps[1].scalars["loss"]
    assert {r.name for r in trace.steps[0].records if r.kind == "init"} >= {"generator.0.weight", "discriminator.0.weight"}


@pytest.mark.slow
def test_a_trainer_that_refuses_to_stop_is_stopped_at_the_next_batch(tmp_path: Path) -> None:
    """``min_steps`` keeps the Trainer going when asked to stop after --steps 2: the next
    training batch raises the recorder's stop; nothing past step 1 is recorded."""
    pytest.importorskip("lightning")
    proc = _launch(tmp_path, "m.trace", 2, "lightning_manual.py", "--max_steps", "100", "--min_steps", "8")
    trace = read_trace(tmp_path / "m.trace")
    assert trace.manifest.outcome["status"] == "ok" and [s.step for s in trace.steps] == [0, 1]
    assert "global step" not in proc.stdout  # the fit did not return: the stop ended the script


# -- accumulation, sanity check, bounded stop, Lightning's state, resume --------------------

ACC = ("--accumulate", "2", "--every", "2", "--max_steps", "100", "--val_every", "4")


@pytest.fixture(scope="module")
def acc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two identical runs (accumulating 2 micro-batches, 4 steps, a checkpoint every 2 steps,
    a CSV logger, validation every 4 batches, a sanity check), and a run resumed from the
    first run's checkpoint after step 2 (``--resume``), in the first run's folder."""
    pytest.importorskip("lightning")
    pytest.importorskip("torchdata")
    a, b = tmp_path_factory.mktemp("acc_a"), tmp_path_factory.mktemp("acc_b")
    proc_a = _launch(a, "a.trace", 4, "lightning_resume.py", *ACC)
    _launch(b, "b.trace", 4, "lightning_resume.py", *ACC)
    shutil.copytree(a / "checkpoints", a / "saved")  # as the uninterrupted run left them
    metrics = list(csv.DictReader((a / "logs" / "run" / "version_0" / "metrics.csv").open()))
    _launch(a, "resumed.trace", 2, "lightning_resume.py", *ACC, "--resume", "saved/step=2.ckpt")
    return {"a": read_trace(a / "a.trace"), "b": read_trace(b / "b.trace"), "resumed": read_trace(a / "resumed.trace"),
            "dir": a, "stderr": proc_a.stderr, "metrics": metrics}


@pytest.mark.slow
def test_accumulation_a_step_holds_its_micro_batches(acc: dict[str, Any]) -> None:
    a = acc["a"]
    assert a.manifest.outcome["status"] == "ok" and [s.step for s in a.steps] == [0, 1, 2, 3]
    assert a.manifest.environment["lightning"]["accumulate_grad_batches"] == 2
    ids = [i for s in a.steps for i in s.batch_ids]
    assert all(len(s.batch_ids) == 16 for s in a.steps) and len(set(ids)) == 64  # 2 batches of 8, none twice
    for s in a.steps:
        names = {(r.kind, r.name) for r in s.records}
        assert {("batch", "ids"), ("batch", "ids#1"), ("input", "input"), ("input", "input#1"),
                ("loss", "loss"), ("loss", "loss#1")} <= names, names
        assert ("loss", "loss#2") not in names and len(s.scalars["losses"]) == 2
    # the micro-batches are told apart: their ids and losses differ
    s0 = {r.name: r for r in a.steps[0].records if r.kind in ("batch", "loss")}
    assert s0["ids"].fingerprint != s0["ids#1"].fingerprint and s0["loss"].fingerprint != s0["loss#1"].fingerprint
    light = [s.scalars["lightning"] for s in a.steps]
    assert [(x["global_step"], x["batch_idx"]) for x in light] == [(0, 1), (1, 3), (2, 5), (3, 7)]


@pytest.mark.slow
def test_two_identical_lightning_runs_compare_equal(acc: dict[str, Any]) -> None:
    """The runs differ only in their folders, so in ModelCheckpoint's state (its dirpath):
    ``scalars["lightning"]["callbacks"]`` tells them apart, compare's verdict does not."""
    from reprobisect.core.compare import compare_traces

    a, b = acc["a"], acc["b"]
    c = compare_traces(a, b)
    assert c, str(c)
    la, lb = a.steps[1].scalars["lightning"], b.steps[1].scalars["lightning"]
    assert la["loops"] == lb["loops"] and la["callbacks"].keys() == lb["callbacks"].keys()
    assert la["callbacks"] != lb["callbacks"]


@pytest.mark.slow
def test_sanity_check_is_evaluation_before_step_zero(acc: dict[str, Any]) -> None:
    a = acc["a"]
    runs = [(s.step, e["phase"], e["after_step"], e["batches"]) for s in a.steps for e in s.scalars.get("eval", [])]
    # the sanity check (2 batches) before step 0; validation after batch 4 (= step 1) is before step 2
    assert runs == [(0, "sanity_check", None, 2), (2, "validation", 1, 2)], runs
    assert a.steps[0].scalars["lightning"]["global_step"] == 0


@pytest.mark.slow
def test_steps_bound_stops_the_fit_cleanly_with_logger_and_checkpoints(acc: dict[str, Any]) -> None:
    """--steps 4 with max_steps=100: the Trainer stopped as early stopping stops it, with no
    exception through Lightning; the logger and ModelCheckpoint ran as usual."""
    import torch

    d, a = acc["dir"], acc["a"]
    assert "Traceback" not in acc["stderr"] and "failed" not in acc["stderr"].lower()
    assert a.manifest.outcome["detail"] == "recorded 4 step(s)"
    saved = sorted(p.name for p in (d / "saved").iterdir())
    assert saved == ["last.ckpt", "step=2.ckpt", "step=4.ckpt"], saved
    ck = torch.load(d / "saved" / "step=4.ckpt", map_location="cpu", weights_only=False)
    assert ck["global_step"] == 4 and any(k.startswith("ModelCheckpoint") for k in ck["callbacks"])
    train_steps = sorted({int(r["step"]) for r in acc["metrics"] if r["train_loss"]})
    assert train_steps == [0, 1, 2, 3], acc["metrics"]


@pytest.mark.slow
def test_a_ckpt_path_resume_continues_the_run(acc: dict[str, Any]) -> None:
    """Resumed from the checkpoint saved after step 2 (global step 2): its first recorded step
    is step 2 of the uninterrupted run, bitwise (data order from the StatefulDataLoader's
    saved position, parameters, optimizer state, learning rate), and so is the Trainer's
    own state: the fit loop's progress, global step, batch index and ModelCheckpoint's state
    (the resumed callback saves global step 2 again at the end of the first micro-batch, as
    ``_last_global_step_saved`` is not in its state, over the same files: the script turns
    Lightning's version counter off)."""
    a, r = acc["a"], acc["resumed"]
    assert r.manifest.outcome["status"] == "ok" and [s.step for s in r.steps] == [0, 1]
    assert [s.scalars["lightning"] for s in r.steps] == [s.scalars["lightning"] for s in a.steps[2:4]]
    assert next(iter(r.steps[0].scalars["lightning"]["callbacks"])).startswith("ModelCheckpoint")
    for sa, sr in zip(a.steps[2:4], r.steps):
        assert sa.batch_ids == sr.batch_ids
        assert sa.scalars["lr"] == sr.scalars["lr"] and sa.scalars["loss"] == sr.scalars["loss"]
        fa = {(x.kind, x.name): x.fingerprint for x in sa.records if x.kind in ("param", "optim_state", "grad", "loss")}
        fr = {(x.kind, x.name): x.fingerprint for x in sr.records if x.kind in ("param", "optim_state", "grad", "loss")}
        assert fa == fr
    # the resumed run starts from the parameters the uninterrupted one had after step 1
    after1 = {x.name: x.fingerprint for x in a.steps[1].records if x.kind == "param"}
    init = {x.name: x.fingerprint for x in r.steps[0].records if x.kind == "init"}
    assert init == after1
    # the sanity check is not rerun on a resume: no evaluation before the first resumed step
    assert "eval" not in r.steps[0].scalars
    assert not (acc["dir"] / "checkpoints" / "last-v1.ckpt").exists()


@pytest.mark.slow
def test_a_plain_dataloader_resumed_mid_epoch_restarts_the_epoch_order(tmp_path: Path) -> None:
    """With a plain DataLoader, Lightning restores the loops' progress but not the position
    in the epoch (it warns): the resumed step 2 draws step 0's batch. The recording shows
    just that: the same global step, batch index and loop progress, other batch IDs."""
    pytest.importorskip("lightning")
    args = ("--max_steps", "100", "--loader", "plain")
    _launch(tmp_path, "a.trace", 4, "lightning_resume.py", *args)
    shutil.copytree(tmp_path / "checkpoints", tmp_path / "saved")
    proc = _launch(tmp_path, "r.trace", 2, "lightning_resume.py", *args, "--resume", "saved/step=2.ckpt")
    assert "dataloader is not resumable" in proc.stderr
    a, r = read_trace(tmp_path / "a.trace"), read_trace(tmp_path / "r.trace")
    la, lr = a.steps[2].scalars["lightning"], r.steps[0].scalars["lightning"]
    assert (lr["global_step"], lr["batch_idx"], lr["loops"]) == (2, 2, la["loops"])
    assert r.steps[0].batch_ids == a.steps[0].batch_ids != a.steps[2].batch_ids
