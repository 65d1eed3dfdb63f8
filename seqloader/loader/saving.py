"""L3: a loader's state out and in: built from the loader's parts, and a loaded one checked against them.

The format of a state (its keys, versions, migrations and value checks) is
:mod:`seqloader.loader.state.state`; this module is how a state meets a loader, a concept of its own:
:func:`state_of` builds the :class:`~seqloader.loader.state.state.LoaderState` of a loader from its
settings, its :class:`~seqloader.loader.reading.Reading` and its progress, and
:func:`check_loadable` runs every check of a loaded state before the loader changes anything
(``DataLoader.load_state_dict`` then hands the parts their share).

:func:`check_matches` (same dataset, arguments, kinds of sub-states), :func:`check_position`,
:func:`check_ahead` and :func:`check_against_recipe` (what the state's epoch reads: ``position``
inside it, ``ahead`` its batches, its mixture buildable) raise ``ValueError`` naming the key, the
saved and the current value; none of them mutates anything (a failed ``load_state_dict`` leaves
the loader untouched). The types and bounds of each value are checked before, by
:meth:`LoaderState.from_dict <seqloader.loader.state.state.LoaderState.from_dict>`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, cast

from seqloader.loader import world
from seqloader.loader.recipe.changes import RecipeChanges
from seqloader.loader.state.progress import Progress
from seqloader.loader.reading import Reading
from seqloader.loader.settings import Settings
from seqloader.loader.state.positions import check_positions
from seqloader.loader.state.source_files import check_pipeline_files
from seqloader.loader.state.state import STAGE, IterableState, LoaderState, is_stateful

__all__ = ["check_against_recipe", "check_ahead", "check_loadable", "check_matches", "check_position", "len_or_none",
           "state_of"]


def state_of(loader: Settings, reading: Reading, progress: Progress) -> LoaderState:
    """The state of a loader now, from its settings, its reading part and its progress.

    Example:
        >>> loader = type("L", (), dict(dataset=list(range(10)), batch_size=4, drop_last=False, shuffle=True,
        ...                             seed=3, num_workers=0))()
        >>> s = state_of(loader, Reading(False, None, None, 4, None, 0, Progress(), None), Progress())
        >>> s.seed, s.position, s.dataset_len, s.saved_with
        (3, 0, 10, {'num_workers': 0, 'world_size': 1})
    """
    sampler_state, sampler_epoch = None, None
    if reading.custom is not None:
        sampler_state, sampler_epoch = reading.custom.state(progress.epoch, progress.position, progress.started)
    elif reading.seekable is not None:
        sampler_state = reading.seekable.state_dict()  # its seed; the loader keeps the epoch
    iterable, dataset = reading.iterable, cast(Any, loader.dataset)
    dataset_state = dataset.state_dict() if not iterable and is_stateful(dataset) else None
    return LoaderState(
        seed=loader.seed, epoch=progress.epoch, position=progress.position, ahead=progress.ahead,
        step=progress.step, recipe=reading.control.changes.to_state(), files=reading.files(dataset),
        positions=None if iterable else reading.positions(dataset),
        dataset_len=len_or_none(dataset), batch_size=loader.batch_size, drop_last=loader.drop_last,
        shuffle=bool(loader.shuffle) and not iterable, derivation=reading.derivation,
        sampler_len=None if iterable or reading.custom is None else len_or_none(reading.custom),
        sampler_epoch=sampler_epoch, sampler=sampler_state, dataset=dataset_state,
        iterable=None if progress.iterable is None else progress.iterable.copy(),
        saved_with={"num_workers": loader.num_workers, "world_size": world.current_world()[1]})


def check_loadable(saved: LoaderState, loader: Settings, reading: Reading, progress: Progress,
                   check_files: bool) -> RecipeChanges:
    """Every check of a loaded state against the loader, before anything changes; returns the
    state's recipe changes, validated (see ``DataLoader.load_state_dict`` for what is refused)."""
    check_pipeline_files(saved.files, loader.dataset, check_files)  # the files, then what the positions mean:
    check_positions(saved.positions, loader.dataset, check_files)  # each names more than a length that differs
    check_matches(saved, state_of(loader, reading, progress), not reading.iterable and reading.batch_sampler is None)
    check_ahead(saved, world.current_world()[1])
    changes = reading.control.checked(saved.recipe, None if reading.iterable else reading.recipe(loader))
    if reading.custom is not None:
        reading.custom.check(saved)
    elif not reading.iterable:
        check_against_recipe(saved, reading.recipe(loader).replace(changes=changes))
    return changes


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
        >>> from seqloader.loader.recipe.recipe import Recipe
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


def len_or_none(obj: Any) -> Optional[int]:
    """``len(obj)``, or ``None`` when it has none (an ``IterableDataset``, a sampler without ``__len__``).

    Example:
        >>> len_or_none([1, 2]), len_or_none(iter([1, 2]))
        (2, None)
    """
    try:
        return len(obj)
    except TypeError:
        return None
