"""Where in the chain a difference was introduced (``Divergence.localization``).

Layer-wise localization uses the fingerprints of each module's inputs that the recorder
keeps with its activation: the first activation whose inputs agree on both sides and
whose output does not is the *origin*; one whose inputs already differed is
*propagation*; if the first differing activation's inputs already differ and nothing
recorded before it diverged, the change happened between modules (in the parent's
forward code, outside any hooked module). A ``collective`` output whose input agrees on
its rank is an *arrival*: the difference came through the collective from another rank.
"""

from __future__ import annotations

from reprobisect.trace.format import Record, Step

__all__: list[str] = []


def _is_ancestor(parent: str, child: str) -> bool:
    base = parent.split("#", 1)[0]
    return base == "" or child.startswith(base + ".")


def _arrived(name: str, sa: Step, sb: Step) -> bool:
    """A collective's output (``NAME/out``) whose input (``NAME/in``) agrees bit for bit on both sides."""
    if not name.endswith("/out"):
        return False
    key = ("collective", name[: -len("/out")] + "/in")
    ia, ib = sa.by_key().get(key), sb.by_key().get(key)
    return ia is not None and ib is not None and ia.fingerprint == ib.fingerprint


def _localize(ra: Record, rb: Record, earlier: bool, diverged_modules: list[str]) -> str:
    if ra.kind != "activation":
        return "propagation" if earlier else "first"
    if ra.inputs is None or rb.inputs is None:
        return "propagation" if earlier else "unknown"
    if tuple(ra.inputs) == tuple(rb.inputs):
        if any(_is_ancestor(ra.name, m) for m in diverged_modules):
            return "propagation"  # a container whose submodule already diverged
        return "origin"
    return "propagation" if earlier else "between_modules"
