"""``bisect probe``: probe the current checkout once, for ``git bisect run``.

Exit 0 good, 1 bad, 125 skip (git bisect's convention: a timeout or infrastructure
failure skips). Its own errors must stop the bisection, not blame the commit, so bad input
exits 128 and an internal error 250 (``git bisect run`` aborts on >= 128; it would read 2
as "bad"; 129 is SIGHUP's); ``reprobisect.cli.main`` maps them (``reprobisect.exitcodes``). The probe runs in place: git bisect has
already checked the commit out, so no worktree is made.
"""

from __future__ import annotations

import click

from reprobisect.cli.options import probe_options, split_command
from reprobisect.core.options import ProbeOptions
from reprobisect.render import envelope, probe_report_json, render_probe_report
from reprobisect.render.comparison import command_warning
from reprobisect.render.safe import printable_lines
from reprobisect.workflows import repro

__all__ = ["command"]


@click.command(
    name="probe",
    context_settings={"ignore_unknown_options": False},
    epilog="Example: git bisect run bisect probe --reference good-trace -- python train.py",
)
@click.option("--reference", type=click.Path(), default=None, help="Trace of the good run (for --check match).")
@click.option("--check", type=click.Choice(["match", "repro", "finite"]), default=None,
              help="Predicate: match the reference, two runs agree, or no NaN/Inf [default: match].")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@probe_options
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def command(options: ProbeOptions, reference: str | None, check: str | None, as_json: bool, cmd: tuple[str, ...]) -> int:
    """Probe the current checkout once: exit 0 good, 1 bad, 125 skip.

    Bad input exits 128 and an internal error 250: git bisect run stops instead of
    blaming the commit.
    """
    report = repro.probe_checkout(split_command(cmd), options, check=check, reference=reference)
    code = report.exit_code
    if as_json:
        verdict = envelope.probe_verdict(report.verdict)
        click.echo(envelope.dumps(envelope.document("probe", verdict, code, probe_report_json(report))))
        return code
    comparison = getattr(report.verdict, "comparison", None)
    warning = command_warning(comparison.env) if comparison is not None else None
    if warning:  # this checkout ran with other arguments than the reference: not like for like
        click.echo(printable_lines(warning.replace("the two runs were", "this run and the reference were")))
    click.echo(render_probe_report(report))
    return code
