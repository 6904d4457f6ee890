"""Golden traces: the recorders' output, pinned bit for bit (issue 35, the recorder reshape).

The torch and TensorFlow recorders were reshaped into a step chain plus observers
(``reprobisect.runners.chain``); a trace must not change by a bit in the move. Each case
captures a small real run through ``reprobisect.workflows.capture`` (the launcher, a real
subprocess, PYTHONHASHSEED=0, one thread) and compares a digest of its trace with the one
kept in ``tests/golden/traces/<case>.json``:

- per step: every record's order, kind, name, dtype, shape, fingerprint, module, inputs and
  stored flag, a hash of its statistics, the step's batch IDs, and its scalars less those
  that measure time or memory (``data_wait_s``, ``record_s``, ``compute_s``,
  ``cuda_memory_*``);
- the manifest less what names the machine, the moment or the place (``environment``,
  ``revision``, ``command``, ``created``, ``recorder``, the outcomes' ``trace`` and
  ``wall_s`` (each rank's too), the trace's files: ``steps.jsonl`` holds the timings above; the tensor
  files' hashes are kept).

``REPROBISECT_REGEN_GOLDEN=1`` rewrites the golden files (only when a change of a trace is
intended, and said so in the change).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from reprobisect.workflows.capture import CaptureConfig, capture

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
CORPUS = EXAMPLES / "corpus"
GOLDEN = Path(__file__).resolve().parent / "golden" / "traces"
REGEN = os.environ.get("REPROBISECT_REGEN_GOLDEN") == "1"
ENV = {"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TF_DETERMINISTIC_OPS": "1",
       "CUDA_VISIBLE_DEVICES": ""}

_TIMING = {"data_wait_s", "record_s", "compute_s", "cuda_memory_allocated", "cuda_memory_reserved"}
_MANIFEST_DROP = {"environment", "revision", "command", "created", "recorder", "files"}

MLP = ["python", str(EXAMPLES / "mlp.py"), "--seed", "0", "--samples", "256", "--hidden", "32"]
TORCH_CASES: dict[str, tuple[list[str], dict[str, Any]]] = {
    # Adam, a DataLoader, dropout; step 1's full tensors kept (stored flags, the tensor file)
    "torch_adam_dataloader": (MLP, dict(steps=3, full_steps=(1,))),
    # hand-written SGD (p.data.add_), clip_grad_norm_, evaluation under no_grad: manual steps
    "torch_manual_sgd": (["python", str(CORPUS / "lstm_sgd.py")], dict(steps=3)),
    "torch_sentinel": (MLP, dict(steps=3, detail="sentinel")),
}
TF_CASES: dict[str, tuple[list[str], dict[str, Any]]] = {
    "keras_fit_graph": (["python", str(CORPUS / "keras_fit.py")], dict(steps=3)),
    "keras_fit_eager": (["python", str(CORPUS / "keras_fit.py"), "--eager", "1"], dict(steps=3)),
    "tf_tape_eager": (["python", str(CORPUS / "tf_tape.py"), "--deterministic", "1"], dict(steps=3)),
    "tf_tape_function": (["python", str(CORPUS / "tf_tape.py"), "--deterministic", "1", "--function", "1"],
                         dict(steps=3)),
}
LIGHTNING_CASES = {
    "lightning_valtest": (["python", str(CORPUS / "lightning_valtest.py"), "--max_steps", "3"], dict(steps=5)),
}
COMPILE_CASES = {
    "torch_compile_gpt": (["python", str(CORPUS / "gpt_compile.py"), "--deterministic", "1"], dict(steps=3)),
}


# -- the digest ------------------------------------------------------------------------------

def _record_line(r: dict[str, Any]) -> str:
    stats = r.get("stats")
    sh = hashlib.sha256(json.dumps(stats, sort_keys=True).encode()).hexdigest()[:16] if stats is not None else "-"
    extra = {k: r[k] for k in ("module", "inputs", "meta") if r.get(k) is not None}
    return (f"{r['order']} {r['kind']} {r['name']} {r['dtype']} {list(r['shape'])} {r['fingerprint']} "
            f"stored={r.get('stored')} stats={sh}" + (f" {json.dumps(extra, sort_keys=True)}" if extra else ""))


def _steps(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        s = json.loads(line)
        scalars = {k: v for k, v in (s.get("scalars") or {}).items() if k not in _TIMING}
        ids = s.get("batch_ids")
        out.append({
            "step": s["step"],
            "batch_ids": hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16] if ids is not None else None,
            "records": [_record_line(r) for r in s["records"]],
            "scalars": scalars,
            **{k: v for k, v in s.items() if k not in ("step", "batch_ids", "records", "scalars")},
        })
    return out


def _outcome(o: Any) -> Any:
    """An outcome less where and how long (the trace's path, the wall time, a traceback)."""
    if not isinstance(o, dict):
        return o
    return {k: v for k, v in o.items() if k not in ("trace", "wall_s", "traceback")}


def _manifest(path: Path) -> dict[str, Any]:
    m = json.loads((path / "manifest.json").read_text())
    out = {k: v for k, v in m.items() if k not in _MANIFEST_DROP}
    out["outcome"] = _outcome(out.get("outcome"))
    if isinstance(out.get("ranks"), list):  # a distributed run's top manifest: each rank's outcome
        out["ranks"] = [{**r, "outcome": _outcome(r.get("outcome"))} if isinstance(r, dict) else r
                        for r in out["ranks"]]
    files = m.get("files") or {}
    out["tensor_files"] = {k: v["sha256"] for k, v in sorted(files.items()) if k.startswith("tensors/")}
    return out


def digest(trace: Path) -> dict[str, Any]:
    """What is pinned of ``trace`` (one shard or, for a distributed run, every rank's)."""
    ranks = trace / "ranks"
    if ranks.is_dir():
        return {"ranks": {p.name: digest(p) for p in sorted(ranks.iterdir())}, "manifest": _manifest(trace)}
    return {"manifest": _manifest(trace), "steps": _steps(trace / "steps.jsonl")}


# -- captures --------------------------------------------------------------------------------

def _capture(tmp: Path, name: str, argv: list[str], cfg: dict[str, Any]) -> tuple[Path, Any]:
    work = tmp / name
    work.mkdir()
    r = capture(argv, work / "t.trace", CaptureConfig(quiet=True, timeout=600, env=ENV, **cfg), cwd=work)
    return work / "t.trace", r


def _capture_all(tmp: Path, cases: dict[str, tuple[list[str], dict[str, Any]]]) -> dict[str, tuple[Path, Any]]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        futs = {name: pool.submit(_capture, tmp, name, argv, cfg) for name, (argv, cfg) in cases.items()}
        return {name: f.result() for name, f in futs.items()}


def check(name: str, trace: Path, result: Any) -> None:
    assert result.outcome.status == "ok", (name, result.outcome, result.output_tail[-3000:])
    got = digest(trace)
    path = GOLDEN / f"{name}.json"
    if REGEN or not path.exists():
        if not REGEN:
            pytest.fail(f"no golden digest {path}: run with REPROBISECT_REGEN_GOLDEN=1 to write it")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        return
    want = json.loads(path.read_text())
    got = json.loads(json.dumps(got, sort_keys=True))
    if got != want:
        _explain(name, want, got)


def _explain(name: str, want: dict[str, Any], got: dict[str, Any]) -> None:
    """Fail naming the first difference (step and record line, then the manifest's keys)
    rather than two dumps."""
    if "ranks" in want:
        for rank in sorted(set(want["ranks"]) | set(got.get("ranks", {}))):
            _explain(f"{name} {rank}", want["ranks"].get(rank, {}), got.get("ranks", {}).get(rank, {}))
    ws, gs = want.get("steps", []), got.get("steps", [])
    assert len(ws) == len(gs), f"{name}: {len(gs)} steps, golden has {len(ws)}"
    for w, g in zip(ws, gs):
        for i, (a, b) in enumerate(zip(w["records"], g["records"])):
            assert a == b, f"{name} step {w['step']} record {i}:\n want {a}\n  got {b}"
        assert len(w["records"]) == len(g["records"]), f"{name} step {w['step']}: record count differs"
        assert w == g, f"{name} step {w['step']}:\n want {w}\n  got {g}"
    wm, gm = want.get("manifest", {}), got.get("manifest", {})
    diff = [k for k in sorted(set(wm) | set(gm)) if wm.get(k) != gm.get(k)]
    assert not diff, f"{name}: manifest differs at {diff}: want {[wm.get(k) for k in diff]}, got {[gm.get(k) for k in diff]}"


# -- fixtures: one set of captures per framework ---------------------------------------------

def _need(module: str) -> None:
    """Skip unless ``module`` is installed (looked up, not imported: the captures import it)."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")


@pytest.fixture(scope="module")
def torch_traces(tmp_path_factory):
    _need("torch")
    return _capture_all(tmp_path_factory.mktemp("golden-torch"), TORCH_CASES)


@pytest.fixture(scope="module")
def tf_traces(tmp_path_factory):
    _need("tensorflow")
    return _capture_all(tmp_path_factory.mktemp("golden-tf"), TF_CASES)


@pytest.fixture(scope="module")
def lightning_traces(tmp_path_factory):
    _need("lightning")
    return _capture_all(tmp_path_factory.mktemp("golden-lightning"), LIGHTNING_CASES)


@pytest.fixture(scope="module")
def compile_traces(tmp_path_factory):
    _need("torch")
    return _capture_all(tmp_path_factory.mktemp("golden-compile"), COMPILE_CASES)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ddp_trace(tmp_path_factory):
    _need("torch")
    d = tmp_path_factory.mktemp("golden-ddp")
    shutil.copy(CORPUS / "ddp_torchrun.py", d)
    argv = ["python", "-m", "torch.distributed.run", "--nproc_per_node", "2", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "ddp_torchrun.py"]
    r = capture(argv, d / "t.trace", CaptureConfig(quiet=True, timeout=600, env=ENV, steps=3), cwd=d)
    return d / "t.trace", r


# -- the tests -------------------------------------------------------------------------------

@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(TORCH_CASES))
def test_torch_trace_is_golden(torch_traces, name):
    check(name, *torch_traces[name])


@pytest.mark.parametrize("name", sorted(TF_CASES))
def test_tensorflow_trace_is_golden(tf_traces, name):
    check(name, *tf_traces[name])


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(LIGHTNING_CASES))
def test_lightning_trace_is_golden(lightning_traces, name):
    check(name, *lightning_traces[name])


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(COMPILE_CASES))
def test_torch_compile_trace_is_golden(compile_traces, name):
    check(name, *compile_traces[name])


@pytest.mark.slow
@pytest.mark.torch
def test_ddp_torchrun_trace_is_golden(ddp_trace):
    check("ddp_torchrun", *ddp_trace)


# -- the chain core the recorders share (framework-free, no capture) ---------------------------

def test_observers_run_in_rank_order_and_only_where_they_override_a_hook():
    """``flatten`` keeps, per hook, the observers that override it, by rank whatever order
    they were registered in; a name registered twice for one framework is refused."""
    from reprobisect.runners.chain import Observer, flatten, observer_classes, register_observer

    calls: list[str] = []

    class Late(Observer):
        def step_scalars(self, scalars):
            calls.append("late")
            scalars["late"] = len(scalars)

    class Early(Observer):
        def step_scalars(self, scalars):
            calls.append("early")
            scalars["early"] = len(scalars)

    class Quiet(Observer):
        pass

    fw = "golden-test-framework"
    register_observer(fw, "late", Late, rank=20)
    register_observer(fw, "quiet", Quiet, rank=5)
    register_observer(fw, "early", Early, rank=10)
    with pytest.raises(ValueError, match="observer 'early' of the golden-test-framework recorder is already"):
        register_observer(fw, "early", Early, rank=1)
    observers = [e.cls(None) for e in observer_classes(fw)]
    assert [type(o).__name__ for o in observers] == ["Quiet", "Early", "Late"]
    hooks = flatten(observers, "step_scalars")
    assert len(hooks) == 2 and flatten(observers, "after_step") == ()
    scalars: dict = {}
    for h in hooks:
        h(scalars)
    assert calls == ["early", "late"] and scalars == {"early": 0, "late": 1}


def test_the_shared_evaluation_summary_keeps_the_recorders_json():
    """One summary for both recorders: runs per phase, IDs fingerprinted in order, outputs
    combined; TF's runs whose IDs were not all known say no samples."""
    import numpy as np

    from reprobisect.runners.chain import EvalRuns, combine

    runs = EvalRuns()
    r = runs.run("no_grad", 3)
    r["forwards"] += 2
    r["batches"] += 1
    r["ids"].append(np.arange(4, dtype=np.int64))
    r["outputs"] += ["a", "b"]
    assert runs.run("no_grad", 3) is r  # the same phase goes on
    runs.run("validation", 0)["train_mode_layers"] = ["drop"]
    out = runs.take(list)
    assert runs.runs == [] and runs.cur is None
    assert list(out[0]) == ["phase", "after_step", "forwards", "batches", "samples", "ids_fingerprint",
                            "outputs_fingerprint", "outputs_fingerprinted"]
    assert out[0]["after_step"] == 2 and out[0]["samples"] == 4 and out[0]["outputs_fingerprint"] == combine(["a", "b"])
    assert out[1]["after_step"] is None and out[1]["train_mode_layers"] == ["drop"]
    tf_runs = EvalRuns(ids_known=True)
    t = tf_runs.run("evaluate", 1)
    t["ids"].append(np.arange(2, dtype=np.int64))
    t["ids_known"] = False
    assert tf_runs.take(list)[0]["samples"] is None
