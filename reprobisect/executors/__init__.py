"""Where probes run: ``local`` (subprocesses here, the default) and ``ray`` (a cluster).

Both implement the ``Executor`` protocol of ``reprobisect.executors.base``; the rest of
reprobisect never imports Ray.
"""

from reprobisect.executors.base import Executor, ProbeResult, ProbeSpec

__all__ = ["Executor", "ProbeResult", "ProbeSpec", "make_executor"]


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
