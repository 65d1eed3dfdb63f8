"""Where :class:`~seqloader.loader.epoch.read_ahead.ReadAhead` looks ahead: the same batches of the
epoch whether its plan starts at the epoch's start or mid-epoch (a resume, an autotune switch).

Issue 43 measured a plan started an odd number of batches in (autotune's switch after its first
batch): its looks, counted from the plan's first batch, fell out of step with the lanes, and two
thread workers delivered 15% fewer batches per second for the rest of the epoch.
"""

from __future__ import annotations

from seqloader.loader.epoch.read_ahead import ReadAhead


class Plan:
    """The part of an ``OrderPlan`` the read-ahead reads: ``start`` samples in, batches of ``bs``."""

    def __init__(self, batches: int, start_batch: int, bs: int = 4):
        self.start, self.bs, self.world = start_batch * bs, bs, 1
        self._len = batches - start_batch

    def __len__(self) -> int:
        return self._len

    def window_rows(self, b: int) -> list:
        return [self.start // self.bs + b]   # (the epoch's batch number, to see which was asked for)


class Dataset:
    def __init__(self):
        self.asked: list = []

    def decode_ahead(self, rows, threads):
        self.asked.append(rows[0])


def asked(start_batch: int) -> list:
    ahead, data, plan = ReadAhead(distance=8, every=2, lanes=2, threads=2), Dataset(), Plan(40, start_batch)
    for b in range(len(plan)):
        ahead(data, plan, b)
    return data.asked


def test_a_plan_started_mid_epoch_looks_at_the_batches_of_the_whole_epoch_s_plan():
    whole = asked(0)
    assert whole[:5] == [0, 1, 8, 9, 12]   # the lanes' first windows, then the looks of batches 0, 1 and 4
    for start in (1, 3, 7, 12):
        resumed = asked(start)
        first = [start, start + 1, start + 8]   # its first batch asks for the lanes' windows and its own next
        assert resumed[:3] == first, start
        assert resumed[3:] == [b for b in whole if b > start + 8], start   # then the epoch's own looks
