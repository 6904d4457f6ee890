"""``bisect envs``: one command under two environments: the environment diff, then the
first divergence (default tolerance).

Exit 0 when the runs agree, 1 when they differ, 2 for bad input.
"""

from __future__ import annotations

import click

from reprobisect.cli.options import probe_options, split_command
from reprobisect.core.options import ProbeOptions
from reprobisect.exitcodes import ExitCode
from reprobisect.render import envelope, envs_json, render_envs
from reprobisect.workflows.envs import run_envs
from reprobisect.workflows.repro import DEFAULT_CONFIRM_MAX

__all__ = ["command"]


@click.command(
    name="envs",
    epilog="Example: bisect envs --a env.OMP_NUM_THREADS=1 --b env.OMP_NUM_THREADS=2 -- python train.py\n\n"
    "SPEC items: python=PATH, env.NAME=VALUE (set before the child starts), NAME=VALUE (replaces {NAME} in CMD).",
)
@click.option("--a", "spec_a", required=True, help="Side a: python=PATH,env.NAME=VALUE,NAME=VALUE.")
@click.option("--b", "spec_b", required=True, help="Side b, same form.")
@click.option("--confirm/--no-confirm", default=True, show_default=True,
              help="When the sides differ and a hint names a cause besides the environment difference (string "
                   "hashing, an unseeded DataLoader), re-run both sides with it held fixed: 2 more runs per "
                   "candidate tried. --no-confirm only names them, as questions.")
@click.option("--confirm-max", type=click.IntRange(min=0), default=DEFAULT_CONFIRM_MAX, show_default=True,
              help="Test at most this many candidate causes (2 runs each).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@probe_options
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def command(options: ProbeOptions, spec_a: str, spec_b: str, confirm: bool, confirm_max: int, as_json: bool,
            cmd: tuple[str, ...]) -> int:
    """Compare one command under two environments."""
    result = run_envs(split_command(cmd), options, a=spec_a, b=spec_b, confirm=confirm, confirm_max=confirm_max)
    code = ExitCode.OK if result else ExitCode.DIFFER
    if as_json:
        verdict = envelope.comparison_verdict(result.comparison)
        click.echo(envelope.dumps(envelope.document("envs", verdict, code, envs_json(result))))
    else:
        click.echo(render_envs(result))
    return code
