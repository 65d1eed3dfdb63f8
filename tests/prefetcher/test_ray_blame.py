"""Blame under load, on the Ray executor: a replacement actor gets its jobs only once its set-up has
answered, so a job that ends the actor cannot lose the set-up's reply with it and be reported as
a death "while starting" (issue 44, item 8). The set-up's reply travels on another thread of the
actor, and on a busy host it had not left when the job's ``os._exit`` ran.

Ray itself is replaced by a recorder: what matters is the order of the calls the executor makes,
which a real cluster shows only under load (``python -m tools.stress ... test_ray.py``).
"""

from __future__ import annotations

from types import SimpleNamespace

from seqloader.prefetcher.executor import Started
from seqloader.prefetcher.ray import RayExecutor
from seqloader.prefetcher.ray_actor import STARTED
from seqloader.prefetcher.ray_options import RayWorkers


class _Ref:
    """An object ref: hashable, as Ray's are."""

    def __init__(self, name, args):
        self.name, self.args = name, args


class _Method:
    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def remote(self, *args):
        ref = _Ref(self.name, args)
        self.calls.append(ref)
        return ref

    def options(self, **_):
        return self


class _Handle:
    def __init__(self, calls):
        for name in ("setup", "compute", "watch", "hint", "retarget"):
            setattr(self, name, _Method(name, calls))


def _executor():
    calls: list = []
    ex = RayExecutor(1, None, None, RayWorkers())
    ex._cls = SimpleNamespace(remote=lambda: _Handle(calls))
    ex._refs = {"shared": "shared-ref", "init": "init-ref"}
    ex._seq = ("seq", "seq-ref")
    answered: list = []
    ex._ray = SimpleNamespace(
        wait=lambda refs, **_: ([r for r in refs if r in answered], []),
        get=lambda ref: (STARTED, 4242, "node", "127.0.0.1"),
        exceptions=SimpleNamespace(RayError=RuntimeError, RayTaskError=RuntimeError))
    return ex, calls, answered


def test_a_replacements_jobs_wait_for_its_set_up_to_answer():
    ex, calls, answered = _executor()
    ex.replace(0, "seq")  # a replacement, owed items 5 and 6
    ex.submit(0, 0, 5)
    ex.submit(0, 0, 6)
    assert [c.name for c in calls] == ["setup", "watch"]  # nothing to compute before the set-up answers
    assert ex.poll(0.0) == []
    answered.append(next(c for c in calls if c.name == "setup"))
    events = ex.poll(0.0)
    assert [type(e) for e in events] == [Started]
    assert [(c.name, c.args) for c in calls if c.name == "compute"] == [("compute", (0, 5)), ("compute", (0, 6))]
    ex.submit(0, 0, 7)  # once started, a job goes at once
    assert calls[-1].name == "compute" and calls[-1].args == (0, 7)
