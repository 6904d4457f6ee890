"""The ``bisect`` command-line program: a click group whose subcommands load lazily.

Each subcommand lives in ``reprobisect.commands.<name>`` and is imported only when it is
run (or listed with its help), so ``bisect --help`` stays fast and imports no framework.
Errors from the library (``ReproError``) are caught here, once, and printed as one line.
"""

from __future__ import annotations

import importlib
import sys

import click

from reprobisect import __version__
from reprobisect.errors import ReproError

__all__ = ["cli", "main", "COMMANDS"]

# name -> (module, one-line help shown in `bisect --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "capture": ("reprobisect.commands.capture", "Record a few steps of an unmodified training command into a trace."),
    "compare": ("reprobisect.commands.compare", "Name the first step, stage and tensor where two traces disagree."),
    "runs": ("reprobisect.commands.runs", "Find the commit that changed (or broke) training between --good and --bad."),
    "probe": ("reprobisect.commands.probe", "Probe the current checkout once (exit 0 good, 1 bad, 125 skip) for git bisect run."),
    "repro": ("reprobisect.commands.repro", "Run the same command twice and name the first nondeterministic tensor."),
    "seeds": ("reprobisect.commands.seeds", "Map which chain components depend on the seed (and which wrongly don't)."),
    "envs": ("reprobisect.commands.envs", "Compare one command under two environments (interpreter, env vars, device, dtype)."),
    "audit": ("reprobisect.commands.audit", "Run a nightly determinism audit from a YAML config."),
    "doctor": ("reprobisect.commands.doctor", "Check a run for the symptoms of the debugging guide."),
    "report": ("reprobisect.commands.report", "Render a result as text or a self-contained HTML report."),
    "demo": ("reprobisect.commands.demo", "Try it in one minute: bisect a generated repository."),
}


class LazyGroup(click.Group):
    """A click group that imports a subcommand's module only when it is needed."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, _ = COMMANDS[name]
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            return _not_built(name)
        return getattr(mod, "command")

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_) for name, (_, help_) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _not_built(name: str) -> click.Command:
    @click.command(name=name, help=COMMANDS[name][1] + "\n\nNot built yet.", context_settings={"ignore_unknown_options": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def stub(args: tuple[str, ...]) -> None:
        raise click.exceptions.Exit(_fail(f"'bisect {name}' is not built yet in reprobisect {__version__}"))

    return stub


def _fail(message: str, code: int = 2) -> int:
    click.echo(f"error: {message}", err=True)
    return code


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="reprobisect")
def cli() -> None:
    """reprobisect: where do two training runs first stop agreeing, and why?"""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console scripts ``bisect`` and ``reprobisect``."""
    from reprobisect import interrupt

    try:
        with interrupt.signals_as_interrupt():  # SIGTERM/SIGHUP clean up like Ctrl-C
            rv = cli.main(args=argv, prog_name="bisect", standalone_mode=False)
    except ReproError as e:
        return _fail(str(e), e.exit_code)
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.ClickException as e:
        e.show()
        return 2
    except click.exceptions.Abort as e:
        return _fail(str(e.__cause__ or "") or "aborted", interrupt.exit_code(e))
    except KeyboardInterrupt as e:
        return _fail(str(e) or "interrupted", interrupt.exit_code(e))
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
