"""The flags every probing command shares, and the config file that can give them.

``capture``, ``probe``, ``runs``, ``repro``, ``seeds`` and ``envs`` take the same flags:
``--steps``, ``--timeout``, ``--executor``, ``--jobs``, the tolerance flags (``--tolerance``,
``--atol``, ``--rtol``, ``--override GLOB=ATOL,RTOL``), ``--keep``, ``-o/--out``,
``--full-steps``, ``--quiet``, ``--detail full|sentinel`` and ``--state-every K`` (what each
probe records per step), each executor's own flags (``reprobisect.executors.EXECUTORS``:
Ray's ``--address``, ``--gpus-per-probe``, ``--cpus-per-probe``, ``--placement``), and
``--config FILE`` (YAML or JSON) that can give any of them. Flags given on the command line
win over the file; the file wins over the defaults. An unknown key in the file is one error
line naming it. The library never sees any of this: it takes the ``ProbeOptions`` built here.

Use::

    @click.command()
    @probe_options
    @click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
    def command(options: ProbeOptions, cmd: tuple[str, ...]) -> int:
        argv = split_command(cmd)
        ...
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Callable

import click

from reprobisect.core.checks import check_number
from reprobisect.core.compare import POLICIES, Tolerance
from reprobisect.core.options import ProbeOptions
from reprobisect.errors import UsageError
from reprobisect.executors import EXECUTORS, ExecutorFlag, executor_kind
from reprobisect.trace.outdir import prepare_output_dir

__all__ = ["FiniteFloat", "POSITIVE_SECONDS", "NON_NEGATIVE", "parse_steps", "load_config", "build_options",
           "tolerance_from", "tolerance_options", "probe_options", "capture_options", "executor_options", "link_option",
           "split_command", "with_verbosity", "forgotten_separator"]


class FiniteFloat(click.ParamType):
    """A float option that refuses NaN and infinity when parsed (click's FLOAT takes 'nan')."""

    name = "float"

    def __init__(self, minimum: float | None = None, open_min: bool = False) -> None:
        self.minimum, self.open_min = minimum, open_min

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            v = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        try:
            check_number("the value", v, minimum=self.minimum, open_min=self.open_min)
        except UsageError as e:
            self.fail(str(e), param, ctx)
        return v


POSITIVE_SECONDS = FiniteFloat(0, open_min=True)
NON_NEGATIVE = FiniteFloat(0)


def parse_steps(value: Any, what: str = "--full-steps") -> tuple[int, ...]:
    """'0,1' / [0, 1] / 3 → (0, 1) / (0, 1) / (3,); anything else is a UsageError."""
    if value is None or value == "":
        return ()
    items = value.split(",") if isinstance(value, str) else (value if isinstance(value, (list, tuple)) else [value])
    try:
        out = tuple(int(str(x).strip()) for x in items if str(x).strip() != "")
    except ValueError:
        raise UsageError(f"{what} takes comma-separated step numbers like 0,1 (got '{value}')") from None
    if any(s < 0 for s in out):
        raise UsageError(f"{what} takes step numbers >= 0 (got '{value}')")
    return out


# --------------------------------------------------------------------------- config files

_COMMON = ("steps", "timeout", "executor", "jobs", "tolerance", "atol", "rtol", "override", "keep", "out",
           "full_steps", "quiet", "link", "detail", "state_every")
"""The shared option names (also the config-file keys, with '-' or '_')."""
_TOLERANCE = ("tolerance", "atol", "rtol")


def _executor_keys() -> dict[str, tuple[str, ExecutorFlag]]:
    """Config-file key -> (executor name, flag) for every registered executor's flags."""
    keys: dict[str, tuple[str, ExecutorFlag]] = {}
    for kind in EXECUTORS.values():
        for flag in kind.flags:
            for key in (flag.field, flag.flag.lstrip("-").replace("-", "_"), *flag.keys):
                keys[key] = (kind.name, flag)
    return keys


def _read_mapping(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"config file '{path}' does not exist; check the --config path") from None
    except IsADirectoryError:
        raise UsageError(f"config file '{path}' is a folder; give --config a YAML or JSON file") from None
    except OSError as e:
        raise UsageError(f"cannot read config file '{path}': {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"config file '{path}' is not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); "
                         "save it as UTF-8 YAML or JSON") from None
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as e:  # yaml.YAMLError, ValueError
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"config file '{path}' is not valid YAML/JSON ({first})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"config file '{path}' must hold a mapping of option: value")
    if set(data) == {"probe"} and isinstance(data["probe"], dict):
        data = data["probe"]
    return data


def load_config(path: str | Path) -> dict[str, Any]:
    """Read the probe options a YAML/JSON config file gives; unknown keys are a UsageError.

    Keys are the option names with '-' or '_' (``full-steps``, ``gpus_per_probe``; ``overrides``
    for ``override``); the options may also sit under a top-level ``probe:`` mapping. An
    executor's key comes back as ``"<executor>.<field>"`` (``ray.address``).
    """
    path = Path(path)
    exec_keys = _executor_keys()
    out: dict[str, Any] = {}
    for key, value in _read_mapping(path).items():
        name = str(key).replace("-", "_")
        name = "override" if name == "overrides" else name
        if name in _COMMON:
            out[name] = value
        elif name in exec_keys:
            kind, flag = exec_keys[name]
            out[f"{kind}.{flag.field}"] = value
        else:
            known = ", ".join(sorted({n.replace("_", "-") for n in (*_COMMON, *exec_keys)}))
            raise UsageError(f"config file '{path}': unknown key '{key}' (known: {known})")
    return out


def _coerce_executor(name: str, value: Any) -> Any:
    flag = next(f for k in EXECUTORS.values() for f in k.flags if f"{k.name}.{f.field}" == name)
    if flag.kind == "number":
        if isinstance(value, bool):
            raise ValueError
        return float(value)
    return str(value)


def _coerce(name: str, value: Any, source: str) -> Any:
    try:
        if "." in name:
            return _coerce_executor(name, value)
        if name == "full_steps":
            return parse_steps(value)
        if name in ("link", "override"):
            if name == "override" and isinstance(value, dict):
                return value  # glob: rule, checked by Tolerance.from_flags
            items = [value] if isinstance(value, str) else value
            if not isinstance(items, (list, tuple)) or not all(isinstance(x, str) and x.strip() for x in items):
                raise ValueError
            return tuple(items)
        if name in ("steps", "jobs", "state_every"):
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if name in ("timeout", "atol", "rtol"):
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if name in ("keep", "quiet"):
            if not isinstance(value, bool):
                raise ValueError
            return value
        if name == "out":
            return Path(str(value))
        return str(value)
    except (TypeError, ValueError):
        raise UsageError(f"{source}: '{name.split('.')[-1].replace('_', '-')}' has a bad value {value!r}") from None


def _given(name: str, value: Any) -> bool:
    """Whether a command-line value was given (click's None, False flags and empty tuples were not)."""
    if value is None:
        return False
    if name in ("keep", "quiet") and value is False:
        return False
    return not (name in ("link", "override") and not value)


def _values(cli: dict[str, Any], config: str | Path | None) -> dict[str, Any]:
    """Coerced option values: the command line's over the config file's."""
    values: dict[str, Any] = {}
    if config is not None:
        for k, v in load_config(config).items():
            if v is not None:
                values[k] = _coerce(k, v, f"config file '{config}'")
    given = {k: _coerce(k, v, "command line") for k, v in cli.items() if _given(k, v)}
    if any(k in given for k in _TOLERANCE):  # a tolerance on the command line replaces the file's
        for k in _TOLERANCE:
            values.pop(k, None)
    values.update(given)
    return values


def tolerance_from(values: dict[str, Any]) -> Tolerance | None:
    """The ``Tolerance`` that ``tolerance``/``atol``/``rtol``/``override`` values give (None: none)."""
    return Tolerance.from_flags(values.get("tolerance"), values.get("atol"), values.get("rtol"),
                                values.get("override") or ())


def build_options(cli: dict[str, Any], config: str | Path | None = None) -> ProbeOptions:
    """Options from CLI values (None = not given) over a config file over the defaults.

    ``cli`` is keyed by the option names; an executor's own settings by ``"<executor>.<field>"``.
    """
    values = _values(cli, config)
    kind = executor_kind(values.get("executor", "local"))
    own = {k.split(".", 1)[1]: v for k, v in values.items() if k.startswith(f"{kind.name}.")}
    kw = {k: v for k, v in values.items() if k in _COMMON and k not in (*_TOLERANCE, "override")}
    if config is not None:
        kw["config"] = Path(config)
    return ProbeOptions(**kw, tolerance=tolerance_from(values), executor_config=kind.make_config(own))


# --------------------------------------------------------------------------- click options


def tolerance_options(unset: str) -> list[Callable[[Any], Any]]:
    """The four tolerance flags; ``unset`` says what the command does when none is given."""
    return [
        click.option("--tolerance", type=click.Choice(list(POLICIES)), default=None,
                     help=f"bitwise: bits must match; default: per-dtype torch.testing.assert_close figures. Unset: {unset}."),
        click.option("--atol", type=NON_NEGATIVE, default=None, help="Explicit absolute tolerance for floating tensors."),
        click.option("--rtol", type=NON_NEGATIVE, default=None, help="Explicit relative tolerance (relative to the second side)."),
        click.option("--override", "override", multiple=True, metavar="GLOB=ATOL,RTOL",
                     help="Per-tensor rule on 'kind/name', e.g. 'grad/*=1e-5,1e-4' or 'param/*=bitwise'. "
                          "Repeatable; first match wins."),
    ]


def _executor_flag_options() -> list[Callable[[Any], Any]]:
    out = []
    for kind in EXECUTORS.values():
        for flag in kind.flags:
            type_: Any = {"number": NON_NEGATIVE, "choice": click.Choice(list(flag.choices))}.get(flag.kind)
            out.append(click.option(flag.flag, f"{kind.name}.{flag.field}".replace(".", "__"), type=type_,
                                    default=None, help=flag.help))
    return out


_STEPS = click.option("--steps", type=int, default=None, help="Optimizer steps each probe records [default: 3].")
_TIMEOUT = click.option("--timeout", type=POSITIVE_SECONDS, default=None,
                        help="Seconds before a probe is killed (whole process group).")
_FULL_STEPS = click.option("--full-steps", default=None, help="Steps whose full tensors are kept, e.g. 0,1.")
_QUIET = click.option("-q", "--quiet", is_flag=True, default=None,
                      help="Print only the result and errors: no progress, no notes.")
_DETAIL = click.option("--detail", default=None, metavar="full|sentinel",
                       help="What each step records: full (every tensor of the chain) or sentinel (batch, loss, gradient "
                            "norm, learning rates, scale, parameters after the step) [default: full].")
_STATE_EVERY = click.option("--state-every", default=None, metavar="K",
                            help="Capture complete state after every K-th step [default: 50 with --detail sentinel].")
_CONFIG = click.option("--config", type=click.Path(dir_okay=False), default=None,
                       help="YAML/JSON file giving any of these options.")


def _apply(f: Callable[..., Any], decorators: list[Callable[[Any], Any]]) -> Callable[..., Any]:
    for d in reversed(decorators):
        f = d(f)
    return f


def _pop_cli(kwargs: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The shared options' values out of a command's keyword arguments (executor flags renamed)."""
    cli = {n: kwargs.pop(n) for n in names if n in kwargs}
    for key in [k for k in kwargs if "__" in k]:
        cli[key.replace("__", ".")] = kwargs.pop(key)
    return cli


def probe_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Add the shared probe flags + ``--config`` to a click command.

    The command receives them as one ``options: ProbeOptions`` keyword argument.
    """

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        cli = _pop_cli(kwargs, _COMMON)  # commands that make worktrees add --link (link_option)
        options = build_options(cli, kwargs.pop("config"))
        if options.out is not None:  # before any probe runs: refuse a folder that is not ours
            prepare_output_dir(options.out)
        kwargs["options"] = options
        return f(*args, **kwargs)

    return _apply(wrapper, [
        _STEPS,
        _TIMEOUT,
        _EXECUTOR,
        _JOBS,
        *tolerance_options("bitwise (envs: default)"),
        click.option("--keep", is_flag=True, default=None, help="Keep the probes' traces."),
        click.option("-o", "--out", type=click.Path(file_okay=False), default=None, help="Folder for the traces (kept)."),
        _FULL_STEPS,
        _DETAIL,
        _STATE_EVERY,
        _QUIET,
        *_executor_flag_options(),
        _CONFIG,
    ])


_EXECUTOR = click.option("--executor", type=click.Choice(list(EXECUTORS)), default=None,
                         help="Where the probes run [default: local].")
_JOBS = click.option("-j", "--jobs", type=int, default=None, help="Probes run at once [default: 1].")
_CAPTURE_SHARED = ("steps", "timeout", "full_steps", "quiet", "executor", "detail", "state_every")


def capture_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Add the shared flags that apply to one recorded run (``--steps``, ``--timeout``,
    ``--full-steps``, ``--detail``, ``--state-every``, ``--quiet``, ``--executor`` and its executor's flags) and ``--config``
    to ``capture``, with the same meaning, checks and config-file keys as on the probing
    commands (other known keys of the file are ignored: they are about probing). The command
    receives ``options: ProbeOptions``."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs["options"] = build_options(_pop_cli(kwargs, _CAPTURE_SHARED), kwargs.pop("config"))
        return f(*args, **kwargs)

    quiet = click.option("-q", "--quiet", is_flag=True, default=None,
                         help="Print only the result and errors: the command's output is not streamed (it is "
                              "kept in the trace's output.log).")
    return _apply(wrapper, [_STEPS, _TIMEOUT, _FULL_STEPS, _DETAIL, _STATE_EVERY, quiet, _EXECUTOR,
                            *_executor_flag_options(), _CONFIG])


def executor_options(f: Callable[..., Any] | None = None, *,
                     jobs_help: str = "Probes run at once [default: 2].") -> Callable[..., Any]:
    """Add ``--executor``, ``--jobs`` (default 2) and each executor's flags to a command that runs
    probes only now and then (``compare --zoom``: its two re-runs, at once by default; ``audit``:
    its checks, ``jobs_help`` says so); the command receives ``options: ProbeOptions``."""
    if f is None:
        return functools.partial(executor_options, jobs_help=jobs_help)

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        cli = _pop_cli(kwargs, ("executor", "jobs"))
        cli["jobs"] = 2 if cli.get("jobs") is None else cli["jobs"]
        kwargs["options"] = build_options(cli)
        return f(*args, **kwargs)

    jobs = click.option("-j", "--jobs", type=int, default=None, help=jobs_help)
    return _apply(wrapper, [_EXECUTOR, jobs, *_executor_flag_options()])


def link_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--link PATH`` (repeatable) to a command that makes worktrees; put it above
    ``@probe_options``, which folds it into ``options.link`` (a config file's ``link:`` too)."""
    return click.option(
        "--link", "link", multiple=True, default=(), metavar="PATH",
        help="Path of your checkout (relative to the repository root: ignored data, untracked configs) "
             "symlinked into every probe's worktree; repeatable.",
    )(f)


def split_command(args: tuple[str, ...] | list[str]) -> list[str]:
    """The training command given after ``--``; missing → one clear UsageError."""
    argv = list(args)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        ctx = click.get_current_context(silent=True)
        name = ctx.info_name if ctx is not None and ctx.info_name else "repro"
        raise UsageError(f"give the training command after --, e.g. bisect {name} ... -- python train.py")
    return argv


# --------------------------------------------------------------------------- every command


_VERBOSITY_HELP = {
    "quiet": "Print only the result and errors: no progress, no notes.",
    "verbose": "More detail: progress as lines (also without a terminal) and, where the command has it, more of "
               "the result (compare: every environment difference).",
}


def with_verbosity(command: click.Command) -> click.Command:
    """``command`` with ``-q/--quiet`` and ``-v/--verbose``, meaning the same on every command.

    A command that declares ``--quiet`` itself (the probing commands: it also goes into their
    ``ProbeOptions``) keeps its own; the others get them here. Either way the choice is set for
    the run in ``reprobisect.support.progress`` (``verbosity``), which every progress display and
    renderer reads; the command's callback sees only the parameters it declares."""
    if getattr(command, "_reprobisect_verbosity", False):
        return command
    own = {p.name for p in command.params}
    added = [name for name in ("quiet", "verbose") if name not in own]
    for name in added:
        command.params.append(click.Option([f"-{name[0]}", f"--{name}"], is_flag=True, default=False,
                                           help=_VERBOSITY_HELP[name]))
    callback = command.callback

    @functools.wraps(callback)  # type: ignore[arg-type]
    def run(*args: Any, **kwargs: Any) -> Any:
        from reprobisect.support.progress import set_verbosity

        level = {name: bool(kwargs.pop(name) if name in added else kwargs.get(name)) for name in ("quiet", "verbose")}
        if level["quiet"] and level["verbose"]:
            raise UsageError("-q/--quiet and -v/--verbose contradict each other; give one of them")
        with set_verbosity(**level):
            return callback(*args, **kwargs)  # type: ignore[misc]

    command.callback = run
    command._reprobisect_verbosity = True  # type: ignore[attr-defined]
    return command


def _option_arity(command: click.Command) -> dict[str, bool]:
    """Every option name of ``command`` → whether it takes a value (``--steps 3``) or not (a flag)."""
    arity = {"-h": False, "--help": False}
    for p in command.params:
        if isinstance(p, click.Option):
            for name in (*p.opts, *p.secondary_opts):
                arity[name] = not (p.is_flag or p.count)
    return arity


def forgotten_separator(ctx: click.Context | None, option: str, args: list[str]) -> str | None:
    """The corrected command line when ``option`` (unknown to the command) follows the first word
    of a training command given without ``--`` (``bisect capture -o x python train.py --lr 1e-3``:
    ``--lr`` is the program's); None when the mistake is another (a mistyped option of ours).

    Only commands that take a training command (a ``cmd`` argument) are asked; ``args`` are the
    words ``bisect`` was given."""
    command = ctx.command if ctx is not None else None
    if command is None or not any(isinstance(p, click.Argument) and p.name == "cmd" for p in command.params):
        return None
    at = next((i for i, a in enumerate(args) if a == command.name), None)
    if at is None:
        return None
    words, arity = args[at + 1:], _option_arity(command)
    first: int | None = None
    skip = False
    for i, word in enumerate(words):
        if skip:
            skip = False
        elif word == "--":
            return None
        elif first is not None and (word == option or word.startswith(option + "=")):
            import shlex

            return "bisect " + shlex.join([command.name, *words[:first], "--", *words[first:]])
        elif word.startswith("-") and len(word) > 1:
            name = word.split("=", 1)[0]
            skip = arity.get(name, False) and "=" not in word
        elif first is None:
            first = i
    return None
