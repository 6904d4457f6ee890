"""Op-level zoom (issue 3 item 6): the dispatch-mode recorder and the controller-side zoom."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from reprobisect.errors import UsageError
from reprobisect.trace import Record, TraceWriter, read_trace
from reprobisect.workflows.zoom import ZoomSide, first_divergent_op, run_zoom, zoom_target

PY = sys.executable

SCRIPT = textwrap.dedent(
    """
    import os, torch
    from torch import nn

    class Scale(nn.Module):
        def forward(self, x):
            y = x * 2
            # version B multiplies by a float that is not exactly 2 in float32
            return y * (2.0000002 if os.environ.get("TORCH_ZOOM_TEST_SWITCH") == "1" else 2.0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.scale = Scale()
            self.out = nn.Linear(4, 1)

        def forward(self, x):
            return self.out(self.scale(torch.relu(self.fc(x))))

    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(10):
        x = torch.randn(8, 4)
        loss = net(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    """
)


# -- the recorder, in process ---------------------------------------------------------

def _net():
    torch = pytest.importorskip("torch")
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            h = self.lin(x)
            h.add_(1.0)  # in place: its input fingerprint must be taken before it runs
            return h * 3

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()
            self.head = nn.Linear(3, 1)

        def forward(self, x):
            return self.head(self.block(self.block(x)))  # block called twice

    torch.manual_seed(0)
    return torch, Net()


def _train(torch, net, steps, on_step=None):
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for k in range(steps):
        loss = net(torch.randn(2, 3, generator=g)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if on_step:
            on_step(k)
    return opt


def test_zoom_records_each_op_of_the_module_at_the_step_only():
    torch, net = _net()
    from reprobisect.runners.fingerprint_torch import fingerprint
    from reprobisect.runners.zoom_torch import install_zoom

    zoom = install_zoom("block", 1)
    taken = {}
    try:
        _train(torch, net, 3, on_step=lambda k: taken.__setitem__(k, zoom.take()))
    finally:
        zoom.remove()
    assert taken[0] == [] and taken[2] == []
    recs = taken[1]
    names = [r.name for r in recs]
    # two calls of block, each: linear (t + addmm), add_, mul; occurrences count across calls
    assert names[:4] == ["block::aten.t.default#0", "block::aten.addmm.default#0",
                         "block::aten.add_.Tensor#0", "block::aten.mul.Tensor#0"]
    assert names.count("block::aten.mul.Tensor#1") == 1 and len(names) == 8
    assert all(r.kind == "activation" and r.meta["zoom"] for r in recs)
    addmm, add_, mul = recs[1], recs[2], recs[3]
    assert addmm.module == "block.lin" and add_.module == "block"
    assert add_.inputs == (addmm.fingerprint,)  # taken before the in-place add ran
    assert add_.fingerprint != addmm.fingerprint and mul.inputs == (add_.fingerprint,)
    assert mul.meta["args"] == [3] and add_.meta["args"] == ["1.0"]
    assert [r.meta["call"] for r in recs] == [0] * 4 + [1] * 4
    assert mul.stats is not None and mul.dtype == "float32" and mul.shape == (2, 3)
    # the chain holds: the second call's first op consumes the first call's output
    assert recs[5].inputs[1] == mul.fingerprint
    assert fingerprint(torch.zeros(1)) not in {r.fingerprint for r in recs}


def test_zoom_into_one_call_and_numerics_unchanged():
    torch, net = _net()
    from reprobisect.runners.fingerprint_torch import fingerprint
    from reprobisect.runners.zoom_torch import install_zoom

    state = {k: v.clone() for k, v in net.state_dict().items()}
    _train(torch, net, 2)
    plain = [fingerprint(p) for p in net.parameters()]
    net.load_state_dict(state)
    zoom = install_zoom("block#1", 0)
    try:
        _train(torch, net, 2)
        recs = zoom.take()
    finally:
        zoom.remove()
    assert [fingerprint(p) for p in net.parameters()] == plain  # observing changed nothing
    assert [r.name for r in recs] == ["block#1::aten.t.default#0", "block#1::aten.addmm.default#0",
                                      "block#1::aten.add_.Tensor#0", "block#1::aten.mul.Tensor#0"]
    assert {r.meta["call"] for r in recs} == {1}


def test_zoom_inside_the_step_recorder_skips_the_recorders_own_work(tmp_path):
    torch, net = _net()
    from reprobisect.runners.torch import RecordPolicy, TorchRecorder

    with TraceWriter(tmp_path / "t") as w:
        rec = TorchRecorder(w, RecordPolicy(steps=2, zoom_module="block", zoom_step=0)).install()
        try:
            _train(torch, net, 2)
        finally:
            rec.remove()
    t = read_trace(tmp_path / "t")  # still a valid trace
    ops = [r.name for r in t.step(0).records if "::" in r.name]
    assert len(ops) == 8 and all(n.startswith("block::aten.") for n in ops)
    assert not any("::" in r.name for r in t.step(1).records)
    # the zoomed module's own record and its last op agree: same bits
    by = t.step(0).by_key()
    assert by[("activation", "block")].fingerprint == by[("activation", "block::aten.mul.Tensor#0")].fingerprint


# -- first_divergent_op on written traces (no framework) -------------------------------

def _op(name, fp, inputs, args=(), module="m"):
    op, occ = name.split("::")[1].rsplit("#", 1)
    return Record(name=name, kind="activation", dtype="float32", shape=(2,), fingerprint=fp, inputs=tuple(inputs),
                  module=module, stats={"norm": 1.0}, meta={"zoom": True, "op": op, "occurrence": int(occ), "args": list(args)})


def _trace(path, ops, step=0):
    with TraceWriter(path) as w:
        w.begin_step(step)
        w.record(Record(name="m", kind="activation", dtype="float32", shape=(2,), fingerprint="out"))
        for r in ops:
            w.record(r)
        w.end_step()
    return read_trace(path)


def test_first_divergent_op_names_the_origin_not_the_propagation(tmp_path):
    a = _trace(tmp_path / "a", [_op("m::aten.mul.Tensor#0", "y", ["x"], [2]), _op("m::aten.mul.Tensor#1", "z", ["y"], ["2.0"]),
                                _op("m::aten.relu.default#0", "r", ["z"])])
    b = _trace(tmp_path / "b", [_op("m::aten.mul.Tensor#0", "y", ["x"], [2]), _op("m::aten.mul.Tensor#1", "Z", ["y"], ["2.0000002"]),
                                _op("m::aten.relu.default#0", "R", ["Z"])])
    r = first_divergent_op(a, b, "m", 0)
    assert not r and r.verdict == "origin"
    assert (r.op, r.occurrence, r.record) == ("aten.mul.Tensor", 1, "m::aten.mul.Tensor#1")
    assert (r.args_a, r.args_b) == (["2.0"], ["2.0000002"])
    assert "aten.mul.Tensor #1" in str(r) and "non-tensor arguments differ" in str(r)
    assert r.to_json()["verdict"] == "origin" and r.ops_a == 3
    assert first_divergent_op(a, a, "m", 0).verdict == "agree" and first_divergent_op(a, a, "m", 0)


def test_first_divergent_op_other_verdicts(tmp_path):
    base = [_op("m::aten.mul.Tensor#0", "y", ["x"]), _op("m::aten.relu.default#0", "r", ["y"])]
    a = _trace(tmp_path / "a", base)
    moved = _trace(tmp_path / "b", [_op("m::aten.mul.Tensor#0", "Y", ["X"]), _op("m::aten.relu.default#0", "R", ["Y"])])
    r = first_divergent_op(a, moved, "m", 0)
    assert r.verdict == "inputs_differ" and r.record == "m::aten.mul.Tensor#0" and "inputs or parameters" in r.detail
    other = _trace(tmp_path / "c", [_op("m::aten.mul.Tensor#0", "y", ["x"]), _op("m::aten.gelu.default#0", "g", ["y"])])
    r = first_divergent_op(a, other, "m", 0)
    assert r.verdict == "structure" and "aten.gelu.default#0 in B" in r.detail
    r = first_divergent_op(a, a, "nothere", 0)
    assert r.verdict == "not_run" and "no op of module 'nothere' recorded at step 0 on side A and B" in r.detail


def test_zoom_target_from_divergences():
    from types import SimpleNamespace as D

    assert zoom_target(D(kind="activation", name="enc.layers.1.attn#1[0]", step=4, localization="origin")) == ("enc.layers.1.attn#1", 4)
    assert zoom_target(D(kind="activation", name="enc.norm", step=2, localization="between_modules")) == ("enc", 2)
    assert zoom_target(D(kind="output", name="output", step=0, localization="first")) == ("", 0)
    with pytest.raises(UsageError, match="the divergence is a grad .* not a module output"):
        zoom_target(D(kind="grad", name="fc.weight", step=1, localization="first"))
    with pytest.raises(UsageError, match=r"initial parameter \('fc.weight'.*initialization itself differs"):
        zoom_target(D(kind="init", name="fc.weight", step=0, localization="first"))


# -- end to end: two versions of a script, through the launcher -----------------------

def _capture_both(tmp_path):
    """Record version A and version B (a TORCH_* variable set: the environment record keeps it), in parallel."""
    procs = [
        subprocess.Popen([PY, "-m", "reprobisect.runners.launch", "--trace", str(tmp_path / name), "--steps", "2", "--",
                          "train.py"], cwd=tmp_path, env={**os.environ, **env},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for name, env in (("a.trace", {}), ("b.trace", {"TORCH_ZOOM_TEST_SWITCH": "1"}))
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()[-2000:]
    return read_trace(tmp_path / "a.trace"), read_trace(tmp_path / "b.trace")


@pytest.mark.slow
def test_run_zoom_names_the_changed_mul(tmp_path):
    pytest.importorskip("torch")
    from reprobisect.core.compare import compare_traces

    (tmp_path / "train.py").write_text(SCRIPT)
    a, b = _capture_both(tmp_path)
    cmp = compare_traces(a, b)
    assert cmp.origin is not None and cmp.origin.name == "scale" and cmp.origin.step == 0
    assert b.manifest.environment["env_vars"]["TORCH_ZOOM_TEST_SWITCH"] == "1"
    # the re-run of B repeats the variable from B's environment record
    r = run_zoom(a, b, cmp, side_a=ZoomSide(env={"UNRELATED": "1"}), out_dir=str(tmp_path / "zoom"))
    assert r.verdict == "origin", str(r)
    assert (r.module, r.step, r.op, r.occurrence) == ("scale", 0, "aten.mul.Tensor", 1)
    assert (r.args_a, r.args_b) == (["2.0"], ["2.0000002"])
    assert read_trace(r.trace_a).manifest.policy["zoom_module"] == "scale"
    with pytest.raises(UsageError, match="working folder '/nonexistent' does not exist here"):
        run_zoom(a, b, module="scale", step=0, side_a=ZoomSide(cwd="/nonexistent"))


# -- "ran without ops" vs "did not run" (issue 9 item 5) ---------------------------------

def _passthrough_net():
    torch = pytest.importorskip("torch")
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)
            self.drop = nn.Dropout(p=0.0)  # runs, issues no aten op
            self.ident = nn.Identity()
            self.unused = nn.Linear(3, 3)  # never called

        def forward(self, x):
            return self.ident(self.drop(self.fc(x)))

    torch.manual_seed(0)
    return torch, Net()


def _zoom_trace(tmp_path, name, module):
    torch, net = _passthrough_net()
    from reprobisect.runners.torch import RecordPolicy, TorchRecorder

    with TraceWriter(tmp_path / name) as w:
        rec = TorchRecorder(w, RecordPolicy(steps=2, zoom_module=module, zoom_step=0)).install()
        try:
            _train(torch, net, 2)
        finally:
            rec.remove()
    return read_trace(tmp_path / name)


@pytest.mark.parametrize("module", ["drop", "ident"])
def test_a_module_that_ran_without_ops_is_not_called_not_run(tmp_path, module):
    t = _zoom_trace(tmp_path, module, module)
    marks = [r for r in t.step(0).records if r.meta and r.meta.get("zoom")]
    assert [(r.name, r.meta["ran"], r.meta["ops"]) for r in marks] == [(f"{module}@zoom-call#0", True, 0)]
    assert not any(r.meta and r.meta.get("zoom") for r in t.step(1).records)
    r = first_divergent_op(t, t, module, 0)
    assert r.verdict == "no_ops" and "ran at step 0 on both sides without issuing an op" in r.detail
    assert "did not run" not in str(r)


def test_a_module_that_did_not_run_is_said_so(tmp_path):
    t = _zoom_trace(tmp_path, "u", "unused")
    marks = [r for r in t.step(0).records if r.meta and r.meta.get("zoom")]
    assert [(r.name, r.meta["ran"]) for r in marks] == [("unused@zoom-not-run", False)]
    r = first_divergent_op(t, t, "unused", 0)
    assert r.verdict == "not_run" and "did not run at that step" in r.detail and "without issuing" not in r.detail


def test_ops_on_one_side_and_none_on_the_other_is_structure(tmp_path):
    a = _trace(tmp_path / "a", [_op("m::aten.mul.Tensor#0", "y", ["x"])])
    with TraceWriter(tmp_path / "b") as w:
        w.begin_step(0)
        w.record(Record(name="m", kind="activation", dtype="float32", shape=(2,), fingerprint="out"))
        w.record(Record(name="m@zoom-call#0", kind="activation", dtype="float32", shape=(0,), fingerprint="e",
                        meta={"zoom": True, "ran": True, "call": 0, "ops": 0}))
        w.end_step()
    r = first_divergent_op(a, read_trace(tmp_path / "b"), "m", 0)
    assert r.verdict == "structure" and "ran at step 0 on side B without issuing an op" in r.detail
