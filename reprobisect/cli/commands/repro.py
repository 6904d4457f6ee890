"""``bisect repro``: run one command N times and name the first nondeterministic tensor.

Exit 0 when every run is identical to the first (under the tolerance, bitwise by
default), 1 when not, 2 for bad input or runs that produced nothing to compare.
"""

from __future__ import annotations

import json

import click

from reprobisect.cli.options import probe_options, split_command
from reprobisect.core.options import ProbeOptions
from reprobisect.exitcodes import ExitCode
from reprobisect.render import render_repro, repro_json
from reprobisect.workflows.repro import run_repro

__all__ = ["command"]


@click.command(name="repro", epilog="Example: bisect repro --runs 3 -- python train.py --epochs 1")
@click.option("--runs", type=int, default=3, show_default=True,
              help="How many runs to compare (2 can miss nondeterminism that shows in some runs only).")
@click.option("--hashseed-differ", is_flag=True, help="Give each run a different PYTHONHASHSEED (exposes set-order bugs).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@probe_options
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def command(options: ProbeOptions, runs: int, hashseed_differ: bool, as_json: bool, cmd: tuple[str, ...]) -> int:
    """Run the same command several times and compare: identical, or the first nondeterministic tensor."""
    result = run_repro(split_command(cmd), options, runs=runs, hashseed_differ=hashseed_differ)
    click.echo(json.dumps(repro_json(result), indent=2) if as_json else render_repro(result))
    return ExitCode.OK if result else ExitCode.DIFFER
