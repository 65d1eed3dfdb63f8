"""``IterableDataset`` workloads: ``seqloader.DataLoader`` against torch's on a stream that shards itself.

The dataset is :class:`ShardedStream`: worker ``w`` of ``n`` (from torch's ``get_worker_info()``)
yields items ``w, w + n, w + 2n, ...`` of a map-style dataset, the usual way to split a stream
between workers. Both loaders use 2 workers and ``persistent_workers=True`` and read 3 epochs;
the timing covers building the loader, starting its workers and all 3 epochs.

* ``iterable_tiny``: 200_000 ints, batch 256.
* ``iterable_images``: 4_000 uint8 images 3x224x224 (:class:`~benchmarks.common.ImageDataset`),
  batch 64.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator

import torch.utils.data

from benchmarks.common import ImageDataset, IntDataset, Options, Row, best_of, mb_per_s
from seqloader import DataLoader

__all__ = ["ITERABLE_WORKLOADS", "EPOCHS", "ShardedStream", "iterable_images", "iterable_tiny"]

#: Epochs read per measurement (the persistent workers serve all of them).
EPOCHS = 3


class ShardedStream(torch.utils.data.IterableDataset):
    """The items of a map-style ``dataset``, split between workers by ``get_worker_info()``.

    Worker ``w`` of ``n`` yields items ``w, w + n, ...``; without workers, every item.

    Example:
        >>> list(ShardedStream(IntDataset(5)))
        [0, 1, 2, 3, 4]
    """

    def __init__(self, dataset):
        self.dataset = dataset

    def __iter__(self) -> Iterator:
        info = torch.utils.data.get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        ds = self.dataset
        return (ds[i] for i in range(first, len(ds), step))


def _epochs_seconds(cls, stream: ShardedStream, batch_size: int) -> float:
    """Seconds to build a 2-worker persistent loader and read :data:`EPOCHS` epochs."""
    t0 = time.perf_counter()
    loader = cls(stream, batch_size=batch_size, num_workers=2, persistent_workers=True)
    for _ in range(EPOCHS):
        for _ in loader:
            pass
    dt = time.perf_counter() - t0
    del loader  # shuts the persistent workers down (outside the timing)
    return dt


def _iterable_compare(name: str, dataset, batch_size: int, opts: Options,
                      item_bytes: int | None = None) -> list[Row]:
    stream = ShardedStream(dataset)
    best = best_of(opts.repeat, {
        "seqloader": lambda: _epochs_seconds(DataLoader, stream, batch_size),
        "torch": lambda: _epochs_seconds(torch.utils.data.DataLoader, stream, batch_size),
    })
    n = EPOCHS * len(dataset)
    notes = f"{EPOCHS} epochs, persistent_workers=True"
    return [Row(name, "seqloader.DataLoader", 2, n / best["seqloader"], "samples/s",
                mb_per_s(n, item_bytes, best["seqloader"]), ratio=best["torch"] / best["seqloader"], notes=notes),
            Row(name, "torch DataLoader", 2, n / best["torch"], "samples/s",
                mb_per_s(n, item_bytes, best["torch"]), notes=notes)]


def iterable_tiny(opts: Options) -> list[Row]:
    """A self-sharding stream of 200_000 ints, batch 256, 2 persistent workers, 3 epochs."""
    return _iterable_compare("iterable_tiny", IntDataset(5_000 if opts.quick else 200_000), 256, opts)


def iterable_images(opts: Options) -> list[Row]:
    """A self-sharding stream of 4_000 uint8 3x224x224 images, batch 64, 2 persistent workers, 3 epochs."""
    ds = ImageDataset(256 if opts.quick else 4_000)
    return _iterable_compare("iterable_images", ds, 64, opts, item_bytes=ds.images[0].nbytes)


#: Workload name -> function(Options) -> rows.
ITERABLE_WORKLOADS: dict[str, Callable[[Options], list[Row]]] = {
    "iterable_tiny": iterable_tiny,
    "iterable_images": iterable_images,
}
