"""Tensors that are not plain dense CPU tensors travel through the slot by torch's own pickling.

Nested, sparse, subclassed and other tensors cannot be exported as one out-of-band buffer; they are
pickled in band into the same slot (issue 9.7: nested tensors used to fail with "item 0 cannot be
sent to the parent process"). Plain tensors still travel out of band (tests/prefetcher/test_shm.py).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from seqloader import prefetch
from seqloader.prefetcher.processes.shm import SlotPool, WorkerSlots, is_plain_tensor, read_and_release, write_payload

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")


class Tagged(torch.Tensor):
    """A tensor subclass, as user code defines them."""


def _nested(i, layout):
    with warnings.catch_warnings():  # strided nested tensors warn that they are a prototype
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor([torch.full((2,), float(i)), torch.arange(3.0) + i], layout=layout)


def _dense(i):
    return torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]]) * (i + 1)


class Exotic:
    """Item ``i``: one tensor of every kind that needs torch's own pickling, and a plain one."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        with_attr = torch.full((3,), i)
        with_attr.tag = f"tag {i}"
        return {
            "nested": _nested(i, torch.strided),
            "jagged": _nested(i, torch.jagged),
            "coo": _dense(i).to_sparse(),
            "csr": _dense(i).to_sparse_csr(),
            "subclass": (torch.arange(4.0) + i).as_subclass(Tagged),
            "parameter": torch.nn.Parameter(torch.full((2,), float(i))),
            "with_attr": with_attr,
            "meta": torch.empty(2, 3, device="meta"),
            "plain": torch.full((5,), i),
        }


def _check(got, i):
    for key, layout in (("nested", torch.strided), ("jagged", torch.jagged)):
        assert got[key].is_nested and got[key].layout == layout, key
        parts = got[key].unbind()
        assert torch.equal(parts[0], torch.full((2,), float(i))) and torch.equal(parts[1], torch.arange(3.0) + i)
    assert got["coo"].layout == torch.sparse_coo and torch.equal(got["coo"].to_dense(), _dense(i))
    assert got["csr"].layout == torch.sparse_csr and torch.equal(got["csr"].to_dense(), _dense(i))
    assert type(got["subclass"]) is Tagged
    assert torch.equal(got["subclass"].as_subclass(torch.Tensor), torch.arange(4.0) + i)
    assert isinstance(got["parameter"], torch.nn.Parameter) and got["parameter"].requires_grad
    assert torch.equal(got["parameter"].detach(), torch.full((2,), float(i)))
    assert got["with_attr"].tag == f"tag {i}" and torch.equal(got["with_attr"], torch.full((3,), i))
    assert got["meta"].device.type == "meta" and got["meta"].shape == (2, 3)
    assert type(got["plain"]) is torch.Tensor and torch.equal(got["plain"], torch.full((5,), i))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_nested_sparse_and_subclassed_tensors_round_trip(method):
    with prefetch(Exotic(), num_workers=2, multiprocessing_context=method) as p:
        kept = list(p)  # every result held at once: none is overwritten by a later one
        p.seek(0)
        again = [p.take() for _ in range(p.remaining)]
    for i, got in enumerate(kept):
        _check(got, i)
    for i, got in again:
        _check(got, i)


def test_which_tensors_travel_out_of_band():
    assert is_plain_tensor(torch.ones(3)) and is_plain_tensor(torch.ones(2, 3).t()[0])
    assert is_plain_tensor(torch.ones(2, requires_grad=True)) and is_plain_tensor(torch.ones(2).conj())
    exotic = Exotic()[0]
    assert [k for k, v in exotic.items() if is_plain_tensor(v)] == ["plain"]
    assert not is_plain_tensor(torch.ones(3).numpy())


def test_in_band_tensors_still_use_the_slot_and_their_plain_parts_go_out_of_band():
    pool, slots = SlotPool(num_workers=1, keep=2), WorkerSlots()
    try:
        sid, name = pool.acquire(0)
        slots.open(sid, name)
        payload = write_payload(_dense(3).to_sparse(), slots, sid)  # indices and values: two buffers
        assert len(payload.buffers) == 2
        assert torch.equal(read_and_release(payload, pool).to_dense(), _dense(3))
        sid, name = pool.acquire(0)
        slots.open(sid, name)
        payload = write_payload((torch.arange(4.0) + 1).as_subclass(Tagged), slots, sid)  # torch.save bytes
        assert payload.buffers == () and type(read_and_release(payload, pool)) is Tagged
    finally:
        slots.close(unlink=False)
        pool.close()
