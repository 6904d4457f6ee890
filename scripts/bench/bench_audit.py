"""The audit's own overhead beyond its probes, for a 10-check config (target <= 2 s).

Two figures in one run. ``breakdown``: three real noisy runs are recorded (not counted),
the golden of each of 10 checks is calibrated from two of them, then everything
``bisect audit`` does around probes is timed: checking the config, judging the third run
against each golden (the noise band path: the runs differ), the history transaction and
read-back, the JSON document and the JUnit file. ``end_to_end`` (unless ``--no-e2e``): a
real ``run_audit`` of the same 10 golden checks, its wall time minus the time spent inside
the probes (each ``submit`` to ``result``); the night's one executor start counts as overhead. ``--json`` prints data.

    PYTHONPATH=. python scripts/bench/bench_audit.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from reprobisect.render.audit import audit_json  # noqa: E402
from reprobisect.workflows.audit import golden as goldens, history as hist, load_audit_config  # noqa: E402
from reprobisect.workflows.audit.reports import write_json, write_junit  # noqa: E402
from reprobisect.workflows.audit.run import AuditResult, CheckResult  # noqa: E402

CHECKS = 10


def _end_to_end(cfg) -> dict:
    """A real run_audit of ``cfg``; its wall time minus the time inside the probes."""
    from reprobisect.core.options import ProbeOptions
    from reprobisect.workflows.audit import run as audit_run

    inside = [0.0]
    real = audit_run._probe

    def timed(*a, **kw):
        t = time.perf_counter()
        try:
            return real(*a, **kw)
        finally:
            inside[0] += time.perf_counter() - t

    audit_run._probe = timed
    try:
        t0 = time.perf_counter()
        res = audit_run.run_audit(cfg, ProbeOptions(quiet=True))
        doc = audit_json(res)
        write_json(doc, cfg.folder / "audit-e2e.json")
        write_junit(doc, cfg.folder / "audit-e2e.xml")
        wall = time.perf_counter() - t0
    finally:
        audit_run._probe = real
    return {"wall_s": round(wall, 3), "probes_s": round(inside[0], 3), "overhead_s": round(wall - inside[0], 3),
            "ratio_to_target": round((wall - inside[0]) / 2.0, 3), "verdicts": sorted({c.verdict for c in res.checks})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-e2e", action="store_true", help="skip the end-to-end run (10 real probes)")
    args = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="bench-audit-"))
    try:
        shutil.copy(ROOT / "examples" / "audit" / "train.py", d / "train.py")
        traces = []
        env = {**os.environ, "AUDIT_NOISE": "1e-6"}
        for i in range(3):
            t = d / f"run{i}"
            subprocess.run([sys.executable, "-m", "reprobisect", "capture", "-q", "-o", str(t), "--steps", "2",
                            "--full-steps", "0,1,2", "--", "python", "train.py", "--steps", "4"], cwd=d, check=True,
                           capture_output=True, env=env)
            traces.append(str(t))
        lines = ["name: bench", "steps: 2", "command: python train.py --steps 4", "checks:"]
        lines += [f"  - {{name: c{i}, check: golden, golden: goldens/g{i}, env: {{AUDIT_NOISE: '1e-6'}}}}"
                  for i in range(CHECKS)]
        (d / "a.yaml").write_text("\n".join(lines) + "\n")
        for i in range(CHECKS):
            goldens.save_golden(d / "goldens" / f"g{i}", traces[:2])
        t0 = time.perf_counter()
        cfg = load_audit_config(d / "a.yaml")
        t_cfg = time.perf_counter()
        results = []
        for s in cfg.checks:
            tier, comp, band = goldens.judge(s.golden, traces[2])
            results.append(CheckResult(name=s.name, check=s.check, command=s.command, wall_s=0.0, verdict=tier, line=tier))
        t_judge = time.perf_counter()
        started = "2026-12-01T02:00:00+00:00"
        hist.record_night(cfg.history_path, str(cfg.path), started,
                          [hist.Night(started, r.name, r.check, None, r.verdict, r.line, 0.0) for r in results])
        past = hist.nights(cfg.history_path, str(cfg.path))
        t_hist = time.perf_counter()
        res = AuditResult(config=str(cfg.path), name=cfg.name, started=started, wall_s=0.0, checks=tuple(results),
                          history=tuple(past))
        doc = audit_json(res)
        write_json(doc, d / "audit.json")
        write_junit(doc, d / "audit.xml")
        t_end = time.perf_counter()
        fig = {"checks": CHECKS, "overhead_s": round(t_end - t0, 4), "config_s": round(t_cfg - t0, 4),
               "judge_s": round(t_judge - t_cfg, 4), "history_s": round(t_hist - t_judge, 4),
               "reports_s": round(t_end - t_hist, 4), "target_s": 2.0, "ratio_to_target": round((t_end - t0) / 2.0, 3),
               "verdicts": sorted({r.verdict for r in results})}
        if not args.no_e2e:
            fig["end_to_end"] = _end_to_end(cfg)
        e2e = fig.get("end_to_end")
        print(json.dumps(fig) if args.json else
              f"audit overhead for {CHECKS} checks: {fig['overhead_s']:.3f}s around the probes"
              + (f"; end to end {e2e['overhead_s']:.3f}s of {e2e['wall_s']:.1f}s" if e2e else "")
              + " (target 2 s)")
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
