"""Hugging Face ``datasets``: an Arrow-backed ``datasets.Dataset`` works with ``seqloader.DataLoader``
as it is (batched ``__getitems__``, exact resume), and the Parquet files behind a dataset read with
``seqloader.parquet`` give the same rows. Everything is built locally: no network."""

from __future__ import annotations

import functools
import os

import pytest
import torch

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
datasets = pytest.importorskip("datasets")

import seqloader  # noqa: E402
from seqloader.testing import assert_resumes_exactly  # noqa: E402


def make_dataset(n=23):
    return datasets.Dataset.from_dict({"x": [[float(i), float(-i)] for i in range(n)], "label": [i % 3 for i in range(n)],
                                       "idx": list(range(n))}).with_format("torch")


class Spy:
    """Counts how the loader reads a dataset: batched (``__getitems__``) or item by item."""

    def __init__(self, ds):
        self.ds, self.batched, self.single = ds, 0, 0

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        self.single += 1
        return self.ds[i]

    def __getitems__(self, indices):
        self.batched += 1
        return self.ds.__getitems__(indices)


def test_a_datasets_dataset_is_read_in_batches_through_getitems():
    ds = make_dataset()
    assert callable(getattr(datasets.Dataset, "__getitems__", None))
    spy = Spy(ds)
    batches = list(seqloader.DataLoader(spy, batch_size=5, shuffle=True, seed=0))
    assert spy.batched == 5 and spy.single == 0
    assert sorted(i for b in batches for i in b["idx"].tolist()) == list(range(23))
    for b in batches:
        assert torch.equal(b["x"][:, 0], b["idx"].float()) and torch.equal(b["label"], b["idx"] % 3)


def _make(num_workers, n=23):
    return seqloader.DataLoader(make_dataset(n), batch_size=4, shuffle=True, seed=11, num_workers=num_workers)


@pytest.mark.mp
def test_a_datasets_dataset_resumes_exactly_with_another_num_workers():
    assert_resumes_exactly(functools.partial(_make, n=23), stops=[0, 2, -1])


def test_the_parquet_files_behind_a_dataset_read_with_seqloader_parquet(tmp_path):
    plain = make_dataset().with_format(None)
    plain.to_parquet(str(tmp_path / "train-00000-of-00001.parquet"))
    rows = seqloader.parquet(str(tmp_path), columnar=True)
    batch = rows.__getitems__(list(range(23)))
    assert batch["idx"].tolist() == list(range(23)) and batch["label"].tolist() == list(plain["label"])
    assert [r.tolist() for r in batch["x"]] == list(plain["x"])
