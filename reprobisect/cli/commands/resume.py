"""``bisect resume``: does the command's own checkpoint/resume continue the run bitwise?

Exit 0 when the resumed run is bitwise the uninterrupted one over steps K..N-1, 1 when
not (or no verdict: a run crashed, the command is not deterministic), 2 for bad input.
"""

from __future__ import annotations

import click

from reprobisect.cli.options import probe_options, split_command
from reprobisect.core.options import ProbeOptions
from reprobisect.exitcodes import ExitCode
from reprobisect.render import envelope
from reprobisect.render.resume import render_resume, resume_json
from reprobisect.workflows.resume import check_resume, split_resume_args

__all__ = ["command"]


@click.command(name="resume", epilog="Example: bisect resume --steps 8 --at 4 --resume-args '--resume ckpt.pt' -- python train.py")
@click.option("--at", "at", type=int, default=None,
              help="Interrupt after this many steps (0..K-1 done, step K-1's checkpoint saved); steps K..N-1 are compared.")
@click.option("--resume-args", "resume_args", default=None, metavar="ARGS",
              help="Arguments appended to the command to make it resume (split like a shell), e.g. '--resume ckpt.pt'.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@probe_options
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def command(options: ProbeOptions, at: int | None, resume_args: str | None, as_json: bool, cmd: tuple[str, ...]) -> int:
    """Run the command uninterrupted, interrupted after --at K steps, and resumed; name what the checkpoint forgot."""
    if at is None:
        from reprobisect.errors import UsageError

        raise UsageError("give --at K: the number of steps after which the run is interrupted (below --steps)")
    args = split_resume_args(resume_args)
    result = check_resume(split_command(cmd), args, at=at, options=options)
    code = ExitCode.OK if result else ExitCode.DIFFER
    if as_json:
        click.echo(envelope.dumps(envelope.document("resume", envelope.resume_verdict(result), code, resume_json(result))))
    else:
        click.echo(render_resume(result))
    return code
