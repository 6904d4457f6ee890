"""The environment record (collected in the user's process) and the environment diff."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from reprobisect.core.envdiff import ABSENT, diff_environments
from reprobisect.render import format_changes

PY = sys.executable


def _collect(code: str, cwd, env: dict | None = None) -> dict:
    script = textwrap.dedent(code) + textwrap.dedent(
        """
        import json, sys
        from reprobisect.runners.environment import collect_environment
        e = collect_environment({"extra_key": 1})
        e["_modules"] = sorted(m for m in ("torch", "tensorflow", "keras", "jax") if m in sys.modules)
        print(json.dumps(e))
        """
    )
    r = subprocess.run([PY, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=120,
                       env={**os.environ, **(env or {})})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_torch_process_records_torch_and_determinism_without_importing_tensorflow(tmp_path):
    e = _collect(
        """
        import torch
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = True
        torch.set_float32_matmul_precision("high")
        torch.set_num_threads(1)
        torch.set_default_dtype(torch.float64)
        """,
        tmp_path,
        env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONHASHSEED": "7", "TORCH_SHOW_CPP_STACKTRACES": "1"},
    )
    assert e["_modules"] == ["torch"]  # tensorflow was not dragged in
    import torch

    assert e["packages"]["torch"]["version"] == torch.__version__
    assert e["packages"]["torch"]["path"] == torch.__file__
    assert e["torch"]["num_threads"] == 1
    assert e["torch"]["default_dtype"] == "float64"
    assert e["torch"]["autocast"]["cpu"] == {"enabled": False, "dtype": "bfloat16"}
    assert e["torch"]["compile"]["mode"] == "eager"
    assert e["torch"]["devices"] == ([] if not torch.cuda.is_available() else e["torch"]["devices"])
    d = e["determinism"]
    assert d["deterministic_algorithms"] is True and d["deterministic_warn_only"] is True
    assert d["cudnn_benchmark"] is True
    assert d["float32_matmul_precision"] == "high"
    assert "cuda_matmul_allow_tf32" in d and "cudnn_allow_tf32" in d
    assert {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONHASHSEED": "7"}.items() <= e["env_vars"].items()
    assert not any("CACHE" in k for k in e["env_vars"])  # cache paths are not numerics
    assert e["python"]["executable"] == PY
    assert e["host"]["hostname"] and e["host"]["cpu_count"] >= 1
    assert e["git"] is None  # tmp_path is not a repository
    assert e["extra_key"] == 1


def test_plain_process_never_imports_a_framework(tmp_path):
    e = _collect("", tmp_path)
    assert e["_modules"] == []
    assert "torch" not in e and "determinism" not in e and "tensorflow" not in e
    assert "torch" not in e["packages"]


def test_autocast_state_is_seen_inside_autocast(tmp_path):
    e = _collect(
        """
        import torch
        ctx = torch.autocast("cpu", dtype=torch.bfloat16)
        ctx.__enter__()
        """,
        tmp_path,
    )
    assert e["torch"]["autocast"]["cpu"] == {"enabled": True, "dtype": "bfloat16"}


def test_git_revision_dirty_flag_and_dvc_hashes(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "train.py").write_text("print(1)\n")
    (repo / "dvc.lock").write_text(textwrap.dedent("""\
        schema: '2.0'
        stages:
          prepare:
            cmd: python prepare.py
            outs:
            - path: data/train.csv
              md5: 0123456789abcdef0123456789abcdef
              size: 10
        """))
    (repo / "raw.dvc").write_text("outs:\n- md5: fedcba9876543210fedcba9876543210\n  path: raw\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "init")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    (repo / "sub").mkdir()
    clean = _collect("", repo / "sub")
    assert clean["git"]["commit"] == head and clean["git"]["dirty"] is False
    assert clean["git"]["root"] == str(repo)
    assert clean["data"]["dvc"]["dvc.lock"] == {"data/train.csv": "0123456789abcdef0123456789abcdef"}
    assert clean["data"]["dvc"]["raw.dvc"] == {"raw": "fedcba9876543210fedcba9876543210"}
    (repo / "train.py").write_text("print(2)\n")
    assert _collect("", repo)["git"]["dirty"] is True


def test_diff_separates_numerics_from_info():
    a = {
        "packages": {"torch": {"version": "2.12.0", "path": "/a/torch/__init__.py"}},
        "determinism": {"cudnn_benchmark": False, "deterministic_algorithms": True},
        "env_vars": {"PYTHONHASHSEED": "0"},
        "host": {"hostname": "a", "cpu": "X"},
        "git": {"commit": "abc", "dirty": False, "root": "/r"},
    }
    b = json.loads(json.dumps(a))
    b["packages"]["torch"] = {"version": "2.13.0", "path": "/b/torch/__init__.py"}
    b["determinism"]["cudnn_benchmark"] = True
    del b["env_vars"]["PYTHONHASHSEED"]
    b["env_vars"]["OMP_NUM_THREADS"] = "1"
    b["host"]["hostname"] = "b"
    changes = diff_environments(a, b)
    by = {c.path: c for c in changes}
    assert set(by) == {
        "packages.torch.version", "packages.torch.path", "determinism.cudnn_benchmark",
        "env_vars.PYTHONHASHSEED", "env_vars.OMP_NUM_THREADS", "host.hostname",
    }
    assert by["packages.torch.version"].category == "numerics"
    assert by["determinism.cudnn_benchmark"].numerics
    assert by["env_vars.PYTHONHASHSEED"].b == ABSENT and by["env_vars.OMP_NUM_THREADS"].a == ABSENT
    assert by["packages.torch.path"].category == "info" and by["host.hostname"].category == "info"
    cats = [c.category for c in changes]
    assert cats == sorted(cats, key=lambda c: c != "numerics")  # numerics first
    text = format_changes(changes)
    assert text.index("can change numerics") < text.index("determinism.cudnn_benchmark: False -> True")
    assert text.index("other environment differences") < text.index("host.hostname: 'a' -> 'b'")
    assert by["determinism.cudnn_benchmark"].to_json() == {
        "path": "determinism.cudnn_benchmark", "a": False, "b": True, "category": "numerics"}
    assert diff_environments(a, json.loads(json.dumps(a))) == []
    assert format_changes([]) == ""


@pytest.mark.slow
def test_two_real_records_of_the_same_process_kind_do_not_differ(tmp_path):
    a = _collect("import torch", tmp_path)
    b = _collect("import torch", tmp_path)
    assert diff_environments(a, b) == []
    c = _collect("import torch\ntorch.backends.cudnn.deterministic = True", tmp_path, env={"OMP_NUM_THREADS": "1"})
    paths = {ch.path for ch in diff_environments(a, c) if ch.numerics}
    assert {"determinism.cudnn_deterministic", "env_vars.OMP_NUM_THREADS", "torch.num_threads"} <= paths


@pytest.mark.slow
def test_tensorflow_process_records_op_determinism_and_keras_without_torch(tmp_path):
    pytest.importorskip("tensorflow")
    e = _collect("import tensorflow as tf\ntf.config.experimental.enable_op_determinism()", tmp_path)
    assert "torch" not in e["_modules"] and "tensorflow" in e["_modules"]
    tf = e["tensorflow"]
    assert tf["op_determinism"] is True
    assert any(d.startswith("CPU:") for d in tf["devices"])
    assert tf["keras"]["backend"] == "tensorflow" and e["packages"]["keras"]["version"] == tf["keras"]["version"]
    assert "determinism" not in e  # the torch group only appears with torch


def test_probe_placement_is_recorded_as_info(monkeypatch):
    """Executors pass where a probe ran as REPROBISECT_PROBE_*; the record keeps it as info."""
    from reprobisect.core.envdiff import diff_environments
    from reprobisect.runners.environment import collect_environment

    monkeypatch.setenv("REPROBISECT_PROBE_PLACEMENT", "spread")
    monkeypatch.setenv("REPROBISECT_PROBE_NODE", "node-a")
    a = collect_environment()
    assert a["probe"] == {"node": "node-a", "placement": "spread"}
    monkeypatch.setenv("REPROBISECT_PROBE_NODE", "node-b")
    changes = diff_environments(a, collect_environment())
    assert [(c.path, c.category) for c in changes] == [("probe.node", "info")]
