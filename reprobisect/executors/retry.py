"""The one retry rule: a probe that ended ``timeout`` or ``infra`` (``Outcome.retryable``) runs again.

Such an ending came from outside the code (a timeout, a signal, a lost worker), so it
says nothing about the point being probed; a second attempt usually does. Each attempt
has ``spec.attempt`` + 1, so its trace never shares a folder with the failed one. The
last result is returned, still retryable when every attempt failed (its verdict: skip).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from reprobisect.core.probe import ProbeResult, ProbeSpec
from reprobisect.executors.base import Executor

__all__ = ["retry", "run_with_retry"]


def retry(executor: Executor, result: ProbeResult, retries: int = 1, *,
          before_each: Callable[[], None] | None = None) -> ProbeResult:
    """``result`` itself, or the last of up to ``retries`` new attempts while it ends retryable.

    For callers that submitted several probes at once and retry the failed ones after.
    ``before_each`` runs before every new attempt (count it, or raise to stop).
    """
    n = 0
    while result.outcome.retryable and n < retries:
        n += 1
        if before_each is not None:
            before_each()
        result = executor.submit(replace(result.spec, attempt=result.spec.attempt + 1)).result()
    return result


def run_with_retry(executor: Executor, spec: ProbeSpec, retries: int = 1, *,
                   before_each: Callable[[], None] | None = None) -> ProbeResult:
    """Run ``spec`` on ``executor``, then ``retry`` it up to ``retries`` times.

    ``before_each`` runs before every attempt, the first included.
    """
    if before_each is not None:
        before_each()
    return retry(executor, executor.submit(spec).result(), retries, before_each=before_each)
