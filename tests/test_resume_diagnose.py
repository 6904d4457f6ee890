"""``reprobisect.workflows.resume.diagnose`` on hand-made traces (no process, no framework):
the rules that are hard to plant in a script — a stale checkpoint, an epoch restart that looks
like an off-by-one, Lightning's per-step scalars, a sentinel trace's loss."""

from __future__ import annotations

from pathlib import Path

from reprobisect.trace.format import Manifest, Record, Step
from reprobisect.trace.reader import Trace
from reprobisect.workflows.resume import align, diagnose
from reprobisect.workflows.resume.diagnose import bookkeeping_notes

EPOCH = [[0, 1], [2, 3], [4, 5]]  # batch IDs of an epoch of 3 steps


def _rec(kind: str, name: str, fp: str) -> Record:
    return Record(name=name, kind=kind, dtype="float32", shape=(2,), fingerprint=fp)


def _step(k: int, ids: list, lr: float, w: str, *, init: str | None = None, loss: str = "l", extra: dict | None = None,
          records: tuple = ()) -> Step:
    recs = ((_rec("init", "w", init),) if init else ()) + records + (_rec("loss", "loss", loss), _rec("param", "w", w))
    return Step(step=k, records=recs, batch_ids=ids, scalars={"lr": [lr], **(extra or {})})


def _trace(steps: list[Step], detail: str = "full") -> Trace:
    return Trace(path=Path("t"), manifest=Manifest(status="complete", command=[], environment={},
                                                   policy={"detail": detail}), steps=steps)


def _full(n: int = 6) -> Trace:
    """The uninterrupted run: two epochs, the lr halves every step, params w0, w1, ..."""
    return _trace([_step(k, EPOCH[k % 3], 0.5 ** k, f"w{k}", init="w-init" if k == 0 else None) for k in range(n)])


def _resumed(at: int, ids: list, lrs: list, start: str, params: list[str], **kw) -> Trace:
    return _trace([_step(j, ids[j], lrs[j], params[j], init=start if j == 0 else None, **kw) for j in range(len(ids))])


def test_a_continuation_equal_to_the_uninterrupted_run_has_no_finding():
    a = _full()
    c = _resumed(4, [EPOCH[1], EPOCH[2]], [0.5 ** 4, 0.5 ** 5], "w3", ["w4", "w5"])
    assert diagnose(a, c, 4) is None


def test_a_checkpoint_of_another_step_is_named_stale():
    a = _full()
    c = _resumed(4, [EPOCH[2], EPOCH[0]], [0.5 ** 5, 0.5 ** 6], "w4", ["w5x", "w6x"])
    f = diagnose(a, c, 4)
    assert f.component == "checkpoint" and "after step 4, not after step 3" in f.what


def test_an_epoch_restart_is_data_order_even_when_it_looks_one_step_off():
    a = _full()
    # resumed after step 3 (1 batch into epoch 1) but the epoch starts over: ids of step 3, 4 at steps 4, 5
    c = _resumed(4, [EPOCH[0], EPOCH[1]], [0.5 ** 4, 0.5 ** 5], "w3", ["x4", "x5"])
    f = diagnose(a, c, 4)
    assert f.component == "data order" and "restarted at the start of the epoch" in f.what and f.step == 4


def test_an_off_by_one_step_counter():
    a = _full(7)
    c = _resumed(3, [EPOCH[1], EPOCH[2]], [0.5 ** 3, 0.5 ** 4], "w2", ["x3", "x4"])  # ids of steps 4, 5
    f = diagnose(a, c, 3)
    assert f.component == "step counter" and "one step later" in f.what


def test_lightning_loop_progress_and_callback_state_alone_are_notes_not_a_divergence():
    """After a correct resume at an epoch's last batch Lightning's epoch_progress counters differ
    while every tensor agrees: bookkeeping is said beside the verdict (bookkeeping_notes), with
    the counters named, never as the verdict; the global step is a counter that is a verdict."""
    def lit(k: int, loops: str = "L", cb: str = "C", started: int = 2, step_off: int = 0) -> dict:
        return {"lightning": {"global_step": k + step_off, "epoch": k // 3, "batch_idx": k % 3, "loops": f"{loops}{k}",
                              "progress": {"epoch_progress.total.started": started, "batch_progress.total.ready": k},
                              "callbacks": {"ModelCheckpoint": f"{cb}{k}"}}}

    a = _trace([_step(k, EPOCH[k % 3], 1.0, f"w{k}", init="w-init" if k == 0 else None, extra=lit(k)) for k in range(6)])

    def resumed(**kw) -> object:
        return _trace([_step(j, EPOCH[(4 + j) % 3], 1.0, f"w{4 + j}", init="w3" if j == 0 else None,
                             extra=lit(4 + j, **kw)) for j in range(2)])

    c = resumed(loops="X", started=1)
    assert diagnose(a, c, 4) is None
    notes = bookkeeping_notes(a, c, 4)
    assert len(notes) == 1 and "loop progress differs from step 4" in notes[0]
    assert "epoch_progress.total.started 2 vs 1" in notes[0] and "batch_progress" not in notes[0]
    c = resumed(cb="X")
    assert diagnose(a, c, 4) is None and "'ModelCheckpoint'" in bookkeeping_notes(a, c, 4)[0]
    assert bookkeeping_notes(a, a, 0) == ()
    f = diagnose(a, resumed(step_off=1), 4)
    assert f is not None and f.component == "step counter" and f.step == 4


def test_sentinel_loss_differing_with_the_same_batch_and_params_is_rng():
    a = _trace([_step(k, EPOCH[k % 3], 1.0, f"w{k}", init="w-init" if k == 0 else None) for k in range(4)], "sentinel")
    c = _trace([_step(0, EPOCH[2], 1.0, "x2", init="w1", loss="other"), _step(1, EPOCH[0], 1.0, "x3")], "sentinel")
    f = diagnose(a, c, 2)
    assert f.component == "RNG" and "loss" in f.what


def test_a_forward_output_differing_with_equal_inputs_is_rng_and_momentum_is_optimizer_state():
    a = _trace([_step(k, EPOCH[k % 3], 1.0, f"w{k}", init="w-init" if k == 0 else None,
                      records=(Record("drop", "activation", "float32", (2,), "d", inputs=("in",)),
                               _rec("grad", "w", "g"), _rec("optim_state", "w/momentum_buffer", f"m{k}")))
                for k in range(4)])
    rng = _trace([_step(0, EPOCH[2], 1.0, "x", init="w1",
                        records=(Record("drop", "activation", "float32", (2,), "other", inputs=("in",)),))])
    assert diagnose(a, rng, 2).component == "RNG"
    opt = _trace([_step(0, EPOCH[2], 1.0, "x", init="w1",
                        records=(Record("drop", "activation", "float32", (2,), "d", inputs=("in",)),
                                 _rec("grad", "w", "g"), _rec("optim_state", "w/momentum_buffer", "fresh")))])
    f = diagnose(a, opt, 2)
    assert f.component == "optimizer state" and "momentum_buffer" in f.what


def test_batches_drawn_and_discarded_to_reach_the_data_position_are_left_out():
    """A resume that skips to its position by drawing the epoch's consumed batches and throwing them
    away: the recorder puts them into the first step; they are A's steps 3, 4 exactly, so dropped."""
    a = _full()
    c = _trace([_step(0, EPOCH[0] + EPOCH[1] + EPOCH[2], 0.5 ** 5, "w5", init="w4",
                      records=(_rec("batch", "ids", "i0"), _rec("batch", "ids#1", "i1"), _rec("batch", "ids#2", "i2"))),
                _step(1, EPOCH[0], 0.5 ** 6, "w6")])
    al = align(a, c, 5)
    assert al.start == 5 and al.trace.step(0).batch_ids == EPOCH[2] and "discarded 2 batch(es)" in al.notes[0]
    assert [r.name for r in al.trace.step(0).records if r.kind == "batch"] == ["ids"]
    # extra batches that are not the ones already trained on stay a data-order difference
    bad = _trace([_step(0, EPOCH[0] + EPOCH[2], 0.5 ** 5, "w5", init="w4",
                        records=(_rec("batch", "ids", "i0"), _rec("batch", "ids#1", "i1")))])
    assert align(a, bad, 5).trace is bad and diagnose(a, bad, 5).component == "data order"


def test_a_resume_from_an_older_checkpoint_that_redoes_steps_is_compared_from_there():
    """Checkpoints every 2 steps, interrupted after step 4: the last save is after step 3; a resume
    that continues from it (data and lr of step 4) is aligned there, not called a stale checkpoint."""
    a = _full(8)
    ids = [EPOCH[k % 3] for k in range(4, 7)]
    c = _resumed(5, ids, [0.5 ** k for k in range(4, 7)], "w3", ["w4", "w5", "w6"])
    al = align(a, c, 5)
    assert al.start == 4 and "after step 3" in al.notes[0] and "redid step 4" in al.notes[0]
    assert diagnose(a, c, 5) is None
    # from there, a later difference is still found, at its own step
    c = _resumed(5, ids, [0.5 ** 4, 0.5 ** 5, 1.0], "w3", ["w4", "w5", "x6"])
    f = diagnose(a, c, 5)
    assert f.step == 6 and f.component == "learning rate / scheduler"


def test_a_checkpoint_saved_before_the_update_is_one_step_behind_its_counter():
    """Params after step 2 but the data of step 4 (the counter says 4 steps are done): saved before
    optimizer.step(); not realigned (the data is not step 3's)."""
    a = _full(7)
    c = _resumed(4, [EPOCH[1], EPOCH[2]], [0.5 ** 4, 0.5 ** 5], "w2", ["x4", "x5"])
    assert align(a, c, 4).start == 4
    f = diagnose(a, c, 4)
    assert f.component == "checkpoint" and "one update behind" in f.what and "optimizer.step()" in f.why


def test_a_model_input_replaying_an_earlier_step_without_a_dataloader_is_data_order():
    """Batches sampled by hand (torch.randint, nanoGPT's get_batch): no batch record, so no IDs; the
    model's input equal to an earlier step's input means the data went back, not a dropout draw."""
    def inp(k):
        return (_rec("input", "input[0]", f"x{k}"),)

    a = _trace([_step(k, None, 1.0, f"w{k}", init="w-init" if k == 0 else None, records=inp(k)) for k in range(6)])
    c = _trace([_step(0, None, 1.0, "y4", init="w3", records=inp(0)), _step(1, None, 1.0, "y5", records=inp(1))])
    f = diagnose(a, c, 4)
    assert f.component == "data order" and "input at step 0" in f.what
    c = _trace([_step(0, None, 1.0, "y4", init="w3", records=(_rec("input", "input[0]", "new"),))])
    assert diagnose(a, c, 4).component == "RNG"


def test_an_older_checkpoint_without_batch_ids_or_a_changing_lr_is_realigned_when_bitwise_from_there():
    """Constant lr, no DataLoader: nothing tells the data's position, but every record of the resumed
    run equal to the uninterrupted run's from the step after the checkpoint is a correct resume."""
    a = _trace([_step(k, None, 1.0, f"w{k}", init="w-init" if k == 0 else None, records=(_rec("input", "input", f"x{k}"),))
                for k in range(8)])

    def resumed(first: int) -> Trace:
        return _trace([_step(j, None, 1.0, f"w{first + j}", init="w3" if j == 0 else None,
                             records=(_rec("input", "input", f"x{first + j}"),)) for j in range(3)])

    assert align(a, resumed(4), 5).start == 4 and diagnose(a, resumed(4), 5) is None
    f = diagnose(a, resumed(5), 5)  # params after step 3, data of step 5: not a continuation
    assert f is not None and f.component == "checkpoint" and f.step == 5


def test_a_skip_one_batch_too_far_is_still_named_the_step_counter():
    """The resume draws and discards the consumed batches but one too many: after the discarded ones
    are left out, its batches are the uninterrupted run's one step later (an off-by-one)."""
    a = _trace([_step(k, [2 * k, 2 * k + 1], 1.0, f"w{k}", init="w-init" if k == 0 else None) for k in range(8)])

    def resumed(skip: int) -> Trace:
        first = [i for k in range(skip + 1) for i in (2 * k, 2 * k + 1)]
        recs = tuple(_rec("batch", "ids" if k == 0 else f"ids#{k}", f"i{k}") for k in range(skip + 1))
        return _trace([_step(0, first, 1.0, "x", init="w2", records=recs),
                       _step(1, [2 * (skip + 1), 2 * (skip + 1) + 1], 1.0, "y")])

    al = align(a, resumed(3), 3)
    assert al.trace.step(0).batch_ids == [6, 7] and "discarded 3 batch(es) (those of steps 0..2)" in al.notes[0]
    f = diagnose(a, resumed(4), 3)
    assert f.component == "step counter" and "one step later" in f.what, f
    assert "those of steps 0..3" in align(a, resumed(4), 3).notes[0]
