"""The framework-free core the workflows use: comparing traces (``compare``), searching an
ordered axis (``search``), the session log (``session``), describing a probe (``probe``) and
judging its result (``verdict``, ``outcome``), the options dataclass, hints and checks.

It imports no runner, executor, workflow or CLI, and no ML framework (``tests/test_layering.py``).
"""
