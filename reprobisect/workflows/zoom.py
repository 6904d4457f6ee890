"""Op-level zoom, controller side: re-run both sides recording every aten op of one module.

When ``compare`` names a module as the origin of a divergence at step K (its inputs agree,
its output does not), ``run_zoom`` re-runs both sides' commands under the launcher with
``--zoom-module NAME --zoom-step K --steps K+1`` (``reprobisect.runners.zoom_torch``
records each aten op inside that module's forward at step K) and
``first_divergent_op`` walks the two op sequences in execution order to name the first op
whose tensor inputs agree bitwise and whose output does not.

What is re-run, per side (``ZoomSide`` overrides each): the command the manifest recorded
(``manifest.command``, the program and its arguments), with the interpreter the
environment record names (``environment.python.executable``), in the working directory
the launcher recorded (``manifest.recorder.cwd``), with this process's environment plus
the numerics-relevant variables the side's environment record kept
(``environment.env_vars``) plus ``ZoomSide.env``. Variables the record does not keep are
not repeated: when the two sides differ by one, the caller (``bisect envs``) passes it in
``ZoomSide.env``.

Where (``_placement``): what was recorded, never whatever the user's checkout holds now.
A trace whose ``manifest.revision`` names a commit re-runs at that commit in a detached
worktree of the repository holding it (``ProbeSpec.repo``/``revision``: the executor's
worktree pool, as ``bisect runs``; removed when the executor closes, also on Ctrl-C), from
the recorded folder relative to the repository root, its command's absolute paths into the
checkout made relative; ``links`` (``--link``) bring in what git does not hold. Two sides
at two commits: two worktrees. The user's working tree, index and HEAD are never touched.
The manifest records only *that* a run had uncommitted changes (``dirty``), not which, so a
dirty trace re-runs only in the user's checkout itself while it is at the recorded commit
and still dirty (its changes assumed to be the recorded ones, and the answer says so);
otherwise it is refused with one line naming the commit. A trace recorded outside git
re-runs in place, and the answer says so. ``ZoomSide.cwd`` runs a side in that folder as it is.
``ZoomResult.reruns`` says where each side ran; ``ZoomResult.contradiction`` says where the
re-run disagrees with the trace comparison (``_contradiction``), on a line of its own.
The re-runs are probes on an executor like every probe (own process group, timeout,
outcome; the local one with both sides at once by default), each writing its trace to
``a.trace`` / ``b.trace`` of the zoom folder.

Trust: re-running what a manifest records is running code named by the trace. A trace
this user did not record on this machine (``reprobisect.support.trust``: the manifest's HMAC does
not verify with this user's key) is re-run only with ``trust=True`` or when ``confirm``
(shown the exact command, folder and variables) says yes; otherwise ``UntrustedTraceError``
and nothing runs.

Core module: imports no ML framework; the zoom traces are read like any other trace.
"""

from __future__ import annotations

import os
import re
import shlex
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from reprobisect.core.distributed import rerun_unsupported
from reprobisect.core.probe import ProbeResult, ProbeSpec
from reprobisect.errors import ProbeError, UsageError
from reprobisect.executors.base import Executor
from reprobisect.executors.local import LocalExecutor
from reprobisect.support.trust import is_trusted
from reprobisect.trace import Record, Trace, read_trace
from reprobisect.vcs import git

__all__ = ["ZoomResult", "ZoomSide", "run_zoom", "UntrustedTraceError", "untrusted_reruns", "first_divergent_op", "zoom_target", "SEPARATOR", "VERDICTS"]

SEPARATOR = "::"  # same as reprobisect.runners.zoom_torch.SEPARATOR (kept framework-free here)
VERDICTS = ("origin", "inputs_differ", "agree", "structure", "not_run", "no_ops", "unsupported")
_INDEX = re.compile(r"\[\d+\]$")
_CALL_SUFFIX = re.compile(r"#\d+$")


@dataclass(frozen=True, kw_only=True)
class ZoomSide:
    """How to re-run one side; each field left None takes what the side's manifest recorded."""

    command: tuple[str, ...] | None = None
    """Full command with interpreter (``python train.py --lr 1e-3``); default: the recorded one."""
    cwd: str | None = None
    """Folder to run in; default: the folder the launcher recorded (``manifest.recorder.cwd``)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables added to this process's environment for the re-run (what made this side differ)."""


@dataclass(frozen=True)
class ZoomResult:
    """The first op inside ``module`` at ``step`` whose inputs agree and whose output does not.

    Truthy when the two sides agree on every op (nothing to blame at op level), like
    ``Comparison``. ``verdict``: ``origin`` (the op is named), ``inputs_differ`` (the first
    differing op already had differing inputs: the module's own inputs or parameters
    differ), ``agree`` (every op identical in the re-run), ``structure`` (the op sequences
    differ: ``op`` is the first op present on one side only), ``not_run`` (the module did
    not run at that step on some side), ``no_ops`` (it ran on both sides without issuing
    an op: ``Identity``, ``Dropout(p=0)``, eval-mode dropout pass their input through),
    ``unsupported`` (nothing was re-run: a side is a multi-rank trace, whose re-run with the
    zoom is not implemented yet; ``detail`` says so).
    """

    module: str
    step: int
    verdict: str
    op: str | None = None
    occurrence: int | None = None
    record: str | None = None
    inner_module: str | None = None
    args_a: Any = None
    args_b: Any = None
    stats_a: dict[str, Any] | None = None
    stats_b: dict[str, Any] | None = None
    ops_a: int = 0
    ops_b: int = 0
    first_differing: str | None = None
    detail: str = ""
    trace_a: str | None = None
    trace_b: str | None = None
    reruns: tuple[str, ...] = ()
    """Where each side re-ran (``A at its recorded commit 1a2b3c4d5e (a detached worktree)``,
    ``B in place in '/x' (its trace was recorded outside any git repository ...)``)."""
    contradiction: str = ""
    """Where the re-run disagrees with the trace comparison (a side whose re-run did not
    reproduce its trace at the module, or a zoom verdict the traces contradict); empty when
    none. Shown as its own line: the zoom's answer and the traces' are never presented as one."""

    def __bool__(self) -> bool:
        return self.verdict == "agree"

    def __str__(self) -> str:
        lines = [self._answer()]
        if self.reruns:
            lines.append("  re-ran " + "; ".join(self.reruns))
        if self.contradiction:
            lines.append(f"  {self.contradiction}")
        return "\n".join(lines)

    def _answer(self) -> str:
        where = f"module '{self.module}' at step {self.step}" if self.module else f"the model's forward at step {self.step}"
        if self.verdict == "origin":
            inner = f" (in '{self.inner_module}')" if self.inner_module and self.inner_module != self.module else ""
            s = (f"zoom into {where}: first op whose inputs agree and output differs: "
                 f"{self.op} #{self.occurrence}{inner}")
            if self.args_a != self.args_b:
                s += f"; its non-tensor arguments differ: {self.args_a} vs {self.args_b}"
            if self.stats_a and self.stats_b:
                s += f"; output norm {self.stats_a.get('norm')} vs {self.stats_b.get('norm')}"
            return s + (f" ({self.ops_a} ops compared)" if self.ops_a else "")
        if self.verdict == "unsupported":
            return f"zoom into {where}: {self.detail}"
        return f"zoom into {where}: {self.verdict}: {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _zoom_records(trace: Trace, module: str, step: int) -> list[Record]:
    s = trace.step(step)
    if s is None:
        return []
    prefix = module + SEPARATOR
    return [r for r in s.records if r.name.startswith(prefix) and r.meta and r.meta.get("zoom")]


def _zoom_ops(trace: Trace, module: str, step: int) -> list[Record]:
    """The op records (the markers saying whether the module ran have no ``::``)."""
    return [r for r in _zoom_records(trace, module, step) if "ran" not in r.meta]


_MARKS = ("@zoom-call#", "@zoom-not-run")  # reprobisect.runners.zoom_torch.call_record_name


def _ran(trace: Trace, module: str, step: int) -> bool | None:
    """True: the module ran at ``step`` (a ``NAME@zoom-call#k`` marker); False: the zoom said
    it did not run (``NAME@zoom-not-run``); None: a trace from before these markers (cannot tell)."""
    s = trace.step(step)
    base = _CALL_SUFFIX.sub("", module)
    marks = [r for r in (s.records if s is not None else ())
             if r.meta and r.meta.get("zoom") and "ran" in r.meta and r.name.startswith((module + _MARKS[0], base + _MARKS[0], module + _MARKS[1]))]
    if any(r.meta.get("ran") for r in marks):
        return True
    return False if marks else None


def first_divergent_op(a: Trace, b: Trace, module: str, step: int) -> ZoomResult:
    """Compare two zoom traces' op records for ``module`` at ``step``, in execution order."""
    ops_a, ops_b = _zoom_ops(a, module, step), _zoom_ops(b, module, step)
    base = dict(module=module, step=step, ops_a=len(ops_a), ops_b=len(ops_b), trace_a=str(a.path), trace_b=str(b.path))
    if not ops_a or not ops_b:
        ran = {"A": _ran(a, module, step), "B": _ran(b, module, step)}
        empty = [n for n, ops in (("A", ops_a), ("B", ops_b)) if not ops]
        no_ops = [n for n in empty if ran[n]]
        not_run = [n for n in empty if ran[n] is not True]
        if not not_run and len(no_ops) == 2:
            return ZoomResult(verdict="no_ops", detail=(
                f"module '{module}' ran at step {step} on both sides without issuing an op (Identity, Dropout(p=0) "
                "or eval-mode dropout pass their input through): nothing inside it can differ; "
                "the difference comes from its inputs or from the code around it"), **base)
        if not not_run:
            return ZoomResult(verdict="structure", detail=(
                f"module '{module}' ran at step {step} on side {no_ops[0]} without issuing an op, "
                f"while side {'B' if no_ops[0] == 'A' else 'A'} ran {len(ops_a or ops_b)} op(s): the module "
                "computes differently (a Dropout p or train/eval mode that differs?)"), **base)
        told = []
        if no_ops:
            told.append(f"it ran without issuing an op on side {no_ops[0]}")
        if any(ran[n] is False for n in not_run):
            why = "it did not run at that step in a training forward (or the name differs)"
        else:  # an older trace, without call markers
            why = ("the module did not run in a training forward at that step, ran without issuing an op, "
                   "or the name differs")
        return ZoomResult(verdict="not_run", detail=(
            f"no op of module '{module}' recorded at step {step} on side {' and '.join(not_run)}: {why}"
            + (f"; {told[0]}" if told else "") + "; check the module name in the compare output"), **base)
    first_diff: Record | None = None
    for i, (ra, rb) in enumerate(zip(ops_a, ops_b)):
        if ra.name != rb.name:
            return ZoomResult(verdict="structure", op=ra.meta.get("op"), occurrence=ra.meta.get("occurrence"),
                              record=ra.name, inner_module=ra.module, first_differing=(first_diff or ra).name,
                              detail=f"op {i} is {ra.name} in A but {rb.name} in B: the module runs different ops",
                              **base)
        if ra.fingerprint == rb.fingerprint and ra.meta.get("more_outputs") == rb.meta.get("more_outputs"):
            continue
        if first_diff is None:
            first_diff = ra
        if tuple(ra.inputs or ()) == tuple(rb.inputs or ()):
            return ZoomResult(
                verdict="origin", op=ra.meta.get("op"), occurrence=ra.meta.get("occurrence"), record=ra.name,
                inner_module=ra.module, args_a=ra.meta.get("args"), args_b=rb.meta.get("args"),
                stats_a=ra.stats, stats_b=rb.stats, first_differing=first_diff.name,
                detail="inputs identical, output differs", **base)
    if len(ops_a) != len(ops_b):
        longer, side = (ops_a, "A") if len(ops_a) > len(ops_b) else (ops_b, "B")
        extra = longer[min(len(ops_a), len(ops_b))]
        return ZoomResult(verdict="structure", op=extra.meta.get("op"), occurrence=extra.meta.get("occurrence"),
                          record=extra.name, inner_module=extra.module,
                          first_differing=first_diff.name if first_diff else extra.name,
                          detail=f"side {side} runs more ops ({len(ops_a)} vs {len(ops_b)}); first extra: {extra.name}",
                          **base)
    if first_diff is not None:
        return ZoomResult(verdict="inputs_differ", op=first_diff.meta.get("op"),
                          occurrence=first_diff.meta.get("occurrence"), record=first_diff.name,
                          inner_module=first_diff.module, first_differing=first_diff.name,
                          detail=(f"the first differing op ({first_diff.name}) already has differing inputs: "
                                  "the module's inputs or parameters differ at this step"), **base)
    return ZoomResult(verdict="agree", detail=f"all {len(ops_a)} ops agree bitwise in the re-run "
                      "(the divergence did not reproduce at op level: nondeterminism, or the sides differ by something "
                      "the re-run does not repeat, e.g. an environment variable the record does not keep: "
                      "pass it with ZoomSide(env=...))", **base)


def zoom_target(divergence: Any) -> tuple[str, int]:
    """(module name, step) to zoom into for a compare ``Divergence`` (or ``Comparison``)."""
    d = divergence
    if hasattr(d, "origin") and hasattr(d, "first") and not hasattr(d, "kind"):  # a Comparison
        d = d.origin or d.first
        if d is None:
            raise UsageError("the traces agree: there is no divergence to zoom into")
    kind, name, step = getattr(d, "kind", None), getattr(d, "name", None), getattr(d, "step", None)
    if step is None or name is None:
        raise UsageError(f"cannot zoom into {d!r}: pass module= and step=")
    if kind == "output":
        module = ""  # the model itself (its output record is named 'output')
    elif kind == "activation":
        module = _INDEX.sub("", name)
        if getattr(d, "localization", None) == "between_modules":
            base = module.split("#", 1)[0]
            module = base.rsplit(".", 1)[0] if "." in base else ""  # the change is in the parent's forward
    elif kind == "init":
        raise UsageError(
            f"the first divergence is an initial parameter ('{name}', before any training step): no op ran "
            "to zoom into; the initialization itself differs (an unseeded or differently seeded model)"
        )
    else:
        raise UsageError(
            f"the divergence is a {kind} ('{name}' at step {step}), not a module output; "
            "op-level zoom needs a module (an activation or the model output): pass module= explicitly"
        )
    return module, int(step)


def _side_spec(trace: Trace, side: ZoomSide, module: str, step: int, key: str, timeout: float | None,
               label: str = "A", links: tuple[str, ...] = ()) -> tuple[ProbeSpec, str]:
    """The probe that re-runs one side, and the words saying where it runs (``ZoomResult.reruns``)."""
    m = trace.manifest
    cwd = side.cwd or (m.recorder or {}).get("cwd")
    if not cwd:
        raise UsageError(f"cannot re-run trace '{trace.path}': it records no working folder; pass ZoomSide(cwd=...)")
    place, said, root = _placement(trace, str(cwd), side.cwd is not None, label, links)
    if side.command is not None:
        argv = tuple(side.command)
    else:
        if not m.command:
            raise UsageError(f"trace '{trace.path}' records no command to re-run; pass ZoomSide(command=...)")
        python = ((m.environment or {}).get("python") or {}).get("executable") or "python"
        argv = (python, *(_relative_arg(a, root, str(cwd)) if root else a for a in m.command))
    if place.get("workdir") is not None and not Path(place["workdir"]).is_dir():
        raise UsageError(
            f"cannot re-run trace '{trace.path}': its working folder '{place['workdir']}' does not exist here; "
            "pass ZoomSide(cwd=...)"
        )
    env_vars = (m.environment or {}).get("env_vars")
    recorded_env = {str(k): str(v) for k, v in env_vars.items()} if isinstance(env_vars, dict) else {}
    spec = ProbeSpec(
        key=key,
        argv=argv,
        env={**recorded_env, **dict(side.env)},
        steps=step + 1,
        timeout=timeout,
        extra_launch_args=("--zoom-module", module, "--zoom-step", str(step)),
        **place,
    )
    return spec, said


def _relative_arg(arg: str, root: str, cwd: str) -> str:
    """``arg`` with an absolute path inside the recorded repository ``root`` made relative to
    the recorded ``cwd`` (also after ``--opt=``): in a worktree it must name the worktree's
    file, not the user's checkout's."""
    head, eq, value = arg.partition("=") if arg.startswith("-") and "=" in arg else ("", "", arg)
    if os.path.isabs(value) and (value == root or value.startswith(root.rstrip("/") + "/")):
        return head + eq + os.path.relpath(value, cwd)
    return arg


def _placement(trace: Trace, cwd: str, given: bool, label: str,
               links: tuple[str, ...]) -> tuple[dict[str, Any], str, str | None]:
    """ProbeSpec fields placing one side's re-run, the words saying where it runs, and the
    recorded repository root whose absolute paths in the command are made relative (None: none).

    At the trace's recorded commit, in a detached worktree of the repository that holds it
    (the recorded root, else the current folder's), from the recorded folder relative to the
    repository root: the user's checkout, index and HEAD are never touched. A trace recorded
    outside any git repository (or in one without commits) is re-run in place, and the words
    say so. A trace recorded with uncommitted changes: ``_dirty_placement``.
    """
    if given:
        return {"workdir": cwd}, f"{label} in '{cwd}' (the folder given)", None
    rev = trace.manifest.revision or {}
    commit, root = rev.get("commit"), rev.get("root")
    if not commit or not root:
        why = ("was recorded in a git repository without commits" if rev
               else "was recorded outside any git repository")
        return {"workdir": cwd}, (f"{label} in place in '{cwd}' (its trace {why}: the files there are assumed "
                                  "to be the ones it ran)"), None
    subdir = os.path.relpath(cwd, root)
    if subdir == ".." or subdir.startswith("../"):
        raise UsageError(
            f"cannot re-run trace '{trace.path}' at its commit {commit[:10]}: it ran in '{cwd}', outside its "
            f"repository '{root}'; re-record it from a folder inside the repository"
        )
    info, full = _repo_with(trace, commit, root)
    if rev.get("dirty") is not False:  # dirty, or not known to be clean
        return (*_dirty_placement(trace, info, full, subdir, label), root)
    return ({"repo": str(info.root), "revision": full, "subdir": subdir,
             "links": git.check_links(info, links) if links else ()},
            f"{label} at its recorded commit {full[:10]} (a detached worktree)", root)


def _repo_with(trace: Trace, commit: str, root: str) -> tuple[git.RepoInfo, str]:
    """The repository here that holds ``commit``: the recorded ``root``, else the current
    folder's (a trace recorded in another clone or on another machine); and the full hash."""
    for where in dict.fromkeys((root, os.getcwd())):
        try:
            info = git.open_repo(where)
            return info, git.resolve(info, commit)
        except (UsageError, ProbeError):
            continue
    raise UsageError(
        f"trace '{trace.path}' was recorded at commit {commit[:10]}, which no repository here holds "
        f"(looked in '{root}' and the current folder); run from a clone that has it (git fetch)"
    )


def _dirty_placement(trace: Trace, info: git.RepoInfo, full: str, subdir: str, label: str) -> tuple[dict[str, Any], str]:
    """Where a trace recorded with uncommitted changes re-runs: the manifest records only that
    there were some (no diff), so only the user's checkout itself can hold them, and only when
    it is still at the recorded commit with changes of its own. Those are assumed to be the
    recorded ones, and the words say so. Otherwise: refused, one line naming the commit."""
    m = trace.manifest
    workdir = info.root / subdir
    prog = (m.command or [None])[0]
    script = workdir / prog if prog and prog != "-m" and not prog.startswith("-") else None
    head, dirty = git.checkout_state(info, script if script is not None and script.is_file() else None)
    if head == full and dirty:
        return ({"workdir": str(workdir)},
                f"{label} in the checkout itself at {full[:10]}: its trace was recorded with uncommitted changes, "
                "assumed to be the ones the checkout holds now (the trace records only that there were some)")
    now = (f"at {head[:10]}" if head else "without a commit") + (" with uncommitted changes" if dirty else ", clean")
    raise UsageError(
        f"trace '{trace.path}' was recorded at {full[:10]} with uncommitted changes that the checkout "
        f"{info.root} (now {now}) no longer holds; zoom cannot re-run it faithfully: re-record it from a clean commit"
    )


class UntrustedTraceError(UsageError):
    """A zoom would re-run a command taken from a trace this user did not record here."""


def _describe(trace: Trace, spec: ProbeSpec) -> str:
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(spec.env.items()))
    where = (f"in '{spec.subdir}' of a worktree of {spec.repo} at {spec.revision[:10]}" if spec.revision
             else f"in '{spec.workdir}'")
    return (f"trace '{trace.path}' was not recorded by this user on this machine; zoom would run: "
            f"{(env + ' ') if env else ''}{shlex.join(spec.argv)}  ({where})")


def untrusted_reruns(traces: list[Trace], specs: list[ProbeSpec]) -> list[str]:
    """One line per re-run whose trace is not trusted here (empty: all were recorded here)."""
    return [_describe(t, s) for t, s in zip(traces, specs) if not is_trusted(t)]


def run_zoom(
    a: Trace | str,
    b: Trace | str,
    divergence: Any = None,
    *,
    module: str | None = None,
    step: int | None = None,
    side_a: ZoomSide | None = None,
    side_b: ZoomSide | None = None,
    timeout: float | None = 600.0,
    out_dir: str | None = None,
    trust: bool = False,
    confirm: Callable[[str], bool] | None = None,
    executor: Executor | None = None,
    links: tuple[str, ...] = (),
) -> ZoomResult:
    """Re-run both sides with the zoom at the divergence and name the first differing op.

    Give ``divergence`` (a compare ``Divergence`` or ``Comparison``) or ``module`` and
    ``step``. The zoom traces go to ``out_dir`` (kept, paths in the result) or to a
    temporary folder that is removed afterwards. The re-runs are probes on ``executor``
    (default: a local one running both at once, made and closed here). Raises
    ``ProbeError`` when a re-run does not produce a trace.

    A side whose trace was not recorded by this user here (``reprobisect.support.trust``) is
    re-run only with ``trust=True`` or when ``confirm(text)`` returns True (``text``
    names what would run); otherwise ``UntrustedTraceError`` is raised before anything runs.

    Each side re-runs at its trace's recorded commit in a detached worktree (``links``: paths
    of the user's checkout symlinked into it, as ``bisect runs --link``); see ``_placement``
    for traces recorded outside git or with uncommitted changes. ``ZoomResult.reruns`` says
    where each side ran, ``ZoomResult.contradiction`` where the re-run disagrees with the traces.
    """
    unsupported = rerun_unsupported("zoom", *(x.path if isinstance(x, Trace) else x for x in (a, b)))
    if unsupported:  # a torchrun/job-script command: its ranks are not re-run with the zoom (yet)
        return _unsupported(divergence, module, step, unsupported)
    ta = a if isinstance(a, Trace) else read_trace(a, allow_incomplete=True)
    tb = b if isinstance(b, Trace) else read_trace(b, allow_incomplete=True)
    if module is None or step is None:
        if divergence is None:
            raise UsageError("say where to zoom: pass a divergence, or module= and step=")
        m2, s2 = zoom_target(divergence)
        module = m2 if module is None else module
        step = s2 if step is None else step
    placed = [_side_spec(t, side or ZoomSide(), module, step, key, timeout, label, tuple(links))
              for t, side, key, label in ((ta, side_a, "zoom-a", "A"), (tb, side_b, "zoom-b", "B"))]
    specs = [sp for sp, _ in placed]
    if not trust:
        _confirm_reruns(untrusted_reruns([ta, tb], specs), confirm)
    tmp = None
    if out_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="reprobisect-zoom-")
        root = Path(tmp.name)
    else:
        root = Path(out_dir)
        root.mkdir(parents=True, exist_ok=True)
    try:
        dirs = [root / "a.trace", root / "b.trace"]
        results = _run_sides([replace(sp, trace_dir=str(d)) for sp, d in zip(specs, dirs)], executor)
        _check_reruns(results)
        za, zb = read_trace(dirs[0], allow_incomplete=True), read_trace(dirs[1], allow_incomplete=True)
        result = first_divergent_op(za, zb, module, step)
        result = replace(result, reruns=tuple(said for _, said in placed),
                         contradiction=_contradiction(divergence, result, (ta, tb), (za, zb)))
        if tmp is not None:
            result = replace(result, trace_a=None, trace_b=None)
        return result
    finally:
        if tmp is not None:
            tmp.cleanup()


def _check_reruns(results: list[ProbeResult]) -> None:
    """``ProbeError`` for a re-run that left no trace, or ran another commit than it was given."""
    for label, r in zip("AB", results):
        if not r.outcome or r.trace_dir is None:
            tail = (r.stderr_tail or "").strip().splitlines()[-1:] or [""]
            raise ProbeError(f"zoom re-run of side {label} did not record a trace: {r.outcome} {tail[0]}".rstrip())
        if r.spec.revision and r.commit_ran and r.commit_ran != r.spec.revision:
            raise ProbeError(f"zoom re-run of side {label} ran {r.commit_ran[:10]}, not its recorded commit "
                             f"{r.spec.revision[:10]} (a stale worktree); run it again")


def _module_records(trace: Trace, module: str, step: int) -> dict[tuple[str, str], str]:
    """The fingerprints of ``module``'s own output records at ``step`` (``output`` for the model)."""
    s = trace.step(step)
    name = module or "output"
    return {(r.kind, r.name): r.fingerprint for r in (s.records if s is not None else ())
            if r.kind in ("activation", "output") and (r.name == name or r.name.startswith(name + "["))}


def _contradiction(divergence: Any, result: ZoomResult, traces: tuple[Trace, Trace], reruns: tuple[Trace, Trace]) -> str:
    """Where the zoom's re-run says something else than the trace comparison ("" when nothing).

    A side whose re-run recorded another output of the module than its trace did was not
    reproduced (nondeterminism, or code, data or environment changed since): the ops named
    are the re-run's. A zoom verdict of ``inputs_differ`` where the comparison found the
    module's inputs agreeing, or ``agree`` where the traces diverge, contradicts the traces.
    """
    parts = []
    for label, t, z in zip("AB", traces, reruns):
        recorded, rerun = _module_records(t, result.module, result.step), _module_records(z, result.module, result.step)
        shared = recorded.keys() & rerun.keys()
        if shared and any(recorded[k] != rerun[k] for k in shared):
            parts.append(f"the re-run of side {label} did not reproduce its trace (the module's output at step "
                         f"{result.step} differs from the recorded one: the run is not deterministic, or its code, "
                         "data or environment changed since it was recorded); the ops above are the re-run's")
    d = divergence
    if d is not None and hasattr(d, "first") and not hasattr(d, "kind"):  # a Comparison
        d = d.origin or d.first
    if result.verdict == "inputs_differ" and getattr(d, "localization", None) == "origin":
        parts.append(f"the traces show the module's inputs agreeing at step {result.step}, but in the re-run its "
                     "first differing op already has differing inputs (its parameters or buffers differ, or the "
                     "re-run is not the recorded run)")
    elif result.verdict == "agree" and d is not None:
        parts.append(f"the traces diverge at this module at step {result.step}, but in the re-run every op agrees: "
                     "the divergence did not reproduce")
    return ("the zoom disagrees with the trace comparison: " + "; ".join(parts)) if parts else ""


def _unsupported(divergence: Any, module: str | None, step: int | None, why: str) -> ZoomResult:
    """The zoom's answer for a side it cannot re-run: nothing ran, ``why`` says so."""
    d = divergence
    if d is not None and hasattr(d, "first") and not hasattr(d, "kind"):  # a Comparison
        d = d.origin or d.first
    step = step if step is not None else getattr(d, "step", None)
    if module is None:
        kind, name = getattr(d, "kind", None), getattr(d, "name", None)
        module = _INDEX.sub("", name) if kind == "activation" and name else ""
    rank = getattr(d, "rank", None)
    at = f"; the divergence is on rank {rank}" if rank is not None else ""
    return ZoomResult(module=module, step=int(step) if step is not None else -1, verdict="unsupported",
                      detail=why + at)


def _confirm_reruns(lines: list[str], confirm: Callable[[str], bool] | None) -> None:
    """Raise ``UntrustedTraceError`` unless every re-run is trusted or ``confirm`` says yes."""
    if not lines:
        return
    if confirm is None or not confirm("\n".join(lines)):
        raise UntrustedTraceError(
            lines[0] + ("" if len(lines) == 1 else f" (and {len(lines) - 1} more)")
            + "; not run: pass --trust-trace (trust=True) if you trust this trace's command"
        )


def _run_sides(specs: list[ProbeSpec], executor: Executor | None) -> list[ProbeResult]:
    """Both re-runs at once on ``executor``, or on a local executor of two jobs made here."""
    if executor is None:
        with LocalExecutor(jobs=len(specs)) as local:
            return _run_sides(specs, local)
    futures = [executor.submit(s) for s in specs]
    return [f.result() for f in futures]
