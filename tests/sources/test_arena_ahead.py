"""Decoding ahead of need (``Arena.ahead``, the ``Burst`` that runs it, the loader's ``ReadAhead``):
each block decoded once, a reader never waiting behind the queue, errors reaching the reader, no
thread left once nothing is queued (the loader's batches: tests/contract/test_read_ahead.py).
Threads are synchronised with events (never timing); every wait is bounded."""

from __future__ import annotations

import threading

import pytest

from forking import wait_until
from seqloader.loader.epoch.read_ahead import ReadAhead
from seqloader.sources._arena import Arena
from seqloader.threads.burst import Burst

BOUND = 30.0


def _ahead_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("seqloader-ahead") and t.is_alive()]


class Held:
    """A decode that records its thread and, for the blocks in ``hold``, waits for ``release``."""

    def __init__(self, hold=(), fail=None):
        self.hold, self.fail = set(hold), fail
        self.started, self.release = threading.Event(), threading.Event()
        self.by: dict[int, str] = {}
        self.lock = threading.Lock()

    def __call__(self, blocks, slots):
        for b in blocks:
            with self.lock:
                self.by[b] = threading.current_thread().name
            if b in self.hold:
                self.started.set()
                assert self.release.wait(BOUND)
        if self.fail is not None:
            raise self.fail
        return [({"block": b}, 10) for b in blocks]


def test_blocks_decoded_ahead_are_read_without_a_second_decode():
    arena, decode = Arena(4, "demo"), Held()
    assert arena.ahead([0, 1], decode) == 2
    with arena.pinned([0, 1], decode, str) as got:
        assert got == {0: {"block": 0}, 1: {"block": 1}}
    assert arena.ahead([0, 1], decode) == 0                   # kept: nothing more to do
    assert arena.counters()["blocks_decoded"] == 2
    assert wait_until(lambda: not _ahead_threads(), BOUND)    # the burst's threads ended when idle


def test_a_reader_decodes_a_claimed_block_whose_decode_has_not_begun():
    """The ahead threads are busy (block 0 held): block 9, claimed ahead and queued behind it, is
    decoded by the reader that needs it, which never waits for the queue."""
    arena, decode = Arena(8, "demo"), Held(hold={0, 1})
    arena.ahead([0, 1, 9], decode)                            # two threads, each holding a block
    assert decode.started.wait(BOUND)
    assert wait_until(lambda: len(decode.by) == 2, BOUND)
    with arena.pinned([9], decode, str) as got:               # (block 9 is still queued)
        assert got == {9: {"block": 9}}
    assert decode.by[9] == threading.current_thread().name
    decode.release.set()
    with arena.pinned([0, 1], decode, str) as got:
        assert sorted(got) == [0, 1]
    assert arena.counters()["blocks_decoded"] == 3
    assert wait_until(lambda: not _ahead_threads(), BOUND)


def test_a_reader_waiting_for_another_threads_decode_decodes_a_queued_claim_meanwhile():
    """Block 0 is being decoded by an ahead thread (held), block 1 by the other; a reader that needs
    block 0 decodes block 9, claimed ahead and still queued, instead of only waiting, then gets 0."""
    arena, decode = Arena(8, "demo"), Held(hold={0, 1})
    arena.ahead([0, 1, 9], decode)
    assert wait_until(lambda: len(decode.by) == 2, BOUND)      # both ahead threads hold a block
    got: dict = {}
    reader = threading.Thread(target=lambda: got.update(arena.pinned([0], decode, str).__enter__()),
                              name="the-reader")
    reader.start()
    assert wait_until(lambda: decode.by.get(9) == "the-reader", BOUND)   # helped while block 0 was decoding
    decode.release.set()
    reader.join(BOUND)
    assert not reader.is_alive() and got == {0: {"block": 0}}
    with arena.pinned([9], decode, str) as kept:               # kept: not decoded a second time
        assert kept == {9: {"block": 9}}
    assert arena.counters()["blocks_decoded"] == 3
    assert wait_until(lambda: not _ahead_threads(), BOUND)


def test_an_error_of_a_decode_ahead_reaches_the_reader_that_needs_the_block():
    arena, decode = Arena(4, "demo"), Held(fail=OSError("disk gone"))
    arena.ahead([3], decode)
    assert wait_until(lambda: not _ahead_threads(), BOUND)   # the ahead decode failed, nothing kept
    assert arena.kept() == []
    with pytest.raises(OSError, match="disk gone"):
        with arena.pinned([3], decode, str):
            pass


def test_a_claim_ahead_never_evicts_a_pinned_block():
    arena, decode = Arena(2, "demo"), Held()
    with arena.pinned([0, 1], decode, str):
        assert arena.ahead([2, 3], decode) == 0               # every slot pinned: nothing claimed
    assert arena.ahead([2], decode) == 1                      # the least recently used gives its slot


def test_a_claim_ahead_never_evicts_a_block_decoded_ahead_and_not_read_yet():
    """Two lanes: lane 0 moves to its next window and claims the one after while lane 1's next
    window, decoded ahead, waits unread; least-recently-used would evict it (decoded twice)."""
    arena, decode = Arena(6, "demo"), Held()
    for b in (0, 1):                                          # the current windows, read
        with arena.pinned([b], decode, str):
            pass
    assert arena.ahead([2, 3], decode) == 2                   # each lane's next window, decoded ahead
    assert wait_until(lambda: arena.counters()["blocks_decoded"] == 4, BOUND)
    with arena.pinned([2], decode, str):                      # lane 0 reads its next window
        pass
    with arena.pinned([1], decode, str):                      # lane 1 still reads its current one
        pass
    assert arena.ahead([4, 5], decode) == 2                   # free slots
    assert wait_until(lambda: arena.counters()["blocks_decoded"] == 6, BOUND)
    assert arena.ahead([6], decode) == 1                      # lane 0's window after next: evicts block 0
    assert wait_until(lambda: arena.counters()["blocks_decoded"] == 7, BOUND)
    assert 3 in arena.kept() and 0 not in arena.kept()        # block 3 (unread) kept, block 0 (read) evicted
    assert arena.ahead([7, 8, 9], decode) == 2                # blocks 1 and 2 read: their slots; 3-6 unread: not
    assert wait_until(lambda: arena.counters()["blocks_decoded"] == 9, BOUND)
    with arena.pinned([3], decode, str) as got:               # read at last, without a second decode
        assert got == {3: {"block": 3}}
    assert arena.counters()["blocks_decoded"] == 9 and arena.counters()["blocks_decoded_again"] == 0


def test_a_burst_ends_its_threads_when_idle_and_close_drops_the_queue():
    ran, gate = [], threading.Event()
    burst = Burst("seqloader-ahead-test", 1)
    burst.submit(lambda: gate.wait(BOUND))
    for k in range(3):
        burst.submit(lambda k=k: ran.append(k))
    gate.set()
    assert burst.idle(BOUND) and ran == [0, 1, 2]
    assert not _ahead_threads()
    burst.submit(lambda: ran.append(3))                       # a new burst starts a thread again
    assert wait_until(lambda: ran == [0, 1, 2, 3], BOUND) and burst.idle(BOUND)
    burst.close()
    burst.submit(lambda: ran.append(4))                       # closed: nothing runs
    assert burst.idle(BOUND) and ran == [0, 1, 2, 3]


def test_the_read_ahead_looks_one_lanes_window_ahead_and_batch_0_at_every_lanes_first():
    ahead = ReadAhead(distance=4, every=1, lanes=2, threads=3)
    asked = []

    class Plan:   # (an OrderPlan from the epoch's start)
        start, bs, world = 0, 1, 1

        def __len__(self):
            return 10

        def window_rows(self, b):
            return [b]

    class Data:
        def decode_ahead(self, indices, threads):
            asked.append((indices, threads))

    for b in range(10):
        ahead(Data(), Plan(), b)
    assert asked == [([0], 3), ([1], 3)] + [([b + 4], 3) for b in range(6)]
