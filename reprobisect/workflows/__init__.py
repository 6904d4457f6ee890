"""The workflows that answer a user's question: runs, repro, seeds, envs, capture, zoom, demo.

Each takes plain option dataclasses (``reprobisect.core.options.ProbeOptions``), runs its
probes through an executor (``reprobisect.executors``) and returns result dataclasses that
``reprobisect.render`` turns into text or JSON; none imports click or an ML framework.
The coming ``audit``, ``doctor`` and ``resume`` belong here.
"""
