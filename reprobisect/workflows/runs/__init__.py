"""``bisect runs``: find the commit that changed (or broke) training between two revisions.

The driver around the pure search (``reprobisect.core.search.Bisection``): it resolves the
range, verifies both endpoints, then keeps K probes in flight on an executor, marks
their verdicts, re-checks the culprit and its parent, and names the first divergence
inside the culprit against the last good commit (``reprobisect.core.compare``).

One job per module: ``result`` (what is asked and answered: data), ``driver`` (the
session and its phases: open → verify endpoints → search → re-check → answer),
``prober`` (one commit run and judged, with retries, repeats and the cache), ``resume``
(the session log: where it lives, whether it can be resumed). The answer's text and JSON
are ``reprobisect.render.runs``'s.

What makes it safe to run on a real repository:

- Probes run in detached worktrees under a cache folder (the executor's job); this module
  only reads the repository (``rev-parse``, ``rev-list``, ``show``). The user's working
  tree, index, HEAD, untracked files and stashes are never touched.
- Every verdict is cached by (commit, command, environment relevant to the probe,
  recorder version, steps, check, tolerance, reference) and appended (fsynced) to a
  session log before the search moves on; ``resume=True`` replays the log and continues.
  A Ctrl-C kills the running probes (the executor removes its worktrees) and leaves the
  log consistent: every line in it is a finished probe.
- Infrastructure failures (timeout, a probe killed from outside) are retried once, then
  skipped, never blamed; with ``repeat`` R every probe runs R times and disagreement is a
  skip with reason ``flaky``.

Verdicts, per ``check``: ``match`` — the commit's trace equals the GOOD commit's trace
under the tolerance (bitwise by default: both sides run on this machine); ``finite`` —
no NaN/Inf in N steps; ``repro`` — two runs at the commit agree. Terms other than
good/bad (``("old", "new")``) hunt a change in either direction: the behaviour of the
``good`` revision is "old", whatever the predicate says about it.
"""

from __future__ import annotations

from reprobisect.render.runs import render_result
from reprobisect.workflows.runs.driver import RunsSession, find_first_bad
from reprobisect.workflows.runs.prober import Judged, Prober
from reprobisect.workflows.runs.result import CommitSummary, RunsConfig, RunsResult
from reprobisect.workflows.runs.resume import session_path

__all__ = ["RunsConfig", "RunsResult", "CommitSummary", "RunsSession", "find_first_bad", "session_path",
           "Prober", "Judged", "render_result"]
