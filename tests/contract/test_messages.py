"""What every executor's messages name: a batch by its number in its epoch, whatever opened it.

An epoch opened mid-way (a resume, or an autotune switch) reads its batches from where it stands;
the batch a message names is still its number in the epoch, the step ``indices_at`` reads.
"""

from __future__ import annotations

import pytest

import seqloader
from contract_fixtures import executor, no_leaks, process_executor, ray_cluster  # noqa: F401 (fixtures)
from contract_items import RaisesAt


def _resumed(make, batches_before: int):
    """A loader of ``make()`` resumed after ``batches_before`` batches of epoch 0."""
    first = make()
    it = iter(first)
    for _ in range(batches_before):
        next(it)
    state = first.state_dict()
    del it
    resumed = make()
    resumed.load_state_dict(state)
    return resumed


@pytest.mark.parametrize("resume_after", [0, 10])
def test_an_error_after_a_resume_names_the_epochs_batch_at_num_workers_0(resume_after):
    make = lambda: seqloader.DataLoader(RaisesAt(37, KeyError("no 37")), batch_size=2, seed=0)  # noqa: E731
    loader = _resumed(make, resume_after)
    with pytest.raises(KeyError, match="no 37") as info:
        list(loader)
    assert "seqloader: raised in DataLoader at item 37 (batch 18, epoch 0)" in info.value.__notes__
    assert 37 in loader.indices_at(0, 18)


def test_an_error_after_a_resume_names_the_epochs_batch(executor):
    make = lambda: seqloader.DataLoader(RaisesAt(37, KeyError("no 37")), batch_size=2, seed=0, **executor)  # noqa: E731
    loader = _resumed(make, 10)
    with pytest.raises(KeyError, match="no 37") as info:
        list(loader)
    assert "seqloader: raised in DataLoader at item 37 (batch 18, epoch 0)" in info.value.__notes__


def test_a_shuffled_epochs_error_after_a_resume_names_the_batch_indices_at_reads(executor):
    make = lambda: seqloader.DataLoader(RaisesAt(37, KeyError("no 37")), batch_size=2, seed=3,  # noqa: E731
                                        shuffle=True, **executor)
    loader = _resumed(make, 5)
    with pytest.raises(KeyError, match="no 37") as info:
        list(loader)
    named = [n for n in info.value.__notes__ if "at item 37" in n]
    assert len(named) == 1, info.value.__notes__
    step = int(named[0].split("(batch ")[1].split(",")[0])
    assert step >= 5 and 37 in loader.indices_at(0, step)


def test_a_death_after_a_resume_names_the_epochs_batch(process_executor):
    # the dying item (batch 39) lies beyond what the first loader can have in flight after its
    # 10 batches (at most num_workers x threads x prefetch_factor = 8 ahead): its workers never reach it
    make = lambda: seqloader.DataLoader(RaisesAt(157, "exit", n=200), batch_size=4, seed=0,  # noqa: E731
                                        **process_executor)
    loader = _resumed(make, 10)
    with pytest.raises(RuntimeError) as info:
        list(loader)
    blamed = ["batch 39 (dataset indices [156, 157, 158, 159])"]
    if isinstance(process_executor.get("worker_method"), seqloader.RayWorkers):
        blamed.append("batch 37 (dataset indices [148, 149, 150, 151])")   # docs/ray.md, "Known limits"
    assert any(b in str(info.value) for b in blamed), str(info.value)


def test_an_error_under_autotune_names_the_epochs_batch():
    """Autotune reopens the epoch's rest at each switch; the count does not restart there."""
    loader = seqloader.DataLoader(RaisesAt(301, KeyError("no 301"), n=400), batch_size=2, seed=0, autotune=True)
    with pytest.raises(KeyError, match="no 301") as info:
        list(loader)
    assert "seqloader: raised in DataLoader at item 301 (batch 150, epoch 0)" in info.value.__notes__
