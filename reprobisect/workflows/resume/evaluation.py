"""The evaluation a resumed run did between its steps, compared with the uninterrupted run's.

Pure, like ``diagnose``: it reads the evaluation summaries both recorders write into a step's
``scalars["eval"]`` (forwards under ``no_grad``/``inference_mode``, Keras' ``evaluate``, a
Lightning validation: one entry per run of evaluation, with the fingerprints of its sample IDs
and of its outputs) and knows nothing of frameworks. Training records can agree bitwise while
an evaluation after the resume gives other outputs: what was evaluated is not the trained model
as the training records show it (an EMA/averaged copy of the weights, a teacher) and was not
restored, or was rebuilt after the load. That is a resume that does not continue the run, and
``diagnose`` names it ``evaluation`` when training itself agrees.

Only the evaluations both runs recorded at the same aligned step are compared: the uninterrupted
run's evaluation after step K-1 belongs to the interrupted run, and a resumed run that evaluates
before its first step compares with it only when it does.
"""

from __future__ import annotations

from typing import Any

from reprobisect.trace.reader import Trace

__all__ = ["evaluation_difference"]

_COUNTS = (("forwards", "forward pass(es)"), ("batches", "batch(es)"), ("samples", "sample(s)"))


def _entries(v: Any) -> list[dict[str, Any]]:
    return [e for e in v if isinstance(e, dict)] if isinstance(v, list) else []


def _differs(ea: dict[str, Any], ec: dict[str, Any]) -> str | None:
    """What differs between two evaluation entries of the same phase: 'ids', a count's key,
    'outputs'; None: they agree."""
    ia, ic = ea.get("ids_fingerprint"), ec.get("ids_fingerprint")
    if ia is not None and ic is not None and ia != ic:
        return "ids"
    for key, _ in _COUNTS:
        if ea.get(key) != ec.get(key):
            return key
    if ea.get("outputs_fingerprint") != ec.get("outputs_fingerprint"):
        return "outputs"
    return None


def _first(a: Trace, c: Trace, start: int) -> tuple[int, dict[str, Any], dict[str, Any], str, bool] | None:
    """(A's step the evaluation ran after, A's entry, C's entry, what differs, whether every
    evaluation compared from that step on differs too) at the first differing one; None: all agree."""
    found, differ, compared, before = None, 0, 0, 0
    for sc in c.steps:
        sa = a.step(start + sc.step)
        if sa is None:
            break
        ea, ec = _entries(sa.scalars.get("eval")), _entries(sc.scalars.get("eval"))
        if not ea or not ec or [e.get("phase") for e in ea] != [e.get("phase") for e in ec]:
            continue  # evaluated in one run only (or in other phases) at this step: not compared
        if found is None:
            before = compared  # the evaluations compared at earlier steps (they agreed)
        for xa, xc in zip(ea, ec):
            compared += 1
            what = _differs(xa, xc)
            if what is None:
                continue
            differ += 1
            if found is None:
                found = (sa.step - 1, xa, xc, what)
    return None if found is None else (*found, 1 < differ == compared - before)


def evaluation_difference(a: Trace, c: Trace, start: int) -> tuple[int, str, str] | None:
    """(step, what, why) for the first evaluation after which C's evaluation summary is not A's,
    when C's training steps (from A's step ``start``) agree bitwise with A's; None: every
    evaluation both runs recorded agrees (or none was recorded)."""
    first = _first(a, c, start)
    if first is None:
        return None
    after, ea, ec, what, all_later = first
    phase = ea.get("phase") or "evaluation"
    every = " (and every later one compared)" if all_later else ""
    lead = f"training continues bitwise, but the evaluation ({phase}) after step {after}{every}"
    if what == "ids":
        return (after, f"{lead} read other samples (their IDs' fingerprint differs)",
                "the evaluation's data order is not the uninterrupted run's: a shuffled or sampled evaluation loader "
                "draws from a generator (or sampler state) the resume did not restore; give the evaluation loader "
                "its own seeded generator or restore its state")
    if what != "outputs":
        label = dict(_COUNTS)[what]
        return (after, f"{lead} ran {ea.get(what)!r} vs {ec.get(what)!r} {label}",
                "the evaluation ran differently after the resume: is a counter or setting that decides what it runs "
                "(which batches, how many) not restored? check what the checkpoint holds for it")
    same = ea.get("ids_fingerprint") is not None and ea.get("ids_fingerprint") == ec.get("ids_fingerprint")
    what_text = f"{lead} gives other outputs" + (" on the same samples" if same else "")
    why = ("a module evaluated outside training — an EMA/averaged copy of the weights, a teacher — was not restored, "
           "or was rebuilt after the load (build it before loading the checkpoint, then load its state): the trained "
           "model, its optimizer and its data continue exactly")
    if ec.get("train_mode_layers") or ea.get("train_mode_layers"):
        why += "; or the dropout/batch-norm layers left in train() mode during this evaluation drew other numbers"
    if not same:
        why += ("; or the evaluation's inputs differ (nothing recorded says which samples it read: an evaluation set "
                "drawn from an RNG the resume did not restore would show the same)")
    return (after, what_text, why)

