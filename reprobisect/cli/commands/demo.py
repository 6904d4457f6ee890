"""``bisect demo``: build a throwaway repository with a silent numerics change and bisect it.

Thin: calls ``reprobisect.workflows.demo.run_demo`` and prints the answer. Exit 0 when the search
names the commit the demo planted, 1 otherwise.
"""

from __future__ import annotations

import click

from reprobisect.exitcodes import ExitCode
from reprobisect.render import envelope
from reprobisect.support.progress import Progress
from reprobisect.workflows.demo import DEMO_COMMAND, run_demo

__all__ = ["command"]


@click.command(name="demo")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None,
              help="Build the demo repository here (kept) instead of a temporary folder.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=2, show_default=True, help="Probes run at once.")
@click.option("--keep", is_flag=True, help="Keep the temporary repository.")
@click.option("-q", "--quiet", is_flag=True, help="Print only the result and errors: no progress, no notes.")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
def command(directory: str | None, jobs: int, keep: bool, quiet: bool, as_json: bool) -> int:
    """Try it in one minute: bisect a generated repository.

    Builds a small PyTorch project with ~20 commits (one silently changes the numerics,
    one does not import), runs `bisect runs --check match` on it, and prints the commit
    that changed training and the first tensor that changed inside it.
    """
    quiet = quiet or as_json
    say = (lambda m: None) if quiet else (lambda m: click.echo(m, err=True))
    say("building a demo repository: a tiny MLP project with 20 commits ...")
    with Progress("bisect runs (demo)", quiet=quiet) as bar:
        def started(repo) -> None:
            say(f"  {repo.path}")
            say(f"bisect runs --good {repo.good[:10]} --bad {repo.bad[:10]} --check match -- {' '.join(DEMO_COMMAND)}")

        repo, result = run_demo(directory, jobs=jobs, quiet=quiet, keep=keep, progress=bar, on_built=started)
    hit = result.first_bad is not None and result.first_bad.hash == repo.culprit
    code = ExitCode.OK if hit else ExitCode.DIFFER
    if as_json:
        body = {"repository": str(repo.path), "planted": repo.culprit, "found_planted": hit, "result": result.to_json()}
        click.echo(envelope.dumps(envelope.document("demo", envelope.demo_verdict(hit), code, body)))
    else:
        click.echo(str(result))
        click.echo(
            f"\nthe demo planted its numerics change in {repo.culprit[:10]}: "
            + ("found it." if hit else "NOT found (see above).")
        )
    return code
