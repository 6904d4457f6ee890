"""Where probes run: ``local`` (subprocesses here, the default) and ``ray`` (a cluster).

Both implement the ``Executor`` protocol of ``reprobisect.executors.base``; the rest of
reprobisect never imports Ray.
"""

from reprobisect.executors.base import Executor, ProbeResult, ProbeSpec

__all__ = ["Executor", "ProbeResult", "ProbeSpec", "make_executor", "submit_all"]


def make_executor(name: str, **options) -> Executor:
    """Build the executor called ``name`` ('local' or 'ray') with its options."""
    from reprobisect.errors import UsageError

    if name == "local":
        from reprobisect.executors.local import LocalExecutor

        return LocalExecutor(**options)
    if name == "ray":
        from reprobisect.executors.ray import RayExecutor

        return RayExecutor(**options)
    raise UsageError(f"unknown executor '{name}'; use --executor local or --executor ray")


def submit_all(executor: Executor, specs: list[ProbeSpec]) -> list:
    """Submit probes that belong together (repro's runs, envs' sides).

    Two of them go through the executor's ``submit_pair`` when it has one (Ray: placed
    on one node or spread on purpose, as the executor's placement says); otherwise, and
    on the local executor, each is submitted on its own.
    """
    pair = getattr(executor, "submit_pair", None)
    if pair is not None and len(specs) == 2:
        return list(pair(specs[0], specs[1]))
    return [executor.submit(s) for s in specs]
