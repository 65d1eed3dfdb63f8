"""add_cache: the values of its parent, computed once while cached; LRU eviction; errors not cached;
threads share one computation per item; the cache is per process (pickle and fork start empty)."""

from __future__ import annotations

import os
import pickle
import re
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

import seqloader as sl
from strategies import check_against_oracle, tag
from forking import BOUND, run_in_fork


class Counting:
    """A sequence that counts how often each item is computed (optionally waiting on an event)."""

    def __init__(self, n, gate=None):
        self.n = n
        self.calls = []
        self.gate = gate
        self.lock = threading.Lock()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.gate is not None:
            assert self.gate.wait(BOUND)
        with self.lock:
            self.calls.append(i)
        return ("item", i)

    def __getstate__(self):
        return {"n": self.n, "calls": self.calls, "gate": None}

    def __setstate__(self, state):
        self.__dict__.update(state, lock=threading.Lock())


@given(st.lists(st.integers(), max_size=20), st.integers(1, 5))
def test_add_cache_matches_its_parent(xs, size):
    check_against_oracle(sl.add_cache(xs, size), xs)
    check_against_oracle(sl.add_cache(sl.smap(tag, xs), size), [tag(x) for x in xs])


@given(st.lists(st.integers(0, 9), max_size=60), st.integers(1, 4))
def test_reads_compute_exactly_what_an_lru_cache_misses(reads, size):
    data = Counting(10)
    seq = sl.add_cache(data, size)
    lru, expected = [], []
    for i in reads:
        assert seq[i] == ("item", i)
        if i in lru:
            lru.remove(i)
        else:
            expected.append(i)
        lru.append(i)
        del lru[:-size]
    assert data.calls == expected
    assert list(seq._state.items) == lru


def test_a_cached_item_is_the_same_object_and_negative_indices_share_it():
    seq = sl.add_cache(sl.smap(lambda i: [i], range(4)), 2)
    assert seq[1] is seq[-3]
    assert seq[2] is not seq[2][:]


def test_errors_are_not_cached():
    attempts = []

    def flaky(i):
        attempts.append(i)
        if len(attempts) == 1:
            raise OSError("transient")
        return i

    seq = sl.add_cache(sl.smap(flaky, range(3)))
    with pytest.raises(OSError, match="transient") as info:
        seq[1]
    assert info.value.__notes__ == ["seqloader: raised in smap(flaky, len=3) at item 1"]
    assert seq[1] == 1 and seq[1] == 1
    assert attempts == [1, 1]
    assert not seq._state.pending


def test_threads_reading_one_item_compute_it_once():
    gate = threading.Event()
    data = Counting(5, gate)
    seq = sl.add_cache(data, 1)
    results, threads = [], [threading.Thread(target=lambda: results.append(seq[3])) for _ in range(8)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(BOUND)
    assert results == [("item", 3)] * 8
    assert data.calls == [3]


def test_threads_reading_different_items_compute_in_parallel():
    # Item 0 blocks until item 1 has been computed by another thread: the cache's lock is not held
    # while an item is computed, or this would deadlock (bounded by the event's timeout).
    done_1 = threading.Event()

    def f(i):
        if i == 0:
            assert done_1.wait(BOUND), "item 1 was not computed while item 0 was"
        return i

    seq = sl.add_cache(sl.smap(f, range(2)), 2)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault(0, seq[0]))
    t.start()
    out[1] = seq[1]
    done_1.set()
    t.join(BOUND)
    assert out == {0: 0, 1: 1}


def test_under_thread_prefetch_every_item_is_computed_once():
    data = Counting(40)
    cached = sl.add_cache(data, cache_size=4)
    pairs = sl.smap(lambda a, b: (a, b), cached, cached)  # reads each item twice in a row
    with sl.prefetch(pairs, num_workers=4, method="thread") as p:
        assert list(p) == [(("item", i), ("item", i)) for i in range(40)]
    assert sorted(data.calls) == list(range(40))


def test_unbatch_over_a_cache_computes_each_batch_once():
    calls = []

    def collate(items):
        calls.append(items[0])
        return tuple(items)

    batches = sl.batch(range(10), 4, collate_fn=collate)
    flat = sl.unbatch(sl.add_cache(batches), 4, 10 % 4)
    assert [flat[i] for i in range(10)] == list(range(10))
    assert calls == [0, 4, 8]


def test_pickling_drops_the_cache_and_the_lock():
    data = Counting(5)
    seq = sl.add_cache(data, 3)
    seq[0], seq[1]
    blob = pickle.dumps(seq)
    clone = pickle.loads(blob)
    assert not clone._state.items and clone._state.lock is not seq._state.lock
    assert b"item" not in blob  # no cached value travels
    assert clone[0] == ("item", 0) and clone._seq.calls == [0, 1, 0]
    assert repr(clone) == repr(seq) == "add_cache(cache_size=3, len=5)"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_forked_child_starts_its_own_cache_even_if_the_lock_was_held():
    data = Counting(5)
    seq = sl.add_cache(data, 2)
    seq[1]
    seq._state.lock.acquire()  # as if another thread held it at the fork
    try:
        def child():
            out = [seq[1], seq[2], len(seq._state.items), seq._state.pid == os.getpid()]
            return out, data.calls
        text = run_in_fork(child)
    finally:
        seq._state.lock.release()
    assert text == repr(([("item", 1), ("item", 2), 2, True], [1, 1, 2]))
    assert seq[1] == ("item", 1) and data.calls == [1]  # the parent's cache is untouched


@pytest.mark.parametrize("args, exc, msg", [
    ((range(3), 0), ValueError, "add_cache: cache_size must be a positive int (got 0)"),
    ((range(3), 1.5), TypeError, "add_cache: cache_size must be an int (got float 1.5)"),
    ((range(3), None), TypeError, "add_cache: cache_size must be an int (got NoneType None)"),
    ((range(3), 2**63), ValueError, "add_cache: cache_size must be < 2**63"),
    ((3,), TypeError, "add_cache: seq must be a sequence"),
])
def test_add_cache_argument_errors(args, exc, msg):
    with pytest.raises(exc, match="^" + re.escape(msg)):
        sl.add_cache(*args)


def test_out_of_range_reads_name_the_stage():
    with pytest.raises(IndexError, match=re.escape("add_cache(cache_size=1, len=2): index 2 out of range [-2, 2)")):
        sl.add_cache([1, 2])[2]
