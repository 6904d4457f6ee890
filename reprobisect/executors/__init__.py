"""Where probes run: the registry of executors, by name.

Each executor registers once here (``register``): its name, the class that runs probes
(imported only when one is made), its own config dataclass and the flags that fill it.
The CLI builds ``--executor``'s choices and each executor's flags and config-file keys
from ``EXECUTORS`` alone, and ``executor_for(options)`` makes the one a ``ProbeOptions``
names, handing it only its own settings. Built in: ``local`` (subprocesses here, the
default) and ``ray`` (a cluster). All implement the ``Executor`` protocol of
``reprobisect.executors.base``; the rest of reprobisect never imports Ray.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from reprobisect.core.options import ProbeOptions
from reprobisect.errors import UsageError
from reprobisect.executors.base import Executor, ProbeResult, ProbeSpec
from reprobisect.executors.flags import ExecutorFlag
from reprobisect.executors.ray import RAY_FLAGS, RayConfig
from reprobisect.trace.outdir import prepare_output_dir

__all__ = ["Executor", "ProbeResult", "ProbeSpec", "ExecutorFlag", "ExecutorKind", "EXECUTORS", "register",
           "executor_kind", "make_executor", "executor_for", "Borrowed", "submit_all"]


@dataclass(frozen=True)
class ExecutorKind:
    """A registered executor: how to make it and what it can be told."""

    name: str
    help: str
    target: str
    """``module:Class`` of the executor, imported when one is made."""
    config: type | None = None
    """Its config dataclass (``executor_kwargs(timeout)`` gives the constructor's keywords)."""
    flags: tuple[ExecutorFlag, ...] = ()

    def load(self) -> type:
        module, name = self.target.split(":")
        return getattr(importlib.import_module(module), name)

    def make_config(self, values: dict[str, Any]) -> Any:
        """Its config from ``values`` keyed by field (None: no config dataclass and no values)."""
        if self.config is None:
            if values:
                raise UsageError(f"the {self.name} executor takes no {', '.join(sorted(values))}")
            return None
        return self.config(**values)


EXECUTORS: dict[str, ExecutorKind] = {}
"""name -> ``ExecutorKind``; the one list of executors (``--executor`` offers these)."""


def register(kind: ExecutorKind) -> ExecutorKind:
    """Add an executor to ``EXECUTORS``; its flags must not clash with another executor's."""
    taken = {f.flag for k in EXECUTORS.values() if k.name != kind.name for f in k.flags}
    clash = [f.flag for f in kind.flags if f.flag in taken]
    if clash:
        raise ValueError(f"executor '{kind.name}': flags {clash} are another executor's")
    EXECUTORS[kind.name] = kind
    return kind


register(ExecutorKind("local", "subprocesses on this machine", "reprobisect.executors.local:LocalExecutor"))
register(ExecutorKind("ray", "Ray tasks on a cluster (or a local Ray instance)", "reprobisect.executors.ray:RayExecutor",
                      config=RayConfig, flags=RAY_FLAGS))


def executor_kind(name: str) -> ExecutorKind:
    """The registered executor ``name``; an unknown one is a UsageError naming the choices."""
    try:
        return EXECUTORS[name]
    except KeyError:
        choices = " or ".join(f"--executor {n}" for n in EXECUTORS)
        raise UsageError(f"unknown executor '{name}'; use {choices}") from None


def make_executor(name: str, **options: Any) -> Executor:
    """Build the executor called ``name`` with its constructor's keyword ``options``."""
    return executor_kind(name).load()(**options)


def executor_for(options: ProbeOptions) -> Executor:
    """The executor ``options`` ask for (a context manager: ``with executor_for(o) as ex``).

    It gets the shared settings (jobs, keep, out) and its own config's, nothing else.
    ``out``, when given, must be new, empty or reprobisect's own (``reprobisect.trace.outdir``).
    With ``options.shared_executor`` set, that open executor is lent instead (``Borrowed``:
    closing it does nothing; its traces go where it puts them).
    """
    if options.shared_executor is not None:
        return Borrowed(options.shared_executor)
    kind = executor_kind(options.executor)
    kw: dict[str, Any] = {"jobs": options.jobs, "keep": options.keep or options.out is not None, "out_dir": options.out}
    if kind.config is not None:
        cfg = options.executor_config if options.executor_config is not None else kind.config()
        if not isinstance(cfg, kind.config):
            raise UsageError(f"the {kind.name} executor takes a {kind.config.__name__}, not {type(cfg).__name__}")
        kw.update(cfg.executor_kwargs(options.timeout))
    if options.out is not None:
        prepare_output_dir(options.out)
    return make_executor(kind.name, **kw)


class Borrowed:
    """An open executor lent to a workflow: everything passes through, ``close`` does nothing
    (the owner closes it once, after every workflow that borrowed it has ended)."""

    def __init__(self, inner: Executor) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:  # submit, submit_pair, name, max_parallel, ...
        return getattr(self._inner, name)

    def close(self) -> None:
        pass

    def __enter__(self) -> "Borrowed":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


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
