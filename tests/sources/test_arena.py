"""The arena of decoded blocks (``seqloader/sources/_arena.py``): single flight, no lock while
decoding, errors reaching every waiter, a bound on the wait. Threads are synchronised with
events (never timing); every wait is bounded."""

from __future__ import annotations

import re
import sys
import threading
import warnings

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

    def __call__(self, blocks, slots):
        with self.lock:
            self.calls.append(list(blocks))
        self.started.set()
        assert self.release.wait(BOUND)
        if self.fail is not None:
            raise self.fail
        return [({"block": b}, 100) for b in blocks]


def get(arena: Arena, blocks, decode, describe=str) -> dict:
    """The values of ``blocks`` (pinned only while they are read)."""
    with arena.pinned(blocks, decode, describe) as values:
        return dict(values)


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
    t1, box1 = run_in_thread(lambda: get(arena, [7], gate, str))
    assert gate.started.wait(BOUND)                      # thread 1 is decoding block 7 ...
    t2, box2 = run_in_thread(lambda: get(arena, [7], gate, str))
    wait_for_waiter(arena, 1)                            # ... and thread 2 waits for it
    gate.release.set()
    t1.join(BOUND), t2.join(BOUND)
    assert box1["value"] == box2["value"] == {7: {"block": 7}}
    assert box1["value"][7] is box2["value"][7]          # one decoded object, shared
    assert gate.calls == [[7]]
    assert arena.counters() == {"blocks_decoded": 1, "bytes_decoded": 100, "blocks_waited": 1, "items_read": 0,
                                "blocks_decoded_again": 0}


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
    wait_for_waiter(src._slots.get().arena, 1)
    release.set()
    t1.join(BOUND), t2.join(BOUND)
    assert box1["value"]["x"].tolist() == [1, 2, 3] and box2["value"]["x"].tolist() == [10, 4]
    counts = src.counters()
    assert counts["blocks_decoded"] == 1 and counts["blocks_waited"] == 1 and counts["items_read"] == 5


def test_different_blocks_decode_at_the_same_time():
    """No lock is held while decoding: two decodes of different blocks are in flight together."""
    arena: Arena = Arena(4, "test")
    both = threading.Barrier(2, timeout=BOUND)

    def decode(blocks, slots):
        both.wait()  # returns only when the other thread is inside its decode too
        return [(b, 1) for b in blocks]

    t1, box1 = run_in_thread(lambda: get(arena, [1], decode, str))
    t2, box2 = run_in_thread(lambda: get(arena, [2], decode, str))
    t1.join(BOUND), t2.join(BOUND)
    assert box1["value"] == {1: 1} and box2["value"] == {2: 2}
    assert arena.counters()["blocks_decoded"] == 2


def test_an_error_in_the_decode_reaches_every_waiter_and_is_not_remembered():
    arena: Arena = Arena(4, "test")
    gate = Gate(fail=OSError("disk on fire"))
    t1, box1 = run_in_thread(lambda: get(arena, [3], gate, str))
    assert gate.started.wait(BOUND)
    t2, box2 = run_in_thread(lambda: get(arena, [3], gate, str))
    wait_for_waiter(arena, 1)
    gate.release.set()
    t1.join(BOUND), t2.join(BOUND)
    assert isinstance(box1["error"], OSError) and str(box1["error"]) == "disk on fire"
    assert box2["error"] is box1["error"]                # the waiter gets the decode's own error
    assert gate.calls == [[3]]
    assert arena.counters()["blocks_decoded"] == 0
    gate.fail = None  # a later read tries again
    assert get(arena, [3], gate, str) == {3: {"block": 3}}


def test_a_waiter_gives_up_after_the_bound_naming_the_block(monkeypatch):
    monkeypatch.setattr(_arena, "WAIT_TIMEOUT", 0.0)
    arena: Arena = Arena(4, "parquet")
    gate = Gate()
    t1, box1 = run_in_thread(lambda: get(arena, [5], gate, lambda b: f"row group {b} of a.parquet"))
    assert gate.started.wait(BOUND)
    with pytest.raises(TimeoutError, match=re.escape("parquet: waited 0 s for row group 5 of a.parquet, which "
                                                     "another thread of this process is decoding")):
        get(arena, [5], gate, lambda b: f"row group {b} of a.parquet")
    gate.release.set()
    t1.join(BOUND)
    assert box1["value"] == {5: {"block": 5}}


def test_the_arena_keeps_the_blocks_used_last_and_a_batch_larger_than_it_still_gets_all():
    arena: Arena = Arena(2, "test")
    decode = (lambda blocks, slots: [(b * 10, 1) for b in blocks])
    assert get(arena, [1, 2, 3], decode, str) == {1: 10, 2: 20, 3: 30}
    assert arena.kept() == [2, 3]
    assert get(arena, [2], decode, str) == {2: 20} and arena.kept() == [3, 2]
    assert get(arena, [4], decode, str) == {4: 40} and arena.kept() == [2, 4]
    assert arena.counters()["blocks_decoded"] == 4


def test_many_threads_with_a_tiny_switch_interval_decode_each_block_once():
    """Nothing relies on the GIL: with a switch interval of 1 µs and 8 threads reading 16 blocks
    in an arena that keeps them all, each block is decoded exactly once and every value is right."""
    arena: Arena = Arena(16, "test")
    decodes: list[int] = []
    lock = threading.Lock()

    def decode(blocks, slots):
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
            got = get(arena, want, decode)
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


def test_a_pinned_block_is_neither_evicted_nor_has_its_slot_reused():
    arena: Arena = Arena(2, "test")
    decode = (lambda blocks, slots: [((b, s), 1) for b, s in zip(blocks, slots)])
    with arena.pinned([0, 1], decode, str) as held:
        assert held == {0: (0, 0), 1: (1, 1)}
        with arena.pinned([2], decode, str) as more:
            assert more == {2: (2, None)}                    # every slot pinned: none for block 2
            assert arena.kept() == [0, 1, 2]                 # over capacity while pinned
        assert arena.kept() == [0, 1]                        # 2, the only one unpinned, is dropped
    assert get(arena, [3], decode) == {3: (3, 0)}           # 0, least recently used, gives its slot
    assert arena.kept() == [1, 3]


def test_an_error_releases_the_pins_and_slots_of_the_call():
    arena: Arena = Arena(2, "test")
    ok = (lambda blocks, slots: [((b, s), 1) for b, s in zip(blocks, slots)])

    def fail(blocks, slots):
        raise ValueError("bad block")

    assert get(arena, [0], ok) == {0: (0, 0)}
    with pytest.raises(ValueError, match="bad block"):
        get(arena, [0, 1], fail)                             # 0 kept (pinned, then released); 1 fails
    assert arena.kept() == [0]
    assert get(arena, [1, 2], ok) == {1: (1, 1), 2: (2, 0)}  # slot 1 was given back; 0 evicted for 2


def test_claiming_a_slot_never_evicts_a_block_the_same_call_needs():
    arena: Arena = Arena(2, "test")
    decodes: list[int] = []

    def decode(blocks, slots):
        decodes.extend(blocks)
        return [((b, s), 1) for b, s in zip(blocks, slots)]

    get(arena, [6], decode)
    get(arena, [5], decode)                                   # kept: 6 (slot 0), then 5 (slot 1)
    assert get(arena, [1, 6], decode) == {1: (1, 1), 6: (6, 0)}   # 1 takes 5's slot, not 6's
    assert decodes == [6, 5, 1]


def plain(blocks, slots):
    return [({"block": b}, 1) for b in blocks]


def test_an_arena_smaller_than_its_readers_working_set_warns_once_with_the_fix():
    """Readers cycling over 3 blocks with room for 2: every decode is of a block just evicted."""
    arena = Arena(2, "parquet")
    with pytest.warns(_arena.ArenaTooSmall, match=r"cache_blocks=2 is too small .*block 1.*window \* \(num_workers \+ 1\)"):
        for _ in range(6):
            for b in (0, 1, 2):
                assert get(arena, [b], plain, lambda b: f"block {b}") == {b: {"block": b}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for b in (0, 1, 2) * 4:   # once per arena
            get(arena, [b], plain)
    assert arena.counters()["blocks_decoded_again"] >= 20


def test_an_arena_that_holds_its_readers_working_set_never_warns_across_epochs():
    """A window of 4 blocks at a time over 40 blocks, 30 epochs in shuffled orders, room for 4: the
    blocks of the last window of an epoch may come back in the first of the next (rarely: no warning)."""
    arena = Arena(4, "parquet")
    rng = np.random.default_rng(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(30):
            order = rng.permutation(40).tolist()
            for w in range(0, 40, 4):
                window = order[w:w + 4]
                for _ in range(3):   # batches mixing the rows of the window's blocks
                    get(arena, rng.permutation(window).tolist(), plain)
    # each block once per epoch, less those still kept from the epoch before
    assert 30 * 40 - 4 * 29 <= arena.counters()["blocks_decoded"] <= 30 * 40
