"""``torch.distributed.checkpoint`` (DCP) saves and loads a ``seqloader.DataLoader`` exactly.

DCP treats any object with ``state_dict``/``load_state_dict`` as ``Stateful``:
``dcp.save({"model": ..., "loader": loader})`` stores the loader's state and ``dcp.load`` hands it
back to ``loader.load_state_dict``. A training loop (a tiny model, ``AugItems`` whose items draw an
augmentation from torch's global RNG) stops after a few steps once it has saved, and a fresh
process (or a fresh gloo world) loads the checkpoint and finishes two epochs; every step's sample
indices, augmentation bytes and loss must equal an uninterrupted run's. Checked with 1 process (no
process group), with 2 gloo ranks, and with a checkpoint of 2 ranks loaded by 1 (an elastic
resume: the samples are the 1-rank run's from the saved position on, each read exactly once).
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing

import pytest
import torch

import seqloader
from seqloader.testing import run_distributed
from tests.integrations import _common

dcp = pytest.importorskip("torch.distributed.checkpoint")

EPOCHS = 2


def _train(rank: int, world_size: int, ckpt: str, *, num_workers: int = 0, save_at: int | None = None,
           stop_at: int | None = None, load: str | None = None) -> list[dict]:
    """Train ``EPOCHS`` epochs (from the loaded state, if any); return one record per step.

    ``load``: ``"all"`` loads the model and the loader from ``ckpt``, ``"loader"`` only the
    loader (another world size: the model's steps differ). ``save_at``: ``dcp.save`` after that
    many steps; ``stop_at``: return before that step, like a run that was stopped.
    """
    torch.manual_seed(0)
    net = _common.make_model()
    model = torch.nn.parallel.DistributedDataParallel(net) if world_size > 1 else net
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = seqloader.DataLoader(_common.AugItems(), batch_size=_common.BATCH, shuffle=True,
                                  num_workers=num_workers, seed=1234)
    step = 0
    if load is not None:
        app = {"loader": loader, "progress": {"step": torch.tensor(0)}}
        if load == "all":
            app["model"] = net.state_dict()
        dcp.load(app, checkpoint_id=ckpt)
        if load == "all":
            net.load_state_dict(app["model"])
            step = int(app["progress"]["step"])
    records = []
    for epoch in range(loader.state_dict()["epoch"], EPOCHS):
        for batch in loader:
            if step == stop_at:
                return records
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["labels"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            records.append(_common.step_record(batch, loss, step=step, epoch=epoch))
            step += 1
            if step == save_at:
                dcp.save({"model": net.state_dict(), "loader": loader,
                          "progress": {"step": torch.tensor(step)}}, checkpoint_id=ckpt)
    return records


def _tasks(rank: int, world_size: int, tasks: list) -> list:
    """Run several ``_train`` calls in one world, in order (a fresh model and loader each)."""
    return [_train(rank, world_size, **kw) for kw in tasks]


def _in_fresh_process(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in a fresh ``spawn`` interpreter (no process group)."""
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(fn, *args, **kwargs).result(timeout=110)


def test_one_process_resumes_exactly_from_dcp(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    reference = _train(0, 1, ckpt)
    saved = _train(0, 1, ckpt, save_at=30, stop_at=33, num_workers=2)  # epoch 1, batch 5
    _common.assert_same_steps(saved, reference[:33], what="the run that saved")
    resumed = _in_fresh_process(_train, 0, 1, ckpt, load="all", num_workers=0)
    assert resumed[0]["step"] == 30 and resumed[0]["epoch"] == 1
    _common.assert_same_steps(resumed, reference)


@pytest.mark.timeout(240)
def test_two_ranks_resume_exactly_and_one_rank_resumes_their_checkpoint(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    # (num_workers=0 in the worlds: workers under distributed are tests/integrations/test_distributed.py's)
    # 13 steps per epoch and rank; save in epoch 1 after 5 of its steps (global position 80)
    reference, saved = zip(*run_distributed(_tasks, 2, ([{"ckpt": ckpt}, {"ckpt": ckpt, "save_at": 18,
                                                          "stop_at": 20}],),
                                            workdir=tmp_path, timeout=100))
    resumed = run_distributed(_tasks, 2, ([{"ckpt": ckpt, "load": "all"}],),
                              workdir=tmp_path, timeout=100)
    for rank in range(2):
        _common.assert_same_steps(saved[rank], reference[rank][:20], what=f"rank {rank} that saved")
        assert resumed[rank][0][0]["step"] == 18
        _common.assert_same_steps(resumed[rank][0], reference[rank], what=f"resumed rank {rank}")

    # the same checkpoint, loaded by a world of 1: it reads the rest of epoch 1's global order
    (alone,) = run_distributed(_tasks, 1, ([{"ckpt": ckpt, "load": "loader"}],), workdir=tmp_path,
                               timeout=100)
    one_rank = _train(0, 1, ckpt)  # an uninterrupted 1-process run: batch b is positions 8b..8b+7
    rest_of_epoch_1 = [r for r in one_rank if r["epoch"] == 1][80 // _common.BATCH:]
    assert [(r["index"], r["aug"]) for r in alone[0]] == [(r["index"], r["aug"]) for r in rest_of_epoch_1]
    before = [i for rank in range(2) for r in saved[rank][:18] if r["epoch"] == 1 for i in r["index"]]
    after = [i for r in alone[0] for i in r["index"]]
    assert sorted(before + after) == list(range(_common.N))  # epoch 1: every sample exactly once
