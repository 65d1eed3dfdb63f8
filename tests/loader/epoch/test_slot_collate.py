"""``default_collate`` straight into a worker's slot (issue 20): the same batches as torch's, one write.

``torch_compat.collate_into_slot`` is checked against ``default_collate`` on random structures
(hypothesis) in this process, with plain buffers and through a real slot (reserve, pickle without
copying, read back as the parent does); then through the loader's workers, map-style and iterable.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import default_collate

import seqloader.loader.epoch.batches as fetch_mod
from seqloader import DataLoader
from seqloader.loader.torch_compat import collate_into_slot
from seqloader.prefetcher.processes.payload import Reservation, encode_payload, read_and_release
from seqloader.prefetcher.processes.shm import SlotPool, WorkerSlots

Point = collections.namedtuple("Point", ["a", "b"])

TORCH_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
                torch.float32, torch.float64, torch.bool, torch.complex64]
NUMPY_DTYPES = [np.uint8, np.int32, np.int64, np.float32, np.float64, np.bool_]


# --------------------------------------------------------------------------- structures and equality


def assert_same(got, want, path="batch"):
    """Same structure, types, dtypes, shapes and bits."""
    assert type(got) is type(want), f"{path}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, torch.Tensor):
        assert (got.dtype, got.shape) == (want.dtype, want.shape), f"{path}: {got.dtype}{tuple(got.shape)}"
        assert torch.equal(got.contiguous().reshape(-1).view(torch.uint8),
                           want.contiguous().reshape(-1).view(torch.uint8)), f"{path}: values differ"
    elif isinstance(want, dict):
        assert list(got) == list(want), f"{path}: keys {list(got)} != {list(want)}"
        for k in want:
            assert_same(got[k], want[k], f"{path}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"{path}: lengths differ"
        for k, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{path}[{k}]")
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


def shapes():
    return st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple)


@st.composite
def schemas(draw, depth=2):
    """A sample's structure: leaves are (kind, dtype, shape); containers dict, namedtuple, tuple, list."""
    leaf = st.one_of(
        st.tuples(st.just("tensor"), st.sampled_from(TORCH_DTYPES), shapes()),
        st.tuples(st.just("array"), st.sampled_from(NUMPY_DTYPES), shapes()),
        st.tuples(st.sampled_from(["int", "float", "str", "bytes", "np_float32", "np_int64", "bool"]),
                  st.none(), st.none()),
    )
    if depth == 0:
        return draw(leaf)
    kind = draw(st.sampled_from(["leaf", "dict", "point", "tuple", "list"]))
    if kind == "leaf":
        return draw(leaf)
    if kind == "point":
        return ("point", draw(schemas(depth - 1)), draw(schemas(depth - 1)))
    children = draw(st.lists(schemas(depth - 1), min_size=1, max_size=3))
    if kind == "dict":
        return ("dict", {f"k{j}": c for j, c in enumerate(children)})
    return (kind, children)


def sample(schema, rng):
    """One sample of ``schema`` with random values."""
    kind = schema[0]
    if kind == "dict":
        return {k: sample(c, rng) for k, c in schema[1].items()}
    if kind == "point":
        return Point(sample(schema[1], rng), sample(schema[2], rng))
    if kind in ("tuple", "list"):
        items = [sample(c, rng) for c in schema[1]]
        return tuple(items) if kind == "tuple" else items
    _, dtype, shape = schema
    if kind in ("tensor", "array"):  # random bits (NaNs included), as bools 0 or 1
        count = int(np.prod(shape))
        size = np.dtype(dtype).itemsize if kind == "array" else torch.empty(0, dtype=dtype).element_size()
        raw = rng.integers(0, 256, size=count * size, dtype=np.uint8)
        if dtype in (np.bool_, torch.bool):
            raw %= 2
        array = raw.view(np.uint8 if kind == "tensor" else dtype).reshape(shape if kind == "array" else -1)
        if kind == "array":
            return array
        if not count:
            return torch.empty(shape, dtype=dtype)
        return torch.from_numpy(array.copy()).view(dtype).reshape(shape)
    return {"int": lambda: int(rng.integers(-1000, 1000)), "float": lambda: float(rng.normal()),
            "str": lambda: f"s{rng.integers(100)}", "bytes": lambda: bytes([int(rng.integers(256))]),
            "np_float32": lambda: np.float32(rng.normal()), "np_int64": lambda: np.int64(rng.integers(-5, 5)),
            "bool": lambda: bool(rng.integers(2))}[kind]()


def plain_reserve(sizes):
    return [memoryview(bytearray(n)) for n in sizes]


def through_slot(data):
    """What a worker and the parent do with a batch collated into a real slot."""
    pool, slots = SlotPool(num_workers=1, keep=2), WorkerSlots()
    try:
        sid, name = pool.acquire(0)
        slots.open(sid, name)
        reservation = Reservation(slots, sid)
        value = collate_into_slot(data, reservation.reserve)
        encoded = encode_payload(value, reservation)
        del value
        payload = encoded.write(slots, sid)
        return read_and_release(payload, pool), payload
    finally:
        slots.close(unlink=False)
        pool.close()


# --------------------------------------------------------------------------- in this process


@given(schema=schemas(), batch=st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
def test_collate_into_slot_is_default_collate(schema, batch, seed):
    rng = np.random.default_rng(seed)
    data = [sample(schema, rng) for _ in range(batch)]
    want = default_collate(data)
    assert_same(collate_into_slot(data, plain_reserve), want)
    got, payload = through_slot(data)
    assert_same(got, want)
    in_place = [b for b in payload.buffers if b[0] < payload.data_offset]
    assert len(in_place) == len(_tensor_leaves(schema))  # every stacked tensor was written in place


def _tensor_leaves(schema):
    """The tensor and array leaves of ``schema`` that hold at least one element."""
    kind = schema[0]
    if kind == "dict":
        return [leaf for c in schema[1].values() for leaf in _tensor_leaves(c)]
    if kind == "point":
        return _tensor_leaves(schema[1]) + _tensor_leaves(schema[2])
    if kind in ("tuple", "list"):
        return [leaf for c in schema[1] for leaf in _tensor_leaves(c)]
    return [schema] if kind in ("tensor", "array") and 0 not in schema[2] else []


class Spy:
    def __init__(self):
        self.calls = 0

    def __call__(self, sizes):
        self.calls += 1
        return plain_reserve(sizes)


class Flip(dict):
    """A mapping whose keys come in the other order at every iteration."""

    flips = 0

    def __iter__(self):
        Flip.flips += 1
        keys = list(super().__iter__())
        return iter(keys if Flip.flips % 2 else keys[::-1])


@pytest.mark.parametrize("case", ["requires_grad", "parameter", "mixed_dtypes", "ints_only", "flipping_keys"])
def test_what_the_slot_cannot_place_goes_through_default_collate(case):
    data = {
        "requires_grad": [torch.ones(3, requires_grad=True), torch.zeros(3)],
        "parameter": [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.zeros(2))],
        "mixed_dtypes": [torch.ones(2, dtype=torch.int32), torch.ones(2, dtype=torch.float64)],
        "ints_only": [{"a": 1, "b": (2.0, "x")}, {"a": 3, "b": (4.0, "y")}],
        "flipping_keys": [Flip(x=torch.ones(2), y=torch.ones(3, 3)), Flip(x=torch.zeros(2), y=torch.zeros(3, 3))],
    }[case]
    spy = Spy()
    got = collate_into_slot(data, spy)
    want = default_collate(data)
    if case == "flipping_keys":  # torch's result depends on the iteration order too: compare by key
        assert spy.calls == 1 and {k: got[k].tolist() for k in got} == {k: want[k].tolist() for k in want}
        return
    assert spy.calls == 0
    assert type(got) is type(want) and str(got) == str(want)


@pytest.mark.parametrize("case", ["sparse", "nested", "numpy_strings", "unequal_shapes"])
def test_an_error_of_default_collate_is_raised_unchanged(case):
    data = {
        "sparse": [torch.ones(2).to_sparse(), torch.ones(2).to_sparse()],
        "nested": [torch.nested.nested_tensor([torch.ones(2)]), torch.nested.nested_tensor([torch.ones(2)])],
        "numpy_strings": [np.array(["a"]), np.array(["b"])],
        "unequal_shapes": [torch.ones(2), torch.ones(3)],
    }[case]
    with pytest.raises(Exception) as want:
        default_collate(data)
    with pytest.raises(type(want.value)) as got:
        collate_into_slot(data, plain_reserve)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("case", ["conj", "neg", "channels_last", "transposed", "zero_dim", "empty"])
def test_views_and_layouts_of_plain_tensors_are_placed(case):
    c = torch.randn(3, dtype=torch.complex64)
    data = {"conj": [c.conj(), c.conj()], "neg": [torch._neg_view(torch.ones(2)), torch.ones(2)],
            "channels_last": [torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)] * 2,
            "transposed": [torch.randn(3, 4).t(), torch.randn(3, 4).t()],
            "zero_dim": [torch.tensor(1.5), torch.tensor(2.5)], "empty": [torch.ones(0, 3)] * 2}[case]
    spy = Spy()
    assert_same(collate_into_slot(data, spy), default_collate(data))
    assert spy.calls == 1


def test_a_changed_default_collate_fn_map_turns_the_slot_path_off(monkeypatch):
    from torch.utils.data._utils import collate as torch_collate

    monkeypatch.setitem(torch_collate.default_collate_fn_map, Point, lambda batch, *, collate_fn_map: "custom")
    spy = Spy()
    assert collate_into_slot([Point(torch.ones(1), 2)] * 2, spy) == "custom" and spy.calls == 0


# --------------------------------------------------------------------------- through the loader's workers


class Samples:
    """Map-style: item ``i`` is a dict of an image, a tensor, a namedtuple and plain values."""

    def __init__(self, n=40):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        return {"image": rng.integers(0, 256, (3, 8, 8), dtype=np.uint8), "t": torch.full((2,), float(i)),
                "p": Point(np.float32(i), [i, f"s{i}"]), "label": i % 3, "w": i / 7, "ok": bool(i % 2)}


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        return (Samples()[i] for i in range(first, 40, step))


def batches(loader):
    return list(loader)


@pytest.mark.parametrize("iterable", [False, True])
def test_the_loaders_workers_give_torchs_batches_and_held_batches_stay_valid(iterable):
    ds = Stream() if iterable else Samples()
    nw = dict(num_workers=2, multiprocessing_context="fork")
    want = batches(torch.utils.data.DataLoader(ds, batch_size=6, **(nw if iterable else {})))
    loader = DataLoader(ds, batch_size=6, **nw, persistent_workers=True, seed=0)
    first, second = batches(loader), batches(loader)  # both epochs held: no slot reused under them
    if iterable:  # torch's round-robin over the same two streams
        key = lambda b: b["t"][0, 0].item()  # noqa: E731
        first, second, want = sorted(first, key=key), sorted(second, key=key), sorted(want, key=key)
    for got in (first, second):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w)


class Placed(Exception):
    pass


def refuse(data, reserve):
    raise Placed("the slot path was taken")


def test_only_default_collate_in_a_worker_takes_the_slot_path(monkeypatch):
    monkeypatch.setattr(fetch_mod, "collate_into_slot", refuse)  # inherited by forked workers
    kwargs = dict(batch_size=4, seed=0, num_workers=2, multiprocessing_context="fork")
    with pytest.raises(Placed, match="the slot path was taken") as info:
        batches(DataLoader(Samples(8), **kwargs))
    assert "seqloader: raised in DataLoader in batch 0 (epoch 0, dataset indices [0, 1, 2, 3])" in info.value.__notes__
    with pytest.raises(Placed):
        batches(DataLoader(Stream(), **kwargs))
    custom = batches(DataLoader(Samples(8), collate_fn=lambda b: default_collate(b), **kwargs))
    here = batches(DataLoader(Samples(8), batch_size=4, seed=0))  # num_workers=0: the ordinary path
    for c, h in zip(custom, here):
        assert_same(c, h)


def test_a_batch_error_in_the_slot_path_is_the_batch_error_of_num_workers_0():
    class Uneven(Samples):
        def __getitem__(self, i):
            return torch.ones(2 + (i == 5))

    errors = []
    for nw in (0, 2):
        with pytest.raises(RuntimeError) as info:
            batches(DataLoader(Uneven(8), batch_size=4, num_workers=nw, seed=0))
        errors.append((str(info.value), info.value.__notes__[0]))
    assert errors[0] == errors[1] and "stack expects each tensor to be equal size" in errors[0][0]


class Nested(Samples):
    """Each item reads a loader of its own (num_workers=0): it must get batches, not slot writers."""

    def __getitem__(self, i):
        inner = DataLoader([torch.full((2,), float(i + k)) for k in range(4)], batch_size=2, seed=0)
        return sum(b.sum() for b in inner)


def test_a_loader_read_inside_a_workers_dataset_gets_ordinary_batches():
    got = torch.cat(batches(DataLoader(Nested(6), batch_size=3, num_workers=2, seed=0)))
    assert got.tolist() == [float(2 * sum(range(i, i + 4))) for i in range(6)]


class Columns(torch.utils.data.Dataset):
    """A columnar dataset: ``__getitems__`` gives the whole batch as one dict of arrays."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"x": np.array([i])}

    def __getitems__(self, indices):
        return {"x": np.asarray(indices), "y": np.asarray(indices) * 2}


@pytest.mark.parametrize("kw", [{}, {"num_workers": 2}, {"num_workers": 2, "worker_method": "thread"}],
                         ids=["0 workers", "processes", "threads"])
def test_a_columnar_batch_through_the_default_collate_names_the_collate_to_use(kw):
    with pytest.raises(KeyError) as info:
        next(iter(DataLoader(Columns(), batch_size=4, **kw)))
    assert any("pass collate_fn=torch.utils.data.default_convert" in n for n in info.value.__notes__)
    got = next(iter(DataLoader(Columns(), batch_size=4, collate_fn=torch.utils.data.default_convert, **kw)))
    assert got["x"].tolist() == [0, 1, 2, 3] and got["y"].tolist() == [0, 2, 4, 6]
