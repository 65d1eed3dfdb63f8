"""``python -m tools.trace_view TRACE.json OUT.png``: a seqloader trace (``loader.trace(path)``) as a
small Gantt chart, one row per lane, and :func:`merge`, which puts it on a torch profiler trace's time line.

* :func:`lanes` reads the rows of a trace: one per ``(pid, tid)`` named by its ``thread_name``
  metadata event, in the trace's order (``process_sort_index``: the training loop, then the
  workers), each with its complete events in milliseconds from the trace's first event.
* :func:`render` draws them with matplotlib (the ``test`` extra): batches as bars, their stages
  as thinner bars inside, the loop's waits for data in their own colour; it returns the rows it
  drew, which ``tests/contract/test_trace.py`` checks (the data plotted, not pixels).
* :func:`merge` shifts the seqloader events onto a torch profiler trace
  (``prof.export_chrome_trace``): torch writes wall-clock microseconds less its
  ``baseTimeNanoseconds``, seqloader the monotonic clock of ``time.perf_counter_ns()`` with the
  difference of the two clocks in ``otherData["unix_minus_clock_ns"]``. Open the merged file in
  Perfetto to see the workers' batches under the training step's operators.

``python -m tools.trace_view --example docs/images/trace.png`` records the picture of
``docs/input_bound.md`` first (2 worker processes, ``profile_stages=True``, a decode of ~3 ms a
sample and a training step of ~4 ms; the trace JSON is written next to the picture's temporary
copy) and then draws it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from typing import Any, Optional

#: Bar colours by event category (``cat``).
COLOURS = {"loop": "#d62728", "batch": "#1f77b4", "stage": "#ff7f0e"}


@dataclasses.dataclass
class Lane:
    """One row: its ``(pid, tid)``, its label, and its events ``(start_ms, dur_ms, cat, name)``."""

    key: tuple
    label: str
    events: list


def lanes(doc: dict) -> list[Lane]:
    """The rows of trace ``doc`` (a loaded JSON object): one per lane named by a ``thread_name``
    event, ordered by ``process_sort_index`` then ``tid``; times in ms from the first event."""
    events = doc["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    order = {e["pid"]: e["args"]["sort_index"] for e in events
             if e["ph"] == "M" and e["name"] == "process_sort_index"}
    timed = [e for e in events if e["ph"] == "X"]
    t0 = min((e["ts"] for e in timed), default=0.0)
    rows = {key: Lane(key, label, []) for key, label in names.items()}
    for e in timed:
        key = (e["pid"], e["tid"])
        if key not in rows:
            rows[key] = Lane(key, f"pid {key[0]} tid {key[1]}", [])
        rows[key].events.append(((e["ts"] - t0) / 1000, e["dur"] / 1000, e.get("cat", ""), e["name"]))
    return sorted(rows.values(), key=lambda r: (order.get(r.key[0], r.key[0]), r.key[1]))


def render(doc: dict, path: str, title: Optional[str] = None) -> list[Lane]:
    """Draw trace ``doc`` into the image ``path`` (its format from the suffix): one row per lane,
    the first lane at the top. Returns the rows drawn, in the order of their y positions (top first)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = lanes(doc)
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.5), dpi=110)
    stages = sorted({name for row in rows for _, _, cat, name in row.events if cat == "stage"})
    palette = dict(zip(stages, ["#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf"] * 9))
    shown: dict = {}
    for y, row in enumerate(reversed(rows)):
        for start, dur, cat, name in row.events:
            inner = cat == "stage"
            colour = palette[name] if inner else COLOURS.get(cat, "#7f7f7f")
            label = name if inner else {"loop": "wait for data", "batch": "batch"}.get(cat, cat)
            bars = ax.broken_barh([(start, max(dur, 0.01))], (y - (0.2 if inner else 0.38), 0.4 if inner else 0.76),
                                  facecolors=colour, edgecolor="white", linewidth=0.3)
            shown.setdefault(label, bars)
    ax.set_yticks(range(len(rows)), [r.label for r in reversed(rows)])
    ax.set_xlabel("ms from the first event (time.perf_counter_ns() clock)")
    ax.set_title(title or "seqloader trace: one lane per worker and the training loop", fontsize=9)
    ax.legend(list(shown.values()), list(shown), fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25),
              ncol=min(6, len(shown)), frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return rows


def merge(ours: dict, theirs: dict) -> dict:
    """A copy of torch's trace ``theirs`` with the events of seqloader's trace ``ours`` added on
    its time line (their lanes named ``"seqloader: <lane>"``, pids moved above any real pid)."""
    shift_us = (ours["otherData"]["unix_minus_clock_ns"] - theirs.get("baseTimeNanoseconds", 0)) / 1000
    out = dict(theirs)
    added = []
    for e in ours["traceEvents"]:
        e = dict(e, pid=(1 << 30) + e["pid"])
        if e["ph"] == "X":
            e["ts"] = e["ts"] + shift_us
        elif e["name"] in ("process_name", "thread_name"):
            e["args"] = {"name": f"seqloader: {e['args']['name']}"}
        added.append(e)
    out["traceEvents"] = list(theirs["traceEvents"]) + added
    return out


def example_trace(path: str) -> None:
    """Record the trace of ``docs/input_bound.md``'s picture into ``path``."""
    import time

    import seqloader

    loader = seqloader.DataLoader(seqloader.smap(_decode, list(range(96))), batch_size=4, num_workers=2, seed=0,
                                  profile_stages=True, persistent_workers=True)
    it = iter(loader)   # the workers start before the trace: it shows the steady state
    next(it)
    with loader.trace(path):
        for _ in range(12):
            next(it)
            time.sleep(0.004)      # the training step
    del it


def _decode(i: int) -> int:
    import time

    time.sleep(0.003)              # a decode of ~3 ms a sample
    return i


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.trace_view", description=__doc__.split("\n")[0])
    parser.add_argument("trace", nargs="?", help="a trace JSON written by loader.trace(path)")
    parser.add_argument("out", help="the image to write (png, svg, ...)")
    parser.add_argument("--example", action="store_true", help="record docs/input_bound.md's example trace first")
    args = parser.parse_args(argv)
    if args.example:
        args.trace = os.path.join(tempfile.mkdtemp(), "trace.json")
        example_trace(args.trace)
    if args.trace is None:
        parser.error("a trace JSON, or --example")
    with open(args.trace) as f:
        doc = json.load(f)
    rows = render(doc, args.out)
    print(f"{args.out}: {len(rows)} lanes ({', '.join(r.label for r in rows)}) from {args.trace}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
