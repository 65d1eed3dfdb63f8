"""L3: a loader's state out and in: checks of a loaded state against the loader it is loaded into.

The format of a state (its keys, versions, migrations and value checks) is
:mod:`seqloader.loader.state`; this module is how a state meets a loader, a concept of its own.

:func:`check_matches` (same dataset, arguments, kinds of sub-states), :func:`check_position`,
:func:`check_ahead` and :func:`check_against_recipe` (what the state's epoch reads: ``position``
inside it, ``ahead`` its batches, its mixture buildable) raise ``ValueError`` naming the key, the
saved and the current value; none of them mutates anything (a failed ``load_state_dict`` leaves
the loader untouched). The types and bounds of each value are checked before, by
:meth:`LoaderState.from_dict <seqloader.loader.state.LoaderState.from_dict>`.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, Optional, cast

from seqloader.loader.state import STAGE, IterableState, LoaderState

__all__ = ["check_against_recipe", "check_ahead", "check_matches", "check_position", "len_or_none",
           "load_seekable_sampler"]

def check_matches(saved: LoaderState, current: LoaderState, batch_size_may_change: bool = False) -> None:
    """Raise ``ValueError`` if ``saved`` cannot resume the loader whose fresh state is ``current``.

    Compared: ``dataset_len``, ``batch_size`` (unless ``batch_size_may_change``: the state counts
    samples, so the built-in orders and a custom ``sampler`` resume from the first unread sample
    with any batch size; a custom ``batch_sampler`` or an ``IterableDataset`` cannot, and batches
    yielded out of order past the watermark are batches of the saved size), ``drop_last``,
    ``shuffle``, ``sampler_len``, whether the dataset is iterable, and whether the sampler and
    dataset have sub-states. ``seed``, ``epoch`` and ``position`` are taken from ``saved``;
    ``saved_with`` is ignored.

    Example:
        >>> a = LoaderState(seed=1, epoch=0, position=0, dataset_len=10, batch_size=2,
        ...                 drop_last=False, shuffle=False)
        >>> check_matches(a, a)
        >>> check_matches(a, dataclasses.replace(a, dataset_len=9))
        Traceback (most recent call last):
        ValueError: load_state_dict: 'dataset_len' is 10 in the state_dict but len(dataset) is 9; this state was saved for a different dataset
    """
    if saved.dataset_len != current.dataset_len:
        raise ValueError(f"{STAGE}: 'dataset_len' is {saved.dataset_len} in the state_dict but "
                         f"len(dataset) is {current.dataset_len}; this state was saved for a "
                         "different dataset")
    if saved.batch_size != current.batch_size and batch_size_may_change and saved.ahead:
        raise ValueError(f"{STAGE}: 'batch_size' is {saved.batch_size} in the state_dict but this loader has "
                         f"batch_size={current.batch_size}, and 'ahead' lists batches of {saved.batch_size} "
                         "yielded out of order (in_order=False); resume with the saved batch_size")
    for key, what in (("batch_size", "batch_size"), ("drop_last", "drop_last"),
                      ("shuffle", "shuffle")):
        if key == "batch_size" and batch_size_may_change:
            continue
        a, b = getattr(saved, key), getattr(current, key)
        if a != b:
            raise ValueError(f"{STAGE}: {key!r} is {a!r} in the state_dict but this loader has "
                             f"{what}={b!r}; build the loader with the arguments it was saved with")
    if saved.sampler_len != current.sampler_len:
        raise ValueError(f"{STAGE}: 'sampler_len' is {saved.sampler_len} in the state_dict but this "
                         f"loader's sampler has len {current.sampler_len}; a custom sampler's positions "
                         "only resume the same sampler (e.g. a DistributedSampler needs the same "
                         "world size; the built-in sharding of shuffle=True/False resumes any)")
    if (saved.iterable is None) != (current.iterable is None):
        kind: Callable[[LoaderState], str] = (  # noqa: E731
            lambda s: "an IterableDataset" if s.iterable is not None else "a map-style dataset")
        raise ValueError(f"{STAGE}: 'iterable' says the state_dict was saved for {kind(saved)} but "
                         f"this loader reads {kind(current)}")
    for key, owner in (("sampler", "sampler"), ("dataset", "dataset")):
        a, b = getattr(saved, key) is None, getattr(current, key) is None
        if a != b:
            has: Callable[[bool], str] = lambda none: "no state" if none else "a state"  # noqa: E731
            raise ValueError(f"{STAGE}: {key!r} holds {has(a)} in the state_dict but this loader's "
                             f"{owner} has {has(b)} (state_dict/load_state_dict); use the same "
                             f"{owner} class as when saving")
    current_iterable = cast(IterableState, current.iterable)  # not None when saved's is not (checked above)
    if saved.iterable is not None and len(saved.iterable.workers) != len(current_iterable.workers):
        sw, cw = len(saved.iterable.workers), len(current_iterable.workers)
        raise ValueError(f"{STAGE}: 'iterable' holds {sw} worker stream(s) but this loader has "
                         f"{cw} (num_workers={saved.saved_with.get('num_workers', '?')} when saved, "
                         f"num_workers={current.saved_with.get('num_workers', '?')} now); an "
                         "IterableDataset resumes only with the same number of streams, max(1, num_workers)")


def check_position(saved: LoaderState, length: Optional[int] = None) -> None:
    """A built-in order's position is at most the end of an epoch: its ``length`` (default
    ``dataset_len``; a mixture whose weights changed has another), or less than ``length +
    world_size`` when the last round of a distributed epoch was padded.

    Example:
        >>> s = LoaderState(seed=1, epoch=0, position=11, dataset_len=10, batch_size=2, drop_last=False,
        ...                 shuffle=False, saved_with={"world_size": 2})
        >>> check_position(s); check_position(dataclasses.replace(s, position=12))
        Traceback (most recent call last):
        ValueError: load_state_dict: 'position' is 12 in the state_dict but an epoch of this loader has 10 samples; the state is corrupt or was saved for a different loader
    """
    n = (saved.dataset_len if length is None else length) or 0
    world = saved.saved_with.get("world_size", 1)
    limit = n + max(world if isinstance(world, int) and world > 0 else 1, 1) - 1 if n else 0
    if saved.position > limit:
        raise ValueError(f"{STAGE}: 'position' is {saved.position} in the state_dict but an epoch of this "
                         f"loader has {n} samples; the state is corrupt or was saved for a different loader")


def check_against_recipe(saved: LoaderState, recipe: Any) -> None:
    """A built-in order's state against ``recipe`` (the loader's, with the state's changes): the
    epoch's order can be built (its mixture, with the weight changes), ``position`` lies in it
    (:func:`check_position`) and each key of ``ahead`` is a batch of it from ``position``.

    Example:
        >>> from seqloader.loader.recipe import Recipe
        >>> r = Recipe(dataset=list(range(10)), dataset_len=10, batch_size=2, drop_last=False,
        ...            collate_fn=list, shuffle=False, seed=0)
        >>> s = LoaderState(seed=0, epoch=0, position=2, dataset_len=10, batch_size=2, drop_last=False,
        ...                 shuffle=False, ahead=(4,))
        >>> check_against_recipe(s, r); check_against_recipe(dataclasses.replace(s, ahead=(5,)), r)
        Traceback (most recent call last):
        ValueError: load_state_dict: 'ahead' lists 5, which is not the first position of a batch of epoch 0 from position 2; the state is corrupt or was saved for a different loader
    """
    try:
        order = recipe.order(saved.epoch)
    except (TypeError, ValueError) as e:
        if not recipe.changes:
            raise
        raise ValueError(f"{STAGE}: 'recipe' cannot be applied to this loader's dataset in epoch {saved.epoch} "
                         f"({type(e).__name__}: {e}); the state is corrupt or was saved for another dataset") from e
    check_position(saved, order.n)
    if saved.ahead:
        plan = recipe.plan(saved.epoch, saved.position, step=saved.step)
        for key in saved.ahead:
            if plan.batch_of(key) is None:
                raise ValueError(f"{STAGE}: 'ahead' lists {key}, which is not the first position of a batch of "
                                 f"epoch {saved.epoch} from position {saved.position}; the state is corrupt or was "
                                 "saved for a different loader")


def check_ahead(saved: LoaderState, world_size: int) -> None:
    """Batches yielded out of order past the watermark are known for one rank only: such a state
    resumes exactly only in a world of one (``world_size``: the current one)."""
    worlds = (saved.saved_with.get("world_size", 1), world_size)
    if saved.ahead and max(w if isinstance(w, int) else 1 for w in worlds) > 1:
        raise ValueError(f"{STAGE}: 'ahead' lists {len(saved.ahead)} batch(es) yielded out of order "
                         f"(in_order=False) past 'position', under torch.distributed (world sizes "
                         f"{worlds[0]} saved, {worlds[1]} now): each rank yielded other batches, so one "
                         "rank's state cannot resume the others exactly; use in_order=True with ranks")


def load_seekable_sampler(sampler: Any, state: Any) -> None:
    """Hand a seekable sampler (:class:`~seqloader.loader.shuffle_sampler.SeekableSampler`) its sub-state:
    the first change of a load, since it checks everything before it changes anything; a refusal
    is a ``ValueError`` naming ``'sampler'`` (its own message kept).

    Example:
        >>> from seqloader import BijectiveShuffleSampler
        >>> load_seekable_sampler(BijectiveShuffleSampler(range(4), seed=1), {"seed": "x"})
        Traceback (most recent call last):
        ValueError: load_state_dict: 'sampler' cannot be loaded into BijectiveShuffleSampler(len=4, seed=1) (TypeError: BijectiveShuffleSampler.load_state_dict: seed must be an int (got str 'x'))
    """
    try:
        sampler.load_state_dict(copy.deepcopy(state))
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise ValueError(f"{STAGE}: 'sampler' cannot be loaded into {sampler!r} ({type(e).__name__}: {e})") from e


def len_or_none(obj: Any) -> Optional[int]:
    """``len(obj)``, or ``None`` when it has none (an ``IterableDataset``, a sampler without ``__len__``)."""
    try:
        return len(obj)
    except TypeError:
        return None
