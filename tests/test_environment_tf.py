"""The TensorFlow/Keras part of the environment record (issue 14 item 6), with real TF in subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

from reprobisect.core.envdiff import diff_environments
from reprobisect.render import format_changes
from reprobisect.runners.environment import keras_api_of

PY = sys.executable


def _collect(code: str, cwd, env: dict | None = None) -> dict:
    return _collect_all(code, cwd, [env])[0]


def _collect_all(code: str, cwd, envs: list[dict | None]) -> list[dict]:
    """The environment record of ``code`` run as a script once per entry of ``envs``, side by side (a
    TF process spends most of its life importing TensorFlow on one core)."""
    script = cwd / "train_env.py"  # a file, so the record can read the script's imports
    script.write_text(textwrap.dedent(code) + textwrap.dedent(
        """
        import json, sys
        from reprobisect.runners.environment import collect_environment
        e = collect_environment()
        e["_modules"] = sorted(m for m in ("torch", "tensorflow", "keras", "jax") if m in sys.modules)
        print("ENV " + json.dumps(e))
        """
    ))

    def run(env: dict | None) -> dict:
        full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
        for k in [k for k, v in full_env.items() if v is None]:
            del full_env[k]
        r = subprocess.run([PY, str(script)], cwd=cwd, capture_output=True, text=True, timeout=180, env=full_env)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("ENV ")][-1][4:])

    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(run, envs))


def test_keras_api_is_read_from_the_script_imports():
    assert keras_api_of("import tensorflow as tf\nm = tf.keras.Sequential()\n") == "tf.keras"
    assert keras_api_of("from tensorflow import keras\n") == "tf.keras"
    assert keras_api_of("from tensorflow.keras import layers\n") == "tf.keras"
    assert keras_api_of("import keras\nfrom keras import layers\n") == "keras"
    assert keras_api_of("import keras\nimport tensorflow as tf\nx = tf.keras.layers.Dense\n") == "tf.keras+keras"
    assert keras_api_of("import tf_keras as keras\n") == "tf_keras"
    assert keras_api_of("import tensorflow as tf\n# no keras here\n") == "none"
    assert keras_api_of("import kerasx\nfrom keras_cv import x\n") == "none"


@pytest.mark.slow
def test_op_determinism_and_tf_numerics_vars_show_in_the_environment_diff(tmp_path):
    code = """
        import os
        import tensorflow as tf
        import keras
        if os.environ.get("DET"):
            tf.config.experimental.enable_op_determinism()
        from reprobisect.runners.environment import note_tf_execution
        note_tf_execution(run_eagerly=False, jit_compile=bool(os.environ.get("JIT")), mode="graph")
        """
    a, b = _collect_all(code, tmp_path, [{"DET": None, "JIT": None, "TF_XLA_FLAGS": None},
                                         {"DET": "1", "JIT": "1", "TF_XLA_FLAGS": "--tf_xla_auto_jit=2",
                                          "TF_CUDNN_DETERMINISTIC": "1"}])
    assert "torch" not in a["_modules"]
    tf = a["tensorflow"]
    assert tf["op_determinism"] is False and b["tensorflow"]["op_determinism"] is True
    assert tf["version"] == a["packages"]["tensorflow"]["version"] and a["packages"]["tensorflow"]["path"]
    assert a["packages"]["keras"]["path"] and tf["keras"]["version"] == a["packages"]["keras"]["version"]
    assert tf["keras"]["backend"] == "tensorflow" and "note" not in tf["keras"]
    assert tf["keras"]["api"]["used"] == "keras" and tf["keras"]["mixed_precision_policy"] == "float32"
    assert tf["execution"] == {"run_eagerly": False, "jit_compile": False, "mode": "graph"}
    assert any(d.startswith("CPU:") for d in tf["devices"]) and "build" in tf and "onednn_built" in tf
    changes = {c.path: c for c in diff_environments(a, b)}
    det = changes["tensorflow.op_determinism"]
    assert det.numerics and (det.a, det.b) == (False, True)
    for key in ("tensorflow.execution.jit_compile", "env_vars.TF_XLA_FLAGS", "env_vars.TF_CUDNN_DETERMINISTIC"):
        assert changes[key].numerics, key
    assert set(k for k, c in changes.items() if c.numerics) == {
        "tensorflow.op_determinism", "tensorflow.execution.jit_compile", "env_vars.TF_XLA_FLAGS",
        "env_vars.TF_CUDNN_DETERMINISTIC"}  # nothing else moves between two records of one script
    assert "tensorflow.op_determinism: False -> True" in format_changes(list(changes.values()))


@pytest.mark.slow
def test_keras_on_the_torch_backend_says_the_tf_recorder_records_nothing(tmp_path):
    pytest.importorskip("torch")
    e = _collect("import keras\n", tmp_path, env={"KERAS_BACKEND": "torch"})
    assert "tensorflow" not in e["_modules"] and "tensorflow" not in e
    k = e["keras"]
    assert k["backend"] == "torch" and k["api"]["used"] == "keras"
    assert "torch backend: the TensorFlow recorder records nothing" in k["note"]
    assert e["env_vars"]["KERAS_BACKEND"] == "torch"


def test_a_keras_backend_change_is_numerics_and_its_note_is_info():
    a = {"keras": {"backend": "jax", "note": "Keras runs on the jax backend: ...", "api": {"used": "keras", "how": "x"}}}
    b = {"keras": {"backend": "torch", "note": "Keras runs on the torch backend: ...", "api": {"used": "keras", "how": "y"}}}
    by = {c.path: c.category for c in diff_environments(a, b)}
    assert by == {"keras.backend": "numerics", "keras.note": "info", "keras.api.how": "info"}


def test_keras_api_reads_the_script_in_argv_even_after_runpy_restored_main(tmp_path, monkeypatch):
    """The launcher seals the trace after runpy put ``__main__`` back to the launcher:
    the script is the one in ``sys.argv[0]``."""
    from reprobisect.runners import environment

    script = tmp_path / "train.py"
    script.write_text("from tensorflow import keras\n")
    monkeypatch.setattr(sys, "argv", [str(script), "--epochs", "1"])
    assert environment._keras_api()["used"] == "tf.keras"
    monkeypatch.setattr(sys, "argv", ["-c"])
    assert environment._keras_api()["used"] in ("none", "unknown")  # pytest's own __main__, never a guess from argv
