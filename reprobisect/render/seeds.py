"""How ``bisect seeds`` reads: the seed-sensitivity map as text and as ``--json``.

Reads a ``SeedMap`` (``reprobisect.workflows.seeds``) by its attributes.
"""

from __future__ import annotations

from typing import Any

from reprobisect.render.repro import escalation_json, escalation_lines, probe_result_json
from reprobisect.render.safe import printable_lines

__all__ = ["render_seed_map", "seed_map_json"]


def render_seed_map(m: Any) -> str:
    """Text for ``bisect seeds``: one line per component, the flags, the noise floor."""
    lines = [f"seed sensitivity over seeds {', '.join(m.seeds)}:"]
    w = max(len(c.component) for c in m.components)
    for c in m.components:
        lines.append(f"  {c.component:<{w}}  {c.status:<9}  {c.evidence}")
    fd = m.first_divergence
    if fd is not None and getattr(fd, "first", None) is not None:
        d = fd.first
        seen = f" (sentinel: {d.sentinel})" if getattr(d, "sentinel", None) else ""
        lines.append(f"first difference between seeds {m.seeds[0]} and {m.seeds[1]}: step {d.step}, {d.kind} '{d.name}'{seen}")
        lines += escalation_lines(getattr(m, "escalation", None))
    control = getattr(m, "control", None)
    if control is not None:
        lines.append(control.text)
    if m.flags:
        lines.append("flags:")
        lines += [f"  ! {f}" for f in m.flags]
    else:
        lines.append("no flags: every component behaves as expected with the seed")
    if m.noise_floor:
        lines.append("noise floor (std across seeds):")
        for s in m.noise_floor:
            ls, gs = s.loss_spread, s.grad_norm_spread
            lt = f"loss {ls['mean']:.6g} ± {ls['std']:.3g}" if ls else "loss n/a"
            gt = f"grad norm {gs['mean']:.6g} ± {gs['std']:.3g}" if gs else "grad norm n/a"
            lines.append(f"  step {s.step}: {lt}; {gt}")
    return printable_lines("\n".join(lines))


def seed_map_json(m: Any) -> dict[str, Any]:
    """What ``bisect seeds --json`` prints."""
    fd = m.first_divergence
    return {
        "seeds": list(m.seeds),
        "components": {c.component: c.to_json() for c in m.components},
        "flags": list(m.flags),
        "noise_floor": [s.to_json() for s in m.noise_floor] if m.noise_floor is not None else None,
        "first_divergence": fd.to_json() if hasattr(fd, "to_json") else None,
        "runs": [probe_result_json(r) for r in m.runs],
        "control": m.control.to_json() if getattr(m, "control", None) is not None else None,
        **escalation_json(getattr(m, "escalation", None)),
    }
