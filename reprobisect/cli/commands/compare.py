"""`bisect compare A B`: name the first step, stage and tensor where two traces disagree.

Parses the tolerance options (``reprobisect.cli.options.tolerance_from``, as every probing
command does), calls ``reprobisect.core.compare.compare_paths`` and renders the
``Comparison`` as text or JSON. Exit status: 0 agree, 1 diverged, 2 bad input.
"""

from __future__ import annotations

import sys

import click

from reprobisect.cli.options import executor_options, link_option, tolerance_from, tolerance_options
from reprobisect.core import compare as _compare
from reprobisect.core.options import ProbeOptions
from reprobisect.executors import executor_for
from reprobisect.exitcodes import ExitCode
from reprobisect.render import comparison_json, envelope, render_comparison
from reprobisect.render.safe import printable_lines
from reprobisect.support.progress import verbosity
from reprobisect.workflows.zoom import run_zoom

__all__ = ["command"]


def _tolerance_flags(f):
    for d in reversed(tolerance_options("bitwise when both traces share device and environment, else default")):
        f = d(f)
    return f


@click.command(name="compare")
@click.argument("a", type=click.Path(path_type=str))
@click.argument("b", type=click.Path(path_type=str))
@_tolerance_flags
@click.option("--allow-incomplete", is_flag=True, help="Read incomplete or failed traces up to their last whole step.")
@click.option("--verify", is_flag=True,
              help="Verify both traces whole first: every listed file against its SHA-256, no unlisted file, every "
                   "stored tensor against its record (name, dtype, shape, fingerprint). Otherwise shards are checked "
                   "only when a tensor is read.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option("--zoom", is_flag=True, help="On divergence, re-run both sides recording every op of the first diverging module.")
@click.option("--trust-trace", is_flag=True,
              help="With --zoom: re-run the commands recorded in traces this machine did not record, without asking.")
@link_option
@executor_options
def command(a: str, b: str, tolerance: str | None, atol: float | None, rtol: float | None, override: tuple[str, ...],
            allow_incomplete: bool, verify: bool, as_json: bool, zoom: bool, trust_trace: bool, link: tuple[str, ...],
            options: ProbeOptions) -> int:
    """Name the first step, stage and tensor where traces A and B disagree.

    Exit status: 0 when they agree (identical, or within the tolerance), 1 when they
    diverge, 2 on bad input (a missing, truncated or foreign trace, a bad option).

    --zoom re-runs the commands the traces recorded, each at its trace's recorded commit in a
    detached worktree (--link PATH: files git does not hold, symlinked in); a trace recorded
    with uncommitted changes the checkout no longer holds is refused. A trace that this user did not
    record on this machine (someone else's) is untrusted: zoom shows what it would run
    and asks, or, without a terminal, refuses unless --trust-trace is given.
    """
    tol = tolerance_from({"tolerance": tolerance, "atol": atol, "rtol": rtol, "override": override})
    result = _compare.compare_paths(a, b, tolerance=tol, allow_incomplete=allow_incomplete, verify=verify)

    zoomed = None
    if zoom and not result and result.first is not None:
        # zooms into the origin module, else the first divergence; without a terminal nobody can
        # be asked: an untrusted trace is refused unless --trust-trace
        confirm = _confirm if sys.stdin is not None and sys.stdin.isatty() else None
        with executor_for(options) as ex:  # --executor/--jobs: where the two re-runs go
            zoomed = run_zoom(a, b, result, trust=trust_trace, confirm=confirm, executor=ex, links=link)
    code = ExitCode.OK if result else ExitCode.DIFFER
    if as_json:
        doc = envelope.document("compare", envelope.comparison_verdict(result), code, comparison_json(result, zoomed))
        click.echo(envelope.dumps(doc, indent=1))
    else:
        click.echo(render_comparison(result, verbose=verbosity().verbose))  # -v: every environment difference
        if zoomed is not None:
            click.echo(printable_lines(f"zoom: {zoomed}"))
    return code


def _confirm(text: str) -> bool:
    click.echo(printable_lines(text), err=True)  # what would run, shown: a name in it cannot rewrite the screen
    return click.confirm("run these commands?", default=False, err=True)
