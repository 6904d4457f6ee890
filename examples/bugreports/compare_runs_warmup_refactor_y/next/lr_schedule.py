"""The "noam" learning-rate factor, with the warmup and the decay as separate pieces."""


def warmup_factor(step, warmup_steps, kind="exp"):
    """How far up the warmup is at `step`: linear, or exponential from 1 % of the peak."""
    progress = min(1.0, (step + 1) / warmup_steps)
    if kind == "linear":
        return progress
    return 0.01 ** (1.0 - progress)


def rsqrt_decay(step, warmup_steps):
    """Inverse-square-root decay after the warmup, 1.0 at its end."""
    return (max(step + 1, warmup_steps) / warmup_steps) ** -0.5


def noam_factor(step, warmup_steps, d_model):
    """Peak d_model^-0.5 * warmup^-0.5, reached through the warmup and then decayed."""
    peak = d_model ** -0.5 * warmup_steps ** -0.5
    if step + 1 < warmup_steps:
        return peak * warmup_factor(step, warmup_steps)
    return peak * rsqrt_decay(step, warmup_steps)
