"""The transformers ``Trainer`` with ``SeqloaderCallback`` resumes exactly, and its epoch count agrees.

Real ``Trainer`` runs in fresh interpreters (``_transformers_run.py``, CPU): an uninterrupted
run, a run that checkpoints every few steps and dies with ``os._exit`` mid-epoch, and fresh runs
that ``train(resume_from_checkpoint=...)`` from a checkpoint right after epoch 0's last step, in
epoch 1, and (with gradient accumulation) in epoch 1 again. Every resumed optimizer step (sample indices, augmentation bytes drawn
from torch's global RNG, loss) and the Trainer's ``state.epoch`` must equal the uninterrupted run's.
"""

from __future__ import annotations

import json

import pytest

from tests.integrations import _common

pytest.importorskip("transformers")

from seqloader.integrations.transformers import SeqloaderCallback  # noqa: E402

SCRIPT = "_transformers_run.py"


def _run(tmp_path, expect_rc=0, **config):
    config = {"epochs": 2, "num_workers": 0, "dir": str(tmp_path / "out"), **config,
              "out": str(tmp_path / config["out"])}
    return _common.run_script(SCRIPT, config, tmp_path, expect_rc=expect_rc)


def _check(tmp_path, out, reference, first_step):
    resumed = _common.read_records(tmp_path / f"{out}.0.jsonl")
    assert resumed[0]["step"] == first_step
    _common.assert_same_steps(resumed, reference, what=out)
    ref_epochs = {r["step"]: r["epoch"] for r in reference}
    assert [r["epoch"] for r in resumed] == [ref_epochs[r["step"]] for r in resumed], (
        f"{out}: the Trainer's state.epoch differs from the uninterrupted run's")


@pytest.mark.timeout(300)
def test_trainer_resumes_exactly_from_checkpoints_at_epoch_0s_end_and_in_epoch_1(tmp_path):
    _run(tmp_path, mode="ref", out="ref", dir=str(tmp_path / "ref_out"))
    # 25 optimizer steps per epoch; checkpoint-N every 5 steps; killed when step 34 begins
    _run(tmp_path, mode="crash", out="crash", crash_at=33, ckpt_every=5, num_workers=2,
         expect_rc=_common.CRASH_RC)
    reference = _common.read_records(tmp_path / "ref.0.jsonl")
    _common.assert_same_steps(_common.read_records(tmp_path / "crash.0.jsonl"), reference[:33],
                              what="the run that crashed")
    state = json.loads((tmp_path / "out" / "checkpoint-30" / "trainer_state.json").read_text())
    saved = state["stateful_callbacks"]["SeqloaderCallback"]["attributes"]["loader_state"]
    assert (saved["epoch"], saved["position"]) == (1, 5 * _common.BATCH)
    for step, workers in ((25, 0), (30, 2)):
        _run(tmp_path, mode="resume", out=f"resumed{step}", num_workers=workers,
             ckpt=str(tmp_path / "out" / f"checkpoint-{step}"))
        _check(tmp_path, f"resumed{step}", reference, step + 1)


@pytest.mark.timeout(240)
def test_trainer_with_gradient_accumulation_resumes_exactly(tmp_path):
    # 25 batches per epoch, 5 per optimizer step: 5 steps per epoch; checkpoint-6 is in epoch 1
    common = {"accum": 5, "ckpt_every": 3}
    _run(tmp_path, mode="ref", out="ref", dir=str(tmp_path / "ref_out"), **common)
    _run(tmp_path, mode="crash", out="crash", crash_at=7, expect_rc=_common.CRASH_RC, **common)
    reference = _common.read_records(tmp_path / "ref.0.jsonl")
    assert len(reference) == 10
    _run(tmp_path, mode="resume", out="resumed", ckpt=str(tmp_path / "out" / "checkpoint-6"), **common)
    _check(tmp_path, "resumed", reference, 7)


class _Args:
    """The ``TrainingArguments`` fields the callback reads."""

    def __init__(self, ignore_data_skip=True, gradient_accumulation_steps=1):
        self.ignore_data_skip = ignore_data_skip
        self.gradient_accumulation_steps = gradient_accumulation_steps


class _State:
    def __init__(self, global_step=0, stateful_callbacks=None):
        self.global_step = global_step
        self.stateful_callbacks = stateful_callbacks or {}
        self.epoch = 0.0


def _loader(n=40, **kw):
    import seqloader

    return seqloader.DataLoader(list(range(n)), batch_size=4, shuffle=True, seed=0, **kw)


def test_the_callback_refuses_set_ups_that_would_not_resume_exactly():
    cb = SeqloaderCallback()
    import torch

    with pytest.raises(TypeError, match="override Trainer.get_train_dataloader"):
        cb.on_train_begin(_Args(), _State(), None, train_dataloader=torch.utils.data.DataLoader(range(4)))
    with pytest.raises(ValueError, match="ignore_data_skip=True"):
        cb.on_train_begin(_Args(ignore_data_skip=False), _State(), None, train_dataloader=_loader())
    with pytest.raises(ValueError, match="gradient_accumulation_steps=3 does not divide the 10 batches"):
        cb.on_train_begin(_Args(gradient_accumulation_steps=3), _State(), None, train_dataloader=_loader())
    with pytest.raises(ValueError, match="has no seqloader state"):
        cb.on_train_begin(_Args(), _State(global_step=4), None, train_dataloader=_loader())


def test_the_callback_checks_the_loaders_epoch_against_the_trainers():
    loader = _loader()
    it = iter(loader)
    next(it)
    saved = {"SeqloaderCallback": {"args": {}, "attributes": {"loader_state": loader.state_dict()}}}
    cb = SeqloaderCallback()
    # the loader state is in epoch 0, after 1 batch; a Trainer at global step 11 is in epoch 1
    with pytest.raises(ValueError, match="is in epoch 0 but the Trainer resumes global step 11 in epoch 1"):
        cb.on_train_begin(_Args(), _State(11, saved), None, train_dataloader=_loader())
    cb.on_train_begin(_Args(), _State(1, saved), None, train_dataloader=(resumed := _loader()))
    assert resumed.state_dict()["position"] == 4
    assert cb.state()["attributes"]["loader_state"] == resumed.state_dict()


def test_without_transformers_the_import_error_names_the_extra(monkeypatch):
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, "transformers.trainer_callback", None)
    monkeypatch.delitem(sys.modules, "seqloader.integrations.transformers")
    with pytest.raises(ImportError, match=r"pip install seqloader\[transformers\]"):
        importlib.import_module("seqloader.integrations.transformers")
