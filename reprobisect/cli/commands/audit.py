"""``bisect audit CONFIG.yaml``: nightly determinism checks with goldens, history and reports.

Exit 0 when every check passes (bitwise or within-noise), 1 when any diverged or is
inconclusive, 2 for a bad config (one line naming the key and the fix) or a report path that
may not be written (an existing file reprobisect did not write, a link, a folder: checked
before any check runs; ``reprobisect.trace.outfile``). ``--update-golden``
records the goldens and exits 0 (1 when one could not be recorded).
"""

from __future__ import annotations

from pathlib import Path

import click

from reprobisect.cli.options import executor_options
from reprobisect.core.options import ProbeOptions
from reprobisect.render.audit import audit_json, render_audit
from reprobisect.workflows.audit import load_audit_config, run_audit
from reprobisect.workflows.audit.reports import check_outputs, html_writer, write_html, write_json, write_junit

__all__ = ["command"]


@click.command(name="audit", epilog="Example: bisect audit configs/audit-example.yaml --junit audit.xml --html audit.html")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--junit", type=click.Path(dir_okay=False), default=None, help="Write a JUnit XML report here.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write the audit result document here.")
@click.option("--html", type=click.Path(dir_okay=False), default=None, help="Write a self-contained HTML report here.")
@click.option("--update-golden", is_flag=True, help="Record every golden (and its noise band) instead of checking.")
@executor_options(jobs_help="Checks run at once (each runs its own probes) [default: 2].")
def command(options: ProbeOptions, config: str, junit: str | None, json_path: str | None, html: str | None,
            update_golden: bool) -> int:
    """Run an audit config's checks: bitwise / within-noise / diverged / inconclusive, per check."""
    cfg = load_audit_config(config)  # the whole config is checked before anything runs
    # every report path may be written (new, or a report of ours), before the night is spent
    check_outputs({"junit": junit, "json": json_path, "html": html})
    if html:
        html_writer()  # the report package is there, before the night is spent
    result = run_audit(cfg, options, update_golden=update_golden)
    doc = audit_json(result)
    write_json(doc, Path(result.results_dir) / "audit.json")  # always, beside the night's traces
    if json_path:
        write_json(doc, json_path)
    if junit:
        write_junit(doc, junit)
    if html:
        write_html(doc, html)
    click.echo(render_audit(result))
    return result.exit_code  # the document's exit_code too (audit_json): the file and the process agree
