"""``bisect capture``: record a few steps of an unmodified training command into a trace.

Exit 0 when the trace is complete; 1 when the command crashed, went non-finite, never
stepped an optimizer or timed out; 125 when it could not be tested (import failure);
2 for bad input.
"""

from __future__ import annotations

import click

from reprobisect.cli.options import capture_options, parse_steps
from reprobisect.core.options import ProbeOptions
from reprobisect.executors import executor_for
from reprobisect.render import envelope
from reprobisect.workflows.capture import CaptureConfig, capture, display_path, outcome_lines, user_traceback

__all__ = ["command"]


@click.command(
    name="capture",
    epilog="Example: bisect capture -o run.trace --steps 3 -- python train.py --lr 1e-3",
)
@click.option("-o", "--out", required=True, type=click.Path(), help="Trace folder to write.")
@click.option("--state-steps", default="", help="Steps after which complete state is captured, e.g. 2.")
@click.option("--seed", default=None, help="The seed the command uses (recorded in the manifest).")
@click.option("--stop-on-nonfinite", is_flag=True, help="End the run at the first NaN/Inf.")
@click.option("--max-disk", type=int, default=None, help="Bound in bytes for full tensors and state.")
@click.option("--max-records-per-step", type=int, default=None,
              help="Bound on forward records (inputs, activations, outputs) a step; past it they are counted, not recorded [20000].")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@capture_options
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def command(out: str, options: ProbeOptions, state_steps: str, seed: str | None, stop_on_nonfinite: bool, max_disk: int | None,
            max_records_per_step: int | None, as_json: bool, cmd: tuple[str, ...]) -> int:
    """Record a few steps of an unmodified training command (after --) into a trace.

    --steps, --timeout, --full-steps, --detail, --state-every, --executor (with its flags) and --config mean what
    they mean for the probing commands, and a --config file's keys for them apply here too.
    """
    config = CaptureConfig(
        steps=options.steps,
        full_steps=options.full_steps,
        state_steps=parse_steps(state_steps, "--state-steps"),
        seed=seed,
        timeout=options.timeout,
        stop_on_nonfinite=stop_on_nonfinite,
        max_disk=max_disk,
        max_records_per_step=max_records_per_step,
        detail=options.detail,
        state_every=options.state_every,
        quiet=options.quiet or as_json,  # --json: stdout is the JSON only
    )
    if options.executor == "local":
        result = capture(list(cmd), out, config)  # streams the command's output live
    else:
        with executor_for(options) as ex:
            result = capture(list(cmd), out, config, executor=ex)
    code = result.exit_code
    if as_json:
        click.echo(envelope.dumps(envelope.document("capture", envelope.capture_verdict(code), code, result.to_json())))
        return code
    for line in outcome_lines(result):  # once, on stdout; the stream above was the command's own
        click.echo(line)
    o = result.outcome
    if o.status != "ok":  # the error detail: shown with -q too
        # the user's frames only; the whole traceback is in the trace's output.log
        tail = user_traceback(o.traceback)[-12:] if o.traceback else (result.stderr_tail or "").strip().splitlines()[-8:]
        for line in tail:
            click.echo(f"  {line}", err=True)
        if o.traceback and result.output_log:
            click.echo(f"  (the whole traceback: {display_path(result.output_log)})", err=True)
    return code
