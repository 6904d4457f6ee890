"""``modes``: evaluation in training mode, and training in evaluation mode.

``model.eval()`` selects the behaviour of dropout and batch norm; ``no_grad()`` only turns
gradients off. Neither implies the other, which gives the guide's two mistakes, both read
from one recorded run (the PyTorch recorder notes them; ``runners/torch.py``):

- an evaluation pass under ``no_grad``/``inference_mode`` whose model is still in training
  mode: dropout drops, batch norm normalises with the batch and updates its running
  statistics (``scalars.eval[*].train_mode_layers``);
- training in eval mode: ``model.eval()`` for an evaluation and no ``model.train()`` after
  it (the recorder sees forwards with gradients of a model in eval mode after it trained in
  train mode: an ``eval_mode`` evaluation run inside a step that has a loss and gradients
  but no training forward of the model, no ``output`` record), or a model whose dropout/batch-norm layers are in eval mode
  during its training forward (``scalars.eval_mode_layers``; intentional when batch-norm
  statistics are frozen for fine-tuning, never for dropout: ``scalars.eval_mode_dropout``
  names the dropout layers among them, and an evaluation before the first step, whose
  ``model.eval()`` was not undone, is named as the likely origin).
"""

from __future__ import annotations

from reprobisect.trace.format import Step
from reprobisect.trace.reader import Trace
from reprobisect.workflows.doctor.model import Finding

__all__ = ["check_modes"]


def _eval_in_train_mode(steps: list[Step]) -> list[Finding]:
    hits = [(s.step, e) for s in steps for e in (s.scalars.get("eval") or [])
            if isinstance(e, dict) and e.get("train_mode_layers")]
    if not hits:
        return []
    step, e = hits[0]
    after = e.get("after_step")
    when = f"after step {after}" if after is not None else "before the first step"
    ev = {"phase": e.get("phase"), "after_step": after, "layers_in_training_mode": e["train_mode_layers"],
          "forwards": e.get("forwards"), "evaluations_affected": len(hits)}
    return [Finding("modes", "warning",
                    f"the evaluation under {e.get('phase')} {when} runs with dropout/batch norm in training mode "
                    f"({', '.join(e['train_mode_layers'][:4])}): dropout drops units and batch norm uses the batch's "
                    "statistics and updates its running ones, so validation numbers are noisy and training changes",
                    ev, "call model.eval() before the evaluation (no_grad does not do it) and model.train() after it")]


def _trained_in_eval_mode(steps: list[Step]) -> list[Finding]:
    bad = []
    for s in steps:
        kinds = {r.kind for r in s.records}
        phases = [e for e in (s.scalars.get("eval") or []) if isinstance(e, dict) and e.get("phase") == "eval_mode"]
        if phases and kinds & {"loss", "grad"} and "output" not in kinds:  # no training forward of the model
            bad.append(s.step)
    if bad:
        prev = [s.step for s in steps if s.step < bad[0]]
        ev = {"steps_in_eval_mode": bad, "trained_in_train_mode_until": prev[-1] if prev else None}
        return [Finding("modes", "warning",
                        f"from step {bad[0]} on the model trains in eval mode: model.eval() was called (for an "
                        "evaluation) and model.train() not after it, so dropout is off and batch norm stops "
                        "adapting for the rest of training", ev,
                        "call model.train() after every evaluation, before the next training batch")]
    layered = [s for s in steps if s.scalars.get("eval_mode_layers")]
    if layered:
        first = layered[0]
        names, drop = first.scalars["eval_mode_layers"], list(first.scalars.get("eval_mode_dropout") or [])
        ev = {"step": first.step, "layers_in_eval_mode": names, "steps": [s.step for s in layered]}
        before = [e for e in (steps[0].scalars.get("eval") or []) if isinstance(e, dict) and e.get("after_step") is None]
        why = ""
        if before and first.step == steps[0].step:
            ev["evaluation_before_training"] = before[0].get("phase")
            why = (" after an evaluation before the first step (under "
                   f"{before[0].get('phase')}): model.eval() for it was not undone with model.train()")
        if drop:
            ev["dropout_in_eval_mode"] = drop
            return [Finding("modes", "warning",
                            f"the model trains in eval mode from step {first.step}{why}: its dropout layer(s) "
                            f"({', '.join(drop[:4])}) drop nothing during training"
                            + (" and batch norm stops adapting" if len(drop) < len(names) else ""),
                            ev, "call model.train() before the training loop and after every evaluation")]
        return [Finding("modes", "warning",
                        f"the model trains with {len(names)} batch-norm layer(s) in eval mode from step {first.step}"
                        f"{why} ({', '.join(names[:4])}): intentional only when batch-norm statistics are frozen on "
                        "purpose", ev, "call model.train() before training (and re-freeze only the layers meant to be "
                        "frozen)")]
    return []


def check_modes(trace: Trace) -> list[Finding]:
    """The ``modes`` findings of one recorded run, or one ``info``."""
    steps = list(trace.steps)
    found = _eval_in_train_mode(steps) + _trained_in_eval_mode(steps)
    if found:
        return found
    evals = sum(len(s.scalars.get("eval") or []) for s in steps)
    what = (f"{evals} evaluation run(s) in eval mode" if evals else
            "no evaluation ran in the steps recorded (only training mode checked)")
    return [Finding("modes", "info", f"train/eval modes consistent: training in train mode, {what}",
                    {"steps": len(steps), "evaluations": evals}, "")]
