"""What decides which sample a position is: each stage describes itself, and one walk reads them.

A loader state says "position 40960 of epoch 3"; that is exact only if position 40960 means the
same sample when it is loaded. Every op answers for itself, as Grain's ops name themselves: its
``_position_stage()`` returns a :class:`Stage` with

* ``name``: the op (``"shuffle"``, ``"keep"``, ``"parquet"``);
* ``params``: the parameters that decide *which* sample of its inputs a position is (JSON values:
  ``shuffle``'s seed, ``pack``'s method and window, ``keep``'s predicate and a digest of the kept
  positions), and nothing that changes only values (``smap``'s function, ``pack``'s ``pad_id``);
* ``children``: its inputs, in order;
* ``values``: what changes only the values (``smap``'s and ``rng_map``'s function, ``rng_map``'s
  seed, a source's ``transform=``): not in a state, but in what a cached index is keyed by (a
  ``keep`` predicate reads values);
* ``source``: whether it is a source of files (``files()`` and ``fingerprint()``): the one place
  that says so (:func:`is_source`).

:func:`walk` is the one walk of a pipeline. It visits the dataset and, below it, every stage's
children; an object that does not describe itself (a user's Dataset class, a ``Subset``, a lazy
sequence of a user's) is looked into by its attributes (``__dict__`` in order, then
``__slots__``) when it is the dataset itself, a :class:`~seqloader.LazySequence`, or ``enter``
says so. Lists, tuples and dicts are looked into when they hold at most :data:`MAX_CONTAINER`
items (a list of a million samples costs one ``len()``); other objects are leaves. Each object is
visited once and the walk goes at most :data:`MAX_DEPTH` levels deep. Three things read it: the
state's record of positions (``seqloader.loader.state.positions``), the files check (the sources, in
pipeline order) and the key of ``pack``'s and ``keep``'s cached index (``seqloader.packing``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Optional

from seqloader.sequences.base import LazySequence
from seqloader.sequences.stage import Stage, digest, function_name

__all__ = ["MAX_CONTAINER", "MAX_DEPTH", "Node", "Stage", "describe_stage", "digest", "function_name", "is_source",
           "walk"]

#: The most items a list, tuple or dict may hold for the walk to look into it.
MAX_CONTAINER = 256
#: The deepest the walk goes (levels of stages, attributes and containers below the dataset).
MAX_DEPTH = 64

_SCALARS = (str, bytes, bytearray, int, float, complex, bool, type(None), range)


def _duck_source(obj: Any) -> bool:
    try:  # a probe: an object whose __getattr__ raises something else is no source
        return callable(getattr(obj, "files", None)) and callable(getattr(obj, "fingerprint", None))
    except Exception:
        return False


def describe_stage(obj: Any) -> Optional[Stage]:
    """``obj``'s :class:`Stage`: its own ``_position_stage()``, or, for an object that has none
    but ``files()`` and ``fingerprint()`` (a source of a user's), a source stage; else ``None``.

    Example:
        >>> from seqloader import shuffle
        >>> describe_stage(shuffle(range(4), seed=3)).params, describe_stage([1, 2])
        ({'seed': 3}, None)
    """
    if isinstance(obj, type) or isinstance(obj, _SCALARS):
        return None
    own = getattr(type(obj), "_position_stage", None)
    if callable(own):
        stage: Stage = own(obj)
        return stage
    if _duck_source(obj):
        return Stage(type(obj).__name__, {}, source=True)
    return None


def is_source(obj: Any) -> bool:
    """Whether ``obj`` is a source of files (its stage says so; see :func:`describe_stage`).

    Example:
        >>> class Files:
        ...     def files(self): return [["a.parquet", 10, "v1"]]
        ...     def fingerprint(self): return "0123"
        >>> is_source(Files()), is_source([1, 2]), is_source(Files)
        (True, False, False)
    """
    stage = describe_stage(obj)
    return stage is not None and stage.source


@dataclasses.dataclass(frozen=True)
class Node:
    """One object the walk reached: ``obj`` at ``depth``, with its ``stage`` (``None`` for an
    object that does not describe itself), and whether the walk looked into it (``entered``)."""

    obj: Any
    depth: int
    stage: Optional[Stage]
    entered: bool


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


def walk(dataset: Any, enter: Optional[Callable[[Any], bool]] = None) -> list[Node]:
    """Every object of the pipeline ``dataset``, depth first in pipeline order (see the module docstring).

    Args:
        dataset: the pipeline (a source, a lazy sequence, a Dataset object, a list, ...).
        enter: which other objects that do not describe themselves to look into (``None``: only
            the dataset itself and lazy sequences).

    Returns:
        The nodes in the order reached: a stage before its children; scalars are left out.

    Example:
        >>> from seqloader import batch, shuffle
        >>> [(n.stage.name if n.stage else type(n.obj).__name__, n.depth)
        ...  for n in walk(batch(shuffle(list(range(10)), seed=1), 4))]
        [('batch', 0), ('shuffle', 1), ('list', 2)]
        >>> [type(n.obj).__name__ for n in walk(list(range(10**6)))]   # a long list is not looked into
        ['list']
    """
    nodes: list[Node] = []
    visited: set[int] = set()

    def visit(obj: Any, depth: int, top: bool) -> None:
        if depth > MAX_DEPTH or id(obj) in visited or isinstance(obj, _SCALARS):
            return
        visited.add(id(obj))
        stage = describe_stage(obj)
        if stage is not None:
            nodes.append(Node(obj, depth, stage, True))
            for child in stage.children:
                visit(child, depth + 1, False)
            return
        if isinstance(obj, (list, tuple, dict)):
            inside = len(obj) <= MAX_CONTAINER
            nodes.append(Node(obj, depth, None, inside))
            if inside:
                for x in list(obj.values() if isinstance(obj, dict) else obj):
                    visit(x, depth + 1, False)
            return
        inside = top or isinstance(obj, LazySequence) or (enter is not None and enter(obj))
        nodes.append(Node(obj, depth, None, inside))
        if inside:
            for x in _attributes(obj):
                visit(x, depth + 1, False)

    visit(dataset, 0, True)
    return nodes
