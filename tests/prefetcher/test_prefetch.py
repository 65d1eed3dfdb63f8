"""``seqloader.prefetch`` over worker processes: workers are processes of their own, sequences sent
by reference (``shared``), worker set-up, shared-memory round trips, start methods and the
process-only arguments. What every executor promises (reads, seeks, read-ahead, reset, close,
errors, timeouts) is ``test_promises.py``.

Datasets are module-level classes so that they pickle for ``spawn``/``forkserver``.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import pickle

import numpy as np
import pytest
import torch

import seqloader as sl
from seqloader import prefetch
from seqloader.prefetcher.processes.worker import dumps_seq


class Pids:
    """Item ``i`` is ``(i, pid of the process computing it)``."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i, os.getpid()


class Setup:
    """Item ``i``: ``(i, what worker_init_fn saw, torch's worker info, intra-op threads)``."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return (i, os.environ.get("SEQLOADER_TEST_INIT"), torch.utils.data.get_worker_info(),
                torch.get_num_threads())


def init_env(worker_id):
    os.environ["SEQLOADER_TEST_INIT"] = f"{worker_id}/{torch.utils.data.get_worker_info()}"


Point = collections.namedtuple("Point", "x y")


def full_1000(i):
    return torch.full((1000,), i)


class Nested:
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return {
            "np": np.full((3, 4), i, dtype=np.float32),
            "fortran": np.asfortranarray(np.arange(12).reshape(3, 4) + i),
            "strided": np.arange(20)[::3] + i,
            "objects": np.array([i, "x"], dtype=object),
            "tensor": (torch.full((2, 2), i), [torch.tensor(i, dtype=torch.bfloat16)]),
            "bool": torch.tensor([True, False]),
            "empty": torch.empty(0, 3),
            "transposed": torch.arange(6).reshape(2, 3).t() + i,
            "point": Point(torch.tensor([i]), np.int64(i)),
            "plain": ("s", i, None),
        }


def test_items_are_computed_in_worker_processes_of_their_own():
    # that the same workers serve seeks and resets: test_promises.py (every executor)
    with prefetch(Pids(40), num_workers=2) as p:
        first = [p[i] for i in range(40)]
        p.reset(Pids(10))
        later = list(p)
    pids = {pid for _, pid in first}
    assert os.getpid() not in pids and len(pids) == 2
    assert {pid for _, pid in later} <= pids


def test_reset_retargets_the_same_workers_at_a_new_sequence_and_epoch():
    data = np.arange(1000) * 2
    with prefetch(sl.gather(data, np.arange(10)), num_workers=2, shared=data) as p:
        assert list(p) == list(range(0, 20, 2))
        p.reset(sl.gather(data, np.arange(500, 505)))
        assert len(p) == 5 and list(p) == [1000, 1002, 1004, 1006, 1008]
        p.reset(range(3))
        assert list(p) == [0, 1, 2]


def test_reset_sends_the_dataset_by_reference_not_by_value():
    big = np.zeros(1_000_000, dtype=np.uint8)
    small = dumps_seq(sl.gather(big, np.arange(4)), big)
    assert len(small) < 2_000 < big.nbytes
    assert len(pickle.dumps(sl.gather(big, np.arange(4)))) > big.nbytes


def test_workers_run_worker_init_fn_with_their_id_and_know_nothing_of_torchs_loader():
    with prefetch(Setup(), num_workers=2, worker_init_fn=init_env) as p:
        got = list(p)
    assert [g[0] for g in got] == list(range(8))
    assert {g[1] for g in got} == {"0/None", "1/None"}       # both workers ran it, with their id
    assert all(g[2] is None and g[3] == 1 for g in got)      # no WorkerInfo; one intra-op thread


def test_shared_is_sent_once_and_referenced_by_later_sequences():
    data = np.arange(1000) * 2
    with prefetch(sl.gather(data, np.arange(3)), num_workers=1, shared=data) as p:
        assert list(p) == [0, 2, 4]
        p.reset(sl.gather(data, [10, 20]))   # pickled with a reference to `data`, not a copy
        assert list(p) == [20, 40]


def _check_nested(got, i):
    want = Nested()[i]
    for key in ("np", "fortran", "strided"):
        np.testing.assert_array_equal(got[key], want[key])
        assert got[key].dtype == want[key].dtype
    assert got["objects"].tolist() == want["objects"].tolist()
    assert torch.equal(got["tensor"][0], want["tensor"][0])
    assert got["tensor"][1][0].dtype == torch.bfloat16 and got["tensor"][1][0].item() == i
    assert torch.equal(got["bool"], want["bool"]) and got["empty"].shape == (0, 3)
    assert torch.equal(got["transposed"], want["transposed"])
    assert isinstance(got["point"], Point) and got["point"].y == i and torch.equal(got["point"].x, want["point"].x)
    assert got["plain"] == ("s", i, None)


def test_nested_arrays_and_tensors_round_trip():
    with prefetch(Nested(), num_workers=2) as p:
        for i in range(len(p)):
            _check_nested(p[i], i)


def test_returned_batches_are_never_overwritten():
    n = 60
    with prefetch(sl.smap(full_1000, range(n)), num_workers=2) as p:
        kept = list(p)
        views = [p[i][::7] for i in range(n)]
        more = list(p)
    assert all(torch.equal(kept[i], torch.full((1000,), i)) for i in range(n))
    assert all(torch.equal(views[i], torch.full((143,), i)) for i in range(n))
    assert all(torch.equal(more[i], torch.full((1000,), i)) for i in range(n))


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_start_methods_pickle_the_sequence(method):
    data = Nested()
    with prefetch(data, num_workers=2, multiprocessing_context=method, worker_init_fn=init_env) as p:
        _check_nested(p[4], 4)
        _check_nested(p[0], 0)
        p.reset(sl.gather(data, [5, 1]))
        _check_nested(p[0], 5)
        _check_nested(p[1], 1)


def test_context_object_is_accepted():
    with prefetch(range(4), 1, multiprocessing_context=multiprocessing.get_context("fork")) as p:
        assert list(p) == [0, 1, 2, 3]


def test_an_empty_sequence_starts_no_worker():
    p = prefetch([], num_workers=2)
    assert len(p) == 0 and list(p) == []
    with pytest.raises(IndexError):
        p[0]
    p.close()


# the arguments of every executor: test_promises.py
@pytest.mark.parametrize("kwargs, exc, match", [
    ({"num_workers": 1, "multiprocessing_context": "thread"}, ValueError, r"'thread' is not a start method"),
    ({"num_workers": 1, "multiprocessing_context": 3}, TypeError, r"multiprocessing_context must be None"),
])
def test_start_method_errors_name_the_argument(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        prefetch(range(3), **kwargs)


def test_reset_with_an_unpicklable_sequence_is_a_type_error_and_changes_nothing():
    with prefetch(range(5), 1) as p:
        assert p[0] == 0
        with pytest.raises(TypeError, match="prefetch.reset: seq cannot be pickled"):
            p.reset(sl.smap(lambda x: x, range(3)))
        assert len(p) == 5 and p[1] == 1


class WorkerIds:
    """Item ``i`` is ``(i, pid)``; slow enough that several workers take part."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return i, os.getpid()


def test_item_i_is_computed_by_worker_i_mod_num_workers_like_torch():
    with prefetch(WorkerIds(), num_workers=3, prefetch_factor=2) as p:
        got = list(p)
        p[5], p[4]  # a seek keeps the assignment
        pids = [h.pid for h in p._executor.handles]
    assert [pid for _, pid in got] == [pids[i % 3] for i in range(24)]
