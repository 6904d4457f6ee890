"""``bisect resume``: does the user's own checkpoint/resume continue a run bitwise?

``run`` drives the three runs (uninterrupted, interrupted like a preemption, resumed);
``diagnose`` compares the resumed run with the uninterrupted one and names the state
component a checkpoint forgot. ``docs/resume.md`` documents the semantics.
"""

from reprobisect.workflows.resume.diagnose import COMPONENTS, Alignment, Finding, align, diagnose
from reprobisect.workflows.resume.run import (Reference, ResumeResult, RunSummary, check_resume, judge_resumed,
                                              record_reference, split_resume_args)

__all__ = ["COMPONENTS", "Alignment", "Finding", "align", "Reference", "ResumeResult", "RunSummary", "check_resume", "diagnose",
           "judge_resumed", "record_reference", "split_resume_args"]
