"""The loader's resume state: the one module that builds, reads, validates and migrates it.

A state is a small dict of JSON types (see ``docs/design.md``, "Loader state: format and versions")::

    {"format": "seqloader.DataLoader", "version": 4, "seed": 1234, "epoch": 2,
     "position": 40960, "ahead": [], "step": 2140, "dataset_len": 50000, "batch_size": 64,
     "drop_last": False, "shuffle": True, "derivation": 2, "sampler_len": None,
     "sampler_epoch": None, "sampler": None, "dataset": None, "iterable": None,
     "recipe": None, "files": [], "saved_with": {"num_workers": 4, "world_size": 8}}

``position`` counts samples of the epoch's *global* order already yielded (all ranks together);
after the last batch of an epoch (before ``StopIteration``) it is the epoch's end, and a resumed
iterator yields nothing more of that epoch. With ``in_order=False`` it is the *watermark* (every
batch before it has been yielded) and ``ahead`` lists the keys (global position of the first
sample) of the few batches already yielded beyond it, at most the in-flight window; else ``[]``. ``derivation`` names how ``(seed, epoch, position)``
turn into the order and the global-RNG seeds (``seqloader/loader/seeding.py``); a loaded state
keeps its own, so version-1 states (derivation 1) resume exactly as seqloader 0.1 would have.
``step`` is the global step (batches yielded since the first epoch, on every rank alike) of the batch
at ``position``: what a batch-size schedule and changes keyed by step read.
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
holds one entry per worker stream (see :class:`~seqloader.loader.stream_state.IterableState`).
``recipe`` is ``None`` until the recipe changes during the run, then the changes (see
:mod:`seqloader.loader.changes`): mixture weights as ``[step, epoch, position, weights]`` and
skipped samples as ``[epoch, position, kind, ranges]``, O(number of changes). ``files`` lists
the small fingerprint of the file list of every source in the pipeline, in pipeline order
(``[{"files": n, "fingerprint": hex, ...}, ...]``, see :mod:`seqloader.loader.sources_walk`):
``[]`` when it reads no source, ``None`` when the state comes from a version that did not record
them (it is then not checked). ``saved_with`` is informational: loading reads only its
``world_size``, to bound ``position`` after a padded last round.

:meth:`LoaderState.from_dict` validates everything (types, format, version, and every int within
``[0, 2**63)``: :mod:`seqloader.loader.validation`) and upgrades old versions one step at a time
through :data:`_MIGRATIONS`;
:func:`~seqloader.loader.state_checks.check_matches` compares a loaded state with the loader it is
loaded into. Neither mutates anything.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from seqloader.loader.validation import STAGE as _STAGE, check_int_in as _check_int, check_value as _check, \
    is_int as _is_int, is_int_in as _is_int_in
from seqloader.loader.stream_state import IterableState

__all__ = ["FORMAT", "VERSION", "KEYS", "IterableState", "LoaderState", "is_stateful"]

#: The value of the ``"format"`` key.
FORMAT = "seqloader.DataLoader"
#: The current version; bumped whenever the meaning of a key changes.
VERSION = 4
#: The derivations of orders and seeds a state may name (``seqloader/loader/seeding.py``).
DERIVATIONS = (1, 2)
#: The keys of a version-:data:`VERSION` state, in order.
KEYS = ("format", "version", "seed", "epoch", "position", "ahead", "step", "dataset_len", "batch_size",
        "drop_last", "shuffle", "derivation", "sampler_len", "sampler_epoch", "sampler", "dataset",
        "iterable", "recipe", "files", "saved_with")

#: The mark of a version-3 fingerprint (of paths and modification times) in a migrated state.
LEGACY_FINGERPRINT = "v3:"

#: ``_MIGRATIONS[v]`` turns a version-``v`` dict into a version-``v + 1`` dict (a new dict).
#: 1 -> 2: the derivation of orders and seeds became a key (version 1 meant derivation 1); the epoch
#: of a set_epoch sampler is saved (unknown for version 1); iterable streams are seqloader's own
#: (version-1 iterable states cannot resume exactly and are refused). Other meanings are kept.
#: 2 -> 3: ``step`` (the global step of the batch at ``position``; version 2 counted none: the
#: batches of the epoch before ``position`` are taken as the steps), ``recipe`` (no change) and
#: ``files`` (no fingerprint) are new keys; the others keep their meaning.
#: 3 -> 4: ``files`` lists the description of every source of the pipeline (version 3 held the
#: description of the dataset itself when it was a source, else ``None``), and a fingerprint is of
#: the files' content (relative names, sizes, footers or member tables; version 3 fingerprinted
#: absolute paths and modification times, which cannot be compared with it): a description
#: becomes a one-element list whose fingerprint is marked ``"v3:"`` (loading it raises, naming the
#: ``check_files=False`` override), ``None`` stays ``None`` (not recorded: not checked).
_MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}


def is_stateful(obj: Any) -> bool:
    """Whether ``obj`` follows torchdata's ``Stateful`` protocol (``state_dict`` and ``load_state_dict``).

    Example:
        >>> is_stateful(object()), is_stateful(type("S", (), {"state_dict": dict, "load_state_dict": print})())
        (False, True)
    """
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def _migrate_1_to_2(d: dict[str, Any]) -> dict[str, Any]:
    if d.get("iterable") is not None:
        raise ValueError(f"{_STAGE}: this version-1 state_dict was saved for an IterableDataset, which "
                         "seqloader 0.1 read on torch's workers with other random streams and stream "
                         "states; it cannot be resumed exactly by this version (restart the epoch, or "
                         "finish it with seqloader 0.1)")
    return {**d, "version": 2, "derivation": 1, "sampler_epoch": None, "ahead": []}


def _migrate_2_to_3(d: dict[str, Any]) -> dict[str, Any]:
    # reads values not validated yet: what is malformed is left for from_dict to name
    saved_with = d.get("saved_with")
    world = saved_with.get("world_size", 1) if isinstance(saved_with, dict) else 1
    batch_size: Any = d.get("batch_size")
    per_step = (batch_size if _is_int_in(batch_size, 1) else 1) * (world if _is_int_in(world, 1) else 1)
    position = d.get("position", 0)
    step = position // per_step if _is_int_in(position) else 0
    return {**d, "version": 3, "step": step, "recipe": None, "files": None}


def _migrate_3_to_4(d: dict[str, Any]) -> dict[str, Any]:
    files = d.get("files")
    if isinstance(files, dict):
        old = files.get("fingerprint")
        files = [{**files, "fingerprint": f"{LEGACY_FINGERPRINT}{old}"}] if isinstance(old, str) else [files]
    return {**d, "version": 4, "files": files}


#: The keys of a source's file-list description (``seqloader.sources.fingerprint.describe_files``):
#: those it always has, and those it may have.
DESCRIPTION_KEYS = ({"files", "fingerprint"}, {"files", "fingerprint", "chunk", "chunks"})


def _check_description(key: str, d: Any) -> None:
    """One entry of ``files``: the keys of a description, with values of the right types."""
    must, may = DESCRIPTION_KEYS
    _check(isinstance(d, dict) and must <= set(d) <= may, key, d,
           f"a dict with the keys {sorted(must)} (and {sorted(may - must)})")
    _check_int(f"{key}.files", d["files"])
    _check(isinstance(d["fingerprint"], str) and len(d["fingerprint"]) <= 128, f"{key}.fingerprint",
           d["fingerprint"], "a str of hex digits")
    if "chunk" in d:
        _check_int(f"{key}.chunk", d["chunk"], low=1)
    if "chunks" in d:
        _check(isinstance(d["chunks"], list) and all(isinstance(c, str) for c in d["chunks"]), f"{key}.chunks",
               d["chunks"], "a list of str")


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
        ValueError: load_state_dict: this state_dict has version 99, newer than this seqloader's version 4; upgrade seqloader to load it
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
    step: int = 0
    sampler_len: Optional[int] = None
    sampler_epoch: Optional[int] = None
    sampler: Any = None
    dataset: Any = None
    iterable: Optional[IterableState] = None
    recipe: Optional[dict[str, Any]] = None
    files: Optional[list[dict[str, Any]]] = dataclasses.field(default_factory=list)
    saved_with: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The public state dict (JSON types, plus whatever the verbatim sub-states hold)."""
        return {
            "format": FORMAT, "version": VERSION, "seed": self.seed, "epoch": self.epoch,
            "position": self.position, "ahead": list(self.ahead), "step": self.step,
            "dataset_len": self.dataset_len,
            "batch_size": self.batch_size, "drop_last": self.drop_last, "shuffle": self.shuffle,
            "derivation": self.derivation, "sampler_len": self.sampler_len,
            "sampler_epoch": self.sampler_epoch, "sampler": self.sampler, "dataset": self.dataset,
            "iterable": None if self.iterable is None else self.iterable.to_dict(),
            "recipe": self.recipe, "files": None if self.files is None else [dict(f) for f in self.files],
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
        _check_int("version", version, low=1)
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
        for key in ("epoch", "position", "step"):
            _check_int(key, d[key])
        _check_int("dataset_len", d["dataset_len"], none_ok=True)
        _check_int("batch_size", d["batch_size"], low=1, none_ok=True)
        _check_int("sampler_len", d["sampler_len"], none_ok=True)
        _check(isinstance(d["ahead"], list), "ahead", d["ahead"], "a list of distinct ints at or after 'position'")
        for k, key in enumerate(d["ahead"]):
            _check_int(f"ahead[{k}]", key, low=d["position"])
        _check(len(set(d["ahead"])) == len(d["ahead"]), "ahead", d["ahead"], "a list of distinct ints")
        _check_int("sampler_epoch", d["sampler_epoch"], low=-2**63, none_ok=True)
        _check(d["derivation"] in DERIVATIONS and _is_int(d["derivation"]), "derivation",
               d["derivation"], f"one of {list(DERIVATIONS)}")
        for key in ("drop_last", "shuffle"):
            _check(isinstance(d[key], bool), key, d[key], "a bool")
        _check(isinstance(d["saved_with"], dict), "saved_with", d["saved_with"], "a dict")
        _check_int("saved_with.world_size", d["saved_with"].get("world_size", 1), low=1)
        _check_int("saved_with.num_workers", d["saved_with"].get("num_workers", 0))
        _check(d["recipe"] is None or isinstance(d["recipe"], dict) and set(d["recipe"]) <= {"weights", "skips"},
               "recipe", d["recipe"], "None or a dict with the keys 'weights' and/or 'skips'")
        _check(d["files"] is None or isinstance(d["files"], list), "files", d["files"],
               "None or a list of file-list descriptions (one per source)")
        for k, description in enumerate(d["files"] or ()):
            _check_description(f"files[{k}]", description)
        iterable = None if d["iterable"] is None else IterableState.from_dict(d["iterable"])
        return cls(seed=d["seed"], epoch=d["epoch"], position=d["position"],
                   dataset_len=d["dataset_len"], batch_size=d["batch_size"],
                   drop_last=d["drop_last"], shuffle=d["shuffle"], derivation=d["derivation"],
                   ahead=tuple(d["ahead"]), step=d["step"], recipe=d["recipe"],
                   files=None if d["files"] is None else [dict(f) for f in d["files"]],
                   sampler_len=d["sampler_len"], sampler_epoch=d["sampler_epoch"],
                   sampler=d["sampler"],
                   dataset=d["dataset"], iterable=iterable, saved_with=dict(d["saved_with"]))


_MIGRATIONS[1] = _migrate_1_to_2
_MIGRATIONS[2] = _migrate_2_to_3
_MIGRATIONS[3] = _migrate_3_to_4
