"""``bisect repro``: run one command N times and name the first nondeterministic tensor.

Exit 0 when every run is identical to the first (under the tolerance, bitwise by
default), 1 when not, 2 for bad input or runs that produced nothing to compare.
"""

from __future__ import annotations

import click

from reprobisect.cli.options import probe_options, split_command
from reprobisect.core.options import ProbeOptions
from reprobisect.exitcodes import ExitCode
from reprobisect.render import envelope, render_repro, repro_json
from reprobisect.workflows.repro import DEFAULT_CONFIRM_MAX, run_repro

__all__ = ["command"]


@click.command(name="repro", epilog="Example: bisect repro --runs 3 -- python train.py --epochs 1")
@click.option("--runs", type=int, default=3, show_default=True,
              help="How many runs to compare (2 can miss nondeterminism that shows in some runs only).")
@click.option("--hashseed-differ", is_flag=True, help="Give each run a different PYTHONHASHSEED (exposes set-order bugs).")
@click.option("--confirm/--no-confirm", default=True, show_default=True,
              help="When the runs differ, test each candidate cause (PYTHONHASHSEED, the DataLoader's generator, "
                   "one thread, deterministic algorithms, TF op determinism) by re-running the pair with it held "
                   "fixed: 2 more runs per candidate tried. --no-confirm only names them, as questions.")
@click.option("--confirm-max", type=click.IntRange(min=0), default=DEFAULT_CONFIRM_MAX, show_default=True,
              help="Test at most this many candidate causes (2 runs each); the rest are named as questions.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@probe_options
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def command(options: ProbeOptions, runs: int, hashseed_differ: bool, confirm: bool, confirm_max: int, as_json: bool,
            cmd: tuple[str, ...]) -> int:
    """Run the same command several times and compare: identical, or the first nondeterministic tensor.

    When the runs differ, the likely causes are tested by re-running the pair with each held
    fixed (2 more runs per cause tried): "confirmed: with PYTHONHASHSEED=0 the runs agree", or
    "not this: still differs with ...". A cause not tested is a question with the check to make.
    """
    result = run_repro(split_command(cmd), options, runs=runs, hashseed_differ=hashseed_differ, confirm=confirm,
                       confirm_max=confirm_max)
    code = ExitCode.OK if result else ExitCode.DIFFER
    if as_json:
        click.echo(envelope.dumps(envelope.document("repro", envelope.repro_verdict(result), code, repro_json(result))))
    else:
        click.echo(render_repro(result))
    return code
