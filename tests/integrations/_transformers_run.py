"""Driver for tests/integrations/test_transformers.py: a transformers ``Trainer`` run in a fresh interpreter.

``python _transformers_run.py '{"mode": ..., ...}'`` trains a tiny regression model (a plain
``nn.Module`` returning ``{"loss": ...}``) for ``epochs`` epochs on ``AugItems`` through a
``seqloader.DataLoader`` returned by ``get_train_dataloader``, with ``SeqloaderCallback``, and
records every optimizer step (``<out>.0.jsonl``: indices, augmentation bytes, loss, and the
Trainer's ``state.epoch``). Modes: ``ref`` (uninterrupted), ``crash`` (checkpoints every
``ckpt_every`` steps, then ``os._exit(CRASH_RC)`` when step ``crash_at + 1`` begins), ``resume``
(``train(resume_from_checkpoint=ckpt)``). ``accum`` sets ``gradient_accumulation_steps``.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:  # nothing runs on import (pytest collects this file)
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    import _common
    import seqloader
    from seqloader.integrations.transformers import SeqloaderCallback

    CFG = json.loads(sys.argv[1])

    class Regression(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = _common.make_model()
            self.seen: list = []

        def forward(self, x, labels, index, aug):
            loss = torch.nn.functional.mse_loss(self.net(x), labels)
            self.seen.append({"index": index, "aug": aug, "loss": loss})
            return {"loss": loss}

    class Record(TrainerCallback):
        """One line per optimizer step: the micro-batches since the last step, and ``state.epoch``."""

        def __init__(self, model):
            self.model = model
            self.recorder = _common.Recorder(f"{CFG['out']}.0.jsonl")

        def on_step_begin(self, args, state, control, **kwargs):
            if CFG["mode"] == "crash" and state.global_step == CFG["crash_at"]:
                os._exit(_common.CRASH_RC)

        def on_step_end(self, args, state, control, **kwargs):
            seen, self.model.seen[:] = list(self.model.seen), []
            merged = {"index": torch.cat([s["index"] for s in seen]), "aug": torch.cat([s["aug"] for s in seen])}
            loss = sum(float(s["loss"]) for s in seen)
            self.recorder.write(_common.step_record(merged, loss, step=state.global_step, epoch=state.epoch))

    class SeqloaderTrainer(Trainer):
        def __init__(self, *args, train_loader, **kwargs):
            super().__init__(*args, **kwargs)
            self.train_loader = train_loader

        def get_train_dataloader(self):
            return self.train_loader

    loader = seqloader.DataLoader(_common.AugItems(), batch_size=_common.BATCH, shuffle=True,
                                  num_workers=CFG["num_workers"], seed=1234)
    model = Regression()
    args = TrainingArguments(
        output_dir=CFG["dir"], num_train_epochs=CFG["epochs"], learning_rate=0.05, optim="sgd",
        lr_scheduler_type="constant", weight_decay=0.0, gradient_accumulation_steps=CFG.get("accum", 1),
        save_strategy="steps" if CFG["mode"] == "crash" else "no", save_steps=CFG.get("ckpt_every", 10),
        logging_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, seed=0,
        ignore_data_skip=True)
    trainer = SeqloaderTrainer(model=model, args=args, train_loader=loader,
                               callbacks=[SeqloaderCallback(), Record(model)])
    trainer.train(resume_from_checkpoint=CFG["ckpt"] if CFG["mode"] == "resume" else None)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
