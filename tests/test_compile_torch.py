"""Recording under ``torch.compile`` (inductor on CPU) and the recorder's own error messages.

A tiny nanoGPT-style script (2 layers, d=32, vocab 64, seq 16; ``(logits, loss)``; an
``estimate_loss()`` pass under ``no_grad`` in eval mode before training; AdamW), recorded
through the launcher eagerly, compiled whole (``torch.compile(model)``), per block
(``h[i] = torch.compile(block)``) and with ``block.compile()``; and ``bisect envs`` with
``TORCH_COMPILE_DISABLE=1`` vs ``0``. The compiled runs share one module-scoped set of
traces (inductor compiles take tens of seconds on a small CPU).
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

from reprobisect.core.compare import compare_paths, compare_traces, Tolerance
from reprobisect.trace import TraceWriter, read_trace, record_array

PY = sys.executable

GPT = '''
import json, os, sys, torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
# compiled on CPU, the embedding backward adds in a thread-dependent order; deterministic
# mode makes two runs bitwise equal, so "with vs without the recorder" compares numerics only
torch.use_deterministic_algorithms(True)
V, D, T, L, H = 64, 32, 16, 2, 2


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(D, 3 * D)
        self.c_proj = nn.Linear(D, D)

    def forward(self, x):
        B, T_, C = x.shape
        q, k, v = (t.view(B, T_, H, C // H).transpose(1, 2) for t in self.c_attn(x).split(D, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T_, C))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(D), Attn(), nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(V, D), wpe=nn.Embedding(T, D),
            h=nn.ModuleList([Block() for _ in range(L)]), ln_f=nn.LayerNorm(D)))
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, V), targets.reshape(-1))
        return logits, loss


mode = sys.argv[1]
model = GPT()
if mode == "whole":
    model = torch.compile(model)
elif mode == "blocks":
    for i, block in enumerate(model.transformer.h):
        model.transformer.h[i] = torch.compile(block)
elif mode == "rootmethod":
    model.compile()
elif mode == "method":
    for block in model.transformer.h:
        block.compile()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.randint(0, V, (64, T + 1), generator=torch.Generator().manual_seed(1))


def get_batch(i):
    d = data[i * 4:(i + 1) * 4]
    return d[:, :-1], d[:, 1:]


@torch.no_grad()
def estimate_loss():
    model.eval()
    _, loss = model(*get_batch(10))
    model.train()
    return loss.item()


print("eval", estimate_loss())
for it in range(2):
    logits, loss = model(*get_batch(it))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()

if os.environ.get("REPORT"):  # numerics and dynamo's counters, for the observer checks
    import hashlib
    from torch._dynamo.utils import counters
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    out = {"params": h.hexdigest(), "loss": loss.item(), "graph_breaks": sum(counters["graph_break"].values()),
           "unique_graphs": counters["stats"]["unique_graphs"]}
    flag = os.environ.get("TORCH_COMPILE_DISABLE", "unset")
    with open(os.environ["REPORT"] + "-" + flag + ".json", "w") as f:
        json.dump(out, f)
'''


def _launch(tmp: Path, name: str, mode: str, *, env: dict | None = None, steps: int = 3):
    trace = tmp / f"{name}.trace"
    cmd = [PY, "-m", "reprobisect.runners.launch", "--trace", str(trace), "--steps", str(steps), "--",
           str(tmp / "gpt.py"), mode]
    r = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})
    return r, trace


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Eager, compiled whole / per block / block.compile() traces, the bisect-envs pair
    (TORCH_COMPILE_DISABLE=1 vs 0, full tensors kept) and the compiled numerics with and
    without the recorder. The script runs 2 steps under --steps 3: it ends by itself, so
    its own end-of-run report is written."""
    tmp = tmp_path_factory.mktemp("compile")
    (tmp / "gpt.py").write_text(GPT)
    out: dict = {"tmp": tmp}
    for name, mode in (("eager", "eager"), ("blocks", "blocks"), ("method", "method"), ("rootmethod", "rootmethod")):
        r, trace = _launch(tmp, name, mode)
        out[name] = (r, trace)
    rep = str(tmp / "recorded")
    envs = subprocess.run(
        [PY, "-m", "reprobisect", "envs", "-q", "--steps", "3", "--full-steps", "0,1", "--tolerance", "default",
         "--a", "env.TORCH_COMPILE_DISABLE=1", "--b", "env.TORCH_COMPILE_DISABLE=0", "-o", str(tmp / "envs"),
         "--", "python", str(tmp / "gpt.py"), "whole"],
        cwd=tmp, capture_output=True, text=True, timeout=900, env={**os.environ, "REPORT": rep})
    out["envs"] = envs
    plain = subprocess.run([PY, str(tmp / "gpt.py"), "whole"], cwd=tmp, capture_output=True, text=True, timeout=600,
                           env={**os.environ, "REPORT": str(tmp / "plain"), "TORCH_COMPILE_DISABLE": "0"})
    assert plain.returncode == 0, plain.stderr[-3000:]
    out["report_plain"] = json.loads((tmp / "plain-0.json").read_text())
    out["report_recorded"] = json.loads((tmp / "recorded-0.json").read_text())
    out["envs_traces"] = sorted(p for p in (tmp / "envs").iterdir() if (p / "manifest.json").is_file())
    return out


def _names(trace) -> list[set[tuple[str, str]]]:
    return [{(r.kind, r.name) for r in s.records} for s in trace.steps]


def _tensor(trace, step: int, kind: str, name: str) -> np.ndarray:
    rec = next(r for r in trace.step(step).records if (r.kind, r.name) == (kind, name))
    arr = trace.tensor(step, rec)
    assert arr is not None, f"{kind} {name} not stored at step {step}"
    return arr


def _compile_env(trace) -> dict:
    return trace.manifest.environment["torch"]["compile"]


def _envs_pair(runs):
    by_flag = {}
    for p in runs["envs_traces"]:
        t = read_trace(p)
        by_flag[t.manifest.environment["env_vars"]["TORCH_COMPILE_DISABLE"]] = t
    return by_flag["1"], by_flag["0"]


@pytest.mark.slow
def test_compiled_gpt_records_ok_with_the_eager_names(runs) -> None:
    """nanoGPT style (whole-model compile, no_grad eval first, AdamW): ``ok``, every record
    named as in the eager trace (no ``_orig_mod``), the trace saying it ran compiled."""
    envs = runs["envs"]
    assert envs.returncode in (0, 1), envs.stdout[-3000:] + envs.stderr[-3000:]
    eager_r, eager_path = runs["eager"]
    assert eager_r.returncode == 0, eager_r.stderr[-3000:]
    eager = read_trace(eager_path)
    assert _compile_env(eager)["mode"] == "eager"
    disabled, whole = _envs_pair(runs)
    assert whole.manifest.outcome["status"] == "ok" and len(whole.steps) == 2
    env = _compile_env(whole)
    assert env["mode"] == "compiled" and env["backend"] == "inductor"
    assert env["regions"] == [{"module": "", "class": "GPT", "how": "torch.compile(module)", "ran": "compiled",
                               "backend": "inductor"}]
    assert env["unobserved"] == ["*"] and "activations inside compiled regions are not recorded" in env["note"]
    assert any("not recorded" in n for n in whole.manifest.extra.get("notes", []))
    for names_c, names_e in zip(_names(whole), _names(eager)):
        assert names_c <= names_e  # the same names, for every record it holds
        assert not any("_orig_mod" in n for _, n in names_c)
        assert names_e - names_c == {x for x in names_e if x[0] == "activation"}  # only activations are missing
    kinds = {k for k, _ in _names(whole)[0]}
    assert {"input", "output", "loss", "grad", "param", "optim_state"} <= kinds
    # TORCH_COMPILE_DISABLE=1: the same torch.compile(model) call runs eagerly, and records
    # exactly what the eager script does (the wrapper's and the model's hooks counted once)
    assert _compile_env(disabled)["mode"] == "eager" and _compile_env(disabled)["disabled_by"] == ["TORCH_COMPILE_DISABLE=1"]
    assert _names(disabled) == _names(eager)
    assert compare_traces(disabled, eager, Tolerance(mode="bitwise"))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["blocks", "method"])
def test_per_module_compile_records_around_the_compiled_blocks(runs, mode: str) -> None:
    """``h[i] = torch.compile(block)``: each block's own output is recorded (outside its
    region, named ``transformer.h.0``, class ``Block``), not what runs inside it;
    ``block.compile()``: the block is called compiled, so neither is."""
    r, path = runs[mode]
    assert r.returncode == 0, r.stderr[-3000:]
    t = read_trace(path)
    eager = read_trace(runs["eager"][1])
    env = _compile_env(t)
    how = "torch.compile(module)" if mode == "blocks" else "module.compile()"
    assert env["mode"] == "compiled"
    assert [(x["module"], x["class"], x["how"], x["ran"]) for x in env["regions"]] == [
        (f"transformer.h.{i}", "Block", how, "compiled") for i in range(2)]
    acts = [(rec.name, rec.module) for rec in t.steps[0].records if rec.kind == "activation"]
    blocks = [("transformer.h.0", "Block"), ("transformer.h.1", "Block")]
    outside = [("transformer.wte", "Embedding"), ("transformer.wpe", "Embedding")]
    tail = [("transformer.ln_f", "LayerNorm"), ("lm_head", "Linear")]
    assert acts == outside + (blocks if mode == "blocks" else []) + tail
    for names_c, names_e in zip(_names(t), _names(eager)):
        assert names_c <= names_e and not any("_orig_mod" in n for _, n in names_c)
    # compare names what differs, never the activations the compiled side could not hold
    c = compare_traces(eager, t, Tolerance(mode="default"))
    assert all(d.verdict != "missing" for d in (c.first, *c.next) if d is not None), str(c)
    assert "under torch.compile" in c.note


@pytest.mark.slow
def test_model_compile_of_the_whole_model_keeps_the_parameter_names(runs) -> None:
    """``model.compile()``: the model is called compiled, so none of its forward hooks fires
    eagerly; parameters still carry the model's names, and the trace says that the
    model's inputs and outputs are not recorded (compare does not call them missing)."""
    r, path = runs["rootmethod"]
    assert r.returncode == 0, r.stderr[-3000:]
    t, eager = read_trace(path), read_trace(runs["eager"][1])
    env = _compile_env(t)
    assert [(x["module"], x["how"], x["ran"]) for x in env["regions"]] == [("", "module.compile()", "compiled")]
    assert env["unobserved"] == ["*", "<input>", "<output>"]
    assert any("inputs and outputs are not recorded" in n for n in t.manifest.extra["notes"])
    names = _names(t)[0]
    assert {k for k, _ in names} == {"init", "loss", "grad", "param", "optim_state"}
    assert names == {x for x in _names(eager)[0] if x[0] in ("init", "loss", "grad", "param", "optim_state")}
    c = compare_traces(eager, t, Tolerance(mode="default"))
    assert all(d.verdict != "missing" for d in (c.first, *c.next) if d is not None), str(c)


@pytest.mark.slow
def test_recording_a_compiled_model_changes_neither_numerics_nor_graphs(runs) -> None:
    """Observers observe: the compiled run's parameters and loss are bitwise those of the
    same run without the recorder, with the same graphs and no added graph break (the
    hooks trace to nothing inside the compiled region)."""
    plain, recorded = runs["report_plain"], runs["report_recorded"]
    assert recorded == plain
    assert plain["graph_breaks"] == 0


@pytest.mark.slow
def test_envs_compile_disabled_vs_compiled_names_the_first_difference(runs) -> None:
    """``bisect envs --a env.TORCH_COMPILE_DISABLE=1 --b env.TORCH_COMPILE_DISABLE=0``: the
    environment difference is said, the activations only the eager side holds are a note,
    not a ``missing`` divergence, and the answer agrees with the stored tensors."""
    envs = runs["envs"]
    out = envs.stdout
    assert "TORCH_COMPILE_DISABLE" in out and "torch.compile.mode" in out
    assert "missing" not in out and "under torch.compile" in out
    disabled, whole = _envs_pair(runs)
    c = compare_traces(disabled, whole, Tolerance(mode="default"))
    assert (envs.returncode == 0) == bool(c)
    firsts = [d for d in (c.first, *c.next) if d is not None]
    assert all(d.kind != "activation" and d.verdict not in ("missing", "shape", "dtype") for d in firsts)
    # the loss of step 0 as the recorder stored it, checked here independently of compare
    la = _tensor(disabled, 0, "loss", "loss")
    lb = _tensor(whole, 0, "loss", "loss")
    close = np.allclose(la, lb, atol=1e-5, rtol=1.3e-6)
    loss_verdicts = [d for d in firsts if (d.step, d.kind) == (0, "loss")]
    assert close == (not loss_verdicts)
    if c.first is not None:  # the first named difference really exceeds the float32 tolerance
        d = c.first
        xa, xb = _tensor(disabled, d.step, d.kind, d.name), _tensor(whole, d.step, d.kind, d.name)
        assert not np.allclose(xa, xb, atol=1e-5, rtol=1.3e-6)


STEP = """
import os, sys, torch
from torch import nn
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.Adam(m.parameters(), lr=0.1)
x, y = torch.randn(16, 4), torch.randn(16, 1)


@torch.compile(backend="eager")
def train_step():
    opt.zero_grad()
    loss = ((m(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    return loss


for i in range(3):
    train_step()
if len(sys.argv) > 1:
    import hashlib
    from torch._dynamo.utils import counters
    h = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in m.parameters())).hexdigest()
    open(sys.argv[1], "w").write(f"{h} {counters['stats']['unique_graphs']}")
"""


@pytest.mark.slow
def test_a_training_step_compiled_whole_is_recorded_at_its_step_hooks(tmp_path: Path) -> None:
    """``torch.compile(train_step)`` with backward and ``optimizer.step()`` inside: the
    optimizer hooks run eagerly behind a graph break (else the run would end ``no_steps``),
    parameters carry the model's names, the model's inputs/outputs are declared not
    recorded, and the parameters are bitwise those of the run without the recorder."""
    script = tmp_path / "step.py"
    script.write_text(STEP)
    trace = tmp_path / "t"
    r = subprocess.run([PY, "-m", "reprobisect.runners.launch", "--trace", str(trace), "--steps", "5", "--",
                        str(script), str(tmp_path / "rec.txt")], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    plain = subprocess.run([PY, str(script), str(tmp_path / "plain.txt")], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert (tmp_path / "rec.txt").read_text() == (tmp_path / "plain.txt").read_text()
    t = read_trace(trace)
    assert len(t.steps) == 3
    assert [(r.kind, r.name) for r in t.steps[0].records if r.kind in ("loss", "param")] == [
        ("loss", "loss"), ("param", "0.weight"), ("param", "0.bias"), ("param", "2.weight"), ("param", "2.bias")]
    assert {r.kind for r in t.steps[0].records} == {"init", "loss", "grad", "param", "optim_state"}
    env = _compile_env(t)
    assert env["mode"] == "compiled" and env["unobserved"] == ["*", "<input>", "<output>"]
    assert env["regions"][0]["function"] == "train_step" and "function train_step" in env["note"]
    # the recorder's stop (a BaseException from the optimizer hook) leaves the compiled step cleanly
    r = subprocess.run([PY, "-m", "reprobisect.runners.launch", "--trace", str(tmp_path / "t2"), "--steps", "2", "--",
                        str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and len(read_trace(tmp_path / "t2").steps) == 2, r.stderr[-3000:]


# --------------------------------------------------------------------- fast checks


def test_a_forward_that_raises_is_the_programs_crash_not_infra(tmp_path: Path) -> None:
    """PyTorch calls an ``always_call`` forward hook as ``(module, args, result)`` when the
    forward raised; the recorder took that for its own failure (a TypeError) and ended the
    run as ``infra``, hiding the program's error."""
    p = tmp_path / "bad.py"
    p.write_text(textwrap.dedent("""
        import torch
        from torch import nn
        class Bad(nn.Module):
            def __init__(self):
                super().__init__()
                self.l = nn.Linear(4, 1)
            def forward(self, x):
                if x.shape[0] == 3:
                    raise ValueError("bad batch size 3")
                return self.l(x)
        m = Bad()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for n in (4, 3):
            opt.zero_grad()
            m(torch.randn(n, 4)).sum().backward()
            opt.step()
    """))
    trace = tmp_path / "t"
    r = subprocess.run([PY, "-m", "reprobisect.runners.launch", "--trace", str(trace), "--steps", "5", "--", str(p)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert r.returncode == 3, r.stderr[-2000:]
    o = read_trace(trace, allow_incomplete=True).manifest.outcome
    assert o["status"] == "crashed" and o["detail"] == "ValueError: bad batch size 3" and o["step"] == 1
    assert "TypeError" not in r.stderr


def test_the_recorders_failure_message_shows_its_first_cause(tmp_path: Path) -> None:
    """A secondary error raised while handling the original one (a cleanup path) must not
    hide it: the message names the original, first line only, then the secondary."""
    import torch  # noqa: F401

    from reprobisect.runners.torch import RecordPolicy, TorchRecorder

    rec = TorchRecorder(TraceWriter(tmp_path / "t"), RecordPolicy(steps=1))
    try:
        try:
            raise AssertionError("UnspecializedNNModuleVariable(GPT) is already tracked for mutation.\nlong details")
        except AssertionError:
            raise TypeError("TorchRecorder._fwd() missing 1 required positional argument: 'output'")
    except TypeError as e:
        stop = rec._internal_error("_fwd", e)
    assert stop.reason == "recorder_error"
    assert ("fwd: AssertionError: UnspecializedNNModuleVariable(GPT) is already tracked for mutation. (then TypeError: "
            "TorchRecorder._fwd() missing 1 required positional argument: 'output')") in stop.detail
    assert "long details" not in stop.detail
    rec2 = TorchRecorder(TraceWriter(tmp_path / "t2"), RecordPolicy(steps=1))
    try:
        raise RuntimeError("alone")
    except RuntimeError as e:
        assert "(opt_post: RuntimeError: alone)" in rec2._internal_error("_opt_post", e).detail


def test_a_compile_error_inside_the_recorders_code_is_infra() -> None:
    """Dynamo names the user-code frames it was tracing; one in the recorder's own files
    means torch.compile failed on reprobisect's hooks: infra, with that error's first line."""
    import torch._dynamo.exc as dexc

    from reprobisect.runners import launch

    here = Path(launch.__file__).parent
    ours = dexc.InternalTorchDynamoError(
        "UnspecializedNNModuleVariable(GPT) is already tracked for mutation.\n\nfrom user code:\n"
        f'   File "{here / "torch.py"}", line 611, in _fwd\n')
    try:
        try:
            raise ours
        except dexc.InternalTorchDynamoError:
            raise TypeError("secondary")
    except TypeError as e:
        assert launch._compile_traced_recorder(e) == (
            "InternalTorchDynamoError: UnspecializedNNModuleVariable(GPT) is already tracked for mutation.")
    theirs = dexc.Unsupported('graph break\n\nfrom user code:\n   File "/home/u/train.py", line 3, in forward\n')
    assert launch._compile_traced_recorder(theirs) is None
    assert launch._compile_traced_recorder(ValueError(str(here))) is None


def test_user_path_and_unwrap() -> None:
    import torch
    from torch import nn

    from reprobisect.runners.compile_torch import unwrap, user_path

    assert user_path("transformer.h.0._orig_mod.attn.c_attn.weight") == "transformer.h.0.attn.c_attn.weight"
    assert user_path("_orig_mod.lm_head.weight") == "lm_head.weight"
    assert user_path("my_orig_mod.x") == "my_orig_mod.x"
    m = nn.Linear(2, 2)
    assert unwrap(m) is m
    assert unwrap(torch.compile(m, backend="eager")) is m


ENV = {"device": "cpu", "host": {"hostname": "h"}}


def _trace(path: Path, names: list[str], env: dict) -> Path:
    with TraceWriter(path, command=["python", "train.py"], environment=env) as w:
        w.begin_step(0)
        for name in names:
            a = np.ones(3, np.float32)
            w.record(record_array(name, "activation", a, module="M"), a)
        a = np.ones((), np.float32)
        w.record(record_array("loss", "loss", a), a)
        w.end_step({"loss": 1.0})
    return path


def test_compare_does_not_call_activations_a_compiled_side_could_not_record_missing(tmp_path: Path) -> None:
    eager = _trace(tmp_path / "e", ["wte", "h.0.attn", "h.0.attn#1", "h.0[1]", "h.0", "h.1.mlp", "head"], ENV)
    compiled_env = {**ENV, "torch": {"compile": {"mode": "compiled", "unobserved": ["h.0.*", "h.1"]}}}
    compiled = _trace(tmp_path / "c", ["wte", "h.0", "head"], compiled_env)
    c = compare_paths(eager, compiled, tolerance=Tolerance(mode="bitwise"))
    # h.0[1] is h.0's own (second) output, which the compiled side records outside its region
    assert c.first is not None and (c.first.name, c.first.verdict, c.first.only_in) == ("h.0[1]", "missing", "a")
    assert not c.next
    assert "3 activation record(s) only in A not compared: trace B ran those modules under torch.compile" in c.note
    c = compare_paths(compiled, eager, tolerance=Tolerance(mode="bitwise"))
    assert "only in B not compared: trace A ran" in c.note
    # a trace that does not say it ran compiled gets no such allowance
    plain = _trace(tmp_path / "p", ["wte", "h.0", "head"], ENV)
    c = compare_paths(eager, plain, tolerance=Tolerance(mode="bitwise"))
    assert c.first.verdict == "missing" and c.first.name == "h.0.attn" and not c.note
    whole = _trace(tmp_path / "w", [], {**ENV, "torch": {"compile": {"mode": "compiled", "unobserved": ["*"]}}})
    assert compare_paths(eager, whole, tolerance=Tolerance(mode="bitwise"))


def test_the_recorders_own_compile_is_not_the_programs() -> None:
    """``REPROBISECT_FP_COMPILE=1`` compiles a row reduction of the recorder's: it must not
    make an eager program's trace read as compiled."""
    from reprobisect.runners import fingerprint_torch
    from reprobisect.runners.compile_torch import COMPILES

    before = len(COMPILES.calls)
    COMPILES.note(fingerprint_torch._rowsum_fused, {"dynamic": True})
    assert len(COMPILES.calls) == before and not any(r() is fingerprint_torch._rowsum_fused for r in COMPILES.functions)


@pytest.mark.slow
def test_record_api_with_a_model_compiled_before_it(tmp_path: Path) -> None:
    """``reprobisect.torch.record(torch.compile(model), ...)``: the wrapper is the model
    (names without ``_orig_mod``), and the trace says it ran compiled."""
    script = tmp_path / "api.py"
    script.write_text(textwrap.dedent(f"""
        import torch
        from torch import nn
        import reprobisect.torch as rt
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        cm = torch.compile(m, backend="eager")
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        x, y = torch.randn(16, 4), torch.randn(16, 1)
        with rt.record(cm, opt, trace={str(tmp_path / "t")!r}, steps=2):
            for i in range(2):
                opt.zero_grad()
                ((cm(x) - y) ** 2).mean().backward()
                opt.step()
    """))
    r = subprocess.run([PY, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    t = read_trace(tmp_path / "t")
    assert [(x.kind, x.name) for x in t.steps[0].records] == [
        *[("init", n) for n in ("0.weight", "0.bias", "2.weight", "2.bias")],
        ("input", "input"), ("output", "output"), ("loss", "loss"),
        *[(k, n) for k in ("grad", "param") for n in ("0.weight", "0.bias", "2.weight", "2.bias")]]
    env = _compile_env(t)
    assert env["mode"] == "compiled" and env["unobserved"] == ["*"]
    assert env["regions"][0]["module"] == "" and env["regions"][0]["class"] == "Sequential"
