"""``find_sources``: a generic, bounded walk of a pipeline's objects that finds every source of files."""

from __future__ import annotations

import torch

import seqloader
from seqloader.loader.pipeline.walk import pipeline_sources
from seqloader.loader.pipeline.walk import MAX_CONTAINER, MAX_DEPTH, find_sources, is_source


class Files(seqloader.LazySequence):
    """A stand-in source: ``files()`` and ``fingerprint()``, and a few items."""

    def __init__(self, name, n=4):
        self.name, self.n = name, n

    def __len__(self):
        return self.n

    def _item(self, i):
        return i

    def files(self):
        return [[self.name, self.n, "v"]]

    def fingerprint(self):
        return self.name

    def __repr__(self):
        return f"files({self.name})"


class Slotted(seqloader.LazySequence):
    __slots__ = ("_inner", "_other")

    def __init__(self, inner, other=None):
        self._inner = inner
        if other is not None:
            self._other = other

    def __len__(self):
        return len(self._inner)

    def _item(self, i):
        return self._inner[i]


def test_every_op_is_walked_in_pipeline_order_and_each_source_found_once():
    a, b, c = Files("a"), Files("b"), Files("c")
    pipeline = seqloader.smap(lambda x, y: x, seqloader.concatenate([a[1:], seqloader.shuffle(b, seed=1)])[:4],
                              seqloader.rng_map(lambda x, rng: x, seqloader.mix([c, a], weights=[1, 1], length=8)[:4],
                                                seed=2))
    assert find_sources(pipeline) == [a, b, c]
    assert find_sources(a) == [a]  # the dataset itself
    assert find_sources(Slotted(Slotted(b), a)) == [b, a]  # __slots__ are attributes too; an unset slot is skipped


def test_torch_datasets_and_user_classes_are_entered_by_the_loader_and_short_containers_followed():
    a, b = Files("a"), Files("b")

    class Holder(torch.utils.data.Dataset):
        def __init__(self):
            self.parts = {"train": [a], "extra": (seqloader.smap(str, b),)}

        def __len__(self):
            return 4

        def __getitem__(self, i):
            return i

    nested = torch.utils.data.ConcatDataset([Holder(), torch.utils.data.Subset(a, [0, 1])])
    assert pipeline_sources(nested) == [a, b]
    assert find_sources(nested) == []  # without enter=, only lazy sequences (and the top object) are entered
    assert find_sources(Holder()) == [a, b]  # the top object is always entered


class Plain:
    def __init__(self, inner):
        self.inner = inner


class Untouchable(list):
    """A list that fails the test if anything looks at its items."""

    def __iter__(self):
        raise AssertionError("the walk iterated a large list")

    def __getitem__(self, i):
        raise AssertionError("the walk indexed a large list")


def test_large_containers_are_not_looked_into_and_cost_nothing():
    a = Files("a")
    rows = Untouchable([(i, i + 1) for i in range(1_200_000)] + [a])
    assert find_sources(Plain(rows)) == []  # not looked into: one len()
    assert find_sources(Plain([0] * (MAX_CONTAINER - 1) + [a])) == [a]
    assert find_sources(Plain({k: k for k in range(MAX_CONTAINER)} | {"a": a})) == []
    assert find_sources(Plain(Plain(a))) == []  # a plain object below the top is not entered


def test_cycles_end_and_depth_is_bounded():
    a = Files("a")
    loop: list = [a]
    loop.append(loop)
    assert find_sources(Plain(loop)) == [a]
    deep: object = a
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    assert find_sources(Plain(deep)) == []
    shallow: object = a
    for _ in range(MAX_DEPTH - 2):
        shallow = [shallow]
    assert find_sources(Plain(shallow)) == [a]


def test_what_counts_as_a_source():
    class Raises:
        def __getattr__(self, name):
            raise KeyError(name)

    class OnlyFiles:
        def files(self):
            return []

    assert is_source(Files("a")) and not is_source(Files) and not is_source(OnlyFiles())
    assert not is_source(Raises()) and find_sources(Plain(Raises())) == []
