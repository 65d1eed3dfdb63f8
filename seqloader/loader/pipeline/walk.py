"""L3: the sources a pipeline reads, found by the one walk of a pipeline (:func:`find_sources`).

A loader state that says "position 40960" means "of *these* files", whatever ops sit between the
files and the loader (``smap``, ``rng_map``, ``mix``, slices, ``concatenate``, a user's Dataset
holding a source in an attribute). The loader fingerprints every source :func:`find_sources`
finds (:mod:`seqloader.loader.state.source_files`). The walk is :func:`seqloader.sequences.describe.walk`
(each stage names its inputs; other objects are looked into by their attributes, bounded), and
what a source is, :func:`seqloader.sequences.describe.is_source` (its stage says so): the same
walk records what the positions mean (:mod:`seqloader.loader.state.positions`) and keys ``pack``'s and
``keep``'s cached index. The loader also enters torch's ``Dataset`` objects (``enter``), so
``Subset``, ``ConcatDataset`` and a user's Dataset class holding a source are walked too.

The order is the walk's (depth first, inputs in order), which is the pipeline's order: the
sources of ``mix([a, b])`` are ``[a, b]``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch.utils.data

from seqloader.sequences.describe import MAX_CONTAINER, MAX_DEPTH, is_source, walk

__all__ = ["MAX_CONTAINER", "MAX_DEPTH", "find_sources", "is_source", "pipeline_sources"]


def find_sources(dataset: Any, enter: Optional[Callable[[Any], bool]] = None) -> list[Any]:
    """The sources of files in the pipeline ``dataset``, in pipeline order (see the module docstring).

    Args:
        dataset: the pipeline (a source, a lazy sequence, a Dataset object, ...); its own
            attributes are looked at whatever its kind.
        enter: which other objects to look into, besides lazy sequences (``None``: none).

    Returns:
        The distinct sources found (by identity), ``[]`` when there are none.

    Example:
        >>> import seqloader
        >>> class Files(seqloader.LazySequence):
        ...     def __init__(self, name): self.name = name
        ...     def __len__(self): return 3
        ...     def _item(self, i): return i
        ...     def files(self): return [[self.name, 3, "v"]]
        ...     def fingerprint(self): return self.name
        ...     def __repr__(self): return f"files({self.name})"
        >>> a, b = Files("a"), Files("b")
        >>> find_sources(seqloader.smap(str, seqloader.mix([a, b[1:], a], weights=[1, 1, 1])))
        [files(a), files(b)]
        >>> find_sources(list(range(10**6)))    # a long list is not looked into
        []
    """
    return [n.obj for n in walk(dataset, enter) if n.stage is not None and n.stage.source]


def _is_dataset(obj: Any) -> bool:
    return isinstance(obj, torch.utils.data.Dataset)


def pipeline_sources(dataset: Any) -> list[Any]:
    """The sources of files that ``dataset`` reads, in pipeline order: through lazy sequences and
    torch ``Dataset`` objects (``Subset``, ``ConcatDataset``, a user's class holding a source).

    Example:
        >>> pipeline_sources(torch.utils.data.Subset(list(range(10)), [1, 2]))
        []
    """
    return find_sources(dataset, enter=_is_dataset)
