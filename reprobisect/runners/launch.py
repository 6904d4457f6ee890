"""``python -m reprobisect.runners.launch``: record an unmodified training command.

::

    python -m reprobisect.runners.launch --trace DIR [--steps N] [--full-steps 0,1]
        [--state-steps 3] [--stop-on-nonfinite] [--max-disk BYTES] [--seed S]
        [--zoom-module NAME --zoom-step K] [--max-records-per-step N]
        [--replay-from TRACE --replay-step S]
        [--detail full|sentinel] [--state-every K]
        --  script.py ARGS...  |  -- -m pkg.module ARGS...

The script runs through ``runpy`` exactly as ``python script.py ARGS`` would run it:
``sys.argv`` is ``[script.py, ARGS...]``, ``sys.path[0]`` is the script's folder, it
runs as ``__main__``, the working directory is unchanged (``-m`` runs like
``python -m``: ``sys.path[0]`` is the working directory). A meta-path hook waits for the
script to import a framework and only then activates its recorder: each recorder registers
the module that triggers it (``reprobisect.runners.registry``: ``torch`` activates
``reprobisect.runners.torch``); nothing else is imported on the script's behalf (no
TensorFlow). After ``--steps`` optimizer steps the recorder raises ``StopRun`` (a
``BaseException``) out of ``optimizer.step()`` (under Lightning the Trainer is asked to stop
instead, ``trainer.should_stop``, so checkpoints and loggers finish normally; the raise is
the fallback when it will not); the launcher then seals the trace, stops
DataLoader worker processes and any other child process, and leaves with ``os._exit``.

How the run ended is written into the manifest as ``outcome`` (``Outcome.to_json()``) and
returned as the exit status (``reprobisect.core.outcome.LAUNCH_EXIT``):

- ``ok`` (0): the steps were recorded (or the script ended by itself after >= 1 step,
  including ``SystemExit(0)``); the trace is ``complete``.
- ``skip`` (5): ``ImportError``/``ModuleNotFoundError``/``SyntaxError`` before the first
  optimizer step completed, or a script/module that does not exist: the command cannot
  be tested here (git bisect's 125). Trace ``failed``.
- ``crashed`` (3): any other exception, or a nonzero ``SystemExit`` (also before the first
  step: a script that exits with an error status is a failing command), with the step it
  happened in and the traceback. Trace ``failed``; steps already written stay readable
  with ``allow_incomplete``.
- ``infra`` (7): reprobisect's own recorder failed inside the run (a bug of ours, caught
  in its hooks): the run is stopped at the next safe point and the probe is never counted
  as evidence about the program. Trace ``failed``.
- ``nonfinite`` (4): ``--stop-on-nonfinite`` and a NaN/Inf appeared; the trace is
  ``complete`` up to and including that step and names the first non-finite record.
- ``no_steps`` (6): the script never trained: it ended without any step (it never imported
  torch, or never called ``optimizer.step()`` nor updated a parameter after ``backward()``),
  or it ran 200 backward passes with neither (reported then, not after the whole script).
  The detail says what to do next. Trace ``failed``.

``--detail sentinel`` records only each step's sentinels (batch, loss, gradient norm,
learning rates, GradScaler scale, parameters after the step) and complete state every
``--state-every K`` steps (default 50 with sentinel); ``full`` (the default) records the
whole chain. Both go into the manifest's policy (``detail``, ``state_every``).

``--replay-from TRACE --replay-step S`` replays: the command runs from its start with the
recorder quiet, loads the complete state TRACE captured after step ``S - 1`` where step
``S`` began, and records ``--steps`` steps numbered ``S, S+1, ...``; the manifest's
``extra.replay`` says from which trace and step. A state that cannot be restored
faithfully ends the run as ``skip`` ("cannot replay: ...");
``reprobisect.runners.replay_torch`` has the details.

``--seed`` is recorded in the manifest only; the script seeds itself from its own
arguments (``bisect seeds`` substitutes ``{seed}`` into the command). Without ``--seed``
the manifest's seed is the first ``torch.manual_seed`` the script called (``extra.
seed_source``), or null. Evaluation after the last step is in ``extra.eval_after_last_step``.
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import os
import re
import runpy
import sys
import time
import traceback
from dataclasses import replace
from typing import Any, Sequence

from reprobisect import native
from reprobisect.core.outcome import LAUNCH_EXIT, Outcome, Status, disk_full_detail
from reprobisect.errors import UsageError
from reprobisect.runners.watch import Activator as _Activator
from reprobisect.runners.environment import collect_environment, revision_of
from reprobisect.runners.policy import StopRun
from reprobisect.runners.registry import RecorderEntry, recorders
from reprobisect.trace.format import DEFAULT_STATE_EVERY, DETAILS
from reprobisect.trace.writer import TraceWriter

__all__ = ["main", "parse_args", "run"]

_SKIP_TYPES = (ImportError, SyntaxError)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        out = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected step numbers like 0,1,5, got '{text}'") from None
    if any(x < 0 for x in out):
        raise argparse.ArgumentTypeError(f"step numbers start at 0, got '{text}'")
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m reprobisect.runners.launch",
        description="Run a training script unmodified and record its first optimizer steps into a trace.",
    )
    p.add_argument("--trace", required=True, help="folder to write the trace into (replaced if it is a trace)")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps to record, then end the run (default 3)")
    p.add_argument("--full-steps", type=_int_list, default=(), help="steps whose full tensors are kept, e.g. 0,1")
    p.add_argument("--state-steps", type=_int_list, default=(), help="steps after which complete state is captured")
    p.add_argument("--stop-on-nonfinite", action="store_true", help="end at the first NaN/Inf (outcome nonfinite)")
    p.add_argument("--max-disk", type=int, default=None, help="bound in bytes for the trace's full tensors and state")
    p.add_argument("--seed", default=None, help="the seed this run uses (recorded in the manifest)")
    p.add_argument("--recorded-cwd", default=None,
                   help="the folder to record as the command's cwd when its code was shipped to run elsewhere "
                        "(a Ray worker's copy of the controller's folder), so the trace can be re-run where it came from")
    p.add_argument("--zoom-module", default=None, help="module whose aten ops are recorded at --zoom-step")
    p.add_argument("--zoom-step", type=int, default=None, help="step of the op-level zoom")
    p.add_argument("--max-records-per-step", type=int, default=20000,
                   help="bound on a step's forward records; past it activations are counted, not recorded (default 20000)")
    p.add_argument("--replay-from", default=None, metavar="TRACE",
                   help="replay: load the complete state TRACE captured after step S-1 and record steps S.. "
                        "(--steps of them); see reprobisect.runners.replay_torch")
    p.add_argument("--replay-step", type=int, default=None, metavar="S", help="replay: the first step to record")
    p.add_argument("--defer-stop", action="store_true",
                   help="end after the last step's own end-of-step code, as the next step begins (bisect resume)")
    p.add_argument("--detail", default="full",
                   help="full: every record of the chain (default); sentinel: batch, loss, gradient norm, learning "
                        "rates, scale and parameters after each step, and complete state every --state-every steps")
    p.add_argument("--state-every", default=None,
                   help=f"capture complete state after every K-th step (default {DEFAULT_STATE_EVERY} with --detail "
                        "sentinel, else none)")
    p.add_argument("--overfit", action="store_true", help="bisect doctor: repeat the first batch, dropout and weight decay off")
    p.add_argument("--memory", action="store_true", help="bisect doctor: record per-step memory figures")
    return p


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Split ``OPTIONS -- PROGRAM ARGS`` into the options and the program's argv."""
    argv = list(argv)
    if "--" not in argv:
        raise UsageError("give the command after '--': python -m reprobisect.runners.launch --trace DIR -- train.py ARGS")
    cut = argv.index("--")
    ns = _parser().parse_args(argv[:cut])
    prog = argv[cut + 1 :]
    if not prog or (prog[0] == "-m" and len(prog) < 2):
        raise UsageError("no script after '--'; give 'script.py ARGS' or '-m package.module ARGS'")
    if ns.steps < 1:
        raise UsageError(f"--steps must be at least 1, got {ns.steps}")
    if (ns.zoom_module is None) != (ns.zoom_step is None):
        raise UsageError("--zoom-module and --zoom-step go together")
    if (ns.replay_from is None) != (ns.replay_step is None):
        raise UsageError("--replay-from and --replay-step go together")
    ns.detail, ns.state_every = check_detail(ns.detail, ns.state_every)
    return ns, prog


def check_detail(detail: Any, state_every: Any) -> tuple[str, int | None]:
    """``(detail, state_every)`` checked, the default K filled in for ``sentinel``; a bad
    value is one ``UsageError`` line."""
    if detail not in DETAILS:
        raise UsageError(f"--detail takes {' or '.join(DETAILS)} (got {detail!r})")
    if state_every is None:
        return detail, DEFAULT_STATE_EVERY if detail == "sentinel" else None
    try:
        k = int(str(state_every).strip())
    except ValueError:
        k = 0
    if k < 1:
        raise UsageError(f"--state-every takes a whole number of steps >= 1 (got {state_every!r})")
    return detail, k


class _Run:
    """One recorded run: its options, its writer, the recorders activated in this process.

    ``python -m reprobisect.runners.launch`` makes one with an eager ``TraceWriter``; the
    bootstrap (``reprobisect.runners.bootstrap``, in every Python process a wrapped command
    starts) passes a lazy ``writer`` that makes its trace (flat or a rank's shard) only at
    the first step, so that processes which never step leave nothing behind."""

    def __init__(self, ns: argparse.Namespace, prog: list[str], writer: Any = None) -> None:
        self.ns = ns
        self.prog = prog
        self.recorder: Any = None
        self.replayer: Any = None  # --replay-from: runners.replay_torch.Replayer
        self.active: set[str] = set()  # names of the registered recorders activated so far
        self.t0 = time.monotonic()
        self.policy_json = {
            "steps": ns.steps,
            "full_steps": list(ns.full_steps),
            "state_steps": list(ns.state_steps),
            "stop_on_nonfinite": ns.stop_on_nonfinite,
            "max_disk": ns.max_disk,
            "zoom_module": ns.zoom_module,
            "zoom_step": ns.zoom_step,
            "max_records_per_step": ns.max_records_per_step,
            **({"replay_from": ns.replay_from, "replay_step": ns.replay_step} if ns.replay_from is not None else {}),
            "detail": ns.detail,
            "state_every": ns.state_every,
            **{k: True for k in ("overfit", "memory") if getattr(ns, k, False)},
            **({"defer_stop": True} if ns.defer_stop else {}),
        }
        self.writer = writer if writer is not None else TraceWriter(
            ns.trace,
            command=list(prog),
            policy=self.policy_json,
            seed=ns.seed,
            revision=revision_of(None if prog[0] == "-m" else prog[0]),
            recorder={"launcher": "reprobisect.runners.launch", "cwd": ns.recorded_cwd or os.getcwd(),
                      **({"ran_in": os.getcwd()} if ns.recorded_cwd else {})},
        )

    def activate(self, entry: RecorderEntry) -> None:
        """Activate one registered recorder (its trigger module was imported); once."""
        if entry.name in self.active:
            return
        self.active.add(entry.name)
        recorder = entry.activate(self)
        if recorder is not None and self.recorder is None:
            self.recorder = recorder
            if self.ns.replay_from is not None and entry.name == "torch":
                from reprobisect.runners.replay_torch import Replayer

                self.replayer = Replayer(recorder, self.ns.replay_from, self.ns.replay_step, self.ns.steps)
                self.replayer.install()
            elif self.ns.replay_from is not None and entry.name == "tensorflow":  # re-runs, quiet before S
                from reprobisect.runners.replay_tf import Replayer as TFReplayer

                self.replayer = TFReplayer(recorder, self.ns.replay_from, self.ns.replay_step, self.ns.steps).install()

    def watch_imports(self) -> None:
        """Activate each registered recorder whose trigger is imported already; watch the others' triggers."""
        pending: dict[str, list[RecorderEntry]] = {}
        for entry in recorders():
            if any(t in sys.modules for t in entry.triggers):
                self.activate(entry)
            else:
                for t in entry.triggers:
                    pending.setdefault(t, []).append(entry)
        if pending:
            def on_import(name: str) -> None:
                for entry in pending.get(name, ()):
                    self.activate(entry)

            sys.meta_path.insert(0, _Activator(set(pending), on_import))

    @property
    def steps_done(self) -> int:
        return self.writer.steps_written

    def execute(self) -> Outcome:
        """Run the program; return how it ended (never raises for the program's errors)."""
        prog = self.prog
        self.watch_imports()
        try:
            if prog[0] == "-m":
                mod = prog[1]
                sys.argv = [prog[1], *prog[2:]]  # runpy replaces argv[0] with the module's file
                sys.path[0] = os.getcwd()
                try:
                    spec_ok = importlib.util.find_spec(mod) is not None
                except (ImportError, ValueError) as e:
                    return Outcome(Status.SKIP, detail=f"cannot import module '{mod}': {e}")
                if not spec_ok:
                    return Outcome(Status.SKIP, detail=f"no module named '{mod}' (python -m {mod} cannot start here)")
                runpy.run_module(mod, run_name="__main__", alter_sys=True)
            else:
                script = prog[0]
                if not os.path.exists(script):
                    return Outcome(Status.SKIP, detail=f"can't open file '{script}': no such file (python cannot start it here)")
                sys.argv = list(prog)
                sys.path[0] = os.path.dirname(os.path.realpath(script))
                runpy.run_path(script, run_name="__main__")
        except BaseException as e:  # noqa: BLE001 - classify everything the program does
            return self._classify(e)
        return self._ended()

    def _ended(self, how: str = "ended") -> Outcome:
        if getattr(self.replayer, "refused", None):
            return Outcome(Status.SKIP, detail=self.replayer.refused)
        if self.ns.replay_from is not None and (self.replayer is None or not self.replayer.restored):
            return Outcome(Status.SKIP, detail=f"cannot replay: the command {how} before it reached the point where "
                                               f"step {self.ns.replay_step} began (nothing was restored)")
        if self.recorder is not None and self.recorder.stop is None:
            try:  # a loop without an optimizer: its last update ends a step only now
                self.recorder.finish_manual()
            except BaseException:  # noqa: BLE001 - the StopRun of the last step: already recorded
                if self.recorder.stop is None:
                    raise
        if self.recorder is not None and self.recorder.stop is not None and self.recorder.stop.reason == "no_steps":
            return _stop_outcome(self.recorder.stop)
        if self.recorder is not None and self.recorder.failed is not None and self.recorder.stop is not None:
            return _stop_outcome(self.recorder.stop)  # the program ended before the recorder could stop it
        if self.steps_done == 0:
            if self.recorder is None:
                why = "it never imported torch (no supported framework); nothing to compare"
            elif hasattr(self.recorder, "no_steps_detail"):  # a recorder other than torch's (TensorFlow's)
                why = self.recorder.no_steps_detail()
            else:
                from reprobisect.runners.torch import _no_update_detail

                why = _no_update_detail(self.recorder.backwards, getattr(self.recorder, "graphless_backwards", 0))
            return Outcome(Status.NO_STEPS, detail=f"the command {how} without an optimizer step: {why}")
        detail = f"recorded {self.steps_done} step(s)"
        if self.steps_done < self.ns.steps:
            detail += f"; the command {how} before --steps {self.ns.steps}"
        return Outcome(Status.OK, detail=detail)

    def _classify(self, e: BaseException) -> Outcome:
        if type(e).__name__ == "ReplayRefused" and type(e).__module__ == "reprobisect.runners.replay_torch":
            return Outcome(Status.SKIP, detail=str(e))
        if getattr(self.replayer, "refused", None):
            return Outcome(Status.SKIP, detail=self.replayer.refused)
        from_stop = isinstance(e, StopRun)
        if not from_stop and self.recorder is not None and self.recorder.stop is not None:
            e = self.recorder.stop  # the recorder stopped the run and the program turned that into another exception
            from_stop = True
        if from_stop:
            out = _stop_outcome(e)
            if getattr(self.replayer, "detail", None) and out.status is Status.OK:
                out = Outcome(Status.OK, detail=self.replayer.detail)
            elif self.replayer is not None and out.status is Status.OK:
                out = Outcome(Status.OK, detail=f"replayed {self.steps_done} step(s) from step {self.ns.replay_step} "
                                                f"(the state {self.ns.replay_from} holds after step {self.ns.replay_step - 1})")
            return out
        step = self.steps_done
        if isinstance(e, SystemExit):
            code = e.code
            if code is None or code == 0:
                return self._ended("exited (status 0)")
            where = "before the first optimizer step" if step == 0 else f"at step {step}"
            return Outcome(
                Status.CRASHED,
                detail=f"the command exited with status {code!r} {where}",
                step=step,
                traceback=_format_tb(e),
            )
        if isinstance(e, _SKIP_TYPES) and step == 0:
            return Outcome(
                Status.SKIP,
                detail=f"{type(e).__name__}: {e} (before training started: a dependency or import failure, not a training bug)",
                traceback=_format_tb(e),
            )
        if isinstance(e, KeyboardInterrupt):
            return Outcome(Status.CRASHED, detail=f"interrupted at step {step}", step=step, traceback=_format_tb(e))
        traced = _compile_traced_recorder(e)
        if traced is not None:  # torch.compile failed on reprobisect's own hook code: ours, not the program's
            return Outcome(Status.INFRA, step=step, traceback=_format_tb(e), detail=(
                f"torch.compile failed while tracing reprobisect's recorder hooks at step {step} ({traced}); "
                "a reprobisect bug, not your program's: this probe is no evidence either way"))
        return Outcome(Status.CRASHED, detail=f"{type(e).__name__}: {e}", step=step, traceback=_format_tb(e))

    def seal(self, outcome: Outcome) -> None:
        environment: dict[str, Any] = {}
        try:
            extra = dict(self.recorder.environment_extra) if self.recorder is not None else {}
            environment = collect_environment({**extra, "recorder": {"fingerprint": native.status()}})
        except Exception as e:  # the trace must still be sealed
            environment = {"error": f"environment record failed: {type(e).__name__}: {e}"}
        notes = list(self.recorder.notes) if self.recorder is not None else []
        extra: dict[str, Any] = {}
        if notes:
            extra["notes"] = notes
        if self.ns.replay_from is not None:
            extra["replay"] = self.replayer.manifest_extra() if self.replayer is not None else {
                "from": os.path.abspath(self.ns.replay_from), "step": self.ns.replay_step, "restored": False}
        if self.recorder is not None:
            extra.update(getattr(self.recorder, "manifest_extra", None) or {})  # TensorFlow's extra.tensorflow
        if self.recorder is not None and self.recorder.first_nonfinite is not None:
            step, what = self.recorder.first_nonfinite
            extra["first_nonfinite"] = {"step": step, "record": what}
        seed = self.ns.seed
        if self.recorder is not None:
            try:
                tail = self.recorder.evaluation_after_last_step()
            except Exception as e:  # the trace must still be sealed
                tail = [{"error": f"{type(e).__name__}: {e}"}]
            if tail:
                extra["eval_after_last_step"] = tail
            if seed is None and self.recorder.seed is not None:
                seed = self.recorder.seed  # the script's own torch.manual_seed / seed_everything
                extra["seed_source"] = getattr(self.recorder, "seed_source", "torch.manual_seed")
        outcome = Outcome(
            outcome.status,
            detail=outcome.detail,
            step=outcome.step,
            traceback=outcome.traceback,
            trace=os.path.abspath(getattr(self.writer, "path", self.ns.trace)),
            wall_s=round(time.monotonic() - self.t0, 3),
        )
        self.outcome = outcome
        if not getattr(self.writer, "materialized", True):
            return  # a lazy writer that never began a step: this process leaves no trace
        status = "complete" if outcome.status in (Status.OK, Status.NONFINITE) else "failed"
        self.writer.close(
            status,
            outcome=outcome.to_json(),
            error=None if status == "complete" else str(outcome),
            environment=environment,
            extra=extra,
            seed=seed,
        )
        self.outcome = outcome

    def cleanup_children(self) -> None:
        if self.recorder is not None:
            self.recorder.shutdown_loaders()
        if "multiprocessing" in sys.modules:
            import multiprocessing

            for child in multiprocessing.active_children():
                child.terminate()
            deadline = time.monotonic() + 5
            for child in multiprocessing.active_children():
                child.join(max(0.0, deadline - time.monotonic()))
                if child.is_alive():
                    child.kill()
                    child.join(1)


def _stop_outcome(stop: Any) -> Outcome:
    """How a run the recorder stopped ended: ``ok``, ``nonfinite``, or ``infra`` when the
    recorder itself failed (never the program's crash: see runners.torch._hook)."""
    status = {"ok": Status.OK, "nonfinite": Status.NONFINITE, "recorder_error": Status.INFRA,
              "no_steps": Status.NO_STEPS}[stop.reason]
    return Outcome(status, detail=stop.detail, step=None if status in (Status.OK, Status.NO_STEPS) else stop.step,
                   traceback=getattr(stop, "traceback", None) if status is Status.INFRA else None)


def _compile_traced_recorder(e: BaseException) -> str | None:
    """``Type: first line`` of a torch.compile (dynamo/inductor) error raised while tracing
    the recorder's own code (its file named in dynamo's user-code stack), else None."""
    if "torch._dynamo" not in sys.modules:
        return None
    here = os.path.dirname(os.path.abspath(__file__))
    seen: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and all(cur is not s for s in seen) and len(seen) < 20:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    for x in reversed(seen):  # the first cause first
        if type(x).__module__.startswith(("torch._dynamo", "torch._inductor")) and here in str(x):
            first = str(x).strip().splitlines()[0] if str(x).strip() else ""
            return f"{type(x).__name__}: {first}" if first else type(x).__name__
    return None


def _format_tb(e: BaseException) -> str:
    return "".join(traceback.format_exception(type(e), e, e.__traceback__))[-20000:]


def run(argv: Sequence[str]) -> int:
    """Run the launcher in this process; returns the exit status (does not exit)."""
    ns, prog = parse_args(argv)
    _claim_process()
    r = _Run(ns, prog)
    outcome = _on_full_disk(r.execute(), ns.trace)
    if r.recorder is not None:
        r.recorder.done = True
    r.cleanup_children()
    try:
        r.seal(outcome)
    except OSError as e:  # the manifest itself did not fit: the trace stays 'incomplete', never read as complete
        if e.errno not in _NO_SPACE_ERRNOS:
            raise
        outcome = Outcome(Status.INFRA, detail=disk_full_detail(os.path.abspath(ns.trace), errno.errorcode[e.errno]),
                          trace=os.path.abspath(ns.trace))
        r.outcome = outcome
    _say(r.outcome, r.steps_done)
    return LAUNCH_EXIT[outcome.status]


_NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_NO_SPACE = re.compile(rf"\[Errno ({errno.ENOSPC}|{errno.EDQUOT})\]")


def _on_full_disk(outcome: Outcome, trace: str) -> Outcome:
    """A recorder failure that was a full disk (ENOSPC/EDQUOT while writing the trace) as
    ``disk_full_detail``: the tool's own writing failed, which the parent reports as one
    line naming the disk (``bisect capture``: exit 2), not as a bug of the recorder."""
    if outcome.status is not Status.INFRA:
        return outcome
    m = _NO_SPACE.search(f"{outcome.detail}\n{outcome.traceback or ''}")
    if m is None:
        return outcome
    code = errno.errorcode[int(m.group(1))]
    return replace(outcome, detail=disk_full_detail(os.path.abspath(trace), code))


def _trace_arg(args: Sequence[str]) -> str:
    """The absolute ``--trace`` folder among the launcher's arguments (for an error line)."""
    for i, a in enumerate(args):
        if a == "--":
            break
        if a.startswith("--trace="):
            return os.path.abspath(a.split("=", 1)[1])
        if a == "--trace" and i + 1 < len(args):
            return os.path.abspath(args[i + 1])
    return "the trace folder"


def _claim_process() -> None:
    """This process records through the launcher: a bootstrap that ``sitecustomize`` started
    here (the probe's folder on PYTHONPATH) stands down, and the flat trace is this one's
    (bootstrapped child processes that are not ranks do not take it)."""
    from reprobisect.runners import claims

    claims.stand_down()
    claims.claim_flat()


def _say(outcome: Outcome, steps: int) -> None:
    """How the run ended, one line on stderr (in a probe's ``output.log``); nothing under
    ``bisect capture``, which says it once itself and logs the whole traceback
    (``reprobisect.workflows.capture.OUTCOME_BY_PARENT``)."""
    if os.environ.get("REPROBISECT_OUTCOME_BY_PARENT") == "1":
        return
    trace = outcome.trace
    if outcome.status is Status.OK:
        msg = f"reprobisect: ok, {steps} step(s) recorded into {trace}"
    elif outcome.status is Status.NO_STEPS:
        msg = f"reprobisect: no_steps: {outcome.detail}"
    else:
        msg = f"reprobisect: {outcome} (trace {trace})"
    print(msg, file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m reprobisect.runners.launch``; ends the process."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        code = run(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        code = 2
    except OSError as e:  # the launcher's own writing (claims, the trace's first manifest) hit a full disk
        if e.errno not in _NO_SPACE_ERRNOS:
            raise
        print(f"reprobisect: infra: {disk_full_detail(_trace_arg(args), errno.errorcode[e.errno])}", file=sys.stderr)
        code = LAUNCH_EXIT[Status.INFRA]
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    # the trace is sealed and child processes are gone: leave without running the
    # interrupted script's remaining cleanup (threads, atexit handlers) that could hang
    os._exit(code)


if __name__ == "__main__":
    main()
