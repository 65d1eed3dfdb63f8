"""Healing (``prefetch(restarts=, respawn=)``): a dead worker is replaced and what it owed recomputed.

Workers are killed with SIGKILL by the items themselves, at items the test chooses; "the first
time only" is a marker file created with ``O_EXCL`` (exactly one process wins), so a test can
check that a kill happened exactly once. Nothing waits on a timer. The ``no_leaks`` fixture
(tests/conftest.py) checks that no process or ``/dev/shm`` segment outlives a test.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import signal
import time

import numpy as np
import psutil
import pytest

from seqloader import prefetch
from seqloader.prefetcher.faults import WorkerDied

FORK = multiprocessing.get_context("fork")


def kill_once(marker: str) -> None:
    """SIGKILL this process, unless an earlier call (in any process) created ``marker``."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


def kill_always(directory: str) -> None:
    """SIGKILL this process, leaving one file per kill in ``directory`` (to count them)."""
    open(os.path.join(directory, f"killed-{os.getpid()}"), "w").close()
    os.kill(os.getpid(), signal.SIGKILL)


class KillsAt:
    """Item ``i`` is ``10 * i`` (an array with ``arrays``); items in ``once`` kill their worker the
    first time, items in ``always`` every time."""

    def __init__(self, tmp, n=20, once=(), always=(), arrays=False):
        self.tmp, self.n, self.once, self.always, self.arrays = str(tmp), n, set(once), set(always), arrays

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.once:
            kill_once(os.path.join(self.tmp, f"once-{i}"))
        if i in self.always:
            kill_always(self.tmp)
        return np.full(1000, 10 * i) if self.arrays else 10 * i


def read_all(p, how):
    if how == "in order":
        return list(p)
    out = []
    while p.remaining:
        out.append(p.take())
    return [v for _, v in sorted(out, key=lambda x: x[0])]


def heal_records(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "seqloader" and r.levelno == logging.WARNING]


@pytest.mark.parametrize("how, affinity", [("in order", True), ("take", True), ("take", False)])
def test_a_killed_worker_is_replaced_and_every_item_is_computed_once_more(tmp_path, caplog, how, affinity):
    caplog.set_level(logging.WARNING, logger="seqloader")
    with prefetch(KillsAt(tmp_path, once={5}), num_workers=2, restarts=1, affinity=affinity) as p:
        assert read_all(p, how) == [10 * i for i in range(20)]
        c = p.counters()
    assert (tmp_path / "once-5").exists()  # the kill happened, exactly once (O_EXCL)
    assert c["restarts"] == 1 and sum(w["restarts"] for w in c["workers"]) == 1
    assert sum(w["items"] for w in c["workers"]) >= 20
    (line,) = heal_records(caplog)
    assert "was killed by SIGKILL while producing item 5" in line and "restart 1 of at most 1" in line
    assert "replaced by worker" in line
    # 5, and whatever else the dead worker had computed that was not returned yet (a reply that
    # arrived in the same wait as the death): which ones depends on timing, not on the rule
    again = {int(x) for x in line.rsplit("items computed again: ", 1)[1].split(", ")}
    assert 5 in again and again <= set(range(5, 20)) | {3, 4}


def test_a_replacement_starts_with_the_spawn_method_too(tmp_path):
    with prefetch(KillsAt(tmp_path, once={4}), num_workers=2, restarts=1, multiprocessing_context="spawn") as p:
        assert list(p) == [10 * i for i in range(20)] and p.counters()["restarts"] == 1


def record_start(directory, worker_id):
    open(os.path.join(directory, f"start-{worker_id}-{os.getpid()}"), "w").close()


def test_the_replacement_keeps_the_worker_id_and_runs_the_same_worker_init_fn(tmp_path):
    starts = tmp_path / "starts"
    starts.mkdir()
    init = functools.partial(record_start, str(starts))
    with prefetch(KillsAt(tmp_path, once={3}), num_workers=2, restarts=2, worker_init_fn=init) as p:
        assert list(p) == [10 * i for i in range(20)]
        pids = [h.pid for h in p._executor.handles]
    names = sorted(os.listdir(starts))
    by_worker = {w: sorted(n for n in names if n.startswith(f"start-{w}-")) for w in (0, 1)}
    assert len(by_worker[0]) == 1 and len(by_worker[1]) == 2  # item 3 is worker 1's
    assert f"start-1-{pids[1]}" in by_worker[1]  # the replacement ran worker 1's set-up


def test_leased_values_of_the_dead_worker_stay_valid_and_its_slots_are_freed(tmp_path):
    with prefetch(KillsAt(tmp_path, once={9}, arrays=True), num_workers=2, restarts=1) as p:
        kept = [p[i] for i in range(8)]  # views of both workers' slots
        rest = [p[i] for i in range(8, 20)]
        assert p.counters()["restarts"] == 1
    for i, a in enumerate(kept + rest):
        assert (a == 10 * i).all()
    del kept, rest  # the no_leaks fixture checks that the segments are gone


class Turns:
    """Per-process state, like a stream: worker ``w`` of ``n`` must be asked for its turns
    ``start + k*n`` (``start`` its first turn at or after ``first``) one after another."""

    def __init__(self, tmp, first=0, n=2, length=16, kill=(), pid_of=None):
        self.tmp, self.first, self.n, self.length, self.kill = str(tmp), first, n, length, set(kill)
        self.pid_of, self.next = pid_of, None

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        if self.next is None:
            self.next = self.first + (i % self.n - self.first) % self.n
        if i != self.next:
            raise AssertionError(f"turn {i} asked for, the next is {self.next}")
        self.next += self.n
        if i in self.kill:
            kill_once(os.path.join(self.tmp, f"turn-{i}"))
        return i


def test_respawn_restarts_a_per_process_state_after_the_last_item_returned(tmp_path):
    returned, asked = [], []

    def respawn(worker_id):  # what the worker owes: its turns after the last one returned
        asked.append(worker_id)
        mine = [i for i in returned if i % 2 == worker_id]
        return Turns(tmp_path, first=mine[-1] + 1 if mine else 0)

    with prefetch(Turns(tmp_path, kill={7}), num_workers=2, restarts=1, respawn=respawn) as p:
        for i in range(16):
            returned.append(p[i])  # one at a time: respawn reads what was returned so far
    assert returned == list(range(16)) and asked == [1]


class DiesAfterReplying(Turns):
    """Worker 1 replies with item 1, then dies in item 3 (once); worker 0 holds item 0 until
    worker 1 is dead, so the reader learns of the death while item 1 has arrived, unread."""

    def __init__(self, tmp, dying, pid, first=0):
        super().__init__(tmp, first=first, kill={3})
        self.dying, self.pid = dying, pid

    def __getitem__(self, i):
        if i == 3 and not self.pid.value:  # the first worker 1 only (its replacement computes it again)
            self.pid.value = os.getpid()
            self.dying.set()
        if i == 0 and self.first == 0:
            assert self.dying.wait(60), "worker 1 never reached item 3"
            deadline = time.monotonic() + 60  # a bound, not a timing
            while psutil.pid_exists(self.pid.value) and \
                    psutil.Process(self.pid.value).status() != psutil.STATUS_ZOMBIE:
                assert time.monotonic() < deadline, "worker 1 did not die"
                time.sleep(0.01)
        return super().__getitem__(i)


def test_results_that_arrived_but_were_not_returned_are_recomputed(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="seqloader")
    dying, pid = FORK.Event(), FORK.Value("i", 0)
    returned = []

    def respawn(worker_id):  # the first turn of worker_id not returned
        mine = [i for i in returned if i % 2 == worker_id]
        return DiesAfterReplying(tmp_path, dying, pid, first=mine[-1] + 1 if mine else 0)

    with prefetch(DiesAfterReplying(tmp_path, dying, pid), num_workers=2, restarts=1, respawn=respawn,
                  multiprocessing_context="fork") as p:
        for i in range(16):
            returned.append(p[i])
    assert returned == list(range(16))
    (line,) = heal_records(caplog)  # item 1 had arrived: it is computed again, by the replacement
    assert "worker 1" in line and "while producing item 3" in line and "items computed again: 1, 3" in line


def test_an_item_that_kills_two_workers_is_a_poison_item_and_is_not_computed_again(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="seqloader")
    p = prefetch(KillsAt(tmp_path, always={6}), num_workers=2, restarts=5)
    with pytest.raises(WorkerDied, match=r"while producing item 6; item 6 killed two workers \(first: worker 0 "
                                         r"\(pid \d+\) was killed by SIGKILL\), so it is a poison item") as info:
        list(p)
    assert info.value.poison and info.value.item == 6 and info.value.worker_id == 0
    assert len([n for n in os.listdir(tmp_path) if n.startswith("killed-")]) == 2  # no loop
    assert len(heal_records(caplog)) == 1 and p.closed


def test_restarts_are_bounded_per_sequence_and_reset_starts_a_new_count(tmp_path):
    with prefetch(KillsAt(tmp_path, once={2}), num_workers=2, restarts=1) as p:
        assert list(p) == [10 * i for i in range(20)]
        p.reset(KillsAt(tmp_path, once={3}))  # a new sequence: a new budget
        assert list(p) == [10 * i for i in range(20)]
        assert p.counters()["restarts"] == 2
    p = prefetch(KillsAt(tmp_path, once={4, 5}), num_workers=2, restarts=1)  # either may die first
    with pytest.raises(WorkerDied, match=r"killed by SIGKILL while producing item [45]; not replaced: the 1 "
                                         r"restart\(s\) allowed for this sequence \(restarts=\) are used"):
        list(p)
    assert p.closed


def test_a_worker_killed_from_outside_while_idle_is_replaced(tmp_path):
    class Pid:
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return os.getpid()

    with prefetch(Pid(), num_workers=2, prefetch_factor=1, restarts=1) as p:
        victim = psutil.Process(p[0])
        victim.kill()
        deadline = time.monotonic() + 60  # a bound, not a timing: the kill is seen well before
        while victim.status() != psutil.STATUS_ZOMBIE:  # not reaped: its parent must
            assert time.monotonic() < deadline, "the killed worker never became a zombie"
            time.sleep(0.01)
        rest = list(p[1:])
        assert victim.pid not in rest and len(rest) == 9 and p.counters()["restarts"] == 1


def dies_in_set_up(directory, worker_id):
    if worker_id == 1:
        kill_once(os.path.join(directory, "set-up"))


def always_dies_in_set_up(worker_id):
    if worker_id == 1:
        os.kill(os.getpid(), signal.SIGKILL)


def test_a_worker_that_dies_in_its_set_up_is_replaced_once_and_not_forever(tmp_path):
    init = functools.partial(dies_in_set_up, str(tmp_path))
    with prefetch(range(6), num_workers=2, restarts=3, worker_init_fn=init) as p:
        assert list(p) == list(range(6)) and p.counters()["restarts"] == 1
    p = prefetch(range(6), num_workers=2, restarts=3, worker_init_fn=always_dies_in_set_up)
    with pytest.raises(WorkerDied, match=r"worker 1 \(pid \d+\) was killed by SIGKILL while starting \(before "
                                         r"its set-up and worker_init_fn finished\); not replaced again"):
        p.start()
    assert p.closed


def test_an_error_of_respawn_is_raised_as_the_death_with_its_cause(tmp_path):
    def respawn(worker_id):
        raise LookupError(f"no record for worker {worker_id}")

    p = prefetch(KillsAt(tmp_path, once={1}), num_workers=2, restarts=1, respawn=respawn)
    with pytest.raises(WorkerDied, match=r"item 1; not replaced: respawn\(1\) raised LookupError: no record "
                                         r"for worker 1") as info:
        list(p)
    assert isinstance(info.value.__cause__, LookupError) and p.closed


def test_without_restarts_a_death_raises_as_before_and_nothing_is_logged(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="seqloader")
    p = prefetch(KillsAt(tmp_path, once={5}), num_workers=2)
    with pytest.raises(WorkerDied, match=r"^prefetch\(num_workers=2, prefetch_factor=2, len=20\): seqloader "
                                         r"worker 1 \(pid \d+\) was killed by SIGKILL while producing item 5$"):
        list(p)
    assert not heal_records(caplog) and p.counters()["restarts"] == 0


def test_arguments_are_checked():
    with pytest.raises(ValueError, match=r"restarts must be >= 0 \(got -1\)"):
        prefetch(range(3), 1, restarts=-1)
    with pytest.raises(TypeError, match="restarts must be an int"):
        prefetch(range(3), 1, restarts=1.5)
    with pytest.raises(ValueError, match="respawn is called only when a dead worker is replaced"):
        prefetch(range(3), 1, respawn=lambda w: None)
    with pytest.raises(TypeError, match="respawn must be callable or None"):
        prefetch(range(3), 1, restarts=1, respawn=3)
    with pytest.raises(ValueError, match="restarts applies to worker processes only"):
        prefetch(range(3), 1, method="thread", restarts=1)


def test_describe_names_the_item_in_the_owners_words_and_follows_reset(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="seqloader")

    def describe(seq, i):
        if i == 7:
            raise KeyError("no name")
        return f"row {i} of a sequence of {len(seq)}"

    with prefetch(KillsAt(tmp_path, n=10), num_workers=2, restarts=1, describe=describe) as p:
        assert list(p) == [10 * i for i in range(10)]
        p.reset(KillsAt(tmp_path, n=12, once={5}))  # the words follow the sequence read
        assert list(p) == [10 * i for i in range(12)]
        p.reset(KillsAt(tmp_path, n=9, once={7}))
        assert list(p) == [10 * i for i in range(9)]
    first, second = heal_records(caplog)
    assert "was killed by SIGKILL while producing row 5 of a sequence of 12;" in first
    assert "while producing item 7 (describe raised KeyError: 'no name');" in second  # a message never fails
    with pytest.raises(TypeError, match="describe must be callable or None"):
        prefetch(range(3), num_workers=1, describe="row")
    with prefetch(range(3), num_workers=1, method="thread", describe=describe) as p:  # any executor names items
        assert list(p) == [0, 1, 2]
