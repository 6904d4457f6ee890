"""The ``bisect`` command-line program: a click group whose subcommands load lazily.

Each subcommand lives in ``reprobisect.cli.commands.<name>`` and is imported only when it is
run (or listed with its help), so ``bisect --help`` stays fast and imports no framework.

``main`` is the one error boundary: every exception ends as one line and a documented exit
status, never a traceback that exits 1 (1 means "diverged / bad", and under
``git bisect run`` it would blame the commit):

- bad input or usage (``ReproError``, click's usage errors, an output path that cannot be
  written, a full disk): ``2``; click's usage errors too are one line, with click's "did you
  mean" and the command's ``--help`` (``_click_error``), not click's Usage/Try/Error block;
- an internal error (anything else: a reprobisect bug): ``3``, one line saying so and
  naming the log file the traceback was written to; ``--debug`` (or
  ``REPROBISECT_DEBUG=1``) prints the traceback too;
- ``bisect probe`` follows git bisect run's contract, where 2 would read as "bad": its
  own usage errors exit ``128`` and its internal errors ``250``, both >= 128, which makes
  git abort the bisection instead of blaming commits;
- interrupted: ``130`` (Ctrl-C), ``143`` (SIGTERM), ``129`` (SIGHUP): 128 + the signal, as
  shells do; every one of them >= 128, so an interrupted ``probe`` also aborts git bisect.

The codes are ``reprobisect.exitcodes.ExitCode``. Every command returns its code and
``main`` returns it to the console script, which exits with it: no command exits itself.

A command given ``--json`` that ends in one of these errors still prints a JSON document on
stdout (``reprobisect.render.envelope.error_document``: ``verdict: error``, the exit code, the
line), so a script reading stdout always gets one document.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import errno
import importlib
import os
import sys
import tempfile
import traceback
from pathlib import Path

import click

from reprobisect import __version__
from reprobisect.cli.options import forgotten_separator, with_verbosity
from reprobisect.errors import ReproError
from reprobisect.exitcodes import ExitCode
from reprobisect.support import interrupt
from reprobisect.support.cachedir import user_cache_dir

__all__ = ["cli", "main", "COMMANDS"]

# OSErrors that are the user's environment, not a bug: a path that cannot be written or read
_USER_OS_ERRORS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR, errno.EISDIR}

# name -> (module, one-line help shown in `bisect --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "capture": ("reprobisect.cli.commands.capture", "Record a few steps of an unmodified training command into a trace."),
    "compare": ("reprobisect.cli.commands.compare", "Name the first step, stage and tensor where two traces disagree."),
    "runs": ("reprobisect.cli.commands.runs", "Find the commit that changed (or broke) training between --good and --bad."),
    "probe": ("reprobisect.cli.commands.probe", "Probe the current checkout once (exit 0 good, 1 bad, 125 skip) for git bisect run."),
    "repro": ("reprobisect.cli.commands.repro", "Run the same command 3 times (--runs N) and name the first nondeterministic tensor."),
    "resume": ("reprobisect.cli.commands.resume", "Check that the command's own checkpoint/resume continues a run bitwise."),
    "seeds": ("reprobisect.cli.commands.seeds", "Map which chain components depend on the seed (and which wrongly don't)."),
    "envs": ("reprobisect.cli.commands.envs", "Compare one command under two environments (interpreter, env vars, device, dtype)."),
    "doctor": ("reprobisect.cli.commands.doctor", "Diagnose a training command: first NaN/Inf, a broken update path, nondeterminism."),
    "audit": ("reprobisect.cli.commands.audit", "Nightly determinism audit: checks from a config, goldens, history, JUnit/JSON/HTML."),
    "report": ("reprobisect.cli.commands.report", "Write a self-contained HTML report of a comparison, a runs session or an audit."),
    "demo": ("reprobisect.cli.commands.demo", "Try it in one minute: bisect a generated repository."),
}


class LazyGroup(click.Group):
    """A click group that imports a subcommand's module only when it is needed."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, _ = COMMANDS[name]
        return with_verbosity(getattr(importlib.import_module(module), "command"))

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_) for name, (_, help_) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


# the commands whose --json is a flag (stdout carries the document); audit's --json names a file
_JSON_COMMANDS = ("capture", "compare", "runs", "probe", "repro", "resume", "seeds", "envs", "doctor", "demo")


def _fail(message: str, code: int, json_kind: str | None = None) -> int:
    click.echo(f"error: {message}", err=True)
    if json_kind is not None:  # --json: stdout still carries one document
        from reprobisect.render import envelope

        click.echo(envelope.dumps(envelope.error_document(json_kind, code, message)))
    return code


def _json_kind(args: list[str]) -> str | None:
    """The command ``args`` run when they give it ``--json`` (before ``--``) and its --json is a flag, else None."""
    name = _subcommand(args)
    if name not in _JSON_COMMANDS:
        return None
    for a in args[args.index(name) + 1:]:
        if a == "--":
            return None
        if a == "--json":
            return name
    return None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="reprobisect")
@click.option("--debug", is_flag=True, help="Print the traceback of an internal error (also: REPROBISECT_DEBUG=1).")
def cli(debug: bool) -> None:
    """reprobisect: where do two training runs first stop agreeing, and why?"""


def _subcommand(args: list[str]) -> str | None:
    """The subcommand ``args`` name (the first word that is not a global option)."""
    for a in args:
        if a == "--":
            return None
        if not a.startswith("-"):
            return a
    return None


def _debug(args: list[str]) -> bool:
    if os.environ.get("REPROBISECT_DEBUG", "").strip().lower() not in ("", "0", "false", "no"):
        return True
    for a in args:
        if a == "--debug":
            return True
        if not a.startswith("-"):
            return False
    return False


def _log_dir() -> Path:
    return user_cache_dir() / "logs"


def _write_traceback(exc: BaseException, args: list[str]) -> str | None:
    """Write ``exc``'s traceback to a log file (cache dir, else the temp dir); its path or None."""
    text = (
        f"reprobisect {__version__} internal error, {_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')}\n"
        f"python {sys.version.split()[0]}; argv: bisect {' '.join(args)}\n\n"
        + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    )
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    for folder in (_log_dir(), Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=f"reprobisect-error-{stamp}-", suffix=".log", dir=folder)
            with os.fdopen(fd, "w") as f:
                f.write(text)
            return name
        except OSError:
            continue
    return None


def _internal(exc: BaseException, args: list[str], code: int) -> int:
    """One line (and a log file) for a reprobisect bug: exit ``code``."""
    debug = _debug(args)
    if debug:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    log = _write_traceback(exc, args)
    what = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300] if str(exc) else type(exc).__name__
    where = f"traceback written to {log}" if log else "the traceback could not be written to a log file"
    hint = "" if debug else "; run with --debug to print it"
    return _fail(f"internal error in reprobisect (a bug, not your input; please report it): {what}; {where}{hint}", code,
                 _json_kind(args))


def _os_error(e: OSError) -> str:
    names = [n for n in (e.filename, e.filename2) if n is not None]
    what = f"'{names[0]}'" if names else "a file"
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        where = f"the disk holding {what}" if names else "the disk"
        return f"no space left on {where} ({errno.errorcode[e.errno]}); free space there or choose another path"
    return f"cannot use {what}: {e.strerror or e}; check the path and its permissions"


def _suggestions(e: click.ClickException) -> str:
    """Click's "did you mean" names for an unknown option or command, as ' (did you mean X?)':
    the closest spelling alone when it is clearly the closest (``--step`` → ``--steps``), else
    the close ones in order; ``--help`` only when nothing else is close."""
    given = getattr(e, "option_name", None) or getattr(e, "command_name", None) or ""
    names = sorted(getattr(e, "possibilities", None) or ())
    if len(names) > 1:
        score = {n: difflib.SequenceMatcher(None, given, n).ratio() for n in names}
        names = [n for n in names if n != "--help"] or names
        best = max(score[n] for n in names)
        names = sorted((n for n in names if score[n] >= best - 0.1), key=lambda n: (-score[n], n))
    if not names:
        return ""
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    return f" (did you mean {listed}?)"


def _click_error(e: click.ClickException, args: list[str] | None = None) -> str:
    """Click's usage error as ONE line naming the mistake and the fix (click's own ``show()``
    prints three: Usage, Try, Error), e.g. ``no such option '--stepz' for bisect capture
    (did you mean --steps?); see bisect capture --help``."""
    ctx = getattr(e, "ctx", None)
    path = ctx.command_path if ctx is not None and ctx.command_path else "bisect"
    if isinstance(e, click.exceptions.NoSuchOption):
        fix = forgotten_separator(ctx, e.option_name, args or [])
        if fix is not None:  # the training command's own option: the -- before the command is missing
            return f"no such option '{e.option_name}' for {path}: put -- before the command: {fix}"
        what = f"no such option '{e.option_name}' for {path}{_suggestions(e)}"
    elif type(e).__name__ == "NoSuchCommand":  # click >= 8.4
        what = f"no such command '{getattr(e, 'command_name', '?')}' for {path}{_suggestions(e)}"
    else:
        text = " ".join(e.format_message().split())
        what = (text[:1].lower() + text[1:]).rstrip(".") or type(e).__name__
    if not isinstance(e, click.UsageError):
        return what
    return f"{what}; see {path} --help"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console scripts ``bisect`` and ``reprobisect``: the one error boundary.

    Every outcome is a documented exit status (``reprobisect.exitcodes.ExitCode``, README's
    exit codes); no exception escapes as a traceback. SIGTERM/SIGHUP clean up like Ctrl-C.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    probe = _subcommand(args) == "probe"
    usage = ExitCode.PROBE_USAGE if probe else ExitCode.USAGE
    internal = ExitCode.PROBE_INTERNAL if probe else ExitCode.INTERNAL
    kind = _json_kind(args)
    try:
        with interrupt.signals_as_interrupt():
            # standalone_mode=False: click returns the command's code (and --help's 0) instead of exiting
            rv = cli.main(args=args, prog_name="bisect", standalone_mode=False)
    except ReproError as e:
        code = e.exit_code
        return _fail(str(e), usage if (probe or code == ExitCode.USAGE) else code, kind)
    except click.exceptions.NoArgsIsHelpError as e:
        e.show()  # plain `bisect`: the help text is the answer to "what can I do?"
        return usage
    except click.ClickException as e:
        return _fail(_click_error(e, args), usage, kind)
    except click.exceptions.Abort as e:
        return _fail(str(e.__cause__ or "") or "aborted", interrupt.exit_code(e), kind)
    except KeyboardInterrupt as e:
        return _fail(str(e) or "interrupted", interrupt.exit_code(e), kind)
    except BrokenPipeError:
        return ExitCode.INTERRUPTED  # the reader of stdout went away (e.g. '| head'); nothing to say
    except OSError as e:
        if e.errno in _USER_OS_ERRORS:
            return _fail(_os_error(e), usage, kind)
        return _internal(e, args, internal)
    except Exception as e:  # noqa: BLE001 -- the one boundary: a bug is exit 3, never 1
        return _internal(e, args, internal)
    if probe and rv == ExitCode.USAGE:
        return usage
    return int(rv) if isinstance(rv, int) else ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
