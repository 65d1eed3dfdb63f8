"""``default_collate`` of Python numbers, computed through one numpy array (``torch_compat.collate``):
the tensor torch's own ``default_collate`` returns, or torch's own error, for every mix of values."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.utils.data import default_collate
from torch.utils.data._utils import collate as torch_collate

from seqloader.loader.torch_compat import collate_in_plain_memory

NUMBERS = st.one_of(st.integers(-2**70, 2**70), st.booleans(),
                    st.floats(allow_nan=False), st.integers(-5, 5).map(np.int32),
                    st.just("a"), st.just([1]))


def torchs(data):
    """torch's result, or its error's type."""
    try:
        return default_collate(data)
    except Exception as exc:   # (the error is compared, not hidden)
        return type(exc)


def ours(data):
    try:
        return collate_in_plain_memory(default_collate, data)
    except Exception as exc:
        return type(exc)


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and \
            torch.equal(a, b) and b.untyped_storage().resizable()
    return a == b


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=False)), st.lists(NUMBERS, max_size=6))
def test_a_batch_led_by_an_int_or_a_float_collates_as_torchs(first, rest):
    data = [first, *rest]
    assert same(torchs(data), ours(data)), data


@pytest.mark.parametrize("data", [list(range(256)), [0.5 * i for i in range(256)], [7], [1.0]])
def test_plain_batches_of_numbers_are_torchs_tensors(data):
    assert same(default_collate(data), collate_in_plain_memory(default_collate, data))


def test_a_changed_collate_map_is_followed(monkeypatch):
    monkeypatch.setitem(torch_collate.default_collate_fn_map, int, lambda batch, **_: "mine")
    assert collate_in_plain_memory(default_collate, [1, 2]) == "mine"
