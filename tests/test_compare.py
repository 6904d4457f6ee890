"""The first-divergence engine and `bisect compare`, on traces written through the writer API."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from reprobisect.cli import main
from reprobisect.core.compare import (
    DEFAULT_TOLERANCES,
    Tolerance,
    choose_tolerance,
    compare_paths,
    compare_traces,
)
from reprobisect.core.envdiff import diff_environments
from reprobisect.errors import UsageError
from reprobisect.trace import TraceWriter, fingerprint, read_trace, record_array

ENV = {"device": "cpu", "packages": {"torch": {"version": "2.13.0", "path": "/a/torch"}}, "host": {"hostname": "h1"}}


def _tensors(k: int) -> list[tuple[str, str, np.ndarray, str | None]]:
    rng = np.random.default_rng(k)
    return [
        ("input", "x", rng.standard_normal((4, 8)).astype(np.float32), None),
        ("activation", "fc1", rng.standard_normal((4, 16)).astype(np.float32), "Linear"),
        ("activation", "act", rng.standard_normal((4, 16)).astype(np.float32), "ReLU"),
        ("loss", "loss", np.float32(rng.standard_normal()), None),
        ("grad", "fc1.weight", rng.standard_normal((16, 8)).astype(np.float32), None),
        ("grad", "fc1.bias", rng.standard_normal(16).astype(np.float32), None),
        ("param", "fc1.weight", rng.standard_normal((16, 8)).astype(np.float32), None),
    ]


def build(path: Path, *, steps: int = 5, store: bool = True, env: dict | None = None, change=None, drop=(), extra=(),
          batch=None) -> Path:
    """A trace of ``steps`` steps; ``change(step, kind, name, array)`` may return a new array."""
    with TraceWriter(path, command=["python", "train.py"], environment=env or ENV) as w:
        for k in range(steps):
            w.begin_step(k)
            for kind, name, a, module in _tensors(k):
                if (k, kind, name) in drop:
                    continue
                if change is not None:
                    a = change(k, kind, name, a)
                w.record(record_array(name, kind, a, module=module), a if store else None)
                for ek, ekind, ename, ea, after in extra:
                    if ek == k and after == (kind, name):
                        w.record(record_array(ename, ekind, ea), ea if store else None)
            w.end_step({"loss": 1.0}, batch_ids=batch(k) if batch else [k * 2, k * 2 + 1])
    return path


def bump(step, kind, name, delta, index=(2, 3)):
    """Add ``delta`` to one element of one tensor at one step (``delta='ulp'``: the next float up)."""

    def change(k, kd, n, a):
        if (k, kd, n) == (step, kind, name):
            a = np.array(a, copy=True)
            if delta == "ulp":
                a[index] = np.nextafter(a[index], a.dtype.type(np.inf))
            else:
                a[index] += a.dtype.type(delta)
        return a

    return change


# -- the "done when" of issue 2 ------------------------------------------------------


@pytest.mark.parametrize("store", [True, False], ids=["tensors", "fingerprints-only"])
def test_one_gradient_at_step_3_is_named(tmp_path, store):
    a = build(tmp_path / "a", store=store)
    b = build(tmp_path / "b", store=store, change=bump(3, "grad", "fc1.weight", 1e-3))
    c = compare_paths(a, b)
    assert not c
    d = c.first
    assert (d.step, d.kind, d.name, d.verdict) == (3, "grad", "fc1.weight", "diverged")
    assert d.origin and d.localization == "first"
    assert c.per_step[3].differ == 1 and all(s.differ == 0 for s in c.per_step if s.step != 3)
    assert c.divergences == 1
    if store:
        assert d.diff.source == "tensors"
        assert d.diff.mismatched == 1 and d.diff.total == 128 and d.diff.first_index == (2, 3)
        assert d.diff.max_abs == pytest.approx(1e-3, rel=1e-3)
    else:
        assert d.diff.source == "stats" and c.tensors_read == 0
    assert "step 3 · grad · fc1.weight" in str(c)


def test_identical_traces_read_no_tensor(tmp_path):
    a = build(tmp_path / "a")
    b = build(tmp_path / "b")
    ta, tb = read_trace(a), read_trace(b)
    c = compare_traces(ta, tb)
    assert c and c.first is None and c.verdict == "agree"
    assert c.records_compared == 5 * 7 and c.steps_compared == 5
    assert (c.tensors_read, c.bytes_read) == (0, 0)
    assert (ta.tensors_read, tb.tensors_read, ta.bytes_read, tb.bytes_read) == (0, 0, 0, 0)
    # ... while a differing pair does read, and the counters see it
    c2 = compare_traces(ta, read_trace(build(tmp_path / "c", change=bump(1, "param", "fc1.weight", 1.0))))
    assert not c2 and c2.tensors_read == 2 and c2.bytes_read > 0


# -- tolerances ----------------------------------------------------------------------


def test_auto_tolerance_is_bitwise_in_the_same_environment(tmp_path):
    a = build(tmp_path / "a")
    b = build(tmp_path / "b", env={**ENV, "host": {"hostname": "elsewhere"}, "git": {"commit": "abc123"}},
              change=bump(0, "activation", "act", "ulp"))
    ta, tb = read_trace(a), read_trace(b)
    tol, why = choose_tolerance(ta, tb)
    assert tol.mode == "bitwise" and "share device and environment" in why
    c = compare_traces(ta, tb)
    assert not c and c.first.name == "act" and c.first.diff.max_ulp is not None and c.first.diff.max_ulp >= 1
    assert c.divergences == 1 and c.next == ()


def test_auto_tolerance_is_default_across_devices(tmp_path):
    a = build(tmp_path / "a")
    b = build(tmp_path / "b", env={**ENV, "device": "cuda:0"}, change=bump(0, "activation", "act", "ulp"))
    ta, tb = read_trace(a), read_trace(b)
    tol, why = choose_tolerance(ta, tb)
    assert tol.mode == "default" and "device" in why
    c = compare_traces(ta, tb)
    assert c, str(c)  # within float32's assert_close tolerance
    assert c.per_step[0].close == 1 and "within tolerance" in str(c)


@pytest.mark.parametrize(
    "dtype, inside, outside",
    [
        (np.float32, 5e-6, 5e-5),
        (np.float16, 1e-3, 1e-1),
        (ml_dtypes.bfloat16, 1.5e-2, 2.5e-1),
        (np.float64, 5e-8, 5e-6),
    ],
    ids=["float32", "float16", "bfloat16", "float64"],
)
def test_default_tolerance_per_dtype(tmp_path, dtype, inside, outside):
    base = np.full(10, 1.0, dtype)

    def trace(name, value):
        a = base.copy()
        a[4] = dtype(value)
        with TraceWriter(tmp_path / name, environment=ENV) as w:
            w.begin_step(0)
            w.record(record_array("w", "param", a), a)
            w.end_step()
        return read_trace(tmp_path / name)

    ref = trace("ref", 1.0)
    near = trace("near", 1.0 + inside)
    far = trace("far", 1.0 + outside)
    default = Tolerance(mode="default")
    assert fingerprint(near.tensor(0, near.steps[0].records[0])) != fingerprint(base)
    assert compare_traces(ref, near, default), "inside the default tolerance"
    assert not compare_traces(ref, near, Tolerance(mode="bitwise"))
    c = compare_traces(ref, far, default)
    assert not c and c.first.diff.first_index == (4,)
    atol, rtol = DEFAULT_TOLERANCES[np.dtype(dtype).name]
    assert (c.first.diff.atol, c.first.diff.rtol) == (atol, rtol)


def test_integers_are_exact_in_value_modes(tmp_path):
    def trace(name, v):
        a = np.arange(6, dtype=np.int64)
        a[2] += v
        with TraceWriter(tmp_path / name) as w:
            w.begin_step(0)
            w.record(record_array("ids", "input", a), a)
            w.end_step()
        return read_trace(tmp_path / name)

    c = compare_traces(trace("a", 0), trace("b", 1), Tolerance(mode="explicit", atol=10.0, rtol=1.0))
    assert not c and c.first.diff.mismatched == 1 and c.first.diff.max_abs == 1.0


def test_explicit_and_override(tmp_path):
    a = read_trace(build(tmp_path / "a"))
    b = read_trace(build(tmp_path / "b", change=bump(2, "grad", "fc1.weight", 1e-4)))
    assert not compare_traces(a, b, Tolerance(mode="explicit", atol=1e-5))
    assert compare_traces(a, b, Tolerance(mode="explicit", atol=1e-3))
    assert compare_traces(a, b, Tolerance(mode="explicit", rtol=1.0))
    loose = Tolerance(mode="bitwise", overrides={"grad/*": (1e-3, 0.0)})
    assert compare_traces(a, b, loose)
    strict = Tolerance(mode="explicit", atol=1.0, overrides=[Tolerance.parse_override("grad/fc1.*=bitwise")])
    c = compare_traces(a, b, strict)
    assert not c and c.first.name == "fc1.weight"
    assert "overrides grad/fc1.*=bitwise" in c.tolerance.describe()


def test_bad_tolerances_are_usage_errors():
    with pytest.raises(UsageError, match="GLOB=ATOL,RTOL"):
        Tolerance.parse_override("grad/*")
    with pytest.raises(UsageError, match="is not 'bitwise', 'default' or 'ATOL,RTOL'"):
        Tolerance.parse_override("grad/*=tight")
    with pytest.raises(UsageError, match="finite and >= 0"):
        Tolerance(mode="explicit", atol=-1.0)
    with pytest.raises(UsageError, match="needs --atol"):
        Tolerance(mode="explicit")
    with pytest.raises(UsageError, match="unknown tolerance mode 'loose'"):
        Tolerance(mode="loose")


# -- NaN, signed zero, ULP -----------------------------------------------------------


def _pair(tmp_path, x, y, dtype=np.float32):
    out = []
    for name, v in (("a", x), ("b", y)):
        arr = np.array(v, dtype)
        with TraceWriter(tmp_path / name, environment=ENV) as w:
            w.begin_step(0)
            w.record(record_array("y", "output", arr), arr)
            w.end_step()
        out.append(read_trace(tmp_path / name))
    return out


def test_nan_compared_by_position(tmp_path):
    q = np.array([0x7FC00000], np.uint32).view(np.float32)[0]
    p = np.array([0x7FC00001], np.uint32).view(np.float32)[0]
    a, b = _pair(tmp_path, [1.0, q, 3.0], [1.0, p, 3.0])
    assert not compare_traces(a, b, Tolerance(mode="bitwise"))  # other payload: other bits
    assert compare_traces(a, b, Tolerance(mode="default"))  # same position: agree
    a, b = _pair(tmp_path, [1.0, np.nan, 3.0], [1.0, 2.0, np.nan])
    c = compare_traces(a, b, Tolerance(mode="default"))
    assert not c and c.first.diff.mismatched == 2 and c.first.diff.first_index == (1,)
    assert c.first.diff.nan == (1, 1) and "NaN/Inf" in c.first.diff.detail


def test_signed_zero_equal_only_outside_bitwise(tmp_path):
    a, b = _pair(tmp_path, [0.0, 1.0], [-0.0, 1.0])
    c = compare_traces(a, b, Tolerance(mode="bitwise"))
    assert not c and c.first.diff.max_abs == 0.0 and c.first.diff.max_ulp == 0
    assert compare_traces(a, b, Tolerance(mode="default"))
    assert compare_traces(a, b, Tolerance(mode="explicit", atol=0.0, rtol=0.0))


def test_ulp_distance(tmp_path):
    one = np.float32(1.0)
    a, b = _pair(tmp_path, [one, one], [one, np.nextafter(np.nextafter(one, np.float32(2)), np.float32(2))])
    assert compare_traces(a, b, Tolerance(mode="bitwise")).first.diff.max_ulp == 2
    tiny = np.float32(1e-45)  # the smallest subnormal: -tiny → +tiny crosses both zeros
    a, b = _pair(tmp_path, [-tiny], [tiny])
    assert compare_traces(a, b, Tolerance(mode="bitwise")).first.diff.max_ulp == 2
    a, b = _pair(tmp_path, [1.0, 1.0], [1.0, 1.0078125], dtype=ml_dtypes.bfloat16)
    assert compare_traces(a, b, Tolerance(mode="bitwise")).first.diff.max_ulp == 1


def test_infinities(tmp_path):
    a, b = _pair(tmp_path, [np.inf, 1.0], [np.inf, 1.0 + 1e-7])
    assert compare_traces(a, b, Tolerance(mode="default"))
    a, b = _pair(tmp_path, [np.inf, 1.0], [-np.inf, 1.0])
    c = compare_traces(a, b, Tolerance(mode="default"))
    assert not c and c.first.diff.first_index == (0,)


# -- stats only ----------------------------------------------------------------------


def test_without_tensors_a_small_difference_is_never_called_close(tmp_path):
    a = read_trace(build(tmp_path / "a", store=False))
    b = read_trace(build(tmp_path / "b", store=False, change=bump(1, "grad", "fc1.bias", 1e-7, index=3)))
    c = compare_traces(a, b, Tolerance(mode="default"))
    assert not c
    d = c.first.diff
    assert d.verdict == "inconclusive" and d.source == "fingerprint"  # never close, never an unmeasured "diverged"
    assert "bits differ, size not measured (no tensor stored)" in d.detail
    assert c.verdict == "inconclusive" and "verdict: INCONCLUSIVE at step 1" in str(c)


def test_without_tensors_stats_prove_a_large_difference(tmp_path):
    a = read_trace(build(tmp_path / "a", store=False))
    b = read_trace(build(tmp_path / "b", store=False, change=bump(1, "grad", "fc1.bias", 100.0, index=3)))
    c = compare_traces(a, b, Tolerance(mode="default"))
    d = c.first.diff
    assert (c.first.step, c.first.name, d.source) == (1, "fc1.bias", "stats")
    assert d.stat_deltas["max"] > 90 and "moved by" in d.detail
    nan = read_trace(build(tmp_path / "n", store=False, change=bump(1, "grad", "fc1.bias", np.nan, index=3)))
    assert "NaN/Inf counts differ" in compare_traces(a, nan, Tolerance(mode="default")).first.diff.detail


# -- structure -----------------------------------------------------------------------


def test_missing_record_in_chain_order(tmp_path):
    a = read_trace(build(tmp_path / "a"))
    extra = [(2, "activation", "dropout", np.ones(4, np.float32), ("activation", "fc1"))]
    b = read_trace(build(tmp_path / "b", extra=extra))
    c = compare_traces(a, b)
    assert not c
    d = c.first
    assert (d.step, d.kind, d.name, d.verdict, d.only_in) == (2, "activation", "dropout", "missing", "b")
    assert "missing: only in B" in str(c)
    c = compare_traces(b, a)
    assert (c.first.name, c.first.only_in) == ("dropout", "a")
    # a renamed parameter: the old name only in A, then the new one only in B, in place
    r = read_trace(build(tmp_path / "r", drop={(0, "grad", "fc1.bias")},
                         extra=[(0, "grad", "fc1.b", np.zeros(16, np.float32), ("grad", "fc1.weight"))]))
    c = compare_traces(a, r)
    assert [(x.name, x.only_in) for x in (c.first,) + c.next[:1]] == [("fc1.bias", "a"), ("fc1.b", "b")]


def test_shape_and_dtype_changes(tmp_path):
    a = read_trace(build(tmp_path / "a"))
    b = read_trace(build(tmp_path / "b", change=lambda k, kd, n, x: x[:2] if (k, n) == (1, "x") else x))
    c = compare_traces(a, b)
    assert (c.first.step, c.first.name, c.first.verdict) == (1, "x", "shape")
    assert "shape mismatch: shape (4, 8) vs (2, 8)" in str(c)
    h = read_trace(build(tmp_path / "h", change=lambda k, kd, n, x: x.astype(np.float16) if (k, n) == (0, "act") else x))
    c = compare_traces(a, h, Tolerance(mode="default"))
    assert (c.first.step, c.first.name, c.first.verdict) == (0, "act", "dtype")


def test_different_step_counts_are_said(tmp_path):
    a = read_trace(build(tmp_path / "a", steps=5))
    b = read_trace(build(tmp_path / "b", steps=3))
    c = compare_traces(a, b)
    assert not c and c.steps_compared == 3
    assert c.structure == "A has 5 step(s), B has 3; steps 3-4 only in A"
    assert (c.first.kind, c.first.step, c.first.verdict) == ("step", 3, "missing")
    assert "steps 3-4 only in A" in str(c)


def test_batch_ids_are_the_first_link(tmp_path):
    a = read_trace(build(tmp_path / "a"))
    b = read_trace(build(tmp_path / "b", batch=lambda k: [k * 2, k * 2 + 1] if k < 2 else [k * 2 + 1, k * 2]))
    c = compare_traces(a, b)
    assert (c.first.step, c.first.kind, c.first.verdict) == (2, "batch", "diverged")
    assert "batch IDs differ (first at position 0: 4 vs 5)" in c.first.diff.detail


# -- origin vs propagation -----------------------------------------------------------


def _chain(path: Path, *, out2=0.0, mid=0.0) -> Path:
    """x → enc.l1 → enc.l2 → (parent code adds ``mid``) → head, and the container enc."""
    x = np.linspace(-1, 1, 12, dtype=np.float32)
    h1 = x * 2
    h2 = h1 + np.float32(1) + np.float32(out2)
    h2b = h2 + np.float32(mid)
    h3 = h2b * 3
    with TraceWriter(path, environment=ENV) as w:
        w.begin_step(0)
        w.record(record_array("x", "input", x), x)
        w.record(record_array("enc.l1", "activation", h1, module="Linear", inputs=(fingerprint(x),)), h1)
        w.record(record_array("enc.l2", "activation", h2, module="LayerNorm", inputs=(fingerprint(h1),)), h2)
        w.record(record_array("enc", "activation", h2, module="Encoder", inputs=(fingerprint(x),)), h2)
        w.record(record_array("head", "activation", h3, module="Linear", inputs=(fingerprint(h2b),)), h3)
        w.end_step()
    return path


def test_origin_module_then_propagation(tmp_path):
    c = compare_traces(read_trace(_chain(tmp_path / "a")), read_trace(_chain(tmp_path / "b", out2=1e-3)))
    assert (c.first.name, c.first.module, c.first.localization, c.first.origin) == ("enc.l2", "LayerNorm", "origin", True)
    assert [(d.name, d.localization, d.origin) for d in c.next] == [("enc", "propagation", False), ("head", "propagation", False)]
    assert c.origin is c.first
    text = str(c)
    assert "step 0 · activation · enc.l2 (LayerNorm) · max abs" in text and "origin: its inputs agree" in text


def test_change_between_modules_is_said(tmp_path):
    c = compare_traces(read_trace(_chain(tmp_path / "a")), read_trace(_chain(tmp_path / "b", mid=1e-3)))
    assert (c.first.name, c.first.localization, c.first.origin) == ("head", "between_modules", False)
    assert "between modules" in str(c) and "parent's forward" in str(c)


# -- environment and rendering -------------------------------------------------------


def test_environment_differences_walk_nested_keys():
    a = {"device": "cpu", "packages": {"torch": {"version": "2.12"}}, "env_vars": {"OMP_NUM_THREADS": "1"}, "cwd": "/x"}
    b = {"device": "cpu", "packages": {"torch": {"version": "2.13"}}, "env_vars": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
         "cwd": "/y"}
    d = {x.key: x for x in diff_environments(a, b)}
    assert (d["packages.torch.version"].change, d["packages.torch.version"].a, d["packages.torch.version"].b) == (
        "changed", "2.12", "2.13")
    assert d["env_vars.OMP_NUM_THREADS"].change == "removed"
    assert d["env_vars.CUBLAS_WORKSPACE_CONFIG"].change == "added"
    assert d["cwd"].info and not d["packages.torch.version"].info
    assert [x.key for x in diff_environments(a, b)][-1] == "cwd"  # launch info last
    assert diff_environments(a, dict(a)) == []


def test_environment_is_printed_first(tmp_path):
    a = build(tmp_path / "a")
    b = build(tmp_path / "b", env={**ENV, "packages": {"torch": {"version": "2.12.0", "path": "/a/torch"}}},
              change=bump(1, "loss", "loss", 1.0, index=()))
    text = str(compare_paths(a, b))
    lines = text.splitlines()
    env_line = next(i for i, s in enumerate(lines) if "packages.torch.version: '2.13.0' → '2.12.0'" in s)
    first_line = next(i for i, s in enumerate(lines) if s.startswith("first divergence"))
    assert env_line < first_line
    assert "step 1 · loss · loss" in text


def test_to_json_is_strict_json(tmp_path):
    a, b = _pair(tmp_path, [1.0, np.nan, np.inf], [2.0, 1.0, np.inf])
    c = compare_traces(a, b, Tolerance(mode="default", overrides={"output/*": "default"}))
    data = json.loads(json.dumps(c.to_json(), allow_nan=False))
    assert data["verdict"] == "diverged" and data["first"]["name"] == "y"
    assert data["first"]["diff"]["first_index"] == [0]
    assert data["tolerance"]["mode"] == "default"


# -- the command ---------------------------------------------------------------------


def _run(capsys, *args):
    code = main(["compare", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_exit_codes(tmp_path, capsys):
    a = build(tmp_path / "a")
    same = build(tmp_path / "same")
    diff = build(tmp_path / "diff", change=bump(3, "grad", "fc1.weight", 1e-3))
    code, out, _ = _run(capsys, a, same)
    assert code == 0 and "verdict: AGREE" in out
    code, out, _ = _run(capsys, a, diff)
    assert code == 1 and "step 3 · grad · fc1.weight" in out
    code, out, _ = _run(capsys, a, diff, "--atol", "1e-2")
    assert code == 0
    code, out, _ = _run(capsys, a, diff, "--tolerance", "default", "--override", "grad/*=1e-2,0")
    assert code == 0
    code, out, _ = _run(capsys, a, diff, "--json")
    assert code == 1
    data = json.loads(out)
    assert (data["first"]["step"], data["first"]["kind"], data["first"]["name"]) == (3, "grad", "fc1.weight")


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    a = build(tmp_path / "a")
    t = build(tmp_path / "t")
    data = (t / "steps.jsonl").read_bytes()
    (t / "steps.jsonl").write_bytes(data[:-40])
    for args in ([a, t], [a, tmp_path / "nowhere"], [a, a, "--override", "grad"], [a, a, "--tolerance", "default", "--atol", "1"]):
        code, out, err = _run(capsys, *args)
        assert code == 2, (args, out, err)
        assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err


def test_cli_allow_incomplete(tmp_path, capsys):
    a = build(tmp_path / "a", steps=2)
    w = TraceWriter(tmp_path / "inc", environment=ENV)
    for k in range(2):
        w.begin_step(k)
        for kind, name, arr, module in _tensors(k):
            w.record(record_array(name, kind, arr, module=module), arr)
        w.end_step({"loss": 1.0}, batch_ids=[k * 2, k * 2 + 1])
    # never closed: incomplete
    code, _, err = _run(capsys, a, tmp_path / "inc")
    assert code == 2 and "incomplete" in err
    code, out, _ = _run(capsys, a, tmp_path / "inc", "--allow-incomplete")
    assert code == 0 and "(incomplete, 2 steps)" in out
    # a longer complete run against the stopped one: the common steps are compared, the rest is said
    longer = build(tmp_path / "longer", steps=4)
    code, out, _ = _run(capsys, longer, tmp_path / "inc", "--allow-incomplete")
    assert code == 0 and "note: A has 4 step(s), B has 2; steps 2-3 only in A (trace B is incomplete" in out
    code, out, _ = _run(capsys, longer, a)  # both complete: a real structural difference
    assert code == 1 and "structure: A has 4 step(s), B has 2" in out


def test_cli_zoom(tmp_path, capsys):
    """--zoom hands the comparison to reprobisect.workflows.zoom; a divergence that is no module output is one line, exit 2."""
    a = build(tmp_path / "a")
    b = build(tmp_path / "b", change=bump(3, "grad", "fc1.weight", 1e-3))
    code, out, err = _run(capsys, a, b, "--zoom")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    try:
        import reprobisect.workflows.zoom as zoom

        built = hasattr(zoom, "zoom_target")
    except ImportError:
        built = False
    if built:
        assert "not a module output" in err and "'fc1.weight' at step 3" in err
    else:
        assert err.strip() == "error: op-level zoom is not available in this build"
    code, out, _ = _run(capsys, a, build(tmp_path / "same"), "--zoom")
    assert code == 0  # nothing to zoom into


def test_measure_works_chunk_by_chunk(tmp_path, monkeypatch):
    import reprobisect.core.compare.numeric as numeric

    monkeypatch.setattr(numeric, "_CHUNK", 7)
    x = np.arange(50, dtype=np.float32).reshape(5, 10)
    y = x.copy()
    y[2, 3] += 1  # flat 23: the fourth chunk
    y[4, 9] = np.nan  # flat 49: the last, short chunk
    a, b = _pair(tmp_path, x, y)
    d = compare_traces(a, b, Tolerance(mode="default")).first.diff
    assert (d.mismatched, d.first_index, d.max_abs, d.nan) == (2, (2, 3), 1.0, (0, 1))
    assert d.max_ulp == 2**23 // 16  # 23 → 24: one binade step of float32 at 16..32


def test_bisect_compare_as_a_real_process(tmp_path):
    a = build(tmp_path / "a")
    b = build(tmp_path / "b", change=bump(3, "grad", "fc1.weight", 1e-3))
    exe = Path(sys.executable).with_name("bisect")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "reprobisect"]
    r = subprocess.run([*cmd, "compare", str(a), str(b)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "first divergence:\n  step 3 · grad · fc1.weight" in r.stdout, r.stderr
    r = subprocess.run([*cmd, "compare", str(a), str(tmp_path / "missing")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr


def test_many_divergences_keep_a_short_list_and_count_all(tmp_path):
    a = read_trace(build(tmp_path / "a", steps=3))
    b = read_trace(build(tmp_path / "b", steps=3, change=lambda k, kd, n, x: np.array(x, copy=True) + np.float32(1)))
    c = compare_traces(a, b)
    assert c.divergences == 3 * 7 and len(c.next) == 5
    assert (c.first.step, c.first.name) == (0, "x")
    assert c.tensors_read == 2 * 6  # bitwise: only the first + next five are measured from tensors
    assert [s.differ for s in c.per_step] == [7, 7, 7]
