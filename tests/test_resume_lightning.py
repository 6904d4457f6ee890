"""``bisect resume`` on a Lightning ``trainer.fit(ckpt_path=...)`` resume (ModelCheckpoint every
step): bitwise at an epoch boundary; mid-epoch, Lightning restarts a plain DataLoader at the
epoch's start, which is named as the data order (from batch IDs alone, with or without the
Lightning recorder's per-step scalars)."""

from __future__ import annotations

import pytest

pytest.importorskip("lightning")

from pathlib import Path  # noqa: E402

from reprobisect.core.options import ProbeOptions  # noqa: E402
from reprobisect.workflows.resume import check_resume  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "resume" / "lightning_train.py"


@pytest.mark.slow
@pytest.mark.parametrize("at, verdict, component", [(3, "bitwise", None), (4, "diverged", "data order")])
def test_lightning_ckpt_path_resume(tmp_path, at, verdict, component):
    r = check_resume(["python", str(SCRIPT), "--total", "6"], ["--resume", "ckpts/last.ckpt"], at=at,
                     options=ProbeOptions(steps=6, quiet=True), cwd=tmp_path)
    assert r.verdict == verdict, (r.reason, r.finding, r.runs)
    assert (r.finding.component if r.finding else None) == component
    if verdict == "bitwise":  # Lightning's epoch_progress counters after a restore at the epoch's end: a note
        assert "loop progress differs" in r.reason and "epoch_progress" in r.reason, r.reason
    if component:
        assert r.finding.step == 4 and "restarted at the start of the epoch" in r.finding.what
    assert [s.steps for s in r.runs] == [6, at, 6 - at]
