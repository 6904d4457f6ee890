"""The per-probe bootstrap: record every Python process a command starts, whatever the command.

``bisect ... -- bash train.sh`` / ``torchrun ... train.py`` / ``python main.py`` (that starts
worker processes with ``torch.multiprocessing.spawn``) cannot be rewritten into the
launcher command. Instead ``reprobisect.executors.process`` makes a folder for the probe
(``prepare``) holding a ``sitecustomize.py`` and a ``config.json`` (the trace folder, the
launcher's options, the recorders' trigger modules) and puts the folder first on the
command's ``PYTHONPATH``, with ``REPROBISECT_BOOT`` naming the config. Every Python
process the command starts then runs ``start()`` at interpreter start-up:

- It installs the launcher's import watcher (``runners.watch.Activator``) and nothing
  else: a process that never imports a framework (bash's ``python`` helpers, a data
  preparation script) pays a JSON read. Launcher processes are left alone: ``python -m
  reprobisect.runners.launch`` (which records by itself; ``launch._claim_process`` stands
  the bootstrap down) and torchrun's elastic agent (``torchrun`` /
  ``python -m torch.distributed.run``/``launch``), which never steps an optimizer.
- When the process imports a trigger (``torch``), the launcher's own ``_Run`` is made with
  a *lazy* writer and activates the same recorders with the same policy.
- The writer makes its trace only when the first step is written, so processes that never
  step (launchers, DataLoader workers, evaluation helpers) leave nothing behind. A
  process with world size > 1 (env ``WORLD_SIZE``/``RANK`` as torchrun sets them, or an
  initialized ``torch.distributed`` group, as ``mp.spawn`` workers have) writes its shard
  ``TRACE/ranks/rank-<R>/`` with ``extra.distributed`` = ``{rank, local_rank,
  world_size, backend, device}``. A process that is not distributed writes the flat
  trace ``TRACE/`` if it is the first to claim it (``claim_flat``); a later one is
  bounded the same way but not recorded: it leaves ``unrecorded/<pid>`` in the probe's
  folder and the probe's outcome says so (one flat trace per probe, never two mixed).
- After ``--steps`` steps the recorder ends the process right at the end of that step
  (the same step on every rank, after DDP's all-reduce, so no collective is pending):
  the trace is sealed, DataLoader workers stopped, ranks meet at a barrier (bounded),
  and the process leaves with status 0 (``ok``, ``nonfinite``, ``no_steps``: what the
  trace says) so that torchrun's agent does not tear the group down as a failure; a
  recorder failure leaves with 7. An exception out of the program seals the trace as
  ``crashed`` (a rank's crash always leaves its shard, naming the rank); a program that
  ends by itself is sealed at exit.

``sitecustomize.py`` chains to the user's own ``sitecustomize`` further along
``sys.path``, so that keeps running. A Python started with ``-I``, ``-E`` or ``-S`` (no
``PYTHONPATH`` or no ``site``) is not recorded. This module imports only the standard library at
start-up; the launcher (and the framework recorders) load at the trigger's import.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence

from reprobisect.runners.claims import ENV_CONFIG, ENV_PROBE, claim_flat, stand_down, stood_down

__all__ = ["ENV_CONFIG", "ENV_PROBE", "prepare", "start", "stand_down", "claim_flat", "unrecorded", "crash_times",
           "recording_ended", "distributed_info", "LAUNCHER_MODULES"]

LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")
"""``python -m`` modules that only launch ranks (torchrun's agent): never recorded."""
LAUNCHER_SCRIPTS = ("torchrun",)
"""Console scripts that only launch ranks (torchrun's agent): never recorded."""
_HELPER_SCRIPTS = ("torch/_inductor/compile_worker/__main__.py",)  # torch.compile's worker pool
_BARRIER_S = 30.0

_BOOT: "_Boot | None" = None


# --------------------------------------------------------------------------- the probe's folder


def prepare(folder: str | os.PathLike, *, trace_dir: str | os.PathLike, launch_args: Sequence[str],
            command: Sequence[str], triggers: Sequence[str], cwd: str | os.PathLike,
            pythonpath: str | None = None) -> dict[str, str]:
    """Fill ``folder`` (made here) with the bootstrap and its config; return the environment
    variables that put it into the command: ``PYTHONPATH`` (the folder first, then
    ``pythonpath``), ``REPROBISECT_BOOT`` and the probe token ``REPROBISECT_BOOT_TOKEN``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(__file__).with_name("sitecustomize.py"), folder / "sitecustomize.py")
    token = uuid.uuid4().hex
    config = {"trace": os.path.abspath(trace_dir), "launch_args": list(launch_args), "command": list(command),
              "triggers": sorted(set(triggers)), "cwd": str(cwd), "token": token}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    path = str(folder.resolve()) + (os.pathsep + pythonpath if pythonpath else "")
    return {"PYTHONPATH": path, ENV_CONFIG: str((folder / "config.json").resolve()), ENV_PROBE: token}


def unrecorded(folder: str | os.PathLike) -> list[dict[str, Any]]:
    """The processes of the probe that stepped an optimizer but were not recorded (the flat
    trace was another's): ``[{pid, argv}]``."""
    out = []
    d = Path(folder) / "unrecorded"
    for p in sorted(d.glob("*.json")) if d.is_dir() else ():
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return out


# --------------------------------------------------------------------------- start-up in each process


def _is_launcher(argv: Sequence[str]) -> bool:
    """Whether the process is one that records by itself or only launches others."""
    args = list(argv[1:])
    i = 0
    while i < len(args):  # the interpreter's options, up to the program
        a = args[i]
        if a == "-m":
            mod = args[i + 1] if i + 1 < len(args) else ""
            return mod == "reprobisect.runners.launch" or mod in LAUNCHER_MODULES
        if a == "-c" or a.startswith("-c"):
            return False
        if not a.startswith("-") or a == "-":
            return os.path.basename(a) in LAUNCHER_SCRIPTS or a.replace(os.sep, "/").endswith(_HELPER_SCRIPTS)
        i += 2 if a in ("-X", "-W") else 1
    return False


def start() -> None:
    """Called by the probe's ``sitecustomize``: watch for a framework import in this process."""
    global _BOOT
    path = os.environ.get(ENV_CONFIG)
    if not path or _BOOT is not None or stood_down():
        return
    if _is_launcher(getattr(sys, "orig_argv", sys.argv)):
        return
    with open(path) as f:
        cfg = json.load(f)
    _BOOT = _Boot(cfg, Path(path).parent)
    _BOOT.watch()


class _Discard:
    """The writer of a process that steps but may not write (the flat trace is another's):
    counts steps, so the recorder still stops it after ``--steps``; writes nothing."""

    materialized = False

    def __init__(self, path: Path) -> None:
        self.path = path
        self.steps_written = 0

    def begin_step(self, step: int) -> None:
        pass

    def record(self, rec: Any, array: Any = None) -> Any:
        return rec

    def end_step(self, *args: Any, **kwargs: Any) -> None:
        self.steps_written += 1

    def write_state(self, *args: Any, **kwargs: Any) -> None:
        pass

    def drain(self) -> None:
        pass

    def close(self, *args: Any, **kwargs: Any) -> None:
        pass


class LazyWriter:
    """A ``TraceWriter`` made at the first step (or when a crash must be sealed), where this
    process's place decides: a rank's shard, the flat trace, or nothing (``_Discard``)."""

    def __init__(self, boot: "_Boot") -> None:
        self.boot = boot
        self.path = Path(boot.cfg["trace"])
        self._real: Any = None

    @property
    def materialized(self) -> bool:
        return self._real is not None and getattr(self._real, "materialized", True)

    @property
    def steps_written(self) -> int:
        return self._real.steps_written if self._real is not None else 0

    def open(self) -> Any:
        if self._real is None:
            self._real = self.boot.open_writer()
            self.path = Path(self._real.path)
        return self._real

    def begin_step(self, step: int) -> None:
        self.open().begin_step(step)

    def record(self, rec: Any, array: Any = None) -> Any:
        return self.open().record(rec, array)

    def end_step(self, *args: Any, **kwargs: Any) -> None:
        self.open().end_step(*args, **kwargs)

    def write_state(self, *args: Any, **kwargs: Any) -> None:
        self.open().write_state(*args, **kwargs)

    def drain(self) -> None:
        if self._real is not None:
            self._real.drain()

    def close(self, *args: Any, **kwargs: Any) -> None:
        if self._real is not None:
            self._real.close(*args, **kwargs)


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None and text.strip() != "" else None
    except ValueError:
        return None


def distributed_info() -> dict[str, Any] | None:
    """``{rank, local_rank, world_size, backend, device}`` of this process when its world
    size is > 1 (torchrun's env, else an initialized ``torch.distributed``); else None."""
    world, rank, local = _int(os.environ.get("WORLD_SIZE")), _int(os.environ.get("RANK")), _int(os.environ.get("LOCAL_RANK"))
    backend = None
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            world = dist.get_world_size()
            rank = rank if rank is not None else dist.get_rank()
            backend = str(dist.get_backend())
    except Exception:  # a half-made group: the environment's word stands
        pass
    if world is None or world <= 1 or rank is None:
        return None
    device = "cpu"
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            device = f"cuda:{torch.cuda.current_device()}"
    except Exception:
        device = None
    return {"rank": rank, "local_rank": local, "world_size": world, "backend": backend, "device": device}


class _Boot:
    """The bootstrap of one process: the watcher, then the launcher's run with a lazy writer."""

    def __init__(self, cfg: Mapping[str, Any], folder: Path) -> None:
        self.cfg = dict(cfg)
        self.folder = folder
        self.activator: Any = None
        self.run: Any = None
        self.sealed = False
        self.pid = os.getpid()  # a forked child inherits this object: only this process seals
        self.exit_status: Any = None  # what the program gave sys.exit
        self._prev_hook = sys.excepthook

    def watch(self) -> None:
        from reprobisect.runners.watch import Activator

        names = set(self.cfg.get("triggers") or ())
        if any(n in sys.modules for n in names):
            self._on_import(next(n for n in names if n in sys.modules))
            return
        self.activator = Activator(names, self._on_import)
        sys.meta_path.insert(0, self.activator)
        from reprobisect.runners import claims

        claims.watching(self.activator)

    def _on_import(self, name: str) -> None:
        if self.run is not None or stood_down():
            return
        if self.activator is not None:
            self.activator.remove()
        try:
            self._begin()
        except Exception as e:  # never break the user's process: it runs unrecorded, and says so
            print(f"reprobisect: not recording process {os.getpid()} ({type(e).__name__}: {e})", file=sys.stderr)

    def _begin(self) -> None:
        from reprobisect.runners import launch

        ns, prog = launch.parse_args([*self.cfg["launch_args"], "--", *self.cfg["command"]])
        ns.trace = self.cfg["trace"]
        run = launch._Run(ns, prog, writer=LazyWriter(self))
        self.run = run
        activate = run.activate

        def activate_and_hook(entry: Any) -> None:
            had = run.recorder
            activate(entry)
            if run.recorder is not None and run.recorder is not had:
                self._hook_recorder(run.recorder)

        run.activate = activate_and_hook
        run.watch_imports()
        sys.excepthook = self._excepthook
        self._watch_exit()
        atexit.register(self._atexit)

    def _hook_recorder(self, rec: Any) -> None:
        """End the process where the recorder stops the run (instead of raising StopRun through
        the program). A recorder without ``_finish`` (another framework's) raises as under the
        launcher: the exception hook seals its trace."""
        orig = getattr(rec, "_finish", None)
        if orig is None:
            return

        def finish(stop: Any) -> None:
            try:
                orig(stop)
            except BaseException as e:  # noqa: BLE001 - the StopRun it raises in launcher mode
                if e is not stop:
                    raise
            from reprobisect.runners.launch import _stop_outcome

            self.end(_stop_outcome(stop))

        rec._finish = finish

    # -- placing the trace ----------------------------------------------------------

    def open_writer(self) -> Any:
        from reprobisect.runners.environment import revision_of
        from reprobisect.trace.writer import TraceWriter

        trace = Path(self.cfg["trace"])
        run = self.run
        script = sys.argv[0] if sys.argv and os.path.isfile(sys.argv[0]) else None
        kwargs: dict[str, Any] = dict(
            command=list(self.cfg["command"]), policy=run.policy_json, seed=run.ns.seed,
            revision=revision_of(script),
            recorder={"launcher": "reprobisect.runners.bootstrap", "cwd": run.ns.recorded_cwd or self.cfg["cwd"],
                      "process": {"pid": os.getpid(), "argv": list(sys.argv)}},
        )
        info = distributed_info()
        if info is not None:
            return TraceWriter(trace / "ranks" / f"rank-{info['rank']}", extra={"distributed": info}, **kwargs)
        if claim_flat():
            return TraceWriter(trace, **kwargs)
        try:
            d = self.folder / "unrecorded"
            d.mkdir(exist_ok=True)
            (d / f"{os.getpid()}.json").write_text(json.dumps({"pid": os.getpid(), "argv": list(sys.argv)}))
        except OSError:
            pass
        print(f"reprobisect: process {os.getpid()} ({' '.join(sys.argv)[:200]}) steps an optimizer too; "
              "only the first such process is recorded", file=sys.stderr)
        return _Discard(self.folder / "unrecorded")

    # -- ending -----------------------------------------------------------------------

    def _seal(self, outcome: Any, *, force: bool = False) -> None:
        run = self.run
        if self.sealed or run is None:
            return
        if force and not run.writer.materialized:
            try:
                run.writer.open()
            except Exception as e:  # the crash itself is what matters: say why no trace
                print(f"reprobisect: could not write the trace of process {os.getpid()}: {e}", file=sys.stderr)
                return
        run.seal(outcome)
        self.sealed = True

    def end(self, outcome: Any) -> None:
        """Seal and leave now: the recorder stopped the run at the end of a step."""
        from reprobisect.core.outcome import LAUNCH_EXIT, Status

        run = self.run
        code = 0 if outcome.status in (Status.OK, Status.NONFINITE, Status.NO_STEPS) else LAUNCH_EXIT[outcome.status]
        try:
            if run.recorder is not None:
                run.recorder.done = True
            run.cleanup_children()
            self._seal(outcome)
            if run.writer.materialized:
                self._note_stopped()
            if code == 0:
                _barrier()
            if run.writer.materialized:
                from reprobisect.runners.launch import _say

                _say(run.outcome, run.steps_done)
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            os._exit(code)

    def _note_stopped(self) -> None:
        """Say that this process's recording ended by ``--steps`` (``recording_ended``)."""
        info = distributed_info()
        try:
            d = self.folder / "stopped"
            d.mkdir(exist_ok=True)
            rank, world = (None, None) if info is None else (info["rank"], info["world_size"])
            (d / f"{os.getpid()}.json").write_text(json.dumps({"rank": rank, "world_size": world}))
        except OSError:
            pass

    def _excepthook(self, typ: Any, exc: BaseException, tb: Any) -> None:
        if os.getpid() != self.pid:
            self._prev_hook(typ, exc, tb)
            return
        if typ.__name__ == "StopRun" and self.run is not None and not self.sealed:
            self.end(self.run._classify(exc))  # a recorder that stops by raising (not hooked): the same end
        _note_crash(self.folder)
        try:
            if self.run is not None and not self.sealed:
                if self.run.recorder is not None:
                    self.run.recorder.done = True
                self._seal(self.run._classify(exc), force=True)
        except Exception as e:
            print(f"reprobisect: sealing the trace failed: {type(e).__name__}: {e}", file=sys.stderr)
        self._prev_hook(typ, exc, tb)

    def _watch_exit(self) -> None:
        """Remember the status given to ``sys.exit`` (a wrapper that catches the program's
        exception and exits 1, as ``torch.multiprocessing.spawn``'s workers do): at exit the
        trace is sealed as ``crashed`` then, not as a run that ended by itself."""
        orig = sys.exit
        boot = self

        def exit(status: Any = None) -> None:
            boot.exit_status = status
            orig(status)

        exit.__doc__ = orig.__doc__
        sys.exit = exit

    def _atexit(self) -> None:
        run = self.run
        if self.sealed or run is None or run.recorder is None or os.getpid() != self.pid:
            return
        code = self.exit_status
        if code is not None and code != 0:
            _note_crash(self.folder)
            run.recorder.done = True
            try:
                self._seal(run._classify(SystemExit(code)), force=distributed_info() is not None)
            except Exception as e:
                print(f"reprobisect: sealing the trace at exit failed: {type(e).__name__}: {e}", file=sys.stderr)
            return
        if not run.writer.materialized and not getattr(run.recorder, "backwards", 0):
            return
        try:
            outcome = run._ended()
            run.recorder.done = True
            self._seal(outcome)
        except Exception as e:
            print(f"reprobisect: sealing the trace at exit failed: {type(e).__name__}: {e}", file=sys.stderr)


def _note_crash(folder: Path) -> None:
    """When this process (a rank) crashed: the probe names the rank that crashed first, not
    the peers whose collectives failed because of it."""
    info = distributed_info()
    if info is None:
        return
    try:
        d = folder / "crashes"
        d.mkdir(exist_ok=True)
        (d / f"rank-{info['rank']}.json").write_text(json.dumps({"rank": info["rank"], "time": time.time()}))
    except OSError:
        pass


def recording_ended(folder: str | os.PathLike) -> bool:
    """Whether the probe's recording ended by ``--steps``: the process of the flat trace
    stopped, or every rank of the world did."""
    d = Path(folder) / "stopped"
    ranks: set[int] = set()
    world = 0
    for p in d.glob("*.json") if d.is_dir() else ():
        try:
            x = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(x, dict):
            continue
        if x.get("rank") is None:
            return True
        ranks.add(int(x["rank"]))
        world = max(world, int(x.get("world_size") or 0))
    return bool(ranks) and len(ranks) >= world


def crash_times(folder: str | os.PathLike) -> dict[int, float]:
    """``{rank: time}`` of the ranks of the probe that crashed, as they noted it."""
    out: dict[int, float] = {}
    d = Path(folder) / "crashes"
    for p in d.glob("rank-*.json") if d.is_dir() else ():
        try:
            x = json.loads(p.read_text())
            out[int(x["rank"])] = float(x["time"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def _barrier() -> None:
    """Meet the other ranks (bounded) before leaving, so none leaves a peer mid-transfer."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return
    except Exception:
        return
    t = threading.Thread(target=_quiet_barrier, args=(dist,), daemon=True)
    t.start()
    t.join(_BARRIER_S)


def _quiet_barrier(dist: Any) -> None:
    try:
        dist.barrier()
    except Exception:
        pass
