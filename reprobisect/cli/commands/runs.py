"""``bisect runs --good G --bad B -- CMD``: the commit that changed (or broke) training.

Thin: parses, calls ``reprobisect.workflows.runs.find_first_bad``, prints the answer or ``--json``.
Exit 0 when one first bad commit is named, 1 when the answer is ambiguous or none was
found, 2 for bad input.
"""

from __future__ import annotations

from dataclasses import replace

import click

from reprobisect.cli.options import NON_NEGATIVE, link_option, probe_options, split_command
from reprobisect.core.options import ProbeOptions
from reprobisect.errors import UsageError
from reprobisect.exitcodes import ExitCode
from reprobisect.render import envelope
from reprobisect.workflows.runs import RunsConfig, find_first_bad

__all__ = ["command"]


@click.command(name="runs", context_settings={"allow_interspersed_args": False})
@click.option("--good", "good", required=True, help="A revision that trains the old/expected way.")
@click.option("--bad", "bad", required=True, help="A revision whose training changed.")
@click.option("--check", type=click.Choice(["match", "repro", "finite"]), default="match", show_default=True,
              help="match: trace equals the good commit's; repro: two runs agree; finite: no NaN/Inf.")
@click.option("--first-parent", is_flag=True, help="Follow only the first parent of merges.")
@click.option("--repeat", type=int, default=1, show_default=True, help="Run each probe R times and require agreement.")
@click.option("--resume", is_flag=True, help="Continue the interrupted session with the same arguments.")
@click.option("--terms", default="good,bad", show_default=True, help="Names for before,after the change (e.g. old,new).")
@click.option("--lock-timeout", type=NON_NEGATIVE, default=0.0, show_default=True,
              help="Seconds to wait for another session on this repository to finish (0: refuse at once).")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
@link_option
@probe_options
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def command(good: str, bad: str, check: str, first_parent: bool, repeat: int, resume: bool, terms: str,
            lock_timeout: float, as_json: bool, options: ProbeOptions, cmd: tuple[str, ...]) -> int:
    """Find the commit that changed (or broke) training between --good and --bad.

    Each commit runs in its own detached worktree; your checkout is never touched.
    Data that git does not track (ignored datasets, untracked configs) is not in those
    worktrees: name it with --link PATH (symlinked, never copied).

    Exit 0 when one first bad commit is named (and its re-check agreed), 1 when
    the answer is ambiguous ("could be any of") or the re-check disagreed, 2 for bad
    input or an endpoint that does not probe as its flag says.

    \b
    Example:
      bisect runs --good v1.2 --bad main -- python train.py --lr 3e-4
      bisect runs --good v1.2 --bad main --link data -- python train.py
    """
    argv = split_command(cmd)
    names = tuple(t.strip() for t in terms.split(","))
    if len(names) != 2 or not all(names):
        raise UsageError(f"--terms takes two names separated by a comma, e.g. old,new (got '{terms}')")
    if as_json and not options.quiet:
        options = replace(options, quiet=True)
    result = find_first_bad(
        RunsConfig(good=good, bad=bad, command=tuple(argv), check=check, options=options,
                   first_parent=first_parent, repeat=repeat, resume=resume, terms=names,  # type: ignore[arg-type]
                   lock_timeout=lock_timeout)
    )
    code = ExitCode.OK if result else ExitCode.DIFFER
    if as_json:
        click.echo(envelope.dumps(envelope.document("runs", envelope.runs_verdict(result), code, result.to_json())))
    else:
        click.echo(str(result))
    return code
