"""Driver for tests/integrations/test_lightning.py: one Lightning ``fit`` in a fresh interpreter.

``python _lightning_run.py '{"mode": ..., ...}'`` trains a tiny regression model for ``epochs``
epochs on ``AugItems`` through a ``seqloader.DataLoader`` and records every step of every rank
(``<out>.<rank>.jsonl``). Modes:

* ``ref``: uninterrupted, no checkpoints;
* ``crash``: ``ModelCheckpoint(every_n_train_steps=ckpt_every)`` into ``<ckpt_dir>/steps`` and a
  default ``ModelCheckpoint()`` (end of each epoch) into ``<ckpt_dir>/epochs``, then
  ``os._exit(CRASH_RC)`` at the start of the step after ``crash_at`` optimizer steps (every rank;
  rank 0 last);
* ``resume``: ``fit(ckpt_path=ckpt)`` in this fresh process;
* ``probe``: uninterrupted, with ``ModelCheckpoint(every_n_train_steps=capture_at)``; writes the
  loader state of the first checkpoint to ``<out>.state.json``.

``dataset`` is a key of ``_common.DATASETS`` (``map`` by default; the streams are not shuffled).

``build`` says where the loader comes from: ``hook_top`` (``train_dataloader()``, with
``from seqloader import DataLoader`` before ``fit()``), ``hook_inside`` (``seqloader`` first
imported inside ``train_dataloader()``) or ``fit`` (built before and passed to ``fit()``).
Under DDP (``devices: 2``) Lightning's own launcher starts rank 1 by running this script again.
"""

from __future__ import annotations

import json
import os
import sys

CFG: dict = {}  # the run's configuration (argv[1]); nothing runs on import (pytest collects this file)


def make_loader(num_workers: int):
    import torch

    import _common

    if CFG["build"] == "hook_inside":
        import seqloader  # first import of seqloader in this process, inside Lightning's hook
        cls = seqloader.DataLoader
    else:
        cls = CFG["top_class"]
    dataset = _common.DATASETS[CFG.get("dataset", "map")]()
    return cls(dataset, batch_size=_common.BATCH, shuffle=not isinstance(dataset, torch.utils.data.IterableDataset),
               num_workers=num_workers, seed=CFG.get("seed", 1234))


def crash(trainer) -> None:
    """Die like a killed job: no teardown. Rank 0 (which started rank 1) exits last."""
    import torch

    import _common

    if trainer.world_size > 1:
        torch.distributed.barrier()
        if trainer.global_rank == 0:
            for proc in getattr(trainer.strategy.launcher, "procs", []):
                proc.wait(timeout=60)
    os._exit(_common.CRASH_RC)


def main() -> None:
    CFG.update(json.loads(sys.argv[1]))
    if CFG["build"] != "hook_inside":
        from seqloader import DataLoader  # the class exists before Lightning's hooks run
        CFG["top_class"] = DataLoader
    import torch
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint

    import _common

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = _common.make_model()
            self.recorder = None

        def train_dataloader(self):
            return make_loader(CFG["num_workers"])

        def on_train_start(self):
            self.recorder = _common.Recorder(f"{CFG['out']}.{self.global_rank}.jsonl")

        def on_train_batch_start(self, batch, batch_idx):
            if CFG["mode"] == "crash" and self.trainer.global_step == CFG["crash_at"]:
                crash(self.trainer)

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.mse_loss(self.net(batch["x"]), batch["labels"])
            self.recorder.write(_common.step_record(batch, loss, step=self.trainer.global_step,
                                                    epoch=self.current_epoch))
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    pl.seed_everything(0, verbose=False)
    callbacks = []
    if CFG["mode"] == "probe":
        callbacks.append(ModelCheckpoint(dirpath=CFG["ckpt_dir"], filename="{step}", save_top_k=-1,
                                         every_n_train_steps=CFG["capture_at"]))
    if CFG["mode"] == "crash":  # <ckpt_dir>/steps/step=N.ckpt every N steps, <ckpt_dir>/epochs/ per epoch
        callbacks.append(ModelCheckpoint(dirpath=os.path.join(CFG["ckpt_dir"], "steps"), filename="{step}",
                                         save_top_k=-1, every_n_train_steps=CFG["ckpt_every"]))
        callbacks.append(ModelCheckpoint(dirpath=os.path.join(CFG["ckpt_dir"], "epochs"), filename="{step}",
                                         save_top_k=-1))  # ModelCheckpoint's default: each epoch's end
    trainer = pl.Trainer(accelerator="cpu", devices=CFG["devices"],
                         strategy="ddp" if CFG["devices"] > 1 else "auto",
                         use_distributed_sampler=CFG.get("use_distributed_sampler", True),
                         max_epochs=CFG["epochs"], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=CFG["mode"] in ("crash", "probe"),
                         callbacks=callbacks, num_sanity_val_steps=0)
    module = Module()
    loader = make_loader(CFG["num_workers"]) if CFG["build"] == "fit" else None
    trainer.fit(module, train_dataloaders=loader,
                ckpt_path=CFG["ckpt"] if CFG["mode"] == "resume" else None)
    module.recorder.close()
    if CFG["mode"] == "probe":  # the loader state in the checkpoint ModelCheckpoint wrote
        ckpt = torch.load(os.path.join(CFG["ckpt_dir"], f"step={CFG['capture_at']}.ckpt"), weights_only=False)
        with open(f"{CFG['out']}.state.json", "w", encoding="utf-8") as f:
            json.dump(ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"][0], f)
    if trainer.global_rank == 0:
        for proc in getattr(trainer.strategy.launcher, "procs", []) or []:
            proc.wait(timeout=60)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the native teardown (gloo's threads can abort it after the work is done)


if __name__ == "__main__":
    main()
