"""DistributedDataParallel on a laptop CPU, fed by seqloader.DataLoader, with elastic resume.

Run (from the repository root, after ``pip install -e .``)::

    torchrun --standalone --nproc_per_node=2 examples/ddp_train.py

Interrupt a run in the middle of epoch 1 and resume it with a different number of processes::

    torchrun --standalone --nproc_per_node=2 examples/ddp_train.py --checkpoint /tmp/ckpt.pt --stop-after 40
    torchrun --standalone --nproc_per_node=3 examples/ddp_train.py --checkpoint /tmp/ckpt.pt

Every rank builds the same loader without a sampler: seqloader shards the epoch's global order
(rank ``r`` reads positions ``r, r + world_size, ...``) and ``seed=None`` is drawn on rank 0 and
broadcast. The loader's ``state_dict()`` is the same on every rank and holds no topology, so
rank 0 saves it and any number of processes can load it.
"""

from __future__ import annotations

import argparse
import gc
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import seqloader

TRUE_W = torch.tensor([1.0, -2.0, 0.5, 3.0, 0.0, 1.5, -1.0, 2.0])


class Synthetic(torch.utils.data.Dataset):
    """Item ``i``: ``(x, y)`` with ``y = x @ TRUE_W + noise``, a pure function of ``i``."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(8, generator=g)
        return x, x @ TRUE_W + 0.1 * torch.randn((), generator=g)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--checkpoint", default=None, help="saved after every epoch; resumed from if present")
    parser.add_argument("--stop-after", type=int, default=0, help="save and exit after this many steps")
    args = parser.parse_args()

    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world_size = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.02)
    loader = seqloader.DataLoader(Synthetic(args.samples), batch_size=args.batch_size, shuffle=True,
                                  num_workers=args.num_workers)  # seed=None: rank 0's draw, broadcast

    if args.checkpoint and os.path.exists(args.checkpoint):
        ckpt = torch.load(args.checkpoint, weights_only=True)
        model.module.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optim"])
        loader.load_state_dict(ckpt["loader"])  # saved with any world size
        if rank == 0:
            sd = ckpt["loader"]
            print(f"resumed epoch {sd['epoch']} at sample {sd['position']} of its global order "
                  f"(saved with world_size={sd['saved_with']['world_size']}, now {world_size})")

    def save() -> None:
        if args.checkpoint and rank == 0:  # the loader state is identical on every rank
            torch.save({"model": model.module.state_dict(), "optim": opt.state_dict(),
                        "loader": loader.state_dict()}, args.checkpoint)
        dist.barrier()

    steps = 0
    while (epoch := loader.state_dict()["epoch"]) < args.epochs:
        total, epoch_steps = torch.zeros(2), 0
        for x, y in loader:  # every rank runs the same number of steps (the last is padded)
            loss = ((model(x).squeeze(1) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += torch.tensor([loss.item() * len(y), len(y)])
            steps += 1
            epoch_steps += 1
            if steps == args.stop_after:
                save()
                if rank == 0:
                    print(f"stopped in epoch {epoch} after {steps} steps; checkpoint in {args.checkpoint}")
                break
        else:
            dist.all_reduce(total)
            save()
            if rank == 0:
                print(f"epoch {epoch}: {epoch_steps} steps per rank x {world_size} ranks, "
                      f"mean loss {total[0] / total[1]:.4f}")
            continue
        break  # stopped early
    if rank == 0 and steps != args.stop_after:
        print("weights:", [round(w, 2) for w in model.module.weight.flatten().tolist()])
    # DDP holds the process group: free the model first, so that gloo's threads are joined here and
    # not during the interpreter's teardown (which can abort: "terminate called without an active
    # exception")
    del model, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
