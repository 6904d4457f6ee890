"""`bisect compare A B`: name the first step, stage and tensor where two traces disagree.

Parses the tolerance options, calls ``reprobisect.core.compare.compare_paths`` and renders the
``Comparison`` as text or JSON. Exit status: 0 agree, 1 diverged, 2 bad input.
"""

from __future__ import annotations

import json
import sys

import click

from reprobisect.errors import UsageError
from reprobisect.core.options import NON_NEGATIVE

__all__ = ["command"]


@click.command(name="compare")
@click.argument("a", type=click.Path(path_type=str))
@click.argument("b", type=click.Path(path_type=str))
@click.option("--tolerance", "mode", type=click.Choice(["bitwise", "default"]), default=None,
              help="bitwise: bits must match; default: per-dtype torch.testing.assert_close figures. "
                   "Unset: bitwise when both traces share device and environment, else default.")
@click.option("--atol", type=NON_NEGATIVE, default=None, help="Explicit absolute tolerance for floating tensors.")
@click.option("--rtol", type=NON_NEGATIVE, default=None, help="Explicit relative tolerance (relative to B).")
@click.option("--override", "overrides", multiple=True, metavar="GLOB=ATOL,RTOL",
              help="Per-tensor rule on 'kind/name', e.g. 'grad/*=1e-5,1e-4' or 'param/*=bitwise'. Repeatable; first match wins.")
@click.option("--allow-incomplete", is_flag=True, help="Read incomplete or failed traces up to their last whole step.")
@click.option("--verify", is_flag=True,
              help="Check every file of both traces against its SHA-256 first (tensor shards are otherwise read only when needed).")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option("--zoom", is_flag=True, help="On divergence, re-run both sides recording every op of the first diverging module.")
@click.option("--trust-trace", is_flag=True,
              help="With --zoom: re-run the commands recorded in traces this machine did not record, without asking.")
def command(a: str, b: str, mode: str | None, atol: float | None, rtol: float | None, overrides: tuple[str, ...],
            allow_incomplete: bool, verify: bool, as_json: bool, zoom: bool, trust_trace: bool) -> None:
    """Name the first step, stage and tensor where traces A and B disagree.

    Exit status: 0 when they agree (identical, or within the tolerance), 1 when they
    diverge, 2 on bad input (a missing, truncated or foreign trace, a bad option).

    --zoom re-runs the commands the traces recorded. A trace that this user did not
    record on this machine (someone else's) is untrusted: zoom shows what it would run
    and asks, or, without a terminal, refuses unless --trust-trace is given.
    """
    from reprobisect.core.compare import Tolerance, compare_paths
    from reprobisect.render import comparison_json, render_comparison

    if (atol is not None or rtol is not None) and mode is not None:
        raise UsageError("give either --tolerance or --atol/--rtol, not both")
    if atol is not None or rtol is not None:
        tol = Tolerance(mode="explicit", atol=atol, rtol=rtol, overrides=[Tolerance.parse_override(o) for o in overrides])
    else:
        tol = Tolerance(mode=mode or "auto", overrides=[Tolerance.parse_override(o) for o in overrides])
    result = compare_paths(a, b, tolerance=tol, allow_incomplete=allow_incomplete, verify=verify)

    zoomed = None
    if zoom and not result and result.first is not None:
        zoomed = _zoom(a, b, result, trust_trace)  # zooms into the origin module, else the first divergence
    if as_json:
        click.echo(json.dumps(comparison_json(result, zoomed), indent=1))
    else:
        click.echo(render_comparison(result))
        if zoomed is not None:
            click.echo(f"zoom: {zoomed}")
    raise click.exceptions.Exit(0 if result else 1)


def _confirm(text: str) -> bool:
    click.echo(text, err=True)
    return click.confirm("run these commands?", default=False, err=True)


def _zoom(a: str, b: str, divergence, trust: bool = False):
    try:
        from reprobisect.workflows.zoom import run_zoom
    except ImportError:
        run_zoom = None
    if run_zoom is None:
        raise UsageError("op-level zoom is not available in this build")
    try:
        # without a terminal nobody can be asked: an untrusted trace is refused unless --trust-trace
        confirm = _confirm if sys.stdin is not None and sys.stdin.isatty() else None
        return run_zoom(a, b, divergence, trust=trust, confirm=confirm)
    except NotImplementedError:
        raise UsageError("op-level zoom is not available in this build") from None
