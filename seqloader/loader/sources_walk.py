"""L3: the sources a pipeline reads, found by a bounded walk of its objects (:func:`find_sources`).

A loader state that says "position 40960" means "of *these* files", whatever ops sit between the
files and the loader (``smap``, ``rng_map``, ``mix``, slices, ``concatenate``, a user's Dataset
holding a source in an attribute). The loader fingerprints every source :func:`find_sources`
finds (:mod:`seqloader.loader.source_files`). The walk is generic (no code per op) and bounded:

* **What is a source:** an object with callable ``files()`` and ``fingerprint()`` (every
  :class:`seqloader.sources.base.Source`). It is collected once (by identity) and not entered.
* **What is entered:** the dataset itself, and every :class:`~seqloader.LazySequence` reached
  (``enter`` may add kinds: the loader adds torch's ``Dataset``, so ``Subset``, ``ConcatDataset``
  and a user's Dataset class holding a source are walked too). Entering an object looks at its
  attributes (``__dict__`` in assignment order, then ``__slots__``).
* **Containers** (``list``, ``tuple``, the values of a ``dict``) are looked into only when they
  hold at most :data:`MAX_CONTAINER` items: a list of 1.2 million samples costs one ``len()``.
  Anything else (arrays, strings, functions, file handles) is not looked into.
* **Bounds:** each object is visited once, and the walk goes at most :data:`MAX_DEPTH` levels
  deep, so cycles and deep graphs end.

The order is the walk's (depth first, attributes in order), which is the pipeline's order for
the ops of :mod:`seqloader.sequences`: the sources of ``mix([a, b])`` are ``[a, b]``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

from seqloader.sequences.base import LazySequence

__all__ = ["MAX_CONTAINER", "MAX_DEPTH", "find_sources", "is_source"]

#: The most items a list, tuple or dict may hold for the walk to look into it.
MAX_CONTAINER = 256
#: The deepest the walk goes (levels of attributes and containers below the dataset).
MAX_DEPTH = 64


def is_source(obj: Any) -> bool:
    """Whether ``obj`` is a source of files: callable ``files()`` and ``fingerprint()``.

    Example:
        >>> class Files:
        ...     def files(self): return [["a.parquet", 10, "v1"]]
        ...     def fingerprint(self): return "0123"
        >>> is_source(Files()), is_source([1, 2]), is_source(Files)
        (True, False, False)
    """
    if isinstance(obj, type):
        return False
    try:  # a probe: an object whose __getattr__ raises something else is no source
        return callable(getattr(obj, "files", None)) and callable(getattr(obj, "fingerprint", None))
    except Exception:
        return False


def _attributes(obj: Any) -> Iterator[Any]:
    """The values of ``obj``'s instance attributes: ``__dict__`` in order, then ``__slots__``."""
    d = getattr(obj, "__dict__", None)
    if isinstance(d, dict):
        yield from list(d.values())
    seen = set()
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in seen or name in ("__dict__", "__weakref__"):
                continue
            seen.add(name)
            try:
                yield object.__getattribute__(obj, name)
            except AttributeError:  # an unset slot
                continue


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
    found: list[Any] = []
    visited: set[int] = set()

    def walk(obj: Any, depth: int, top: bool) -> None:
        if depth > MAX_DEPTH or id(obj) in visited:
            return
        if isinstance(obj, (str, bytes, bytearray, int, float, complex, bool, type(None), range)):
            return
        visited.add(id(obj))
        if is_source(obj):
            found.append(obj)
            return
        if isinstance(obj, (list, tuple)):
            if len(obj) <= MAX_CONTAINER:
                for x in obj:
                    walk(x, depth + 1, False)
            return
        if isinstance(obj, dict):
            if len(obj) <= MAX_CONTAINER:
                for x in list(obj.values()):
                    walk(x, depth + 1, False)
            return
        if top or isinstance(obj, LazySequence) or (enter is not None and enter(obj)):
            for x in _attributes(obj):
                walk(x, depth + 1, False)

    walk(dataset, 0, True)
    return found
