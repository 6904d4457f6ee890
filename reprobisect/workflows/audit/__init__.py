"""The library behind ``bisect audit``: nightly determinism checks with goldens and history.

``config``   reading and checking the audit config (``load_audit_config``)
``golden``   golden traces, their noise band, and DVC versioning of them
``history``  the SQLite history beside the config
``run``      ``run_audit``: every check, in four tiers, one night appended to the history
``reports``  the JUnit file and atomic writes of the reports
"""

from __future__ import annotations

from reprobisect.workflows.audit.config import AuditConfig, CheckSpec, load_audit_config, parse_audit_config
from reprobisect.workflows.audit.run import TIERS, AuditResult, CheckResult, Culprit, run_audit

__all__ = ["AuditConfig", "CheckSpec", "load_audit_config", "parse_audit_config", "TIERS", "AuditResult",
           "CheckResult", "Culprit", "run_audit"]
