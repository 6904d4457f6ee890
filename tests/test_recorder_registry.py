"""Recorders register by the module that triggers them (``reprobisect.runners.registry``).

Through the real launcher in a subprocess: a recorder registered for a fake trigger module
is activated after the script's import of that module finished, once, and not at all when
the script never imports it. No framework is imported (cheap).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from reprobisect.runners import registry

PY = sys.executable

DRIVER = textwrap.dedent("""
    import json, os, sys
    from reprobisect.runners import registry

    def activate(run):
        mod = sys.modules["fake_trigger_mod"]
        with open(os.environ["FAKE_MARK"], "a") as f:
            f.write(json.dumps({"ready": mod.READY, "trace": str(run.ns.trace), "torch": "torch" in sys.modules}) + "\\n")
        return None

    registry.register("fake", "fake_trigger_mod", activate)
    from reprobisect.runners.launch import main
    main(sys.argv[1:])
""")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("registry")
    (d / "driver.py").write_text(DRIVER)
    (d / "fake_trigger_mod.py").write_text("READY = True\n")
    (d / "uses.py").write_text("import fake_trigger_mod\nimport fake_trigger_mod\nprint('used', fake_trigger_mod.READY)\n")
    (d / "ignores.py").write_text("print('no fake module here')\n")
    return d


def _launch(folder, script, name):
    mark = folder / f"{name}.marks"
    env = {**os.environ, "FAKE_MARK": str(mark), "PYTHONPATH": os.pathsep.join(
        [str(folder), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([PY, str(folder / "driver.py"), "--trace", str(folder / f"{name}.trace"), "--steps", "1",
                        "--", script], cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    marks = mark.read_text().splitlines() if mark.exists() else []
    return r, marks


def test_a_registered_recorder_activates_when_the_script_imports_its_trigger(folder):
    r, marks = _launch(folder, "uses.py", "uses")
    assert "used True" in r.stdout, r.stderr
    assert len(marks) == 1, (marks, r.stderr)  # once, though the script imports it twice
    assert '"ready": true' in marks[0]  # after the module's own code ran
    assert '"torch": false' in marks[0]  # nothing else imported on the script's behalf
    assert r.returncode == 6 and "no_steps" in r.stderr  # no framework stepped: the usual outcome


def test_a_registered_recorder_stays_off_when_the_script_never_imports_its_trigger(folder):
    r, marks = _launch(folder, "ignores.py", "ignores")
    assert "no fake module here" in r.stdout, r.stderr
    assert marks == []


def test_the_builtin_recorders_and_strict_registration():
    names = {e.name: e.triggers for e in registry.recorders()}
    assert names["torch"] == ("torch",)
    assert names["lightning"] == ("lightning.pytorch", "pytorch_lightning")
    with pytest.raises(ValueError, match="recorder 'torch' is already registered"):
        registry.register("torch", "torch", lambda run: None)
    with pytest.raises(ValueError, match="needs at least one trigger"):
        registry.register("empty", (), lambda run: None)
    with pytest.raises(ValueError, match="'nothere' is not registered"):
        registry.unregister("nothere")


def test_lightning_activation_notes_a_callback_factory_that_is_not_installed():
    from types import SimpleNamespace

    from reprobisect.runners import lightning

    run = SimpleNamespace(recorder=SimpleNamespace(notes=[]))
    # the real group: this environment has reprobisect installed, so its entry point is there
    lightning.activate(run, {"reprobisect": "lightning.pytorch.callbacks_factory"})
    assert run.recorder.notes == []
    lightning.activate(run, {"reprobisect": "no.such.callbacks_factory", "not_imported_pkg": "no.such.group"})
    assert len(run.recorder.notes) == 1 and run.recorder.notes[0].startswith("reprobisect: reprobisect's Lightning callback")
