"""Complete state capture and restore (issue 3 item 3): bitwise resume in a fresh process."""

from __future__ import annotations

import json
import math
import pickle
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from reprobisect.errors import TraceError, UsageError  # noqa: E402
from reprobisect.runners import torch_state  # noqa: E402
from reprobisect.runners.torch_state import Stateful, capture_state, load_state, restore_state  # noqa: E402
from reprobisect.trace import TraceWriter, read_trace  # noqa: E402

PY = sys.executable

TRAIN = textwrap.dedent(
    '''
    import json, random, sys
    import numpy as np
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    from reprobisect.runners import torch_state
    from reprobisect.runners.fingerprint_torch import fingerprint
    from reprobisect.trace import TraceWriter

    mode, trace, capture_at, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    STEPS = 6
    torch_state.track_data_order()
    torch.set_num_threads(1)

    def build(seed):
        torch.manual_seed(seed); random.seed(seed); np.random.seed(seed)
        data = torch.Generator().manual_seed(123)
        ds = TensorDataset(torch.randn(20, 8, generator=data), torch.randn(20, 1, generator=data))
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
        g = torch.Generator().manual_seed(7)
        loader = DataLoader(ds, batch_size=6, shuffle=True, generator=g, num_workers=workers)
        return model, opt, sched, scaler, loader

    def fp(model):
        return fingerprint(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))

    # a fresh process that resumes builds its objects with ANOTHER seed: only restore can fix them
    model, opt, sched, scaler, loader = build(0 if mode == "full" else 99)
    objects = {"model": model, "optimizer": opt, "scheduler": sched, "scaler": scaler}
    out = {}
    step = 0
    if mode == "resume":
        st = torch_state.restore_state(trace, capture_at, objects, loader=loader)
        step = capture_at
        out["position"] = st["data"]["position"]
    else:
        writer = TraceWriter(trace, command=sys.argv)
    while step < STEPS:
        for x, y in loader:
            step += 1
            noise = torch.randn(()) * random.random() * float(np.random.rand()) * 1e-2
            loss = ((model(x) - y) ** 2).mean() + noise
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            sched.step()
            out[step] = [fp(model), x[:, 0].tolist()]
            if mode == "full" and step == capture_at:
                torch_state.capture_state(writer, step, objects, loader=loader)
            if step == STEPS:
                break
    if mode == "full":
        writer.close()
    print("RESULT " + json.dumps(out))
    '''
)


def _run(script: Path, *args) -> dict:
    r = subprocess.run([PY, str(script), *map(str, args)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.mark.parametrize(
    "capture_at,workers",
    [(3, 0), pytest.param(4, 0, marks=pytest.mark.slow), pytest.param(3, 2, marks=pytest.mark.slow)],
    ids=["mid-epoch", "epoch-end", "mid-epoch-2-workers"],
)
def test_restore_in_fresh_process_continues_bitwise(tmp_path, capture_at, workers):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    trace = tmp_path / "run.trace"
    full = _run(script, "full", trace, capture_at, workers)
    assert read_trace(trace).complete
    resumed = _run(script, "resume", trace, capture_at, workers)
    assert resumed["position"]["epoch"] == 0
    assert resumed["position"]["batches"] == capture_at and resumed["position"]["exact"] is True
    for k in range(capture_at + 1, 7):
        assert resumed[str(k)][1] == full[str(k)][1], f"step {k}: a different batch"
        assert resumed[str(k)][0] == full[str(k)][0], f"step {k}: parameters differ"
    # and the check has teeth: the steps before the capture are not what a seed-99 build gives
    assert str(capture_at) not in resumed


class Box:
    """A Stateful that is none of the known classes, with awkward nested state."""

    def __init__(self):
        self.s = {}

    def state_dict(self):
        return self.s

    def load_state_dict(self, sd):
        self.s = sd


def _awkward_state():
    return {
        "ints": {0: {"exp_avg": torch.arange(6, dtype=torch.float32).reshape(2, 3)}, 1: {}},
        "groups": [{"params": [0, 1], "lr": 0.1, "betas": (0.9, 0.999), "name": None}],
        "bf16": torch.tensor([1.5, -2.25], dtype=torch.bfloat16),
        "scalar": torch.tensor(3.0),
        "nan": math.nan,
        "inf": -math.inf,
        "np": np.arange(4, dtype=np.uint32),
        "npscalar": np.float64(0.5),
        "dtype": torch.float16,
        "size": torch.Size([2, 3]),
        "param": torch.nn.Parameter(torch.ones(2)),
    }


def test_nested_state_round_trips_through_safetensors_and_json(tmp_path):
    box = Box()
    box.s = _awkward_state()
    assert isinstance(box, Stateful) and not isinstance(object(), Stateful)
    with TraceWriter(tmp_path / "t") as w:
        capture_state(w, 2, {"box": box, "note": "not stateful"})
    files = sorted(p.name for p in (tmp_path / "t" / "state" / "step-2").iterdir())
    assert files == ["box.json", "box.safetensors", "rng.json", "rng.safetensors"]
    # the skeleton is plain, readable JSON; tensors are named by their path in the state
    skel = json.loads((tmp_path / "t" / "state" / "step-2" / "box.json").read_text())
    assert skel["state"]["groups"][0]["lr"] == 0.1
    from reprobisect.trace import shards

    assert "box/ints/0/exp_avg" in shards.keys(tmp_path / "t" / "state" / "step-2" / "box.safetensors")

    got = load_state(tmp_path / "t", 2)["box"]
    want = _awkward_state()
    assert set(got) == set(want)
    assert torch.equal(got["ints"][0]["exp_avg"], want["ints"][0]["exp_avg"]) and got["ints"][1] == {}
    assert got["groups"] == [{"params": [0, 1], "lr": 0.1, "betas": (0.9, 0.999), "name": None}]
    assert got["bf16"].dtype == torch.bfloat16 and torch.equal(got["bf16"], want["bf16"])
    assert got["scalar"].shape == () and got["scalar"].item() == 3.0
    assert math.isnan(got["nan"]) and got["inf"] == -math.inf
    assert isinstance(got["np"], np.ndarray) and got["np"].dtype == np.uint32 and got["np"].tolist() == [0, 1, 2, 3]
    assert got["npscalar"] == 0.5 and got["dtype"] is torch.float16 and got["size"] == (2, 3)
    assert got["param"].requires_grad

    fresh = Box()
    restore_state(tmp_path / "t", 2, {"box": fresh})
    assert torch.equal(fresh.s["bf16"], want["bf16"])


def test_a_tensor_that_needs_a_copy_is_copied_once_into_memory_numpy_owns():
    """A strided, conjugated or device tensor is copied once, into an array that owns its
    memory, which the writer hands to its background thread without copying it again; a
    contiguous CPU tensor is a view (the writer copies what it keeps)."""
    import ml_dtypes

    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    view = torch_state._to_numpy(base, "w")
    assert not view.flags.owndata and np.shares_memory(view, base.numpy())
    cases = {
        "transposed": (base.t(), base.t().contiguous().numpy()),
        "bf16 strided": (base.to(torch.bfloat16)[:, ::2], base[:, ::2].numpy().astype(ml_dtypes.bfloat16)),
        "conjugated": (torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64).conj(),
                       np.array([1 - 2j, 3 + 1j], dtype=np.complex64)),
    }
    for what, (t, want) in cases.items():
        a = torch_state._to_numpy(t, what)
        assert a.flags.owndata and a.flags.c_contiguous, what
        assert a.dtype == want.dtype and a.shape == want.shape and np.array_equal(a, want), what
    with TraceWriter(Path(tempfile.mkdtemp()) / "t") as w:  # kept as it is: no second copy
        a = torch_state._to_numpy(base.t(), "w")
        w.write_state(0, "m", {"w": a}, {})
        assert w._state_jobs and not w._state_lent


def test_rng_sources_round_trip_and_missing_sources_are_tolerated():
    import random

    state = torch_state.capture_rng()
    assert {"python", "numpy", "torch"} <= set(state)
    a = (random.random(), float(np.random.rand()), torch.rand(3))
    torch_state.restore_rng(state)
    b = (random.random(), float(np.random.rand()), torch.rand(3))
    assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])
    torch_state.restore_rng({"torch": state["torch"]})  # only one source: the others untouched
    assert torch.equal(torch.rand(3), a[2])


def test_unpicklable_state_is_a_clear_error_naming_the_key(tmp_path):
    box = Box()
    box.s = {"ok": 1, "inner": {"fn": lambda: 0}}
    with TraceWriter(tmp_path / "t") as w:
        with pytest.raises(UsageError, match=r"cannot capture state 'box/inner/fn': a function is not a tensor"):
            capture_state(w, 0, {"box": box})
        with pytest.raises(UsageError, match="state object name 'rng' is not usable"):
            capture_state(w, 0, {"rng": Box()})


def test_restore_errors_name_the_step_and_the_objects(tmp_path):
    with TraceWriter(tmp_path / "t") as w:
        capture_state(w, 1, {"box": Box()})
    with pytest.raises(TraceError, match=r"no state at step 5 \(states at: step-1\); capture with --state-steps 5"):
        load_state(tmp_path / "t", 5)
    with pytest.raises(TraceError, match=r"no captured state for 'optimizer' at step 1 \(captured: box\)"):
        restore_state(tmp_path / "t", 1, {"box": Box(), "optimizer": Box()})


def test_state_loads_with_pickle_forbidden(tmp_path, monkeypatch):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    with TraceWriter(tmp_path / "t") as w:
        capture_state(w, 0, {"model": model, "optimizer": opt})

    def forbidden(*a, **k):
        raise AssertionError("pickle used while loading state")

    for mod, name in ((pickle, "loads"), (pickle, "load"), (pickle, "Unpickler"), (torch, "load")):
        monkeypatch.setattr(mod, name, forbidden)
    monkeypatch.setattr(np, "load", forbidden)
    m2 = torch.nn.Linear(3, 2)
    o2 = torch.optim.Adam(m2.parameters())
    restore_state(tmp_path / "t", 0, {"model": m2, "optimizer": o2})
    assert torch.equal(m2.weight, model.weight)
    assert torch.equal(o2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    assert o2.state_dict()["param_groups"] == opt.state_dict()["param_groups"]


def test_no_pickle_in_the_state_code():
    src = Path(torch_state.__file__).read_text()
    code = "\n".join(ln for ln in src.splitlines() if not ln.lstrip().startswith(("#", '"', "'")))
    assert not re.search(r"\bimport pickle\b|pickle\.|torch\.load\(|allow_pickle", code)


def test_tampered_state_is_refused(tmp_path):
    box = Box()
    box.s = {"w": torch.ones(4)}
    with TraceWriter(tmp_path / "t") as w:
        capture_state(w, 0, {"box": box})
    f = tmp_path / "t" / "state" / "step-0" / "box.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    with pytest.raises(TraceError, match="modified after it was sealed"):
        load_state(tmp_path / "t", 0)


RESUMABLE = textwrap.dedent(
    '''
    import os, random
    import numpy as np
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    resume = os.environ.get("RESUME_FROM")
    seed = 99 if resume else 0  # the resumed run starts from other weights: only restore fixes them
    torch.manual_seed(seed); random.seed(seed); np.random.seed(seed)
    data = torch.Generator().manual_seed(123)
    ds = TensorDataset(torch.randn(20, 8, generator=data), torch.randn(20, 1, generator=data))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    loader = DataLoader(ds, batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(7))
    if resume:
        import reprobisect.torch as rt
        rt.restore_state(resume, int(os.environ["RESUME_STEP"]),
                         {"model": model, "optimizer": opt, "scheduler": sched, "scaler": scaler}, loader=loader)
    while True:
        for x, y in loader:
            noise = torch.randn(()) * random.random() * float(np.random.rand()) * 1e-2
            loss = ((model(x) - y) ** 2).mean() + noise
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            sched.step()
    '''
)


@pytest.mark.slow
def test_launcher_state_capture_resumes_into_a_bitwise_identical_trace(tmp_path):
    """Issue 3 item 3 end to end: capture at step 2 under the launcher (6 steps), resume in a
    fresh process from that state, and the resumed trace equals steps 3-5 record by record."""
    import os

    (tmp_path / "train.py").write_text(RESUMABLE)

    def launch(trace, steps, extra_args=(), env=None):
        r = subprocess.run([PY, "-m", "reprobisect.runners.launch", "--trace", str(trace), "--steps", str(steps),
                            *extra_args, "--", "train.py"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300, env={**os.environ, **(env or {})})
        assert r.returncode == 0, r.stderr[-3000:]
        return read_trace(trace)

    full = launch(tmp_path / "full.trace", 6, ["--state-steps", "2"])
    assert sorted(load_state(full, 2)) == ["data", "model", "optimizer", "rng", "scaler", "scheduler"]
    resumed = launch(tmp_path / "resumed.trace", 3, env={"RESUME_FROM": str(full.path), "RESUME_STEP": "2"})
    for k in range(3):
        a, b = full.step(3 + k), resumed.step(k)
        assert a.batch_ids == b.batch_ids, f"step {3 + k}: other batch"
        fa = [(r.kind, r.name, r.fingerprint) for r in a.records]
        fb = [(r.kind, r.name, r.fingerprint) for r in b.records if r.kind != "init"]  # the restored params
        assert len(fa) > 20 and fa == fb, f"step {3 + k}: records differ"
        assert a.scalars["lr"] == b.scalars["lr"] and a.scalars["scaler_scale"] == b.scalars["scaler_scale"]


def test_capture_from_inside_optimizer_step_waits_for_the_iteration_boundary(tmp_path):
    """A step hook sees the state before scheduler.step(): the capture waits for the next batch."""
    from torch.utils.data import DataLoader, TensorDataset

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    loader = DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=1)
    torch_state.track_data_order()  # the launcher installs it before the script runs
    folder = tmp_path / "t" / "state" / "step-0"
    with TraceWriter(tmp_path / "t") as w:
        seen = {}

        def hook(o, args, kwargs):
            if not seen:
                seen["at"] = True
                capture_state(w, 0, {"optimizer": opt, "scheduler": sched}, loader=loader)

        from torch.optim.optimizer import register_optimizer_step_post_hook

        handle = register_optimizer_step_post_hook(hook)
        try:
            it = iter(loader)
            (x,) = next(it)
            model(x).sum().backward()
            opt.step()
            assert not folder.exists()  # deferred: still inside the iteration
            sched.step()
            next(it)  # the next batch: the capture happens before it is fetched
            assert folder.is_dir()
        finally:
            handle.remove()
        capture_state(w, 1, {"scheduler": sched}, when="now")
        assert (tmp_path / "t" / "state" / "step-1").is_dir()
    st = load_state(tmp_path / "t", 0)
    assert st["optimizer"]["param_groups"][0]["lr"] == 0.5 and st["scheduler"]["last_epoch"] == 1
    assert st["data"]["position"]["batches"] == 1
