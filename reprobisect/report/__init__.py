"""Reports people read: one self-contained HTML page per comparison, ``runs`` session or audit.

``html``     ``write_report(source, out_path)``: the page, written atomically
``sources``  what a report can be pointed at, and the ``Page`` each one makes
``stages``   per-step, per-stage and per-module relative differences of two traces
``plots``    matplotlib figures as inline SVG (imported lazily)
``page``     the page as data

matplotlib is imported only when a page is drawn; nothing here imports an ML framework.
"""

from __future__ import annotations

from reprobisect.report.html import render_page, write_report
from reprobisect.report.sources import ACCEPTED, load_page

__all__ = ["ACCEPTED", "load_page", "render_page", "write_report"]
