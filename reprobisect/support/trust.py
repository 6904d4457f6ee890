"""Did this machine (this user) record a trace? The check before re-running a trace's command.

``compare --zoom`` re-runs the interpreter, command, folder and environment variables a
trace's manifest records. A trace received from someone else is untrusted input, and
re-running its command is running their code. So the trace writer seals into the manifest
(``recorder.trust``) an HMAC-SHA256 of exactly what a re-run would execute (the command,
the interpreter, the working folder and the recorded environment variables), keyed by a
random secret kept per user in ``$REPROBISECT_CACHE_DIR/trust-key`` (default
``~/.cache/reprobisect/support/trust-key``, mode 0600, made on first use). A trace is *trusted*
when that HMAC verifies with this user's key.

Why an HMAC and not the bare identity: traces are shared, so anything they carry is public.
A bare host/user token copied from one shared trace would let its reader forge a trace
that passes; an HMAC of one command tells nothing about the HMAC of another. Editing any
re-run field of a trusted trace (the command, say) makes it untrusted. A trace recorded
by the same user on another machine that does not share the cache folder (a Ray worker,
a CI runner) is untrusted here: zoom then asks (or needs ``--trust-trace``).

Core module: imports no ML framework. Signing never fails a recording: without a
writable cache folder the trace is simply unsigned (untrusted).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import threading
from pathlib import Path
from typing import Any, Mapping

from reprobisect.support.cachedir import user_cache_dir

__all__ = ["key_path", "rerun_fields", "sign", "verify", "is_trusted", "TRUST_FIELD"]

TRUST_FIELD = "trust"
"""Key of the signature in the manifest's ``recorder`` mapping."""
_VERSION = 1


def key_path() -> Path:
    """Where this user's secret lives (``$REPROBISECT_CACHE_DIR`` or ``~/.cache/reprobisect``)."""
    return user_cache_dir() / "trust-key"


def _key(create: bool) -> bytes | None:
    path = key_path()
    try:
        data = path.read_bytes().strip()
        if len(data) >= 32:
            return data
    except OSError:
        pass
    if not create:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}-{threading.get_ident()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_hex(32).encode())
        try:  # first writer wins: two recorders starting at once must agree on the key
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
        data = path.read_bytes().strip()
        return data if len(data) >= 32 else None
    except OSError:
        return None


def rerun_fields(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """What a re-run of the trace would execute, from its manifest's JSON form."""
    env = manifest.get("environment") or {}
    env = env if isinstance(env, Mapping) else {}
    py = env.get("python") if isinstance(env.get("python"), Mapping) else {}
    rec = manifest.get("recorder") or {}
    rec = rec if isinstance(rec, Mapping) else {}
    env_vars = env.get("env_vars")
    return {
        "command": list(manifest.get("command") or []),
        "python": (py or {}).get("executable"),
        "cwd": rec.get("cwd"),
        "env_vars": dict(env_vars) if isinstance(env_vars, Mapping) else None,
    }


def _mac(key: bytes, manifest: Mapping[str, Any]) -> str:
    msg = json.dumps({"v": _VERSION, **rerun_fields(manifest)}, sort_keys=True, separators=(",", ":"), default=str)
    return hmac.new(key, msg.encode(), hashlib.sha256).hexdigest()


def sign(manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    """The signature to store as ``recorder['trust']`` for this manifest (None: no key available)."""
    key = _key(create=True)
    if key is None:
        return None
    return {"v": _VERSION, "hmac": _mac(key, manifest)}


def verify(manifest: Mapping[str, Any]) -> bool:
    """True when the manifest's signature was made with this user's key over its re-run fields."""
    rec = manifest.get("recorder") or {}
    sig = rec.get(TRUST_FIELD) if isinstance(rec, Mapping) else None
    if not isinstance(sig, Mapping) or sig.get("v") != _VERSION or not isinstance(sig.get("hmac"), str):
        return False
    key = _key(create=False)
    if key is None:
        return False
    return hmac.compare_digest(sig["hmac"], _mac(key, manifest))


def is_trusted(trace: Any) -> bool:
    """``verify`` for a read ``Trace`` (or a manifest mapping)."""
    if isinstance(trace, Mapping):
        return verify(trace)
    m = getattr(trace, "manifest", trace)
    return verify(m.to_json() if hasattr(m, "to_json") else {})
