"""The arena of decoded blocks (``seqloader/sources/_arena.py``): single flight, no lock while
decoding, errors reaching every waiter, a bound on the wait. Threads are synchronised with
events (never timing); every wait is bounded."""

from __future__ import annotations

import re
import sys
import threading

import numpy as np
import pytest

from seqloader.sources import _arena
from seqloader.sources._arena import Arena

BOUND = 30.0  # seconds: generous bound on every wait of these tests


class Gate:
    """A decode that announces it started and waits for ``release`` before returning."""

    def __init__(self, fail: BaseException | None = None):
        self.started = threading.Event()
        self.release = threading.Event()
        self.calls: list[list[int]] = []
        self.fail = fail
        self.lock = threading.Lock()

    def __call__(self, blocks):
        with self.lock:
            self.calls.append(list(blocks))
        self.started.set()
        assert self.release.wait(BOUND)
        if self.fail is not None:
            raise self.fail
        return [({"block": b}, 100) for b in blocks]


def run_in_thread(fn):
    """Start ``fn()`` in a thread; returns ``(thread, box)`` with ``box["value"]`` or ``box["error"]``."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box


def wait_for_waiter(arena: Arena, n: int) -> None:
    """Until ``n`` threads have registered as waiting on another's decode (bounded)."""
    done = threading.Event()
    for _ in range(int(BOUND / 0.01)):
        if arena.counters()["blocks_waited"] >= n:
            done.set()
            break
        done.wait(0.01)
    assert done.is_set(), "the second thread never asked for the block"


def test_two_threads_asking_for_one_block_decode_it_once():
    arena: Arena = Arena(4, "test")
    gate = Gate()
    t1, box1 = run_in_thread(lambda: arena.get([7], gate, str))
    assert gate.started.wait(BOUND)                      # thread 1 is decoding block 7 ...
    t2, box2 = run_in_thread(lambda: arena.get([7], gate, str))
    wait_for_waiter(arena, 1)                            # ... and thread 2 waits for it
    gate.release.set()
    t1.join(BOUND), t2.join(BOUND)
    assert box1["value"] == box2["value"] == {7: {"block": 7}}
    assert box1["value"][7] is box2["value"][7]          # one decoded object, shared
    assert gate.calls == [[7]]
    assert arena.counters() == {"blocks_decoded": 1, "bytes_decoded": 100, "blocks_waited": 1, "items_read": 0}


def test_a_parquet_row_group_needed_by_two_threads_is_decoded_once(tmp_path, monkeypatch):
    """Through the source: the second thread waits for the first's decode (counted by the source)."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    import seqloader

    pq.write_table(pa.table({"x": np.arange(100)}), tmp_path / "a.parquet", row_group_size=50)
    src = seqloader.parquet(tmp_path, columnar=True)
    entered, release = threading.Event(), threading.Event()
    real = src._read_blocks

    def slow_read(blocks):
        entered.set()
        assert release.wait(BOUND)
        return real(blocks)

    monkeypatch.setattr(src, "_read_blocks", slow_read)
    t1, box1 = run_in_thread(lambda: src.__getitems__([1, 2, 3]))
    assert entered.wait(BOUND)
    t2, box2 = run_in_thread(lambda: src.__getitems__([10, 4]))
    wait_for_waiter(src._arena.get(), 1)
    release.set()
    t1.join(BOUND), t2.join(BOUND)
    assert box1["value"]["x"].tolist() == [1, 2, 3] and box2["value"]["x"].tolist() == [10, 4]
    counts = src.counters()
    assert counts["blocks_decoded"] == 1 and counts["blocks_waited"] == 1 and counts["items_read"] == 5


def test_different_blocks_decode_at_the_same_time():
    """No lock is held while decoding: two decodes of different blocks are in flight together."""
    arena: Arena = Arena(4, "test")
    both = threading.Barrier(2, timeout=BOUND)

    def decode(blocks):
        both.wait()  # returns only when the other thread is inside its decode too
        return [(b, 1) for b in blocks]

    t1, box1 = run_in_thread(lambda: arena.get([1], decode, str))
    t2, box2 = run_in_thread(lambda: arena.get([2], decode, str))
    t1.join(BOUND), t2.join(BOUND)
    assert box1["value"] == {1: 1} and box2["value"] == {2: 2}
    assert arena.counters()["blocks_decoded"] == 2


def test_an_error_in_the_decode_reaches_every_waiter_and_is_not_remembered():
    arena: Arena = Arena(4, "test")
    gate = Gate(fail=OSError("disk on fire"))
    t1, box1 = run_in_thread(lambda: arena.get([3], gate, str))
    assert gate.started.wait(BOUND)
    t2, box2 = run_in_thread(lambda: arena.get([3], gate, str))
    wait_for_waiter(arena, 1)
    gate.release.set()
    t1.join(BOUND), t2.join(BOUND)
    assert isinstance(box1["error"], OSError) and str(box1["error"]) == "disk on fire"
    assert box2["error"] is box1["error"]                # the waiter gets the decode's own error
    assert gate.calls == [[3]]
    assert arena.counters()["blocks_decoded"] == 0
    gate.fail = None  # a later read tries again
    assert arena.get([3], gate, str) == {3: {"block": 3}}


def test_a_waiter_gives_up_after_the_bound_naming_the_block(monkeypatch):
    monkeypatch.setattr(_arena, "WAIT_TIMEOUT", 0.0)
    arena: Arena = Arena(4, "parquet")
    gate = Gate()
    t1, box1 = run_in_thread(lambda: arena.get([5], gate, lambda b: f"row group {b} of a.parquet"))
    assert gate.started.wait(BOUND)
    with pytest.raises(TimeoutError, match=re.escape("parquet: waited 0 s for row group 5 of a.parquet, which "
                                                     "another thread of this process is decoding")):
        arena.get([5], gate, lambda b: f"row group {b} of a.parquet")
    gate.release.set()
    t1.join(BOUND)
    assert box1["value"] == {5: {"block": 5}}


def test_the_arena_keeps_the_blocks_used_last_and_a_batch_larger_than_it_still_gets_all():
    arena: Arena = Arena(2, "test")
    decode = (lambda blocks: [(b * 10, 1) for b in blocks])
    assert arena.get([1, 2, 3], decode, str) == {1: 10, 2: 20, 3: 30}
    assert arena.kept() == [2, 3]
    assert arena.get([2], decode, str) == {2: 20} and arena.kept() == [3, 2]
    assert arena.get([4], decode, str) == {4: 40} and arena.kept() == [2, 4]
    assert arena.counters()["blocks_decoded"] == 4


def test_many_threads_with_a_tiny_switch_interval_decode_each_block_once():
    """Nothing relies on the GIL: with a switch interval of 1 µs and 8 threads reading 16 blocks
    in an arena that keeps them all, each block is decoded exactly once and every value is right."""
    arena: Arena = Arena(16, "test")
    decodes: list[int] = []
    lock = threading.Lock()

    def decode(blocks):
        with lock:
            decodes.extend(blocks)
        return [(np.full(3, b), 1) for b in blocks]

    start = threading.Barrier(8, timeout=BOUND)
    errors: list[BaseException] = []

    def reader(k: int):
        start.wait()
        rng = np.random.default_rng(k)
        for _ in range(200):
            want = sorted(set(rng.integers(0, 16, 3).tolist()))
            got = arena.get(want, decode, str)
            if sorted(got) != want or any(got[b].tolist() != [b] * 3 for b in want):
                errors.append(AssertionError(f"thread {k}: {got}"))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=reader, args=(k,), daemon=True) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(BOUND)
    finally:
        sys.setswitchinterval(old)
    assert not errors and not any(t.is_alive() for t in threads)
    assert sorted(decodes) == list(range(16))
    assert arena.counters()["blocks_decoded"] == 16
