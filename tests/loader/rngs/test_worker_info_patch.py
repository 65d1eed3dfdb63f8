"""``loader/torch_compat/worker_info.py``: torch's ``get_worker_info`` is made thread-aware only
while thread workers live, and torch's own function is back once the last of them has ended."""

from __future__ import annotations

import gc
import os
import random
import re
import signal
import sys
import threading
import time
import types
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import get_worker_info
from torch.utils.data._utils import worker as torch_worker

import seqloader
from forking import run_in_fork, wait_until
from seqloader.loader import torch_compat
from seqloader.loader.torch_compat import worker_info

pytestmark = pytest.mark.skipif(hasattr(torch_worker, "_thread_local_worker_info"),
                                reason="this torch has a thread-local worker info of its own: nothing is patched")

ORIGINAL = torch_worker.get_worker_info.__code__


def unpatched() -> bool:
    return (torch_worker.get_worker_info.__code__ is ORIGINAL and torch_compat.thread_worker_info_holders() == 0
            and not hasattr(torch_worker, "_thread_local_worker_info"))


@pytest.fixture(autouse=True)
def starts_unpatched():
    """Thread loaders an earlier test left to the garbage collector let go first."""
    gc.collect()
    assert wait_until(unpatched), "a thread worker of an earlier test still holds the patch"


class Who(torch.utils.data.Dataset):
    """Item ``i``: ``(i, get_worker_info().id, .num_workers)`` in the thread that computes it."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = get_worker_info()
        return torch.tensor([i, info.id, info.num_workers, info.worker_method == "thread"])


def thread_loader(**kw):
    return seqloader.DataLoader(Who(), batch_size=2, num_workers=2, worker_method="thread", **kw)


@pytest.mark.parametrize("how", ["exhausted", "del mid-epoch", "persistent, loader freed"])
def test_the_original_get_worker_info_is_back_once_the_thread_workers_end(how):
    loader = thread_loader(persistent_workers=how.startswith("persistent"))
    it = iter(loader)
    first = next(it)
    assert first[:, 1].tolist() == [0, 0] and first[:, 2:].tolist() == [[2, 1]] * 2
    assert torch_worker.get_worker_info.__code__ is not ORIGINAL  # patched while they live
    assert get_worker_info() is None  # ... and the main thread still has no info
    if how == "del mid-epoch":
        del it
    else:
        rest = list(it)
        assert [b[:, 1].tolist() for b in rest] == [[1, 1], [0, 0], [1, 1]]  # batch b on worker b % 2
    if how.startswith("persistent"):
        assert torch_compat.thread_worker_info_holders() == 1  # persistent workers outlive the epoch
        del it, loader
        gc.collect()  # a loader (a cycle with its default sampler) closes its persistent workers when freed
    assert wait_until(unpatched)
    assert get_worker_info() is None


def test_closing_one_of_two_thread_loaders_keeps_the_patch_until_the_other_closes():
    one, two = thread_loader(persistent_workers=True), thread_loader(persistent_workers=True)
    list(one)
    it = iter(two)
    next(it)
    assert torch_compat.thread_worker_info_holders() == 2
    del one
    gc.collect()
    assert wait_until(lambda: torch_compat.thread_worker_info_holders() == 1)
    assert torch_worker.get_worker_info.__code__ is not ORIGINAL
    assert [b[:, 1].tolist() for b in it] == [[1, 1], [0, 0], [1, 1]]  # batch b on worker b % 2
    del it, two
    gc.collect()
    assert wait_until(unpatched) and get_worker_info() is None


def test_an_info_needs_the_patch_held_and_a_release_is_never_doubled():
    rng = torch_compat.thread_generators(1)
    with pytest.raises(RuntimeError, match="install_thread_worker_info needs a thread-aware"):
        torch_compat.install_thread_worker_info(0, 1, seed=1, dataset=None, rng=rng)
    hold = torch_compat.thread_worker_info()
    hold.__enter__()
    hold.__exit__(None, None, None)
    with pytest.raises(RuntimeError, match="released more often than acquired"):
        worker_info._PATCH.release()
    assert unpatched()


def test_a_hold_is_thread_safe():
    barrier = threading.Barrier(8)

    def hold_and_let_go():
        barrier.wait()
        for _ in range(200):
            with torch_compat.thread_worker_info():
                assert getattr(torch_worker, "_thread_local_worker_info", None) is not None

    threads = [threading.Thread(target=hold_and_let_go) for _ in range(8)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: the lock, not the GIL, must hold
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert unpatched()


def test_a_forked_child_starts_unpatched():
    with torch_compat.thread_worker_info():
        got = run_in_fork(lambda: (torch_worker.get_worker_info.__code__ is ORIGINAL,
                                   torch_compat.thread_worker_info_holders()))
        assert torch_worker.get_worker_info.__code__ is not ORIGINAL
    assert got == "(True, 0)"


def test_a_torch_with_its_own_thread_local_info_is_not_patched():
    module = types.ModuleType("fake_torch_worker")
    exec("_worker_info = None\ndef get_worker_info():\n    return _worker_info\n", module.__dict__)
    own = module._thread_local_worker_info = threading.local()
    code = module.get_worker_info.__code__
    patch = worker_info._ThreadAwarePatch(module)
    patch.acquire()
    assert patch.local() is own and module.get_worker_info.__code__ is code
    patch.release()
    assert module._thread_local_worker_info is own and module.get_worker_info.__code__ is code


def test_the_patched_body_reads_the_threads_info_first_and_survives_its_removal():
    module = types.ModuleType("fake_torch_worker")
    exec("_worker_info = 'global'\ndef get_worker_info():\n    return _worker_info\n", module.__dict__)
    patch = worker_info._ThreadAwarePatch(module)
    patch.acquire()
    patch.local().worker_info = "mine"
    assert module.get_worker_info() == "mine"
    patch.local().worker_info = None
    assert module.get_worker_info() == "global"
    patched = types.FunctionType(module.get_worker_info.__code__, module.__dict__)  # a call under way at release
    patch.release()
    assert not hasattr(module, "_thread_local_worker_info") and patched() == "global" == module.get_worker_info()


# --------------------------------------------------------------------------- other private details
# Details listed in docs/design.md ("Private details we depend on") that no other test pinned.


class NumpyStateAtInit(torch.utils.data.Dataset):
    """Item ``i``: ``(worker id, info.seed, numpy's first state words when worker_init_fn ran)``."""

    def __len__(self):
        return 2

    def __getitem__(self, i):
        return self.at_init


def record_numpy_state(worker_id):
    info = get_worker_info()
    info.dataset.at_init = (info.id, info.seed, np.random.get_state()[1][:8].tolist())


def test_the_numpy_seed_of_torchs_worker_set_up_is_torchs():
    """``_worker._generate_state``: what torch's own workers seed ``numpy.random`` with."""
    loader = torch.utils.data.DataLoader(NumpyStateAtInit(), batch_size=None, num_workers=2,
                                         worker_init_fn=record_numpy_state)
    seen = {wid: (seed, words) for wid, seed, words in loader}
    assert sorted(seen) == [0, 1]
    for wid, (seed, words) in seen.items():
        want = np.random.RandomState(torch_compat.numpy_worker_seed(seed - wid, wid)).get_state()[1][:8].tolist()
        assert words == want


def test_seeding_the_globals_is_what_the_public_seed_calls_do():
    """The per-batch seeding (``rngs.seed_generators``, since issue 42 through the public
    ``random.seed``) is the public seed calls, the cached Gaussians dropped."""
    from seqloader.loader.rngs.seeding import preserved_globals, seed_globals, torch_seed

    with preserved_globals():
        random.gauss(0, 1)  # leaves a cached Gaussian (gauss_next) that seeding must drop
        np.random.randn(1)
        s = seed_globals(3, 1, 7)
        got = random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state()
        random.seed(s)
        np.random.seed(s & 0xFFFFFFFF)
        torch.manual_seed(torch_seed(s))
        want = random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state()
    assert got[:2] == want[:2] and torch.equal(got[2], want[2])


class ReadsInBatches(torch.utils.data.Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        raise AssertionError("read one item at a time; torch reads __getitems__")

    def __getitems__(self, indices):
        return [10 * i for i in indices]


def test_the_map_style_fetch_is_torchs():
    """``_utils.fetch._MapDatasetFetcher``: ``__getitems__`` when the dataset has one, as torch reads."""
    want = [b.tolist() for b in torch.utils.data.DataLoader(ReadsInBatches(), batch_size=4)]
    assert [b.tolist() for b in seqloader.DataLoader(ReadsInBatches(), batch_size=4, seed=0)] == want
    assert want == [[0, 10, 20, 30], [40, 50]]


class Sleeps(torch.utils.data.Dataset):
    def __len__(self):
        return 1

    def __getitem__(self, i):
        time.sleep(1)
        return i


class KillsItself(torch.utils.data.Dataset):
    def __len__(self):
        return 1

    def __getitem__(self, i):
        os.kill(os.getpid(), signal.SIGKILL)


def test_the_words_we_copy_are_still_torchs():
    """A timeout and a killed worker: seqloader's message starts with torch's own words."""
    with pytest.raises(RuntimeError) as theirs:
        list(torch.utils.data.DataLoader(Sleeps(), num_workers=1, timeout=0.1))
    ours = torch_compat.worker_error(timed_out=True, timeout=0.1, batch="batch 0", worker_id=0, pid=1, exitcode=None,
                                     doing="", detail="")
    assert str(ours).startswith(str(theirs.value))
    with pytest.raises(RuntimeError) as theirs:
        list(torch.utils.data.DataLoader(KillsItself(), num_workers=1))
    # torch says either (its SIGCHLD handler or its queue's timeout sees the death first)
    said = re.sub(r"\(pid(\(s\))? \d+\)", r"(pid\1 1)", str(theirs.value)).strip()
    ours = [str(torch_compat.worker_error(timed_out=False, timeout=0, batch="batch 0", worker_id=0, pid=1,
                                          exitcode=code, doing="while producing batch 0", detail=""))
            for code in (-signal.SIGKILL, 3)]
    assert any(mine.startswith(said) for mine in ours), (said, ours)


def test_the_private_c_functions_we_call_are_there():
    """``_posixshmem``, and ``signal.pthread_sigmask`` (public since issue 42, which measured the
    private ``_signal`` one at ~7 µs a batch less; a missing one would silently leave Ctrl-C
    unmasked around a message)."""
    import _posixshmem

    from seqloader.prefetcher.processes import handle

    assert handle._SIGMASK and callable(_posixshmem.shm_open) and callable(_posixshmem.shm_unlink)


def test_threads_are_not_counted_as_worker_processes():
    """``DataLoader.check_worker_number_rationality`` (torch's undocumented hook) is overridden."""
    many = 4 * (os.cpu_count() or 1) + 8
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seqloader.DataLoader(range(4), num_workers=many, worker_method="thread").check_worker_number_rationality()
    with pytest.warns(UserWarning, match=f"will create {many} worker processes in total"):
        seqloader.DataLoader(range(4), num_workers=many).check_worker_number_rationality()
