"""The wire (``seqloader.prefetcher.wire``): one module for what the process executor and the Ray
actors send (value pickling, the shared object by reference, slot writers, the stage name, the
segment prefix), and ``prefetcher/processes/`` private to the prefetcher."""

from __future__ import annotations

import pathlib
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

from seqloader.prefetcher import ray_actor, wire
from seqloader.prefetcher.processes import payload, shm, worker
from test_layers import MODULES, seqloader_imports


def test_the_process_executor_and_the_ray_actor_speak_one_wire():
    assert worker.TRANSFER is ray_actor.TRANSFER is wire.TRANSFER == "transfer"
    assert shm.SHM_PREFIX is wire.SHM_PREFIX == "seqloader_"
    assert payload.SlotWriter is wire.SlotWriter and payload.SLOT_ITEM is wire.SLOT_ITEM
    assert payload.encode is shm.encode is wire.encode and payload.is_plain_tensor is wire.is_plain_tensor
    assert worker.dumps_seq is wire.dumps_with_shared and worker.loads_seq is ray_actor.loads_with_shared


def test_nothing_outside_the_prefetcher_reaches_into_its_process_executor():
    reaches = {m: sorted(d for d in seqloader_imports(p) if d.startswith("seqloader.prefetcher.processes"))
               for m, p in MODULES.items() if not m.startswith("seqloader.prefetcher")}
    assert not {m: d for m, d in reaches.items() if d}
    from seqloader.loader.epoch.batches import SlotCollate
    assert issubclass(SlotCollate, wire.SlotWriter)


def test_a_sequence_refers_to_the_shared_object_by_id_on_either_pickler():
    dataset = np.arange(100_000)
    seq = {"dataset": dataset, "window": (3, 7)}
    for pickler in (pickle.Pickler, type("Custom", (pickle.Pickler,), {})):
        blob = wire.dumps_with_shared(seq, dataset, pickler=pickler)
        assert len(blob) < 200  # a reference, not 800 kB
        back = wire.loads_with_shared(blob, dataset)
        assert back["dataset"] is dataset and back["window"] == (3, 7)
    assert wire.loads_with_shared(wire.dumps_with_shared(seq, None), None)["dataset"].tolist() == dataset.tolist()


def test_tensors_go_out_of_band_where_asked_and_by_torchs_own_reduction_elsewhere():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()  # not contiguous
    buffers: list = []
    blob = wire.dumps_with_shared({"t": t}, None, buffers, tensors=True)
    assert [b.raw().nbytes for b in buffers] == [24]
    back = pickle.loads(blob, buffers=[b.raw() for b in buffers])
    assert torch.equal(back["t"], t)
    plain = wire.dumps_with_shared({"t": t}, None)  # the process executor's sequences: torch's reduction
    assert torch.equal(wire.loads_with_shared(plain, None)["t"], t)
    data, raws = wire.encode({"t": t, "sparse": t.to_sparse()})
    out = pickle.loads(data, buffers=raws)
    assert torch.equal(out["t"], t) and torch.equal(out["sparse"].to_dense(), t)


def test_the_wire_and_the_ray_actor_import_neither_torch_nor_ray():
    root = pathlib.Path(wire.__file__).resolve().parents[2]
    code = ("import sys, numpy as np\n"
            "from seqloader.prefetcher import ray_actor, wire\n"
            "data, buffers = ray_actor.encode({'x': np.arange(3)})\n"
            "assert ray_actor.decode(data, buffers)['x'].tolist() == [0, 1, 2]\n"
            "assert not wire.is_plain_tensor(np.ones(2)) and wire.reduce_tensor(3) is NotImplemented\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("value", [torch.ones(0), torch.ones(3, requires_grad=True)], ids=["empty", "requires_grad"])
def test_a_tensor_comes_back_as_it_went(value):
    data, raws = wire.encode(value)
    back = pickle.loads(data, buffers=raws)
    assert torch.equal(back.detach(), value.detach()) and back.requires_grad == value.requires_grad


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16,
          torch.int32, torch.int64, torch.bool, torch.complex64, torch.uint16, torch.uint32, torch.uint64]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (3, 4), (1, 5)], ids=str)
def test_every_dtype_and_layout_comes_back_equal_and_writable(dtype, shape):
    base = (torch.arange(max(1, int(np.prod(shape)))) % 3).to(dtype)[:int(np.prod(shape))].reshape(shape)
    values = {"contiguous": base, "transposed": base.mT if base.dim() == 2 else base,
              "offset": torch.cat([base.reshape(-1), base.reshape(-1)])[base.numel():].reshape(shape)}
    if dtype.is_complex:
        values["conj"] = base.conj()
    data, raws = wire.encode(values)
    back = pickle.loads(data, buffers=[memoryview(bytearray(r)) for r in raws])
    for name, value in values.items():
        got = back[name]
        assert type(got) is torch.Tensor and got.dtype == dtype and got.shape == value.shape, name
        assert torch.equal(got, value.resolve_conj()) and not got.is_conj(), name
    for got in back.values():
        got.fill_(1)   # writable, as the buffers it was read from
