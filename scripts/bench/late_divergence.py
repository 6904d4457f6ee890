"""Planted late divergences: does ``bisect runs --detail sentinel`` name what ``--detail full`` names?

    python scripts/bench/late_divergence.py [--steps 200] [--cases lr_milestone,branch,overflow]
                                            [--full search|pair] [--json]

Each case is a tiny training script (an MLP of 8 -> 16 -> 1 on a 4-sample-per-batch
DataLoader, ``--steps`` steps) in a 4-commit git history: good, good (a notes change), the
culprit, culprit (a notes change). The culprit makes the runs first differ around step 150
of 200, never before:

``lr_milestone``  a ``MultiStepLR`` milestone moved from step 1000 to step 150 (the
                  scheduler's counter is in the captured state, so a replay sees it);
``branch``        a data-dependent branch: the batch holding sample 600 (step 150) is
                  scaled by 1.001 inside one module;
``overflow``      a value that overflows late: a buffer grown by 1.075 per forward is cast
                  to float16 on its way into the output (inf, then NaN, at step 153).

For each case ``bisect runs --detail sentinel`` (state every 50 steps) searches the history;
its escalation replays the culprit and its parent from the last state before the first
difference with full detail. The full-detail answer is either a ``bisect runs --detail
full`` search of the same history (``--full search``, the default: its wall time is the
one to compare) or two full captures of the culprit pair compared (``--full pair``: what
the test does, cheaper). Printed per case: the escalated and the full answer (step · kind
· name), whether they are equal, and the wall times.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TEMPLATE = '''\
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
STEPS = {steps}
xs = torch.randn(STEPS * 4, 8, generator=torch.Generator().manual_seed(1))
ys = torch.randn(STEPS * 4, 1, generator=torch.Generator().manual_seed(2))
loader = DataLoader(TensorDataset(torch.arange(STEPS * 4), xs, ys), batch_size=4, shuffle=False)


class Gate(torch.nn.Module):
    flag = False

    def __init__(self):
        super().__init__()
        self.register_buffer("g", torch.ones(()))

    def forward(self, h):
        self.g.mul_(1.075)
{gate}


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.gate = Gate()
        self.fc2 = torch.nn.Linear(16, 1)

    def forward(self, x):
        return self.fc2(self.gate(torch.tanh(self.fc1(x))))


model = Net()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[{milestone}], gamma=0.1)
for ids, x, y in loader:
    model.gate.flag = bool((ids == 600).any())
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    sched.step()
'''

_PLAIN = "        return h + self.g * 0"
CASES: dict[str, dict[str, str]] = {
    # (good, culprit) substitutions
    "lr_milestone": {"good": dict(gate=_PLAIN, milestone="1000"), "bad": dict(gate=_PLAIN, milestone="150")},
    "branch": {"good": dict(gate=_PLAIN, milestone="1000"),
               "bad": dict(gate="        return h * 1.001 if self.flag else h + self.g * 0", milestone="1000")},
    "overflow": {"good": dict(gate=_PLAIN, milestone="1000"),
                 "bad": dict(gate="        return h + (self.g.half() * 0).float()", milestone="1000")},
}


def source(case: str, side: str, steps: int = 200) -> str:
    """The training script of ``case`` at its good or culprit (``bad``) commit."""
    return TEMPLATE.format(steps=steps, **CASES[case][side])


def build_history(repo: Path, case: str, steps: int = 200) -> list[str]:
    """A 4-commit history (good, good, culprit, culprit) of ``case`` in ``repo``; its hashes."""
    repo.mkdir(parents=True)

    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    commits = []
    for i, side in enumerate(["good", "good", "bad", "bad"]):
        (repo / "train.py").write_text(source(case, side, steps))
        (repo / "notes.txt").write_text(f"{i}\n")
        git("add", "-A")
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", f"c{i} {side}")
        commits.append(git("rev-parse", "HEAD"))
    return commits


def search(repo: Path, commits: list[str], cache: Path, steps: int, **opts: Any):
    """``bisect runs`` over the whole history (a ``RunsResult``)."""
    from reprobisect.core.options import ProbeOptions
    from reprobisect.workflows.runs import RunsConfig, find_first_bad

    cfg = RunsConfig(cwd=str(repo), good=commits[0], bad=commits[-1], command=("python", "train.py"),
                     cache_dir=str(cache), options=ProbeOptions(steps=steps, jobs=2, quiet=True, **opts))
    return find_first_bad(cfg)


def full_pair(case: str, work: Path, steps: int):
    """Two full-detail captures (good, culprit) compared bitwise: a ``Comparison``."""
    from reprobisect.core.compare import compare_paths
    from reprobisect.workflows.capture import CaptureConfig, capture

    traces = []
    for side in ("good", "bad"):
        d = work / f"full-{side}"
        d.mkdir(parents=True)
        (d / "train.py").write_text(source(case, side, steps))
        r = capture(["python", "train.py"], d / "trace", CaptureConfig(steps=steps, quiet=True), cwd=d)
        if not r:
            raise RuntimeError(f"{case}: the full capture of the {side} side ended {r.outcome}")
        traces.append(d / "trace")
    return compare_paths(traces[0], traces[1], allow_incomplete=True)


@dataclass
class CaseResult:
    case: str
    culprit_found: bool
    escalated: tuple | None
    full: tuple | None
    reason: str
    sentinel_s: float
    full_s: float

    @property
    def equal(self) -> bool:
        return self.escalated is not None and self.escalated == self.full

    def to_json(self) -> dict[str, Any]:
        return {"case": self.case, "culprit_found": self.culprit_found, "escalated": self.escalated,
                "full": self.full, "equal": self.equal, "reason": self.reason,
                "sentinel_s": round(self.sentinel_s, 2), "full_s": round(self.full_s, 2)}


def _place(first: dict | None) -> tuple | None:
    return None if not first else (first["step"], first["kind"], first["name"])


def run_case(case: str, work: Path, steps: int = 200, full: str = "pair") -> CaseResult:
    """Search ``case``'s history with sentinels, then get the full-detail answer (``full``)."""
    commits = build_history(work / "repo", case, steps)
    t0 = time.perf_counter()
    sent = search(work / "repo", commits, work / "cache-sentinel", steps, detail="sentinel")
    sentinel_s = time.perf_counter() - t0
    found = sent.first_bad is not None and sent.first_bad.hash == commits[2]
    esc = (sent.divergence or {}).get("escalation") or {}
    escalated = _place((esc.get("comparison") or {}).get("first")) if esc.get("conclusive") else None
    t0 = time.perf_counter()
    if full == "search":
        res = search(work / "repo", commits, work / "cache-full", steps)
        want = _place((res.divergence or {}).get("first"))
    else:
        comp = full_pair(case, work, steps)
        want = None if comp.first is None else (comp.first.step, comp.first.kind, comp.first.name)
    full_s = time.perf_counter() - t0
    return CaseResult(case, found, escalated, want, esc.get("reason", "no escalation"), sentinel_s, full_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--full", choices=("search", "pair"), default="search")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="late-divergence-") as tmp:
        for case in a.cases.split(","):
            r = run_case(case, Path(tmp) / case, a.steps, a.full)
            results.append(r)
            if not a.json:
                print(f"{case}: culprit {'found' if r.culprit_found else 'MISSED'}; escalated {r.escalated} "
                      f"{'==' if r.equal else '!='} full {r.full}; sentinel search {r.sentinel_s:.1f} s, "
                      f"full {a.full} {r.full_s:.1f} s\n    {r.reason}", flush=True)
    if a.json:
        print(json.dumps({"steps": a.steps, "full": a.full, "cases": [r.to_json() for r in results]}, indent=2))
    return 0 if all(r.equal and r.culprit_found for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
