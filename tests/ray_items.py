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
