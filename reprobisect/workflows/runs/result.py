"""What ``bisect runs`` is asked (``RunsConfig``) and what it answers (``RunsResult``): data.

The answer's text and JSON are ``reprobisect.render.runs``'s; ``str()`` and ``to_json()``
hand over to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from reprobisect.core.checks import check_number
from reprobisect.core.options import ProbeOptions
from reprobisect.render.runs import commit_json, render_result, result_json

__all__ = ["RunsConfig", "RunsResult", "CommitSummary", "DEFAULT_TERMS"]

DEFAULT_TERMS = ("good", "bad")


@dataclass(frozen=True, kw_only=True)
class RunsConfig:
    """What ``bisect runs`` searches and how."""

    good: str
    """A revision whose training behaves the old/expected way (``--good``)."""
    bad: str
    """A revision whose training changed (``--bad``); must descend from ``good``."""
    command: tuple[str, ...]
    """The user's training command, unmodified (``python train.py --lr 3e-4``)."""
    repo: str | None = None
    """Any folder inside the repository; None: ``cwd``."""
    cwd: str | None = None
    """The folder the user ran bisect from; the command runs from the same relative folder
    inside each worktree. None: the current directory."""
    check: str = "match"
    """'match' (trace equals the good commit's), 'repro' (two runs agree) or 'finite'."""
    options: ProbeOptions = field(default_factory=ProbeOptions)
    """Shared probe options: steps, jobs, timeout, tolerance, executor, quiet, out, keep."""
    first_parent: bool = False
    """Follow only the first parent of merges (``git rev-list --first-parent``)."""
    repeat: int = 1
    """Run each probe this many times and require agreement (flaky commands)."""
    resume: bool = False
    """Continue the interrupted session with the same arguments from its log."""
    terms: tuple[str, str] = DEFAULT_TERMS
    """Names for the behaviour before/after the change (``old,new`` hunts a fix too)."""
    retries: int = 1
    """Re-runs of a probe that timed out or was killed from outside, before it is skipped."""
    recheck: bool = True
    """Re-run the culprit and its parent (uncached) before answering."""
    cache_dir: str | None = None
    """Cache + session folder; None: ``<common git dir>/reprobisect``."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for every probe."""
    lock_timeout: float = 0.0
    """Seconds to wait for another session on the same repository to finish (``--lock-timeout``);
    0: refuse at once, naming the session that holds the lock."""

    def __post_init__(self) -> None:
        # NaN/inf would wait forever for the lock and a negative wait means nothing: refuse
        # them here too, for callers of the library that bypass the command line's check
        check_number("--lock-timeout", self.lock_timeout, minimum=0, unit=" seconds")


@dataclass(frozen=True)
class CommitSummary:
    """A commit as the answer shows it."""

    hash: str
    subject: str = ""
    author: str = ""
    date: str = ""
    diffstat: str = ""

    @property
    def short(self) -> str:
        return self.hash[:10]

    def __str__(self) -> str:
        return f"{self.short} {self.subject}".strip()

    def to_json(self) -> dict[str, Any]:
        return commit_json(self)


@dataclass(frozen=True)
class RunsResult:
    """The answer of ``bisect runs``; truthy when it names one first bad commit and the
    re-check of that commit and its parent agreed with the search."""

    first_bad: CommitSummary | None
    """The first commit with the new behaviour; None when ambiguous or not found."""
    last_good: CommitSummary | None
    """The newest commit known to have the old behaviour."""
    candidates: tuple[CommitSummary, ...]
    """Every commit the answer could be ("could be any of"), oldest first; one when exact."""
    skipped: tuple[tuple[str, str], ...]
    """(commit, reason) for every commit that could not be tested."""
    divergence: dict[str, Any] | None
    """The first divergence inside the culprit against the last good commit
    (step, kind, name, module, verdict, magnitude), when both traces could be compared."""
    divergence_text: str
    """The same, as a line of text (or why there is none)."""
    reason: str
    """Why the culprit probed bad (the verdict's reason)."""
    check: str
    terms: tuple[str, str]
    command: tuple[str, ...]
    range_size: int
    """Commits in the searched range (good excluded)."""
    probes: int
    """Commits judged by the search (endpoints and re-checks not included)."""
    runs: int
    """Probe processes started in this session (retries, repeats, endpoints, re-checks)."""
    cached: int
    """Verdicts taken from the cache or the resumed log instead of a new probe."""
    rounds: int
    wall_s: float
    recheck: str
    """'agreed', 'disagreed: ...' or 'skipped'."""
    session_log: str
    resumed: bool = False
    good_rev: str = ""
    """``--good`` as the user typed it (``v1.2``, ``HEAD~5``); the hash is ``range_good``."""
    bad_rev: str = ""
    """``--bad`` as the user typed it (``HEAD``); the hash is ``range_bad``."""
    range_good: str = ""
    range_bad: str = ""
    replayed: int = 0
    """Search verdicts replayed from the session log (``--resume``); counted in ``probes``."""

    @property
    def inconclusive(self) -> str | None:
        """Why a culprit the search pointed at is not named (its re-check disagreed), or None."""
        if self.first_bad is not None and self.recheck.startswith("disagreed"):
            return self.recheck.split(":", 1)[1].strip()
        return None

    def __bool__(self) -> bool:
        return self.first_bad is not None and not self.recheck.startswith("disagreed")

    def __str__(self) -> str:
        return render_result(self)

    def to_json(self) -> dict[str, Any]:
        return result_json(self)
