"""``assert_resumes_exactly``: the resume contract of a loader, checked batch by batch.

An uninterrupted run records every batch of two epochs and the state after every step of the
first. Each chosen state goes through JSON into a fresh loader; the rest of that epoch and the
whole next epoch must equal the uninterrupted run's (``torch.equal`` on nested tuples, lists and
dicts of tensors), for save/load ``num_workers`` in ``{0, 2} x {0, 2}``, and once in a fresh
``spawn`` process.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import tempfile
from typing import Any, Callable, Iterable, Optional, Sequence

import torch

WORKERS = (0, 2)


def assert_batches_equal(got: Sequence, want: Sequence, what: str = "batches") -> None:
    """Batch-by-batch equality of two lists of (nested) batches (``torch.equal``, same dtype and shape).

    Raises:
        AssertionError: naming ``what`` and the first batch that differs.

    Example:
        >>> assert_batches_equal([torch.tensor([1, 2])], [torch.tensor([1, 2])])
        >>> assert_batches_equal([torch.tensor([1, 2])], [torch.tensor([1.0, 2.0])], "epoch 0")
        Traceback (most recent call last):
        AssertionError: epoch 0: batch 0 differs:
        tensor([1, 2])
        expected
        tensor([1., 2.])
    """
    assert len(got) == len(want), f"{what}: {len(got)} batches, expected {len(want)}"
    for i, (a, b) in enumerate(zip(got, want)):
        assert _equal(a, b), f"{what}: batch {i} differs:\n{a!r}\nexpected\n{b!r}"


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_equal, a, b))
    return type(a) is type(b) and a == b


def json_round_trip(sd: dict) -> dict:
    """``sd`` through ``json.dumps``/``json.loads``, as a checkpoint file would carry it."""
    return json.loads(json.dumps(sd))


def run_saving_after(loader: Any, step: int) -> tuple[list, Optional[dict]]:
    """Iterate ``loader`` to the end of its epoch; return all batches and the state after batch ``step``."""
    batches, state = [], None
    for i, batch in enumerate(loader):
        batches.append(batch)
        if i == step:
            state = loader.state_dict()
    return batches, state


def record(make_loader: Callable[[int], Any], num_workers: int) -> tuple[list, list, list]:
    """``(epoch0, epoch1, states)``: ``states[k]`` is the state after ``k`` batches of epoch 0."""
    loader = make_loader(num_workers)
    states, epoch0 = [json_round_trip(loader.state_dict())], []
    for b in loader:
        epoch0.append(b)
        states.append(json_round_trip(loader.state_dict()))
    epoch1 = list(loader)
    return epoch0, epoch1, states


def assert_resumes_exactly(make_loader: Callable[[int], Any], stops: Iterable[int], *,
                           workers: Sequence[int] = WORKERS, spawn: bool = False) -> None:
    """Check the resume contract for ``make_loader(num_workers)`` at the given stops.

    Args:
        make_loader: builds a fresh loader for a ``num_workers``; with ``spawn=True`` it must be a
            module-level function (it is pickled into a fresh process).
        stops: numbers of batches yielded before saving (negative counts from the end; the
            state after the last batch, taken before ``StopIteration``, resumes into an empty
            rest of that epoch).
        workers: the ``num_workers`` values used for saving and for loading.
        spawn: also resume the first stop in a fresh ``spawn`` process from a JSON file.

    Raises:
        AssertionError: naming the stop, the ``num_workers`` used to save and to load, and the
            first batch that differs.

    Example:
        >>> import seqloader
        >>> def make(num_workers):
        ...     return seqloader.DataLoader(list(range(10)), batch_size=3, shuffle=True, seed=0,
        ...                                 num_workers=num_workers)
        >>> assert_resumes_exactly(make, stops=[0, 2, -1], workers=(0,))
    """
    stops = list(stops)
    runs = {nw: record(make_loader, nw) for nw in workers}
    base0, base1, _ = runs[workers[0]]
    for nw, (e0, e1, _) in runs.items():
        assert_batches_equal(e0, base0, f"epoch 0 with num_workers={nw}")
        assert_batches_equal(e1, base1, f"epoch 1 with num_workers={nw}")
    n = len(base0)
    for save_nw in workers:
        states = runs[save_nw][2]
        for stop in stops:
            k = stop % (n + 1)
            for load_nw in workers:
                loader = make_loader(load_nw)
                loader.load_state_dict(states[k])
                what = f"stop {k}/{n}, saved with num_workers={save_nw}, loaded with {load_nw}"
                _check_resumed(loader, k, n, base0, base1, what)
    if spawn:
        k = stops[0] % (n + 1)
        got_rest, got_next = resume_in_spawned_process(make_loader, runs[workers[-1]][2][k],
                                                       workers[-1])
        assert_batches_equal(got_rest, base0[k:], f"spawned process, stop {k}: rest of the epoch")
        assert_batches_equal(got_next, base1, f"spawned process, stop {k}: next epoch")


def _check_resumed(loader, k: int, n: int, base0: list, base1: list, what: str) -> None:
    """After ``k`` of ``n`` batches: the rest of epoch 0, then epoch 1. The state after the last
    batch (before ``StopIteration``) resumes into an empty rest of epoch 0, as in torchdata."""
    assert_batches_equal(list(loader), base0[k:], f"{what}: rest of the epoch")
    assert_batches_equal(list(loader), base1, f"{what}: next epoch")


def _child(make_loader, state_path: str, num_workers: int, out_path: str) -> None:
    with open(state_path) as f:
        sd = json.load(f)
    loader = make_loader(num_workers)
    loader.load_state_dict(sd)
    rest, nxt = list(loader), list(loader)
    with open(out_path, "wb") as f:
        pickle.dump((rest, nxt), f)


def resume_in_spawned_process(make_loader, state: dict, num_workers: int) -> tuple[list, list]:
    """Write ``state`` to a JSON file, resume from it in a fresh ``spawn`` process, return its batches."""
    with tempfile.TemporaryDirectory() as tmp:
        state_path, out_path = os.path.join(tmp, "state.json"), os.path.join(tmp, "out.pkl")
        with open(state_path, "w") as f:
            json.dump(state, f)
        p = multiprocessing.get_context("spawn").Process(
            target=_child, args=(make_loader, state_path, num_workers, out_path))
        p.start()
        p.join(90)
        if p.is_alive():
            p.kill()
            p.join()
        assert p.exitcode == 0, f"resume in a spawned process failed (exit code {p.exitcode})"
        with open(out_path, "rb") as f:
            return pickle.load(f)
