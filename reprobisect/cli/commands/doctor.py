"""``bisect doctor``: run the training-debugging guide's checks on an unmodified command.

Exit 0 when nothing is above ``info``, 1 when a check found a warning or an error, 2 for
bad input (an unknown ``--check``, no command after ``--``).
"""

from __future__ import annotations

import click
from click.core import ParameterSource

from reprobisect.cli.options import load_config, probe_options, split_command
from reprobisect.core.options import ProbeOptions
from reprobisect.render import envelope
from reprobisect.render.doctor import doctor_json, render_doctor
from reprobisect.workflows.doctor import CHECKS, DEFAULT_OVERFIT_STEPS, DEFAULT_STEPS, parse_checks, run_doctor

__all__ = ["command"]


def _steps(options: ProbeOptions) -> ProbeOptions:
    """``options`` with the doctor's default steps when neither --steps nor the config gave any."""
    ctx = click.get_current_context()
    if ctx.get_parameter_source("steps") not in (None, ParameterSource.DEFAULT):
        return options
    if options.config is not None and "steps" in load_config(options.config):
        return options
    from dataclasses import replace

    return replace(options, steps=DEFAULT_STEPS)


@click.command(name="doctor", epilog="Example: bisect doctor -- python train.py --lr 3e-4")
@click.option("--check", "checks", multiple=True, metavar="NAME",
              help=f"Run only this check (repeatable; default: all). One of: {', '.join(CHECKS)}.")
@click.option("--json", "as_json", is_flag=True, help="Print the diagnosis as JSON.")
@click.option("--overfit-steps", type=click.IntRange(min=2), default=DEFAULT_OVERFIT_STEPS, show_default=True,
              help="Optimizer steps of the fixed-batch run (check overfit).")
@probe_options
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def command(options: ProbeOptions, checks: tuple[str, ...], as_json: bool, overfit_steps: int,
            cmd: tuple[str, ...]) -> int:
    """Run the guide's checks on a training command (after --) and print a ranked diagnosis.

    --steps N (default 10) steps are recorded; the overfit check trains one repeated batch
    for --overfit-steps steps; -o DIR keeps the traces (and, with a NaN, the first bad batch
    and the last healthy state).
    """
    todo = parse_checks(checks)  # before anything runs: an unknown name is one line, exit 2
    argv = split_command(cmd)
    result = run_doctor(argv, _steps(options), checks=todo, overfit_steps=overfit_steps)
    code = result.exit_code
    if as_json:
        click.echo(envelope.dumps(envelope.document("doctor", envelope.doctor_verdict(result), code, doctor_json(result))))
    else:
        click.echo(render_doctor(result))
    return code
