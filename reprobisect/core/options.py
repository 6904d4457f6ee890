"""The probe options every probing command shares, from flags and from a config file.

``capture``, ``probe``, ``runs``, ``repro``, ``seeds``, ``envs`` (and later ``doctor``)
take the same flags: ``--steps``, ``--timeout``, ``--executor``, ``--jobs``, the tolerance
flags, ``--keep``, ``-o/--out``, ``--full-steps``, ``--quiet``, the Ray flags, and
``--config FILE`` (YAML or JSON) that can give any of them. Flags given on the command
line win over the file; the file wins over the defaults. An unknown key in the file is
one error line naming it.

Use::

    @click.command()
    @probe_options
    @click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
    def command(options: ProbeOptions, cmd: tuple[str, ...]) -> None:
        argv = split_command(cmd)
        with options.make_executor() as ex: ...
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable

import click

from reprobisect.core.checks import check_number
from reprobisect.errors import UsageError

__all__ = ["ProbeOptions", "probe_options", "link_option", "check_number", "FiniteFloat", "POSITIVE_SECONDS", "NON_NEGATIVE", "split_command", "load_config", "build_options", "with_defaults", "TOLERANCES", "parse_steps"]

TOLERANCES = ("bitwise", "default")


@dataclass(frozen=True, kw_only=True)
class ProbeOptions:
    """How probes run and how their traces are judged; shared by every probing command."""

    steps: int = 3
    """Optimizer steps each probe records before it ends the run."""
    timeout: float | None = None
    """Seconds before a probe's whole process group is killed (None: no limit)."""
    executor: str = "local"
    """Where probes run: 'local' (subprocesses here) or 'ray' (a Ray cluster)."""
    jobs: int = 1
    """Probes run at once."""
    tolerance: str | None = None
    """'bitwise' or 'default' (per-dtype, as torch.testing); None: the command's own default."""
    atol: float | None = None
    """Explicit absolute tolerance (with rtol: overrides ``tolerance``)."""
    rtol: float | None = None
    """Explicit relative tolerance (with atol: overrides ``tolerance``)."""
    keep: bool = False
    """Keep the probes' traces after the command ends."""
    out: Path | None = None
    """Folder that receives the traces (and keeps them); None: a temporary folder."""
    full_steps: tuple[int, ...] = ()
    """Steps whose full tensors every probe keeps (for magnitudes of a divergence)."""
    quiet: bool = False
    """No progress display."""
    ray_address: str | None = None
    """Ray cluster address for --executor ray (None: start a local instance)."""
    gpus_per_probe: float = 0.0
    """GPUs each probe requests from Ray."""
    cpus_per_probe: float = 1.0
    """CPUs each probe requests from Ray."""
    placement: str | None = None
    """How paired probes (repro, envs) are placed on Ray: 'pack' (one node, the same
    device type) or 'spread' (two nodes, on purpose); None: pack."""
    config: Path | None = None
    """The config file these options were read from, if any."""
    link: tuple[str, ...] = ()
    """Paths of the user's checkout (relative to the repository root: ignored data, untracked
    configs, caches) symlinked into every probe's worktree (``--link``, config ``link: [..]``)."""

    def __post_init__(self) -> None:
        # every number is checked here, before any probe runs, whether it came from a flag
        # or from --config (YAML reads '.nan' and '.inf' as floats): NaN compares False with
        # everything, so 'timeout <= 0' alone would let --timeout nan through as "no limit"
        check_number("--steps", self.steps, minimum=1, integer=True)
        check_number("--jobs", self.jobs, minimum=1, integer=True)
        if self.timeout is not None:
            check_number("--timeout", self.timeout, minimum=0, open_min=True, unit=" seconds")
        check_number("--gpus-per-probe", self.gpus_per_probe, minimum=0)
        check_number("--cpus-per-probe", self.cpus_per_probe, minimum=0)
        if self.executor not in ("local", "ray"):
            raise UsageError(f"unknown executor '{self.executor}'; use --executor local or --executor ray")
        if self.tolerance is not None and self.tolerance not in TOLERANCES:
            raise UsageError(f"unknown tolerance '{self.tolerance}'; use bitwise or default (or --atol/--rtol)")
        if self.placement not in (None, "pack", "spread"):
            raise UsageError(f"unknown placement '{self.placement}'; use --placement pack or --placement spread")
        for n in ("atol", "rtol"):
            v = getattr(self, n)
            if v is not None:
                check_number(f"--{n}", v, minimum=0)

    def tolerance_spec(self, default: str = "bitwise") -> str | dict[str, float]:
        """The tolerance to hand to compare: 'bitwise', 'default', or {'atol', 'rtol'}."""
        if self.atol is not None or self.rtol is not None:
            return {"atol": self.atol or 0.0, "rtol": self.rtol or 0.0}
        return self.tolerance or default

    def executor_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``reprobisect.executors.make_executor(self.executor, ...)``."""
        kw: dict[str, Any] = {"jobs": self.jobs, "keep": self.keep or self.out is not None, "out_dir": self.out}
        if self.executor == "ray":
            kw.update(address=self.ray_address, gpus_per_probe=self.gpus_per_probe, cpus_per_probe=self.cpus_per_probe,
                      placement=self.placement)
            if self.timeout is not None:
                kw["timeout"] = self.timeout
        return kw

    def make_executor(self):
        """The executor these options ask for (a context manager: ``with ... as ex``).

        ``out``, when given, must be new, empty or reprobisect's own (``reprobisect.trace.outdir``).
        """
        from reprobisect.executors import make_executor

        if self.out is not None:
            from reprobisect.trace.outdir import prepare_output_dir

            prepare_output_dir(self.out)

        return make_executor(self.executor, **self.executor_kwargs())

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("out", "config"):
            d[k] = str(d[k]) if d[k] is not None else None
        d["full_steps"] = list(self.full_steps)
        d["link"] = list(self.link)
        return d


_FIELDS = {f.name for f in fields(ProbeOptions)}


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


def load_config(path: str | Path) -> dict[str, Any]:
    """Read the probe options a YAML/JSON config file gives; unknown keys are a UsageError.

    Keys are the option names with '-' or '_' (``full-steps``, ``ray_address``); the
    options may also sit under a top-level ``probe:`` mapping.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UsageError(f"config file '{path}' does not exist; check the --config path") from None
    except OSError as e:
        raise UsageError(f"cannot read config file '{path}': {e.strerror}") from None
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
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name == "address":
            name = "ray_address"
        if name not in _FIELDS or name == "config":
            known = ", ".join(sorted(f.replace("_", "-") for f in _FIELDS if f != "config"))
            raise UsageError(f"config file '{path}': unknown key '{key}' (known: {known})")
        out[name] = value
    return out


def _coerce(name: str, value: Any, source: str) -> Any:
    if value is None:
        return None
    try:
        if name == "full_steps":
            return parse_steps(value)
        if name == "link":
            items = [value] if isinstance(value, str) else value
            if not isinstance(items, (list, tuple)) or not all(isinstance(x, str) and x.strip() for x in items):
                raise ValueError
            return tuple(items)
        if name in ("steps", "jobs"):
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if name in ("timeout", "atol", "rtol", "gpus_per_probe", "cpus_per_probe"):
            return float(value)
        if name in ("keep", "quiet"):
            if not isinstance(value, bool):
                raise ValueError
            return value
        if name in ("out", "config"):
            return Path(str(value))
        return str(value)
    except (TypeError, ValueError):
        raise UsageError(f"{source}: '{name.replace('_', '-')}' has a bad value {value!r}") from None


def build_options(cli: dict[str, Any], config: str | Path | None = None) -> ProbeOptions:
    """Options from CLI values (None = not given) over a config file over the defaults."""
    values: dict[str, Any] = {}
    if config is not None:
        for k, v in load_config(config).items():
            values[k] = _coerce(k, v, f"config file '{config}'")
        values["config"] = Path(config)
    for k, v in cli.items():
        if v is None or (k in ("keep", "quiet") and v is False) or (k == "link" and not v):
            continue
        values[k] = _coerce(k, v, "command line")
    return ProbeOptions(**values)


_OPTION_NAMES = (
    "steps",
    "timeout",
    "executor",
    "jobs",
    "tolerance",
    "atol",
    "rtol",
    "keep",
    "out",
    "full_steps",
    "quiet",
    "ray_address",
    "gpus_per_probe",
    "cpus_per_probe",
    "placement",
)


def probe_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Add the shared probe flags + ``--config`` to a click command.

    The command receives them as one ``options: ProbeOptions`` keyword argument.
    """

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        cli = {n: kwargs.pop(n) for n in _OPTION_NAMES}
        if "link" in kwargs:  # commands that make worktrees add --link (link_option)
            cli["link"] = kwargs.pop("link")
        config = kwargs.pop("config")
        options = build_options(cli, config)
        if options.out is not None:  # before any probe runs: refuse a folder that is not ours
            from reprobisect.trace.outdir import prepare_output_dir

            prepare_output_dir(options.out)
        kwargs["options"] = options
        return f(*args, **kwargs)

    decorators = [
        click.option("--steps", type=int, default=None, help="Optimizer steps each probe records [default: 3]."),
        click.option("--timeout", type=POSITIVE_SECONDS, default=None, help="Seconds before a probe is killed (whole process group)."),
        click.option("--executor", type=click.Choice(["local", "ray"]), default=None, help="Where probes run [default: local]."),
        click.option("-j", "--jobs", type=int, default=None, help="Probes run at once [default: 1]."),
        click.option("--tolerance", type=click.Choice(list(TOLERANCES)), default=None, help="Tolerance policy for comparisons."),
        click.option("--atol", type=NON_NEGATIVE, default=None, help="Explicit absolute tolerance."),
        click.option("--rtol", type=NON_NEGATIVE, default=None, help="Explicit relative tolerance."),
        click.option("--keep", is_flag=True, default=None, help="Keep the probes' traces."),
        click.option("-o", "--out", type=click.Path(file_okay=False), default=None, help="Folder for the traces (kept)."),
        click.option("--full-steps", default=None, help="Steps whose full tensors are kept, e.g. 0,1."),
        click.option("-q", "--quiet", is_flag=True, default=None, help="No progress display."),
        click.option("--address", "ray_address", default=None, help="Ray cluster address (--executor ray)."),
        click.option("--gpus-per-probe", type=NON_NEGATIVE, default=None, help="GPUs per probe (--executor ray)."),
        click.option("--cpus-per-probe", type=NON_NEGATIVE, default=None, help="CPUs per probe (--executor ray)."),
        click.option("--placement", type=click.Choice(["pack", "spread"]), default=None,
                     help="Paired probes on Ray: one node (pack) or two (spread) [default: pack]."),
        click.option("--config", type=click.Path(dir_okay=False), default=None, help="YAML/JSON file giving any of these options."),
    ]
    for d in reversed(decorators):
        wrapper = d(wrapper)
    return wrapper


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
    argv = [a for a in args]
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        ctx = click.get_current_context(silent=True)
        name = ctx.info_name if ctx is not None and ctx.info_name else "repro"
        raise UsageError(f"give the training command after --, e.g. bisect {name} ... -- python train.py")
    return argv


def with_defaults(options: ProbeOptions, **changes: Any) -> ProbeOptions:
    """A copy of ``options`` with ``changes`` (a dataclasses.replace that validates)."""
    return replace(options, **changes)
