"""What every executor shows in a timeline: ``with loader.trace(path):`` (issue 45, item 2).

A Chrome trace event file: one lane per worker with an event per batch it computed (its number in
the epoch, after a resume too) and, with ``profile_stages``, per stage inside it; a lane for the
training loop with its waits for data; microseconds of ``time.perf_counter_ns()``'s clock; written
when the block exits, by an exception too; at most ``max_events`` events; batches unchanged.
"""

from __future__ import annotations

import collections
import json
import time

import pytest
import torch
from torch.profiler import profile

import seqloader
from contract_fixtures import executor, no_leaks, process_executor, ray_cluster  # noqa: F401 (fixtures)
from contract_items import ThreadSafeDraws
from tools import trace_view

N, BATCH = 48, 4   # 12 batches


def _load(path) -> dict:
    with open(path) as f:
        return json.load(f)


def _timed(doc: dict, cat: str) -> list[dict]:
    return sorted((e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == cat), key=lambda e: e["ts"])


def _names(doc: dict, what: str) -> dict:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == what}


def _lanes_do_not_overlap(events: list[dict]) -> None:
    by_lane = collections.defaultdict(list)
    for e in events:
        by_lane[(e["pid"], e["tid"])].append(e)
    for lane in by_lane.values():
        lane.sort(key=lambda e: e["ts"])
        for a, b in zip(lane, lane[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, (a, b)


def test_lanes_batches_and_the_clock(executor, tmp_path):
    make = lambda: seqloader.DataLoader(ThreadSafeDraws(N), batch_size=BATCH, seed=0, **executor)  # noqa: E731
    expected = list(make())
    loader = make()
    before = time.perf_counter_ns()
    with loader.trace(tmp_path / "t.json"):
        batches = list(loader)
    after = time.perf_counter_ns()
    assert len(batches) == len(expected) == N // BATCH
    assert all(torch.equal(a, b) for a, b in zip(batches, expected))   # a trace changes no batch

    doc = _load(tmp_path / "t.json")
    processes = set(_names(doc, "process_name").values())
    assert processes == {"training loop", "worker 0", "worker 1"}
    done = _timed(doc, "batch")
    # one event per batch, on the worker that computed it (in order: batch b on worker b % 2)
    assert collections.Counter(e["args"]["batch"] for e in done) == {b: 1 for b in range(N // BATCH)}
    assert all(e["name"] == f"batch {e['args']['batch']}" and e["pid"] - 1 == e["args"]["batch"] % 2 for e in done)
    waits = _timed(doc, "loop")
    assert [e["args"]["next"] for e in waits] == list(range(1, N // BATCH + 1))
    assert {(e["pid"], e["tid"]) for e in waits} == {(0, 0)} and _names(doc, "thread_name")[(0, 0)] == "training loop"
    # microseconds of perf_counter_ns's clock, for the workers' events too (processes, actors)
    for e in done + waits:
        assert before / 1000 <= e["ts"] and e["ts"] + e["dur"] <= after / 1000 and e["dur"] >= 0, e
    _lanes_do_not_overlap(done)
    _lanes_do_not_overlap(waits)
    assert doc["otherData"]["dropped_events"] == 0 and doc["otherData"]["truncated"] is False

    # the picture (item 4): one row per lane, the training loop first, every event on its row
    rows = trace_view.render(doc, str(tmp_path / "t.png"))
    assert [r.label for r in rows][0] == "training loop"
    assert [r.key for r in rows] == sorted(_names(doc, "thread_name"), key=lambda k: (k[0], k[1]))
    assert sum(len(r.events) for r in rows) == len(done) + len(waits)
    assert {r.key for r in rows if r.events} == {(e["pid"], e["tid"]) for e in done + waits}
    assert (tmp_path / "t.png").stat().st_size > 0


def test_stages_inside_their_batch(executor, tmp_path):
    loader = seqloader.DataLoader(list(range(N)), batch_size=BATCH, seed=0, profile_stages=True, **executor)
    with loader.trace(tmp_path / "t.json"):
        list(loader)
    doc = _load(tmp_path / "t.json")
    batches = {e["args"]["batch"]: e for e in _timed(doc, "batch")}
    stages = _timed(doc, "stage")
    assert {"fetch", "collate"} <= {e["name"] for e in stages}
    assert {e["args"]["batch"] for e in stages} == set(batches) == set(range(N // BATCH))
    for e in stages:
        b = batches[e["args"]["batch"]]
        assert (e["pid"], e["tid"]) == (b["pid"], b["tid"])
        assert b["ts"] <= e["ts"] and e["ts"] + e["dur"] <= b["ts"] + b["dur"] + 1e-3, (e, b)
    _lanes_do_not_overlap(stages)


def test_batch_numbers_are_the_epochs_after_a_resume(executor, tmp_path):
    make = lambda: seqloader.DataLoader(ThreadSafeDraws(N), batch_size=BATCH, shuffle=True, seed=3, **executor)  # noqa: E731
    first = make()
    it = iter(first)
    for _ in range(5):
        next(it)
    state = first.state_dict()
    expected = list(it)
    del it
    loader = make()
    loader.load_state_dict(state)
    with loader.trace(tmp_path / "t.json"):
        rest = list(loader)
    assert len(rest) == len(expected) and all(torch.equal(a, b) for a, b in zip(rest, expected))
    numbers = [e["args"]["batch"] for e in _timed(_load(tmp_path / "t.json"), "batch")]
    assert collections.Counter(numbers) == {b: 1 for b in range(5, N // BATCH)}


def test_written_when_the_block_raises(executor, tmp_path):
    loader = seqloader.DataLoader(list(range(N)), batch_size=BATCH, seed=0, **executor)
    it = iter(loader)
    with pytest.raises(KeyError, match="the training step failed"):
        with loader.trace(tmp_path / "t.json"):
            for _ in range(3):
                next(it)
            raise KeyError("the training step failed")
    del it
    doc = _load(tmp_path / "t.json")
    assert [e["args"]["next"] for e in _timed(doc, "loop")] == [1, 2, 3]
    assert {0, 1, 2} <= {e["args"]["batch"] for e in _timed(doc, "batch")}


def test_the_cap_keeps_the_first_events_and_says_so(executor, tmp_path):
    loader = seqloader.DataLoader(list(range(N)), batch_size=BATCH, seed=0, **executor)
    with pytest.warns(UserWarning, match=r"DataLoader.trace: 5 events recorded \(max_events=5\)"):
        with loader.trace(tmp_path / "t.json", max_events=5) as t:
            list(loader)
    doc = _load(tmp_path / "t.json")
    timed = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(timed) == 5 and doc["otherData"]["max_events"] == 5 and doc["otherData"]["truncated"] is True
    # every batch and every wait was an event: 12 of each, 5 kept
    assert doc["otherData"]["dropped_events"] == t.dropped == 2 * (N // BATCH) - 5


def test_num_workers_0_has_the_training_loop_only(tmp_path):
    loader = seqloader.DataLoader(list(range(N)), batch_size=BATCH, seed=0)
    with loader.trace(tmp_path / "t.json"):
        list(loader)
    doc = _load(tmp_path / "t.json")
    assert set(_names(doc, "process_name").values()) == {"training loop"}
    assert len(_timed(doc, "loop")) == N // BATCH and _timed(doc, "batch") == []


def test_one_trace_at_a_time_and_an_unwritable_path_fails_at_entry(tmp_path):
    loader = seqloader.DataLoader(list(range(N)), batch_size=BATCH)
    with pytest.raises(OSError):
        loader.trace(tmp_path / "missing" / "t.json").__enter__()
    with loader.trace(tmp_path / "t.json"):
        with pytest.raises(ValueError, match="a trace is already recording this loader"):
            loader.trace(tmp_path / "u.json").__enter__()
    with loader.trace(tmp_path / "t.json"):   # the first one ended: a new one records
        list(loader)
    assert len(_timed(_load(tmp_path / "t.json"), "loop")) == N // BATCH


def test_it_lines_up_with_torchs_profiler_trace(tmp_path):
    """torch exports wall-clock microseconds less ``baseTimeNanoseconds``; ``merge`` shifts ours by
    the clocks' difference the trace recorded: each wait falls inside its ``next()``'s span."""
    loader = seqloader.DataLoader(list(range(N)), batch_size=BATCH, num_workers=2, worker_method="thread")
    with profile() as prof, loader.trace(tmp_path / "t.json"):
        for _ in loader:
            time.sleep(0.01)   # the step: spans 10 ms apart
    prof.export_chrome_trace(str(tmp_path / "torch.json"))
    merged = trace_view.merge(_load(tmp_path / "t.json"), _load(tmp_path / "torch.json"))
    spans = sorted((e for e in merged["traceEvents"] if e.get("ph") == "X"
                    and e["name"] == "enumerate(DataLoader)#MapIterator.__next__"), key=lambda e: e["ts"])
    waits = sorted((e for e in merged["traceEvents"] if e.get("cat") == "loop"), key=lambda e: e["ts"])
    assert len(spans) == len(waits) + 1   # the next() that ends the epoch waits for nothing
    slack = 2000.0  # µs: the clocks' difference is read once; each span is 10 ms from the next
    for span, wait in zip(spans, waits):
        assert span["ts"] - slack <= wait["ts"] and wait["ts"] + wait["dur"] <= span["ts"] + span["dur"] + slack
