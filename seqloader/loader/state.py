"""The loader's resume state: the one module that builds, reads, validates and migrates it.

A state is a small dict of JSON types (see ``docs/design.md``, "Loader state: format and versions")::

    {"format": "seqloader.DataLoader", "version": 2, "seed": 1234, "epoch": 2,
     "position": 40960, "ahead": [], "dataset_len": 50000, "batch_size": 64, "drop_last": False,
     "shuffle": True, "derivation": 2, "sampler_len": None, "sampler_epoch": None,
     "sampler": None, "dataset": None, "iterable": None,
     "saved_with": {"num_workers": 4, "world_size": 8}}

``position`` counts samples of the epoch's *global* order already yielded (all ranks together);
after the last batch of an epoch (before ``StopIteration``) it is the epoch's end, and a resumed
iterator yields nothing more of that epoch. With ``in_order=False`` it is the *watermark* (every
batch before it has been yielded) and ``ahead`` lists the keys (global position of the first
sample) of the few batches already yielded beyond it, at most the in-flight window; else ``[]``. ``derivation`` names how ``(seed, epoch, position)``
turn into the order and the global-RNG seeds (``seqloader/loader/seeding.py``); a loaded state
keeps its own, so version-1 states (derivation 1) resume exactly as seqloader 0.1 would have.
``sampler_epoch`` is the ``epoch`` attribute of a custom sampler with ``set_epoch`` (such as a
``DistributedSampler``) when the epoch's indices were read, so the resumed epoch reads the same
order whether the framework calls ``set_epoch`` before or after ``iter()``.
``sampler_len`` is ``len()`` of a custom ``sampler``/``batch_sampler`` (``None`` for the built-in
orders or a sampler without ``__len__``): a custom sampler's positions mean something only for the
same sampler, so a different length (say a ``DistributedSampler`` under another world size) is
refused instead of resuming misaligned.
``sampler`` and ``dataset`` are the verbatim ``state_dict()`` of a user sampler or dataset that has
one (torchdata's ``Stateful`` protocol), else ``None``: the dict is JSON-serialisable exactly when
those sub-states are. ``iterable`` is ``None`` for map-style datasets; for an ``IterableDataset`` it
holds one entry per worker stream (see :class:`IterableState`). ``saved_with`` is informational and
ignored when loading.

:meth:`LoaderState.from_dict` validates everything (types, format, version) and upgrades old
versions one step at a time through :data:`_MIGRATIONS`; :func:`check_matches` compares a loaded
state with the loader it is loaded into. Neither mutates anything.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, Optional, cast

__all__ = ["FORMAT", "VERSION", "KEYS", "IterableState", "LoaderState", "check_ahead", "check_matches", "check_position",
           "is_stateful", "len_or_none"]

#: The value of the ``"format"`` key.
FORMAT = "seqloader.DataLoader"
#: The current version; bumped whenever the meaning of a key changes.
VERSION = 2
#: The derivations of orders and seeds a state may name (``seqloader/loader/seeding.py``).
DERIVATIONS = (1, 2)
#: The keys of a version-:data:`VERSION` state, in order.
KEYS = ("format", "version", "seed", "epoch", "position", "ahead", "dataset_len", "batch_size",
        "drop_last", "shuffle", "derivation", "sampler_len", "sampler_epoch", "sampler", "dataset",
        "iterable", "saved_with")

_STAGE = "load_state_dict"

#: ``_MIGRATIONS[v]`` turns a version-``v`` dict into a version-``v + 1`` dict (a new dict).
#: 1 -> 2: the derivation of orders and seeds became a key (version 1 meant derivation 1); the epoch
#: of a set_epoch sampler is saved (unknown for version 1); iterable streams are seqloader's own
#: (version-1 iterable states cannot resume exactly and are refused). Other meanings are kept.
_MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}


def is_stateful(obj: Any) -> bool:
    """Whether ``obj`` follows torchdata's ``Stateful`` protocol (``state_dict`` and ``load_state_dict``).

    Example:
        >>> is_stateful(object()), is_stateful(type("S", (), {"state_dict": dict, "load_state_dict": print})())
        (False, True)
    """
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check(cond: bool, key: str, value: Any, expected: str) -> None:
    if not cond:
        raise ValueError(f"{_STAGE}: {key!r} must be {expected} (got {value!r})")


@dataclasses.dataclass
class IterableState:
    """Where each worker stream of an ``IterableDataset`` stands (mutable: iterators update it).

    Batch ``i`` of an epoch is read from stream ``i % len(workers)`` (torch's round-robin); the
    loader's ``position`` is the next ``i``. Each stream's ``state`` is
    ``{"dataset": <dataset.state_dict()>, "iterator": <iter(dataset).state_dict()>}`` (either may
    be ``None``; the iterator's when ``__iter__`` returns ``self``) taken after its latest batch,
    or ``None`` when neither has a ``state_dict``.

    Attributes:
        workers: one dict per stream (one stream at ``num_workers=0``), each
            ``{"batches": int, "state": dict or None, "exhausted": bool}``.

    Example:
        >>> s = IterableState.fresh(2); s.record(0, batches=1, state={"dataset": {"i": 4}, "iterator": None})
        >>> s.to_dict()["workers"][0]
        {'batches': 1, 'state': {'dataset': {'i': 4}, 'iterator': None}, 'exhausted': False}
        >>> IterableState.from_dict(s.to_dict()) == s, s.started
        (True, True)
    """

    workers: list[dict[str, Any]]

    @classmethod
    def fresh(cls, streams: int) -> "IterableState":
        """The state before any batch of ``streams`` worker streams."""
        return cls([{"batches": 0, "state": None, "exhausted": False} for _ in range(streams)])

    @property
    def started(self) -> bool:
        """Whether any stream has yielded a batch or ended."""
        return any(w["batches"] or w["exhausted"] for w in self.workers)

    def record(self, worker: int, batches: int, state: Any) -> None:
        """Stream ``worker`` has yielded ``batches`` batches, after which its state is ``state``."""
        w = self.workers[worker]
        w["batches"], w["state"] = batches, state

    def mark_exhausted(self, worker: int, state: Any) -> None:
        """Stream ``worker`` has ended, its final state being ``state``."""
        w = self.workers[worker]
        w["exhausted"], w["state"] = True, state

    def carried(self) -> "IterableState":
        """The next epoch's start when the same dataset objects go on (persistent workers, or
        ``num_workers=0``): no batch yet, each stream's latest state kept for a resume."""
        return IterableState([{"batches": 0, "state": copy.deepcopy(w["state"]), "exhausted": False}
                              for w in self.workers])

    def copy(self) -> "IterableState":
        """An independent copy (sub-states deep-copied)."""
        return IterableState(copy.deepcopy(self.workers))

    def to_dict(self) -> dict[str, Any]:
        return {"workers": [dict(w) for w in self.workers]}

    @classmethod
    def from_dict(cls, d: Any) -> "IterableState":
        _check(isinstance(d, dict) and set(d) == {"workers"}, "iterable", d,
               "None or a dict with the key 'workers'")
        workers = d["workers"]
        _check(isinstance(workers, list) and len(workers) > 0, "iterable.workers", workers,
               "a non-empty list")
        for w in workers:
            _check(isinstance(w, dict) and set(w) == {"batches", "state", "exhausted"},
                   "iterable.workers[]", w, "a dict with keys 'batches', 'state', 'exhausted'")
            _check(_is_int(w["batches"]) and w["batches"] >= 0, "iterable.workers[].batches",
                   w["batches"], "a non-negative int")
            _check(isinstance(w["exhausted"], bool), "iterable.workers[].exhausted", w["exhausted"],
                   "a bool")
            _check(w["state"] is None or isinstance(w["state"], dict) and set(w["state"]) == {"dataset", "iterator"},
                   "iterable.workers[].state", w["state"], "None or a dict with keys 'dataset', 'iterator'")
        return cls(copy.deepcopy(workers))


def _migrate_1_to_2(d: dict[str, Any]) -> dict[str, Any]:
    if d.get("iterable") is not None:
        raise ValueError(f"{_STAGE}: this version-1 state_dict was saved for an IterableDataset, which "
                         "seqloader 0.1 read on torch's workers with other random streams and stream "
                         "states; it cannot be resumed exactly by this version (restart the epoch, or "
                         "finish it with seqloader 0.1)")
    return {**d, "version": 2, "derivation": 1, "sampler_epoch": None, "ahead": []}


@dataclasses.dataclass(frozen=True)
class LoaderState:
    """A validated, immutable loader state; :meth:`to_dict` gives the public dict.

    Example:
        >>> s = LoaderState(seed=7, epoch=0, position=0, dataset_len=10, batch_size=2,
        ...                 drop_last=False, shuffle=True)
        >>> d = s.to_dict()
        >>> LoaderState.from_dict(d) == s
        True
        >>> LoaderState.from_dict({**d, "version": 99})
        Traceback (most recent call last):
        ValueError: load_state_dict: this state_dict has version 99, newer than this seqloader's version 2; upgrade seqloader to load it
    """

    seed: int
    epoch: int
    position: int
    dataset_len: Optional[int]
    batch_size: Optional[int]
    drop_last: bool
    shuffle: bool
    derivation: int = 2
    ahead: tuple[int, ...] = ()
    sampler_len: Optional[int] = None
    sampler_epoch: Optional[int] = None
    sampler: Any = None
    dataset: Any = None
    iterable: Optional[IterableState] = None
    saved_with: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The public state dict (JSON types, plus whatever the verbatim sub-states hold)."""
        return {
            "format": FORMAT, "version": VERSION, "seed": self.seed, "epoch": self.epoch,
            "position": self.position, "ahead": list(self.ahead), "dataset_len": self.dataset_len,
            "batch_size": self.batch_size, "drop_last": self.drop_last, "shuffle": self.shuffle,
            "derivation": self.derivation, "sampler_len": self.sampler_len,
            "sampler_epoch": self.sampler_epoch, "sampler": self.sampler, "dataset": self.dataset,
            "iterable": None if self.iterable is None else self.iterable.to_dict(),
            "saved_with": dict(self.saved_with),
        }

    @classmethod
    def from_dict(cls, d: Any) -> "LoaderState":
        """Validate ``d`` (any supported version) and return the state; mutates nothing.

        Raises:
            TypeError: ``d`` is not a dict.
            ValueError: unknown format, newer version, missing/unknown keys or a bad value
                (the message names the key and the value).
        """
        if not isinstance(d, dict):
            raise TypeError(f"{_STAGE}: expected a dict (got {type(d).__name__})")
        if d.get("format") != FORMAT:
            raise ValueError(f"{_STAGE}: unknown format {d.get('format')!r} (expected {FORMAT!r}); "
                             "this is not a seqloader.DataLoader state_dict")
        version: Any = d.get("version")  # unvalidated until the _check below
        _check(_is_int(version) and version >= 1, "version", version, "a positive int")
        if version > VERSION:
            raise ValueError(f"{_STAGE}: this state_dict has version {version}, newer than this "
                             f"seqloader's version {VERSION}; upgrade seqloader to load it")
        while version < VERSION:
            d = _MIGRATIONS[version](d)
            version = d["version"]
        missing = [k for k in KEYS if k not in d]
        unknown = sorted(k for k in d if k not in KEYS)
        if missing or unknown:
            raise ValueError(f"{_STAGE}: malformed state_dict (missing keys {missing}, unknown keys "
                             f"{unknown})")
        _check(_is_int(d["seed"]) and 0 <= d["seed"] < 2**64, "seed", d["seed"], "an int in [0, 2**64)")
        for key in ("epoch", "position"):
            _check(_is_int(d[key]) and d[key] >= 0, key, d[key], "a non-negative int")
        _check(d["dataset_len"] is None or _is_int(d["dataset_len"]) and d["dataset_len"] >= 0,
               "dataset_len", d["dataset_len"], "None or a non-negative int")
        _check(d["batch_size"] is None or _is_int(d["batch_size"]) and d["batch_size"] > 0,
               "batch_size", d["batch_size"], "None or a positive int")
        _check(d["sampler_len"] is None or _is_int(d["sampler_len"]) and d["sampler_len"] >= 0,
               "sampler_len", d["sampler_len"], "None or a non-negative int")
        _check(isinstance(d["ahead"], list) and all(_is_int(k) and k >= d["position"] for k in d["ahead"])
               and len(set(d["ahead"])) == len(d["ahead"]), "ahead", d["ahead"],
               "a list of distinct ints at or after 'position'")
        _check(d["sampler_epoch"] is None or _is_int(d["sampler_epoch"]),
               "sampler_epoch", d["sampler_epoch"], "None or an int")
        _check(d["derivation"] in DERIVATIONS and _is_int(d["derivation"]), "derivation",
               d["derivation"], f"one of {list(DERIVATIONS)}")
        for key in ("drop_last", "shuffle"):
            _check(isinstance(d[key], bool), key, d[key], "a bool")
        _check(isinstance(d["saved_with"], dict), "saved_with", d["saved_with"], "a dict")
        iterable = None if d["iterable"] is None else IterableState.from_dict(d["iterable"])
        return cls(seed=d["seed"], epoch=d["epoch"], position=d["position"],
                   dataset_len=d["dataset_len"], batch_size=d["batch_size"],
                   drop_last=d["drop_last"], shuffle=d["shuffle"], derivation=d["derivation"],
                   ahead=tuple(d["ahead"]),
                   sampler_len=d["sampler_len"], sampler_epoch=d["sampler_epoch"],
                   sampler=d["sampler"],
                   dataset=d["dataset"], iterable=iterable, saved_with=dict(d["saved_with"]))


def check_matches(saved: LoaderState, current: LoaderState) -> None:
    """Raise ``ValueError`` if ``saved`` cannot resume the loader whose fresh state is ``current``.

    Compared: ``dataset_len``, ``batch_size``, ``drop_last``, ``shuffle``, ``sampler_len``, whether the dataset is
    iterable, and whether the sampler and dataset have sub-states. ``seed``, ``epoch`` and
    ``position`` are taken from ``saved``; ``saved_with`` is ignored.

    Example:
        >>> a = LoaderState(seed=1, epoch=0, position=0, dataset_len=10, batch_size=2,
        ...                 drop_last=False, shuffle=False)
        >>> check_matches(a, a)
        >>> check_matches(a, dataclasses.replace(a, dataset_len=9))
        Traceback (most recent call last):
        ValueError: load_state_dict: 'dataset_len' is 10 in the state_dict but len(dataset) is 9; this state was saved for a different dataset
    """
    if saved.dataset_len != current.dataset_len:
        raise ValueError(f"{_STAGE}: 'dataset_len' is {saved.dataset_len} in the state_dict but "
                         f"len(dataset) is {current.dataset_len}; this state was saved for a "
                         "different dataset")
    for key, what in (("batch_size", "batch_size"), ("drop_last", "drop_last"),
                      ("shuffle", "shuffle")):
        a, b = getattr(saved, key), getattr(current, key)
        if a != b:
            raise ValueError(f"{_STAGE}: {key!r} is {a!r} in the state_dict but this loader has "
                             f"{what}={b!r}; build the loader with the arguments it was saved with")
    if saved.sampler_len != current.sampler_len:
        raise ValueError(f"{_STAGE}: 'sampler_len' is {saved.sampler_len} in the state_dict but this "
                         f"loader's sampler has len {current.sampler_len}; a custom sampler's positions "
                         "only resume the same sampler (e.g. a DistributedSampler needs the same "
                         "world size; the built-in sharding of shuffle=True/False resumes any)")
    if (saved.iterable is None) != (current.iterable is None):
        kind: Callable[[LoaderState], str] = (  # noqa: E731
            lambda s: "an IterableDataset" if s.iterable is not None else "a map-style dataset")
        raise ValueError(f"{_STAGE}: 'iterable' says the state_dict was saved for {kind(saved)} but "
                         f"this loader reads {kind(current)}")
    for key, owner in (("sampler", "sampler"), ("dataset", "dataset")):
        a, b = getattr(saved, key) is None, getattr(current, key) is None
        if a != b:
            has: Callable[[bool], str] = lambda none: "no state" if none else "a state"  # noqa: E731
            raise ValueError(f"{_STAGE}: {key!r} holds {has(a)} in the state_dict but this loader's "
                             f"{owner} has {has(b)} (state_dict/load_state_dict); use the same "
                             f"{owner} class as when saving")
    current_iterable = cast(IterableState, current.iterable)  # not None when saved's is not (checked above)
    if saved.iterable is not None and len(saved.iterable.workers) != len(current_iterable.workers):
        sw, cw = len(saved.iterable.workers), len(current_iterable.workers)
        raise ValueError(f"{_STAGE}: 'iterable' holds {sw} worker stream(s) but this loader has "
                         f"{cw} (num_workers={saved.saved_with.get('num_workers', '?')} when saved, "
                         f"num_workers={current.saved_with.get('num_workers', '?')} now); an "
                         "IterableDataset resumes only with the same number of streams, max(1, num_workers)")


def check_position(saved: LoaderState) -> None:
    """A built-in order's position is at most the end of an epoch: ``dataset_len``, or less than
    ``dataset_len + world_size`` when the last round of a distributed epoch was padded.

    Example:
        >>> s = LoaderState(seed=1, epoch=0, position=11, dataset_len=10, batch_size=2, drop_last=False,
        ...                 shuffle=False, saved_with={"world_size": 2})
        >>> check_position(s); check_position(dataclasses.replace(s, position=12))
        Traceback (most recent call last):
        ValueError: load_state_dict: 'position' is 12 in the state_dict but an epoch of this loader has 10 samples; the state is corrupt or was saved for a different loader
    """
    n = saved.dataset_len or 0
    world = saved.saved_with.get("world_size", 1)
    limit = n + max(world if isinstance(world, int) and world > 0 else 1, 1) - 1 if n else 0
    if saved.position > limit:
        raise ValueError(f"{_STAGE}: 'position' is {saved.position} in the state_dict but an epoch of this "
                         f"loader has {n} samples; the state is corrupt or was saved for a different loader")


def check_ahead(saved: LoaderState, world_size: int) -> None:
    """Batches yielded out of order past the watermark are known for one rank only: such a state
    resumes exactly only in a world of one (``world_size``: the current one)."""
    worlds = (saved.saved_with.get("world_size", 1), world_size)
    if saved.ahead and max(w if isinstance(w, int) else 1 for w in worlds) > 1:
        raise ValueError(f"{_STAGE}: 'ahead' lists {len(saved.ahead)} batch(es) yielded out of order "
                         f"(in_order=False) past 'position', under torch.distributed (world sizes "
                         f"{worlds[0]} saved, {worlds[1]} now): each rank yielded other batches, so one "
                         "rank's state cannot resume the others exactly; use in_order=True with ranks")


def len_or_none(obj: Any) -> Optional[int]:
    """``len(obj)``, or ``None`` when it has none (an ``IterableDataset``, a sampler without ``__len__``)."""
    try:
        return len(obj)
    except TypeError:
        return None


_MIGRATIONS[1] = _migrate_1_to_2
