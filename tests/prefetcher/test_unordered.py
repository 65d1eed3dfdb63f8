"""Reading in completion order: ``Prefetch.take``, ``Prefetch.seek(position, skip=...)`` and ``TakeWindow``.

Stragglers are items that wait on a ``multiprocessing`` event the test sets (fork only), so the
tests look at the *order* of results, never at timings. ``timeout=`` on the prefetches only turns
a regression (a straggler blocking everything) into an error instead of a hang.
"""

from __future__ import annotations

import multiprocessing
import os
import signal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import seqloader as sl
from seqloader import prefetch
from seqloader.prefetcher.prefetch import ItemTimeout, WorkerDied
from seqloader.prefetcher.unordered import TakeWindow

FORK = multiprocessing.get_context("fork")
SAFETY = 60  # seconds; only so that a regression fails instead of hanging


class Gated:
    """Item ``i`` is ``i``; the items in ``gated`` first wait for ``gate`` (fork only).

    Every computation is counted in ``seen`` (shared memory), so a test can check that an item
    was computed exactly once, or never.
    """

    def __init__(self, n, gated=(), bad=()):
        self.n, self.gated, self.bad = n, frozenset(gated), frozenset(bad)
        self.gate = FORK.Event()
        self.seen = FORK.Array("i", n, lock=False)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.seen[i] += 1
        if i in self.gated and not self.gate.wait(SAFETY):
            raise TimeoutError(f"the test never opened the gate for item {i}")
        if i in self.bad:
            raise ValueError(f"bad item {i}")
        return i


def take_all(p):
    got = []
    while p.remaining:
        got.append(p.take()[0])
    return got


def test_completed_items_come_before_a_straggler_and_other_workers_keep_working():
    ds = Gated(30, gated={0})
    with prefetch(ds, num_workers=3, prefetch_factor=2, multiprocessing_context="fork", timeout=SAFETY) as p:
        # Window [0, 6): worker 0 holds 0 (stuck) and 3; workers 1 and 2 compute 1, 2, 4, 5.
        first = [p.take()[0] for _ in range(4)]
        assert sorted(first) == [1, 2, 4, 5]
        ds.gate.set()
        rest = take_all(p)
    assert sorted(first + rest) == list(range(30))
    assert list(ds.seen) == [1] * 30


def test_a_wider_window_lets_the_other_workers_run_further_ahead():
    ds = Gated(30, gated={0})
    with prefetch(ds, num_workers=3, prefetch_factor=2, multiprocessing_context="fork", timeout=SAFETY) as p:
        # Window [0, 12): worker 0 holds 0 and 3 (its room); workers 1 and 2 take all of theirs.
        first = [p.take(window=12)[0] for _ in range(8)]
        assert sorted(first) == [1, 2, 4, 5, 7, 8, 10, 11]
        assert ds.seen[6] == ds.seen[9] == 0 and max(i for i in range(30) if ds.seen[i]) == 11
        ds.gate.set()
        rest = []
        while p.remaining:
            rest.append(p.take(window=12)[0])
    assert sorted(first + rest) == list(range(30))


def test_the_window_bounds_how_far_reading_runs_past_the_oldest_item_not_taken():
    ds = Gated(40, gated={5})
    with prefetch(ds, num_workers=2, prefetch_factor=3, multiprocessing_context="fork", timeout=SAFETY) as p:
        # Once 0..4 are taken, item 5 is stuck on worker 1 with 7 and 9 queued behind it, and the
        # window is [5, 11): worker 0 runs up to 10 and no further.
        taken = [p.take()[0] for _ in range(8)]
        assert sorted(taken) == [0, 1, 2, 3, 4, 6, 8, 10]
        assert all(ds.seen[i] == 0 for i in (7, 9, *range(11, 40)))
        ds.gate.set()
        assert sorted(taken + take_all(p)) == list(range(40))


@pytest.mark.parametrize("num_workers, prefetch_factor, n", [(1, 1, 7), (2, 2, 25), (3, 1, 10), (4, 3, 50)])
def test_every_item_is_taken_and_computed_exactly_once(num_workers, prefetch_factor, n):
    ds = Gated(n)
    with prefetch(ds, num_workers, prefetch_factor=prefetch_factor, multiprocessing_context="fork") as p:
        assert p.remaining == n
        got = take_all(p)
        assert p.remaining == 0
        with pytest.raises(IndexError, match=r"take\(\) with every item taken; seek\(\) to read again"):
            p.take()
    assert sorted(got) == list(range(n)) and list(ds.seen) == [1] * n


def test_values_are_the_items():
    with prefetch(sl.smap(str, range(20)), num_workers=3) as p:
        pairs = [p.take() for _ in range(20)]
    assert sorted(pairs) == sorted((i, str(i)) for i in range(20))


def test_an_item_error_names_its_index_and_counts_as_taken():
    ds = Gated(12, bad={3, 7})
    with prefetch(ds, num_workers=2, multiprocessing_context="fork") as p:
        got, failed = [], []
        while p.remaining:
            try:
                got.append(p.take()[0])
            except ValueError as exc:
                assert str(exc) == f"bad item {exc.seqloader_index}"
                assert any(f"item {exc.seqloader_index} of prefetch" in n and "worker" in n and "pid" in n
                           for n in exc.__notes__)
                assert "in __getitem__" in str(exc.__cause__)
                failed.append(exc.seqloader_index)
        assert not p.closed
    assert sorted(failed) == [3, 7] and sorted(got + failed) == list(range(12))


def test_seek_with_skip_never_computes_the_skipped_items():
    ds = Gated(30)
    with prefetch(ds, num_workers=3, multiprocessing_context="fork") as p:
        p.seek(5, skip={5, 6, 9, 20})
        assert p.remaining == 21
        got = take_all(p)
    assert sorted(got) == sorted(set(range(5, 30)) - {5, 6, 9, 20})
    assert [i for i in range(30) if ds.seen[i]] == sorted(got)
    assert all(ds.seen[i] == 1 for i in got)


def test_a_resumed_reader_takes_exactly_the_items_the_first_one_had_not():
    n = 40
    ds1 = Gated(n, gated={4})
    with prefetch(ds1, num_workers=2, multiprocessing_context="fork", timeout=SAFETY) as first:
        # Window [4, 8) once 0..3 are taken: item 4 is stuck, 5, 6 and 7 are not (6 waits behind 4).
        before = [first.take()[0] for _ in range(6)]
        assert sorted(before) == [0, 1, 2, 3, 5, 7]
        watermark = min(set(range(n)) - set(before))
        above = {i for i in before if i > watermark}
        assert (watermark, above) == (4, {5, 7})
        ds1.gate.set()
    ds = Gated(n)
    with prefetch(ds, num_workers=3, multiprocessing_context="fork") as second:  # another topology
        second.seek(watermark, skip=above)
        after = take_all(second)
    assert sorted(before + after) == list(range(n))
    assert [i for i in range(n) if ds.seen[i]] == sorted(after)


def test_take_continues_an_in_order_read_ahead_without_computing_anything_twice():
    ds = Gated(20)
    with prefetch(ds, num_workers=2, multiprocessing_context="fork") as p:
        assert [p[0], p[1], p[2]] == [0, 1, 2]
        assert p.remaining == 17
        got = take_all(p)
        assert sorted(got) == list(range(3, 20)) and list(ds.seen) == [1] * 20
        assert p[5] == 5 and p[6] == 6  # indexing after take seeks
        assert p.remaining == 13 and sorted(take_all(p)) == list(range(7, 20))
        p.seek(18)
        assert p.remaining == 2 and sorted(take_all(p)) == [18, 19]


def test_take_and_reset():
    data = list(range(100, 150))
    with prefetch(sl.gather(data, list(range(10))), num_workers=2, shared=data) as p:
        partial = [p.take()[0] for _ in range(4)]
        assert len(set(partial)) == 4
        p.reset(sl.gather(data, list(range(20, 27))))
        assert p.remaining == 7
        pairs = sorted(p.take() for _ in range(7))
        assert pairs == [(i, 120 + i) for i in range(7)]
        p.reset(range(3))
        assert list(p) == [0, 1, 2]
        p.seek(1, skip={2})
        assert [p.take() for _ in range(p.remaining)] == [(1, 1)]


def test_seek_argument_errors_name_the_argument():
    with prefetch(range(10), num_workers=1) as p:
        with pytest.raises(IndexError, match=r"prefetch.seek: position 11 out of range \[0, 10\]"):
            p.seek(11)
        with pytest.raises(IndexError, match=r"prefetch.seek: position -1 out of range"):
            p.seek(-1)
        with pytest.raises(TypeError, match=r"prefetch.seek: position must be an int \(got float"):
            p.seek(1.0)
        with pytest.raises(IndexError, match=r"skip holds item 10, out of range \[2, 10\)"):
            p.seek(2, skip=[10])
        with pytest.raises(TypeError, match=r"prefetch.seek: every item of skip must be an int \(got str"):
            p.seek(2, skip=["3"])
        with pytest.raises(TypeError, match=r"prefetch.seek: skip must be an iterable of ints \(got int\)"):
            p.seek(2, skip=3)
        with pytest.raises(ValueError, match=r"prefetch.take: window must be a positive int \(got 0\)"):
            p.take(window=0)
        p.seek(10)
        assert p.remaining == 0
        with pytest.raises(IndexError, match="every item taken"):
            p.take()
    with pytest.raises(ValueError, match=r"after close\(\)"):
        p.take()
    with pytest.raises(ValueError, match=r"after close\(\)"):
        p.seek(0)


def test_take_times_out_and_stays_usable():
    ds = Gated(6, gated={0, 1})
    with prefetch(ds, num_workers=2, prefetch_factor=1, multiprocessing_context="fork", timeout=0.2) as p:
        with pytest.raises(ItemTimeout, match=r"timed out after 0.2 seconds waiting for any item to complete "
                                              r"\(the oldest not taken is item 0\) from worker 0") as info:
            p.take()
        assert info.value.item == 0 and not p.closed
        ds.gate.set()
        assert sorted(take_all(p)) == list(range(6))


class KillsItsWorker(Gated):
    def __getitem__(self, i):
        if i == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i)


def test_a_dead_worker_during_take_is_a_runtime_error():
    p = prefetch(KillsItsWorker(10), num_workers=2, multiprocessing_context="fork")
    with pytest.raises(WorkerDied, match=r"seqloader worker 0 \(pid \d+\) was killed by SIGKILL while producing "
                                         r"item 2"):
        take_all(p)
    assert p.closed
    with pytest.raises(ValueError, match="after an earlier error"):
        p.take()


class InterruptOnce(Gated):
    """Item 2 sends SIGINT to the reader the first time, then waits for the gate."""

    def __init__(self, n):
        super().__init__(n)
        self.fired = FORK.Value("i", 0, lock=False)

    def __getitem__(self, i):
        if i == 2 and not self.fired.value:
            self.fired.value = 1
            os.kill(os.getppid(), signal.SIGINT)
            self.gate.wait(SAFETY)
        return super().__getitem__(i)


def test_keyboard_interrupt_during_take_loses_and_repeats_nothing(sigint_raises):
    ds = InterruptOnce(20)
    p = prefetch(ds, num_workers=2, prefetch_factor=1, multiprocessing_context="fork", timeout=SAFETY)
    got = []
    with pytest.raises(KeyboardInterrupt):
        while p.remaining:
            got.append(p.take()[0])
    ds.gate.set()
    got += take_all(p)
    assert sorted(got) == list(range(20))
    p.close()


# ----------------------------------------------------------------------------- TakeWindow alone


@settings(max_examples=200)
@given(n=st.integers(0, 40), workers=st.integers(1, 5), room=st.integers(1, 3), window=st.integers(1, 12),
       data=st.data())
def test_take_window_hands_out_every_item_once_within_the_window(n, workers, room, window, data):
    start = data.draw(st.integers(0, n))
    skip = data.draw(st.frozensets(st.integers(start, max(start, n - 1)), max_size=5)) if n > start else frozenset()
    w = TakeWindow(n, workers, start, skip)
    queues = [[] for _ in range(workers)]  # a worker completes its items in the order it got them
    taken = []
    while w.remaining():
        for k in range(workers):
            for j in w.next_items(k, room - len(queues[k]), window):
                assert j % workers == k and j not in skip and start <= j < min(n, w.low + window)
                queues[k].append(j)
        busy = [k for k in range(workers) if queues[k]]
        assert busy, "nothing in flight while items remain"
        j = queues[data.draw(st.sampled_from(busy))].pop(0)
        w.taken(j)
        taken.append(j)
        assert len(w.done - skip) < window and all(i > w.low for i in w.done)
    assert sorted(taken) == sorted(set(range(start, n)) - skip)


def test_take_window_untaken_restores_the_item():
    w = TakeWindow(10, 2, 0)
    assert w.next_items(0, 2, 4) == [0, 2] and w.next_items(1, 2, 4) == [1, 3]
    for j in (1, 2, 0):
        w.taken(j)
    assert (w.low, w.done, w.remaining()) == (3, set(), 7)
    w.untaken(0)
    assert (w.low, w.done, w.remaining()) == (0, {1, 2}, 8)
    w.untaken(2)
    assert (w.low, w.done, w.remaining()) == (0, {1}, 9)
    r = w.restarted()
    assert (r.low, r.done) == (0, {1}) and r.next_items(0, 3, 10) == [0, 2, 4] and r.next_items(1, 3, 10) == [3, 5, 7]
