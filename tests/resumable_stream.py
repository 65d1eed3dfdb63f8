"""A resumable ``IterableDataset`` shared by the thread-worker and Ray tests: a module of its own,
so that the items of ``ray_items`` stay free of torch (a Ray actor imports the module an item's
class comes from)."""

from __future__ import annotations

from torch.utils.data import IterableDataset, get_worker_info


class Stream(IterableDataset):
    """A resumable stream per worker (torchdata's protocol on the iterator): worker ``w`` of ``k``
    yields ``w, w + k, ...`` below ``n``."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        w, k = (0, 1) if info is None else (info.id, info.num_workers)
        return _StreamIt(w, k, self.n)


class _StreamIt:
    def __init__(self, w, k, n):
        self.pos, self.k, self.n = w, k, n

    def __iter__(self):
        return self

    def __next__(self):
        if self.pos >= self.n:
            raise StopIteration
        self.pos += self.k
        return self.pos - self.k

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, sd):
        self.pos = sd["pos"]
