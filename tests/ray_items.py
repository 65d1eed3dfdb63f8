"""Items that the Ray tests' actors compute, in a module of light imports (numpy, not torch or
pytest): an actor imports the module an item's function comes from, and its start-up is part of
every test that starts one."""

from __future__ import annotations

import json
import os
import time

import numpy as np

#: Seconds: the bound of every wait (never reached unless something is broken).
BOUND = 60.0


def value(i):
    return {"i": i, "x": np.full(1000, i, dtype=np.float32)}


def same(a, b):
    return a["i"] == b["i"] and np.array_equal(a["x"], b["x"])


def with_tensor(i):
    import torch

    return torch.arange(5) + i


def fails_at_7(i):
    if i == 7:
        raise KeyError(f"no item {i}")
    return i


def needs_config(worker_id):
    raise LookupError(f"no config for worker {worker_id}")


def wait_for(path, bound=BOUND):
    deadline = time.monotonic() + bound
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)
    return os.path.exists(path)


class Marked:
    """Item ``i``: ``fn(i)``; item ``at`` (while the file ``arm`` exists in ``folder``) first writes
    where it runs into ``reached`` and waits for ``release`` (or its own death)."""

    def __init__(self, folder, at, fn=value):
        self.folder, self.at, self.fn = str(folder), at, fn

    def __call__(self, i):
        if i == self.at and os.path.exists(os.path.join(self.folder, "arm")):
            import ray

            where = {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}
            tmp = os.path.join(self.folder, "reached.tmp")
            with open(tmp, "w") as f:
                json.dump(where, f)
            os.rename(tmp, os.path.join(self.folder, "reached"))
            wait_for(os.path.join(self.folder, "release"))
        return self.fn(i)

    def __repr__(self):
        return f"Marked(at={self.at})"


def reached(folder):
    """Where the marked item runs (``{"node", "pid"}``), once it has started."""
    path = os.path.join(folder, "reached")
    assert wait_for(path), "the marked item never started"
    with open(path) as f:
        return json.load(f)


class ExitsAt:
    """Item ``at`` ends its process (``os._exit``), every time."""

    def __init__(self, at):
        self.at = at

    def __call__(self, i):
        if i == self.at:
            os._exit(3)
        return i

    def __repr__(self):
        return f"ExitsAt({self.at})"


class Noisy:
    """A map-style dataset of ``n`` items: ``[i, a draw from torch's global generator, worker id +
    what offset_init set]`` (seeded per batch by the loader; the worker id from
    ``get_worker_info()``), item ``at`` marked as :class:`Marked` does (``folder``: ``None``, never)."""

    def __init__(self, n, folder=None, at=-1):
        self.n, self.marked = n, Marked(folder, at, fn=int) if folder is not None else None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch

        if self.marked is not None:
            self.marked(i)
        info = torch.utils.data.get_worker_info()
        return torch.tensor([float(i), float(torch.rand(())), -1.0 if info is None else float(info.id + OFFSET)])


OFFSET = 0


def offset_init(worker_id):
    """A ``worker_init_fn``: what :class:`Noisy` adds to the worker id."""
    global OFFSET
    OFFSET = 100 * (worker_id + 1)


class SafeDraws:
    """Item ``i``: ``[i, a draw from torch.thread_safe_generator()]``: the same on every executor
    (the global generator in a process or actor, the thread's own in a thread worker)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch

        return torch.tensor([float(i), float(torch.rand(1, generator=torch.thread_safe_generator()))])
