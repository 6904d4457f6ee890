"""The "noam" learning-rate factor: linear warmup, then inverse-square-root decay."""


def noam_factor(step, warmup_steps, d_model):
    """d_model^-0.5 * min(s * warmup^-1.5, s^-0.5) for the 1-based step s."""
    s = step + 1
    return d_model ** -0.5 * min(s * warmup_steps ** -1.5, s ** -0.5)
