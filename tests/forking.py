"""Helpers for tests that wait on threads or fork: a generous bound, a polling wait, a forked child."""

from __future__ import annotations

import os
import select
import time
import warnings

#: Seconds: the bound of every wait in these tests (never reached unless something is broken).
BOUND = 60.0


def wait_until(predicate, bound: float = BOUND) -> bool:
    deadline = time.monotonic() + bound
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def run_in_fork(child) -> str:
    """Fork; the child runs ``child()`` and reports ``repr`` of its result (or error) through a pipe."""
    r, w = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork of a multi-threaded process
        pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            try:
                msg = repr(child())
            except BaseException as exc:
                msg = f"child raised {exc!r}"
            os.write(w, msg.encode())
        finally:
            os._exit(0)
    os.close(w)
    chunks, deadline = [], time.monotonic() + BOUND
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([r], [], [], deadline - time.monotonic())
            data = os.read(r, 65536) if ready else b""
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(r)
        if not wait_until(lambda: os.waitpid(pid, os.WNOHANG)[0] != 0):
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    return b"".join(chunks).decode()
