"""Driver for tests/integrations/test_accelerate.py: an accelerate training loop in a fresh interpreter.

``python [-m torch.distributed.run --nproc_per_node=2] _accelerate_run.py '{"mode": ..., ...}'``
trains a tiny regression model for ``epochs`` epochs on ``AugItems`` through
``seqloader.integrations.accelerate.prepare_loader`` and records every step of every process
(``<out>.<rank>.jsonl``). Modes: ``ref`` (uninterrupted), ``crash`` (``accelerator.save_state``
every ``ckpt_every`` steps, then ``os._exit(CRASH_RC)`` before step ``crash_at``), ``resume``
(``accelerator.load_state(ckpt)`` in this fresh process, then the same loop).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> None:  # nothing runs on import (pytest collects this file)
    import torch
    from accelerate import Accelerator

    import _common
    import seqloader
    from seqloader.integrations.accelerate import prepare_loader

    CFG = json.loads(sys.argv[1])
    accelerator = Accelerator(cpu=True)
    model = _common.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)
    loader = seqloader.DataLoader(_common.AugItems(), batch_size=_common.BATCH, shuffle=True,
                                  num_workers=CFG["num_workers"], seed=1234)
    train = prepare_loader(accelerator, loader)
    step = 0
    if CFG["mode"] == "resume":
        accelerator.load_state(CFG["ckpt"])
        step = int(Path(CFG["ckpt"]).name.split("_")[1])
    recorder = _common.Recorder(f"{CFG['out']}.{accelerator.process_index}.jsonl")
    for epoch in range(train.state_dict()["epoch"], CFG["epochs"]):
        for batch in train:
            if CFG["mode"] == "crash" and step == CFG["crash_at"]:
                accelerator.wait_for_everyone()
                os._exit(_common.CRASH_RC)
            assert batch["x"].device.type == accelerator.device.type
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["labels"])
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            recorder.write(_common.step_record(batch, loss, step=step, epoch=epoch))
            step += 1
            if CFG["mode"] == "crash" and step % CFG["ckpt_every"] == 0:
                accelerator.save_state(os.path.join(CFG["ckpt_dir"], f"step_{step}"))
    recorder.close()
    accelerator.wait_for_everyone()
    accelerator.end_training()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the native teardown (gloo's threads can abort it after the work is done)


if __name__ == "__main__":
    main()
