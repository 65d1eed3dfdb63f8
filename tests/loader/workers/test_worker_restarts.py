"""``DataLoader(max_worker_restarts=N)``: a dead worker is replaced and the epoch goes on, exactly.

Workers are killed with SIGKILL by the dataset itself, at a sample (map-style) or a stream value
(iterable) the test chooses and at the occurrence it chooses (the ``k``-th read of that sample,
counted with marker files created with ``O_EXCL``, so exactly one process wins each count and a
test can check how many kills happened). Nothing waits on a timer. Every batch is compared with
``torch.equal`` against an uninterrupted run; the ``no_leaks`` fixture checks that no process or
``/dev/shm`` segment outlives a test.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import signal

import pytest
import torch

from seqloader import DataLoader, ThreadWorkers
from seqloader.testing import assert_batches_equal, json_round_trip


def read_count(directory: str, name: str) -> int:
    """How many times ``name`` was read before, across processes (this read included: 0-based)."""
    k = 0
    while True:
        try:
            os.close(os.open(os.path.join(directory, f"{name}-read-{k}"), os.O_CREAT | os.O_EXCL))
            return k
        except FileExistsError:
            k += 1


def maybe_die(directory, kills, name) -> None:
    """SIGKILL this process at the reads of ``name`` listed in ``kills`` (``{name: reads}``), and
    at every read for ``reads == "always"``."""
    if directory is None or name not in kills:
        return
    reads = kills[name]
    if reads == "always" or read_count(directory, name) in reads:
        open(os.path.join(directory, f"killed-{os.getpid()}"), "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


def kills_in(directory) -> int:
    return len([n for n in os.listdir(directory) if n.startswith("killed-")])


class Samples(torch.utils.data.Dataset):
    """Sample ``i`` is ``[i, a draw from torch's global RNG]``; ``kills`` maps samples to the reads
    at which they kill their worker."""

    def __init__(self, directory=None, kills=None, n=40):
        self.directory, self.kills, self.n = directory, kills or {}, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        maybe_die(self.directory, self.kills, i)
        return torch.tensor([i, int(torch.randint(0, 10**6, ()))])


class Sharded(torch.utils.data.IterableDataset):
    """Worker ``w`` of ``n`` yields ``[v, draw]`` for ``v`` in ``range(w, total, n)``; Stateful
    (tests/loader/epoch/test_iterable_streams.py's); ``kills`` as in :class:`Samples`, by value; with a
    ``gate`` (an event), a value in ``kills`` waits for it first (a bound of 60 s, not a timing)."""

    def __init__(self, directory=None, kills=None, total=30, gate=None):
        self.directory, self.kills, self.total, self.start, self.pos = directory, kills or {}, total, 0, 0
        self.gate = gate

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, n = (0, 1) if info is None else (info.id, info.num_workers)
        mine = list(range(w, self.total, n))
        start, self.start = self.start, 0
        for self.pos in range(start, len(mine)):
            if self.gate is not None and mine[self.pos] in self.kills:
                self.gate.wait(60)
            maybe_die(self.directory, self.kills, mine[self.pos])
            yield torch.tensor([mine[self.pos], int(torch.randint(0, 10**6, ()))])
        self.pos = len(mine)

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, sd):
        self.start = sd["pos"] + 1


class NoState(Sharded):
    """The same streams without ``state_dict``: they cannot be restarted exactly."""

    state_dict = None
    load_state_dict = None


def map_loader(ds, **kw):
    kw = {"batch_size": 4, "shuffle": True, "num_workers": 2, "seed": 7, "multiprocessing_context": "fork", **kw}
    return DataLoader(ds, **kw)


def iterable_loader(ds, **kw):
    kw = {"batch_size": 2, "num_workers": 2, "seed": 7, "multiprocessing_context": "fork", **kw}
    return DataLoader(ds, **kw)


def assert_same(got, want, in_order, what="batches"):
    """In order: batch by batch; out of order: the same batches (keyed by their first sample)."""
    if not in_order:
        got, want = (sorted(b, key=lambda t: int(t[0, 0])) for b in (got, want))
    assert_batches_equal(got, want, what)


def warnings_logged(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "seqloader" and r.levelno == logging.WARNING]


KINDS = {"map": (Samples, map_loader, 13), "iterable": (Sharded, iterable_loader, 13)}


@pytest.mark.parametrize("persistent", [False, True], ids=["per-epoch", "persistent"])
@pytest.mark.parametrize("in_order", [True, False], ids=["in-order", "out-of-order"])
@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_batches_are_bit_identical_to_an_uninterrupted_run(tmp_path, caplog, kind, in_order, persistent):
    caplog.set_level(logging.WARNING, logger="seqloader")
    make_ds, make_loader, victim = KINDS[kind]
    ref = make_loader(make_ds(), in_order=in_order, persistent_workers=persistent)
    want = [list(ref), list(ref)]
    # the second read of the victim (in epoch 1) kills its worker; the replacement reads it a third time
    loader = make_loader(make_ds(str(tmp_path), {victim: {1}}), in_order=in_order, persistent_workers=persistent,
                         max_worker_restarts=1)
    got = [list(loader), list(loader)]
    for e in (0, 1):
        assert_same(got[e], want[e], in_order, f"epoch {e}")
    assert kills_in(tmp_path) == 1
    stats = loader.stats()
    assert (stats["last"]["worker_restarts"], stats["current"]["worker_restarts"]) == (0, 1)
    assert sum(w["restarts"] for w in stats["current"]["workers"]) == 1
    (line,) = warnings_logged(caplog)
    what = "epoch_batches" if kind == "map" else "stream_batches"
    # the batch, in the loader's words: with its dataset indices (the victim's among them) for a map-style epoch
    named = (rf"batch \d+ \(dataset indices \[[\d, ]*\b{victim}\b[\d, ]*\]\)" if kind == "map" else r"batch \d+")
    assert re.search(rf"was killed by SIGKILL while producing {named}; replaced by worker", line), line
    assert what in line and "epoch=1" in line and "pid" in line


@pytest.mark.parametrize("in_order", [True, False], ids=["in-order", "out-of-order"])
@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_states_saved_before_during_and_after_a_replacement_resume_exactly(tmp_path, kind, in_order):
    make_ds, make_loader, victim = KINDS[kind]
    ref = make_loader(make_ds(), in_order=in_order)
    want = [list(ref), list(ref)]
    loader = make_loader(make_ds(str(tmp_path), {victim: {0}}), in_order=in_order, max_worker_restarts=1)
    got, states = [], [json_round_trip(loader.state_dict())]
    for b in loader:
        got.append(b)
        states.append(json_round_trip(loader.state_dict()))
    assert kills_in(tmp_path) == 1 and loader.stats()["current"]["worker_restarts"] == 1
    assert_same(got, want[0], in_order)
    for k, sd in enumerate(states):  # before, during (right after the batch whose read healed) and after
        resumed = make_loader(make_ds(), in_order=in_order)
        resumed.load_state_dict(sd)
        rest = list(resumed)
        if in_order:
            assert_batches_equal(rest, want[0][k:], f"rest after stop {k}")
        else:
            assert_same(got[:k] + rest, want[0], in_order, f"stop {k}: yielded + rest")
        assert_same(list(resumed), want[1], in_order, f"next epoch after stop {k}")


@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_a_resumed_epoch_heals_exactly_too(tmp_path, kind):
    make_ds, make_loader, victim = KINDS[kind]
    ref = make_loader(make_ds())
    it = iter(ref)
    before = [next(it), next(it)]
    sd = json_round_trip(ref.state_dict())
    want = before + list(it)
    resumed = make_loader(make_ds(str(tmp_path), {victim: {0}}), max_worker_restarts=1)
    resumed.load_state_dict(sd)
    assert_batches_equal(list(resumed), want[2:])
    assert kills_in(tmp_path) == 1 and resumed.stats()["current"]["worker_restarts"] == 1


def test_a_batch_that_kills_two_workers_raises_naming_it_and_its_indices(tmp_path):
    loader = map_loader(Samples(str(tmp_path), {9: "always"}), shuffle=False, max_worker_restarts=3)
    with pytest.raises(RuntimeError, match=r"^DataLoader worker \(pid \d+\) is killed by signal: Killed\. "
                                           r"seqloader: batch 2 \(dataset indices \[8, 9, 10, 11\]\) killed worker 0 "
                                           r"twice .*poison batch and is not computed again"):
        list(loader)
    assert kills_in(tmp_path) == 2  # the worker and its replacement: no loop


def test_without_restarts_a_dead_worker_raises_torchs_message_as_before(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="seqloader")
    loader = map_loader(Samples(str(tmp_path), {9: {0}}), shuffle=False)
    with pytest.raises(RuntimeError, match=r"^DataLoader worker \(pid \d+\) is killed by signal: Killed\. "
                                           r"seqloader: worker 0 \(pid \d+\) died while producing batch 2 "
                                           r"\(dataset indices \[8, 9, 10, 11\]\) "):
        list(loader)
    assert kills_in(tmp_path) == 1 and not warnings_logged(caplog)


def test_a_stream_without_state_cannot_be_restarted_exactly_and_says_so(tmp_path):
    # value 5 is worker 1's second batch (values 1, 3 | 5, 7): it dies once its first batch was
    # yielded (the gate opens then; else that batch would be recomputed, and nothing is lost)
    gate = multiprocessing.get_context("fork").Event()
    loader = iterable_loader(NoState(str(tmp_path), {5: {0}}, gate=gate), max_worker_restarts=2)
    it = iter(loader)
    next(it), next(it)  # batch 1 is stream 1's first
    gate.set()
    with pytest.raises(RuntimeError, match=r"^DataLoader worker \(pid \d+\) is killed by signal: Killed\. .*"
                                           r"the stream of worker 1 \(NoState\) cannot be restarted exactly"):
        list(it)
    assert kills_in(tmp_path) == 1


def test_the_keyword_is_checked():
    assert DataLoader(range(4), num_workers=1, max_worker_restarts=2).max_worker_restarts == 2
    with pytest.raises(ValueError, match=r"max_worker_restarts=1 needs num_workers > 0"):
        DataLoader(range(4), max_worker_restarts=1)
    with pytest.raises(ValueError, match=r"max_worker_restarts must be >= 0 \(got -1\)"):
        DataLoader(range(4), num_workers=1, max_worker_restarts=-1)
    with pytest.raises(TypeError, match="max_worker_restarts must be an int"):
        DataLoader(range(4), num_workers=1, max_worker_restarts=True)


@pytest.mark.parametrize("method", ["thread", ThreadWorkers()], ids=["word", "options"])
def test_thread_workers_refuse_max_worker_restarts_naming_it(method):
    """A thread cannot be replaced alone (a crash in it ends the training process): refused at
    construction, never silently dropped; threads inside worker processes keep it."""
    with pytest.raises(ValueError, match=r"^DataLoader: max_worker_restarts=2 needs worker processes \(got "
                                         r"worker_method='thread'\): a thread worker cannot be replaced alone"):
        DataLoader(range(4), num_workers=2, worker_method=method, max_worker_restarts=2)
    assert DataLoader(range(4), num_workers=2, worker_method=method).max_worker_restarts == 0
    assert DataLoader(range(4), num_workers=2, threads_per_worker=2, max_worker_restarts=2).max_worker_restarts == 2


class Gated(torch.utils.data.Dataset):
    """Sample ``i`` is ``tensor(i)``; the samples in ``held`` wait for ``gate`` (an event the test
    sets once the timeout was raised; 120 s is a bound, not a timing)."""

    def __init__(self, gate=None, held=(), n=12):
        self.gate, self.held, self.n = gate, set(held), n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.held:
            self.gate.wait(120)
        return torch.tensor(i)


def test_a_timeout_names_the_batch_and_its_dataset_indices_and_the_epoch_goes_on():
    kw = {"batch_size": 4, "shuffle": True, "seed": 3}
    ref = DataLoader(Gated(), **kw)
    want, first = list(ref), ref.indices_at(0, 0)
    gate = multiprocessing.get_context("fork").Event()
    loader = DataLoader(Gated(gate, held=first[1:2]), num_workers=1, timeout=0.2, prefetch_factor=1,
                        multiprocessing_context="fork", **kw)
    it = iter(loader)
    shown = ", ".join(map(str, first))
    with pytest.raises(RuntimeError, match=rf"^DataLoader timed out after 0.2 seconds; seqloader: waiting for batch 0 "
                                           rf"\(dataset indices \[{shown}\]\) from worker 0 \(pid \d+\)$"):
        next(it)
    gate.set()
    assert_batches_equal(list(it), want, "the epoch after the timeout")  # nothing was consumed
