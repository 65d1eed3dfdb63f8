"""Drop-in fidelity (issue 9): torch's and torchdata's behaviour at the edges, torch as the oracle
where torch defines one. Datasets are module-level so that they pickle for ``spawn``."""

from __future__ import annotations

import gc
import inspect
import os
import signal

import psutil
import pytest
import torch

import seqloader
from seqloader import DataLoader, StatefulDataLoader, StatefulDistributedSampler
from seqloader.testing import assert_batches_equal, json_round_trip


class FailsAt(torch.utils.data.Dataset):
    """Item ``bad`` raises ``KeyError``; others are their index."""

    def __init__(self, n=12, bad=5):
        self.n, self.bad = n, bad

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            raise KeyError(f"bad sample {i}")
        return i


class Seeds(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.tensor(torch.initial_seed())


class DiesAt(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 4:
            os.kill(os.getpid(), signal.SIGKILL)
        return i


def _log_and_skip(loader, states=None):
    """The batches of one epoch, ``"error"`` for each that raised, as a 'log and skip bad
    batches' loop sees them; with ``states``, the loader's state after each step too."""
    out, it = [], iter(loader)
    while True:
        try:
            out.append(next(it))
        except StopIteration:
            return out
        except KeyError:
            out.append("error")
        if states is not None:
            states.append(json_round_trip(loader.state_dict()))


# -- 1. torchdata's signature ---------------------------------------------------------------------

def test_torchdatas_arguments_are_accepted_and_kept():
    loader = StatefulDataLoader(list(range(6)), batch_size=2, snapshot_every_n_steps=5, seed=0)
    assert loader.snapshot_every_n_steps == 5 and [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5]]
    ours = inspect.signature(DataLoader.__init__).parameters
    assert ours["snapshot_every_n_steps"].default == 1


# -- 3. a batch that raises is consumed --------------------------------------------------------------

@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_failing_batch_is_consumed_like_torchs_and_resumes_after_it(num_workers):
    want = _log_and_skip(torch.utils.data.DataLoader(FailsAt(), batch_size=2, num_workers=num_workers))
    states = []
    got = _log_and_skip(DataLoader(FailsAt(), batch_size=2, num_workers=num_workers, seed=0), states)
    assert len(got) == len(want) and [g == "error" for g in got] == [w == "error" for w in want]
    assert all(torch.equal(g, w) for g, w in zip(got, want) if not isinstance(g, str))
    k = got.index("error")
    assert states[k]["position"] == 2 * (k + 1)  # the failed batch counts as done
    resumed = DataLoader(FailsAt(), batch_size=2, num_workers=num_workers, seed=0)
    resumed.load_state_dict(states[k])
    assert_batches_equal(list(resumed), got[k + 1:])


# -- 4. end of epoch -----------------------------------------------------------------------------

@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_training_loop_over_epochs_consumes_the_same_epochs_after_a_resume(num_workers):
    def make():
        return DataLoader(list(range(9)), batch_size=3, shuffle=True, num_workers=num_workers, seed=1)

    ref = make()
    want = [[b.tolist() for b in ref] for _ in range(3)]
    loader = make()
    it = iter(loader)
    for _ in range(3):
        next(it)
    sd = json_round_trip(loader.state_dict())  # after the last batch, before StopIteration
    assert (sd["epoch"], sd["position"]) == (0, 9)
    resumed = make()
    resumed.load_state_dict(sd)
    got = [[b.tolist() for b in resumed] for _ in range(sd["epoch"], 3)]
    assert got == [[]] + want[1:]
    with pytest.raises(StopIteration):
        next(it)
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["position"] == 0


# -- 2. StatefulDistributedSampler through the loader ------------------------------------------------

@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_distributed_sampler_resumes_exactly_in_every_epoch(num_workers):
    def make():
        sampler = StatefulDistributedSampler(range(20), num_replicas=2, rank=1, shuffle=True, seed=3)
        return DataLoader(list(range(20)), batch_size=3, sampler=sampler, num_workers=num_workers), sampler

    ref, s = make()
    epochs = []
    for e in range(2):
        s.set_epoch(e)
        epochs.append([b.tolist() for b in ref])
    loader, sampler = make()
    list(loader)
    sampler.set_epoch(1)
    it = iter(loader)
    head = [next(it).tolist() for _ in range(2)]
    sd = json_round_trip(loader.state_dict())
    assert sd["sampler"] == {"yielded": 6} and sd["sampler_epoch"] == 1
    resumed, _ = make()  # the resumed sampler's epoch is 0 until set_epoch: the state knows better
    resumed.load_state_dict(sd)
    assert head + [b.tolist() for b in resumed] == epochs[1]


def test_a_set_epoch_after_iter_reads_the_saved_epoch_and_a_new_set_epoch_still_wins():
    def make():
        sampler = torch.utils.data.DistributedSampler(range(12), num_replicas=2, rank=0, shuffle=True)
        return DataLoader(list(range(12)), batch_size=2, sampler=sampler), sampler

    ref, s = make()
    want = []
    for e in range(3):
        s.set_epoch(e)
        want.append([b.tolist() for b in ref])
    loader, sampler = make()
    sampler.set_epoch(0)
    list(loader)
    sampler.set_epoch(1)
    it = iter(loader)
    head = [next(it).tolist()]
    sd = loader.state_dict()
    resumed, rs = make()
    resumed.load_state_dict(sd)
    it = iter(resumed)          # Lightning's order on resume: iter() first ...
    rs.set_epoch(0)             # ... then set_epoch, here even with a stale value
    assert head + [b.tolist() for b in it] == want[1]
    rs.set_epoch(2)
    assert [b.tolist() for b in resumed] == want[2]


# -- 6. non-persistent workers die with their iterator -------------------------------------------

def _worker_pids():
    return {p.pid for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())}


@pytest.mark.parametrize("how", ["break", "exception", "gc"])
def test_non_persistent_workers_exit_with_their_iterator_while_the_loader_lives(how):
    loader = DataLoader(list(range(64)), batch_size=2, num_workers=2, seed=0)
    before = _worker_pids()
    if how == "break":
        for i, _ in enumerate(loader):
            if i == 2:
                break
    elif how == "exception":
        with pytest.raises(ZeroDivisionError):
            for _ in loader:
                1 / 0
    else:
        it = iter(loader)
        next(it)
        assert _worker_pids() - before  # the workers are there
        del it
    gc.collect()
    procs = [psutil.Process(p) for p in _worker_pids() - before if psutil.pid_exists(p)]
    gone, alive = psutil.wait_procs(procs, timeout=60)  # a bound: they exit within seconds
    assert not alive and loader is not None


# -- 7. small things -----------------------------------------------------------------------------

def test_generic_class_like_torchs():
    assert DataLoader[int] is not None and StatefulDataLoader[list] is not None


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_seed_an_item_can_observe_fits_a_signed_64_bit_int(num_workers):
    for seed in (0, 2**64 - 1):
        seeds = torch.cat(list(DataLoader(Seeds(), batch_size=4, num_workers=num_workers, seed=seed)))
        assert seeds.dtype == torch.int64 and len(seeds) == 16


def test_a_killed_worker_raises_torchs_message_then_ours():
    loader = DataLoader(DiesAt(), batch_size=1, num_workers=2, seed=0)
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid \d+\) is killed by signal: Killed\. "
                                           r"seqloader: worker 0 \(pid \d+\) died while producing batch 4"):
        list(loader)


def test_torchs_arguments_are_forwarded_by_keyword():
    seen = {}
    original = torch.utils.data.DataLoader.__init__

    def patched(self, *args, **kwargs):  # what Lightning's re-instantiation patch relies on
        seen["args"], seen["kwargs"] = args, kwargs
        original(self, *args, **kwargs)

    torch.utils.data.DataLoader.__init__ = patched
    try:
        DataLoader(list(range(4)), batch_size=2, sampler=None, seed=0)
    finally:
        torch.utils.data.DataLoader.__init__ = original
    assert seen["args"] == () and {"dataset", "batch_size", "sampler", "in_order"} <= set(seen["kwargs"])


def test_the_public_names_torchdata_code_imports():
    from seqloader.sampler import Stateful, StatefulDistributedSampler as S

    assert S is seqloader.StatefulDistributedSampler and isinstance(DataLoader([1], seed=0), Stateful)


def _bad_init(worker_id):
    raise ValueError(f"worker {worker_id} has no config")


class SlowFirst(torch.utils.data.Dataset):
    """Item 0 waits until the reader has received item 3 and sets ``release`` (a fork-shared
    event): a straggler that certainly finishes after others, whatever the machine's load."""

    def __init__(self):
        import multiprocessing
        self.release = multiprocessing.get_context("fork").Event()

    def __len__(self):
        return 10

    def __getitem__(self, i):
        if i == 0:
            assert self.release.wait(60), "the reader never got item 3"
        return i


@pytest.mark.parametrize("iterable", [False, True])
def test_a_failing_worker_init_fn_raises_at_iter(iterable):
    ds = list(range(8)) if not iterable else torch.utils.data.IterableDataset.__new__(_Stream)
    loader = DataLoader(ds, batch_size=2, num_workers=2, worker_init_fn=_bad_init, seed=0)
    with pytest.raises(ValueError, match="has no config"):
        iter(loader)


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(8))


def test_in_order_false_yields_what_is_ready_and_resumes_each_batch_once():
    ds = SlowFirst()
    loader = DataLoader(ds, batch_size=None, num_workers=2, in_order=False, seed=0,
                        multiprocessing_context="fork")
    got, states = [], []
    for x in loader:
        got.append(int(x))
        states.append(json_round_trip(loader.state_dict()))
        if got[-1] == 3:
            ds.release.set()
    assert sorted(got) == list(range(10)) and got.index(3) < got.index(0)
    k = got.index(3)  # a state taken while item 0 was still pending: watermark 0, 3 ahead
    assert states[k]["position"] == 0 and 3 in states[k]["ahead"] and len(states[k]["ahead"]) < 4
    for j, sd in enumerate(states):
        resumed = DataLoader(list(range(10)), batch_size=None, num_workers=0, seed=0)
        resumed.load_state_dict(sd)
        assert sorted(int(x) for x in resumed) == sorted(set(range(10)) - set(got[:j + 1]))


_FD_SCRIPT = """
import resource, torch
from seqloader import DataLoader

class Random(torch.utils.data.{kind}):
    def __len__(self):
        return 200
    def __getitem__(self, i):
        return torch.randn(2, 2)
    def __iter__(self):
        return (torch.randn(2, 2) for _ in range(200))

resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100))
kept = []
try:
    for t in DataLoader(Random(), batch_size=None, num_workers=1, multiprocessing_context="fork"):
        kept.append(t)   # every batch kept alive holds its slot
    print("ok")
except RuntimeError as e:
    assert "ulimit -n" in str(e) and "set_sharing_strategy" in str(e), e
    print("advice")
"""


@pytest.mark.parametrize("kind", ["Dataset", "IterableDataset"])
def test_running_out_of_file_descriptors_gives_torchs_advice(kind):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _FD_SCRIPT.format(kind=kind)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "advice", out.stderr[-3000:]
