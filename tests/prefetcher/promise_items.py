"""Items for the prefetch promises (``test_promises.py``), in a module of light imports (numpy;
torch only inside the item that returns a tensor): a worker process, a thread or a Ray actor
imports the module an item comes from, and a Ray actor's start-up is part of every test.

What an item did is written to files (one line appended per computation), so the test reads it
whatever computed the item: a thread of this process, a worker process (any start method) or a
Ray actor on a node of this machine.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

#: Seconds: the bound of every wait (never reached unless something is broken).
BOUND = 60.0


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)  # one small write: atomic
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def computed(folder) -> list[int]:
    """The items computed so far by a :class:`Logged` or :class:`Gated` sequence on ``folder``."""
    try:
        with open(os.path.join(folder, "computed")) as f:
            return [int(line) for line in f.read().split()]
    except FileNotFoundError:
        return []


class Logged:
    """``n`` items; item ``i`` is ``i``, after writing ``i`` to ``folder/computed``."""

    def __init__(self, folder, n):
        self.folder, self.n = str(folder), n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        _append(os.path.join(self.folder, "computed"), str(i))
        return i


class Gated(Logged):
    """A :class:`Logged` sequence whose item ``at`` first creates ``folder/reached`` and then waits
    (at most :data:`BOUND` seconds) until the test creates ``folder/release``."""

    def __init__(self, folder, n, at):
        super().__init__(folder, n)
        self.at = at

    def __getitem__(self, i):
        if i == self.at:
            open(os.path.join(self.folder, "reached"), "w").close()
            wait_for(os.path.join(self.folder, "release"))
        return super().__getitem__(i)


def wait_for(path, bound=BOUND) -> bool:
    deadline = time.monotonic() + bound
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)
    return os.path.exists(path)


def release(folder) -> None:
    open(os.path.join(folder, "release"), "w").close()


class Where:
    """Item ``i`` is ``(i, the worker computing it)``: its process and thread."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i, (os.getpid(), threading.current_thread().name)


def fails_at_3(i):
    if i == 3:
        raise ValueError(f"bad record {i}")
    return i


def fails_at_5(i):
    if i == 5:
        raise ValueError(f"bad record {i}")
    return i


def exits_at_3(i):
    if i == 3:
        os._exit(3)
    return i


def needs_config(worker_id):
    raise LookupError(f"no config for worker {worker_id}")


def value(i):
    """A dict with an array and a tensor."""
    import torch

    return {"i": i, "x": np.full(1000, i, dtype=np.float32), "t": torch.arange(5) + i}


def ten_copies(i):
    return [i] * 10
