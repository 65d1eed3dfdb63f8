"""What every executor shows to the tools users look with: torch's profiler span of each ``next()``.

torch's ``DataLoader`` runs each ``__next__`` of its iterators inside
``record_function("enumerate(DataLoader)#<iterator class>.__next__")``; seqloader's iterators open
the same span, on every executor and at ``num_workers=0``, and none while no profiler runs.
"""

from __future__ import annotations

import pytest
import torch
from torch.profiler import profile

import seqloader
from contract_fixtures import executor, no_leaks, process_executor, ray_cluster  # noqa: F401 (fixtures)
from seqloader.loader.torch_compat import profiler as profiler_mod


def _spans(prof) -> list[str]:
    return [e.name for e in prof.events() if e.name.startswith("enumerate(DataLoader)#")]


def _torch_spans(**kw) -> list[str]:
    with profile() as prof:
        list(torch.utils.data.DataLoader(range(24), batch_size=2, **kw))
    return _spans(prof)


def test_the_span_is_torchs_at_num_workers_0():
    with profile() as prof:
        batches = list(seqloader.DataLoader(range(24), batch_size=2))
    names = _spans(prof)
    # torch: one span per batch and one for the next() that ends the epoch
    assert len(names) == len(batches) + 1 == len(_torch_spans())
    assert set(names) == {"enumerate(DataLoader)#MapIterator.__next__"}


def test_every_executor_shows_one_span_per_next(executor):
    with profile() as prof:
        batches = list(seqloader.DataLoader(range(24), batch_size=2, **executor))
    assert len(batches) == 12
    assert _spans(prof) == ["enumerate(DataLoader)#MapIterator.__next__"] * 13


def test_an_iterable_dataset_and_autotune_are_named_by_their_iterators():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(6))

    with profile() as prof:
        list(seqloader.DataLoader(Stream(), batch_size=2))
        list(seqloader.DataLoader(range(6), batch_size=2, autotune=True))
    assert _spans(prof) == (["enumerate(DataLoader)#IterableIterator.__next__"] * 4
                            + ["enumerate(DataLoader)#TunedIterator.__next__"] * 4)


def test_no_profiler_no_span(monkeypatch):
    opened = []
    monkeypatch.setattr(profiler_mod, "record_function", lambda name: opened.append(name))
    assert len(list(seqloader.DataLoader(range(24), batch_size=2))) == 12
    assert opened == []


@pytest.mark.parametrize("kw", [dict(), dict(num_workers=2)])
def test_a_batch_that_raises_closes_its_span(kw):
    def fail(i):
        if i == 5:
            raise ValueError("item 5")
        return i

    with profile() as prof:
        with pytest.raises(ValueError, match="item 5"):
            list(seqloader.DataLoader(seqloader.smap(fail, range(12)), batch_size=2, **kw))
    assert _spans(prof) == ["enumerate(DataLoader)#MapIterator.__next__"] * 3
