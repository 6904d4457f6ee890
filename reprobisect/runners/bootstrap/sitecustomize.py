"""reprobisect's bootstrap for one probe (a copy in the probe's own folder, first on PYTHONPATH).

It starts ``reprobisect.runners.bootstrap`` in this Python process (it records when a
framework is imported and the process steps an optimizer), then runs the ``sitecustomize``
that Python would have run without this folder, so the user's own keeps working.
Removed with the probe's folder when the command ends.
"""


def _reprobisect_boot() -> None:
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    if os.environ.get("REPROBISECT_BOOT"):
        try:
            from reprobisect.runners import bootstrap

            bootstrap.start()
        except Exception as e:  # never keep the user's process from starting
            print(f"reprobisect: bootstrap not started in process {os.getpid()}: {type(e).__name__}: {e}",
                  file=sys.stderr)
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


_reprobisect_boot()
del _reprobisect_boot
