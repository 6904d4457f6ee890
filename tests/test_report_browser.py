"""The report pages rendered by a real browser: Debian's ``chromium``, headless.

``--dump-dom`` gives the DOM after parsing and layout (the verdict is there, the plots are
``<svg>`` elements, not text that failed to parse), ``--screenshot`` a PNG of the page.
Without ``chromium`` on PATH these tests skip and say so; ``scripts/setup.sh`` installs it
where it can (root with apt-get), so CI has it (``CI`` set: a missing browser fails).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from reprobisect.report import write_report

from test_report import audit_doc, build, ENV

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None and os.environ.get("CI"):
    raise RuntimeError("chromium is not installed on this CI machine: run scripts/setup.sh as root (apt-get install chromium)")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/setup.sh installs it as root)")


def chromium(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    """Headless chromium with a profile folder of its own (nothing written to the home)."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
           f"--user-data-dir={tmp / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, "HOME": str(tmp)})


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("browser")
    build(root / "pair" / "a")
    build(root / "pair" / "b", diverge_at=5, env={**ENV, "env_vars": {"OMP_NUM_THREADS": "2"}})
    (root / "audit.json").write_text(json.dumps(audit_doc(root / "pair")))
    return {"comparison": write_report(root / "pair", root / "comparison.html"),
            "audit": write_report(root / "audit.json", root / "audit.html")}


@pytest.mark.parametrize("kind, verdict", [("comparison", "DIVERGED at step 5"),
                                           ("audit", "FAILED: 2 of 3 check(s) did not pass")])
def test_dom_shows_verdict_and_plots(pages, tmp_path, kind, verdict):
    r = chromium("--dump-dom", pages[kind].resolve().as_uri(), tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    dom = r.stdout
    assert "id=\"verdict\"" in dom and verdict in dom
    assert dom.count("<svg") >= 2, "the plots are parsed as SVG elements"
    assert "<parsererror" not in dom


def test_screenshot(pages, tmp_path):
    png = tmp_path / "page.png"
    r = chromium(f"--screenshot={png}", "--window-size=1280,1800", pages["comparison"].resolve().as_uri(), tmp=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1280, 1800)
    assert len(data) > 20_000, "a page with plots, not a blank screen"
