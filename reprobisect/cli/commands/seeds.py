"""``bisect seeds``: which chain components depend on the seed (and which wrongly don't).

Exit 0 when nothing is flagged, 1 when a component contradicts what it should do with
the seed, 2 for bad input (no ``{seed}`` in the command, fewer than two seeds).
"""

from __future__ import annotations

import click

from reprobisect.cli.options import probe_options, split_command
from reprobisect.core.options import ProbeOptions
from reprobisect.exitcodes import ExitCode
from reprobisect.render import envelope, render_seed_map, seed_map_json
from reprobisect.workflows.seeds import run_seeds

__all__ = ["command"]


@click.command(name="seeds", epilog="Example: bisect seeds --seeds 0,1 -- python train.py --seed {seed}")
@click.option("--seeds", "seeds", default="0,1", show_default=True, help="Comma-separated seeds, substituted for {seed}.")
@click.option("--noise-floor", is_flag=True, help="Per-step spread of loss and grad norm across seeds (3+ seeds).")
@click.option("--confirm/--no-confirm", default=True, show_default=True,
              help="When a component changes between seeds, run the first seed once more (1 more run) to tell "
                   "the seed's changes from changes every run makes.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@probe_options
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def command(options: ProbeOptions, seeds: str, noise_floor: bool, confirm: bool, as_json: bool,
            cmd: tuple[str, ...]) -> int:
    """Run the command once per seed and map which components change with it.

    Full tensors of step 0 are kept (unless --full-steps is given) so that init and
    augmentation can be separated from data order.
    """
    result = run_seeds(split_command(cmd), options, seeds=seeds, noise=noise_floor, confirm=confirm)
    code = ExitCode.OK if result else ExitCode.DIFFER
    if as_json:
        click.echo(envelope.dumps(envelope.document("seeds", envelope.seeds_verdict(result), code, seed_map_json(result))))
    else:
        click.echo(render_seed_map(result))
    return code
