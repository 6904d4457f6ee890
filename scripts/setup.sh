#!/usr/bin/env bash
# Create .venv (when absent) and install reprobisect with every extra, pinned by
# constraints/dev.txt. Idempotent: a second run with nothing changed returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${REPROBISECT_VENV:-.venv}
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
# headless chromium renders the HTML reports in tests (tests/test_report_browser.py);
# installed only when missing, only as root with apt-get, else one note line
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
      || echo "note: apt-get install chromium failed; the browser tests of the HTML report will skip" >&2
  else
    echo "note: chromium is not installed (needs root and apt-get); the browser tests of the HTML report will skip" >&2
  fi
fi
want=$(cat pyproject.toml constraints/dev.txt | sha256sum | cut -c1-16)
stamp="$VENV/.reprobisect-installed"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/bisect" ]; then
  exit 0
fi
echo "setting up $VENV (first time: ~2 minutes)..." >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
log="$VENV/install.log"
pip_() { "$VENV/bin/pip" install --disable-pip-version-check "$@" >>"$log" 2>&1 || { grep -v '^WARNING: Location' "$log" | tail -30 >&2; echo "error: pip install $* failed; full log in $log" >&2; exit 1; }; }
: >"$log"
pip_ -U pip
# torch first, alone and exact: on a machine that has the CPU wheel on local disk pip
# takes it; asking for a bare 'torch' could pull a multi-GB CUDA build instead.
pip_ "torch==2.13.0"
# .[devcpu] is .[all,dev] with tensorflow-cpu in place of tensorflow (same stack, no
# CUDA libraries, half the download).
pip_ -c constraints/dev.txt -e ".[devcpu]"
# the native fingerprint kernel, built once for this machine's CPU (optional: without a
# C++ compiler recording uses framework ops, same fingerprints, slower)
"$VENV/bin/python" -m reprobisect.native >>"$log" 2>&1 || echo "note: native fingerprint kernel not built (see $log); recording will be slower" >&2
echo "$want" >"$stamp"
