"""The loader's resume state: the one module that builds, reads, validates and migrates it.

One concept, the state's format: :class:`LoaderState` (its keys, versions and migrations). Its
parts live beside it and are re-exported here: the value checks of every key (every int below
``2**63``: :func:`check_int_in`, :mod:`seqloader.loader.state.values`) and :class:`IterableState`,
the entry of each worker stream of an ``IterableDataset`` (:mod:`seqloader.loader.state.iterable`). How a state
meets a loader (built from its parts, checked against them, loaded into them) is another concept:
:mod:`seqloader.loader.saving`.

A state is a small dict of JSON types (see ``docs/design.md``, "Loader state: format and versions")::

    {"format": "seqloader.DataLoader", "version": 5, "seed": 1234, "epoch": 2,
     "position": 40960, "ahead": [], "step": 2140, "dataset_len": 50000, "batch_size": 64,
     "drop_last": False, "shuffle": True, "derivation": 2, "sampler_len": None,
     "sampler_epoch": None, "sampler": None, "dataset": None, "iterable": None,
     "recipe": None, "files": [], "positions": {"digest": "4f53cda18c2baa0c", "stages": []},
     "saved_with": {"num_workers": 4, "world_size": 8, "seqloader": "0.5.0.dev0"}}

Every key is described in that section's table. In short: ``position`` counts samples of the
epoch's *global* order already yielded (all ranks together; with ``in_order=False`` it is the
watermark, and ``ahead`` lists the keys of the few batches yielded beyond it); ``step`` is the
global step of the batch at ``position``; ``derivation`` names how ``(seed, epoch, position)``
turn into the order and the global-RNG seeds (:data:`~seqloader.orders.orders.DERIVATION`; a
loaded state keeps its own); ``sampler_len``, ``sampler_epoch``, ``sampler`` and ``dataset``
describe a user's sampler and dataset (their verbatim ``state_dict()`` when they have one);
``iterable`` holds one :class:`IterableState` entry per worker stream of an ``IterableDataset``;
``recipe`` the run's changes (:mod:`seqloader.loader.recipe.changes`); ``files`` the fingerprint of the
file list of every source in the pipeline; ``positions`` what decides which sample a position is
(each stage's name and parameters, :mod:`seqloader.loader.state.positions`); ``saved_with`` is informational (and names the release).

:meth:`LoaderState.from_dict` validates everything (types, format, version, and every int within
``[0, 2**63)``: :func:`check_int_in`) and upgrades old versions one step at a time through :data:`_MIGRATIONS`
(or refuses one, naming its version and :func:`reader`); :func:`~seqloader.loader.saving.check_matches`
compares a loaded state with the loader it is loaded into. Neither mutates anything.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, Optional

from seqloader._version import __version__  # the package's one version source (a str)
from seqloader.loader.state.iterable import IterableState
from seqloader.loader.state.values import INT_LIMIT, STAGE, check_int_in, check_value, is_int, is_int_in, shown

__all__ = ["FORMAT", "INT_LIMIT", "KEYS", "STAGE", "VERSION", "IterableState", "LoaderState", "check_int_in",
           "check_value", "is_int", "is_int_in", "is_stateful", "reader", "shown"]

# -- the format ------------------------------------------------------------------------------------

#: The value of the ``"format"`` key.
FORMAT = "seqloader.DataLoader"
#: The current version; bumped whenever the meaning of a key changes.
VERSION = 5
#: The derivations of orders and seeds a state may name (``seqloader/loader/rngs/seeding.py``).
DERIVATIONS = (1, 2)
#: The keys of a version-:data:`VERSION` state, in order.
KEYS = ("format", "version", "seed", "epoch", "position", "ahead", "step", "dataset_len", "batch_size",
        "drop_last", "shuffle", "derivation", "sampler_len", "sampler_epoch", "sampler", "dataset",
        "iterable", "recipe", "files", "positions", "saved_with")

#: The keys each version's states have (a state whose ``version`` was edited has keys of another).
KEYS_OF_VERSION = {1: frozenset(KEYS) - {"derivation", "sampler_epoch", "ahead", "step", "recipe", "files", "positions"}}
KEYS_OF_VERSION[2] = KEYS_OF_VERSION[1] | {"derivation", "sampler_epoch", "ahead"}
KEYS_OF_VERSION[3] = KEYS_OF_VERSION[2] | {"step", "recipe", "files"}
KEYS_OF_VERSION[4] = KEYS_OF_VERSION[3]
KEYS_OF_VERSION[5] = KEYS_OF_VERSION[4] | {"positions"}

#: The mark of a version-3 fingerprint (of paths and modification times) in a migrated state.
LEGACY_FINGERPRINT = "v3:"
#: The mark of a version-4 fingerprint (of footers and member tables, without the data's first and
#: last bytes) in a migrated state: compared with the files' contents cut to what version 4 saw.
V4_FINGERPRINT = "v4:"

#: ``_MIGRATIONS[v]`` turns a version-``v`` dict into a version-``v + 1`` dict (a new dict; releases: CHANGELOG.md).
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
#: 4 -> 5: ``positions`` (what decides which sample a position is: :mod:`seqloader.loader.state.positions`)
#: is a new key; a version-4 state has no record (``None``: loaded without that check). A file's
#: content also covers the data's first and last bytes (``footer:<hex>+data:<hex>``): a version-4
#: description's fingerprint is marked ``"v4:"`` and compared with the contents cut to what version 4 saw.
_MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}


def is_stateful(obj: Any) -> bool:
    """Whether ``obj`` follows torchdata's ``Stateful`` protocol (``state_dict`` and ``load_state_dict``).

    Example:
        >>> is_stateful(object()), is_stateful(type("S", (), {"state_dict": dict, "load_state_dict": print})())
        (False, True)
    """
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def reader() -> str:
    """``'seqloader 0.5.0.dev0 reads state_dict versions 1-5'``: named wherever a state's version is refused."""
    return f"seqloader {__version__} reads state_dict versions {min(_MIGRATIONS, default=VERSION)}-{VERSION}"


def _check_keys_of_version(d: dict[str, Any], version: int) -> None:
    """A state of an earlier version has none of the keys later versions brought; nor does a
    version-3 state list its ``files`` (version 4 did): either says its ``version`` was edited,
    and an upgrade would overwrite what it holds (version 1's ``derivation``, say)."""
    later = sorted(k for k in d if k in KEYS and k not in KEYS_OF_VERSION[version])
    if later:
        since = min(v for v in KEYS_OF_VERSION if set(later) <= KEYS_OF_VERSION[v])
        raise ValueError(f"{STAGE}: 'version' is {version} in the state_dict, but it has the keys {later} of "
                         f"version-{since} states, which version-{version} states do not have; a state saved "
                         f"by seqloader has its own version (was 'version' edited?)")
    if version == 3 and isinstance(d.get("files"), list):
        raise ValueError(f"{STAGE}: 'version' is 3 in the state_dict, but its 'files' is a list, as version 4 "
                         "and later save it (version 3 saved one description or None); a state saved by "
                         "seqloader has its own version (was 'version' edited?)")


#: torchdata's key that accelerate's stateful path (``use_stateful_dataloader=True``) adds to the
#: state it keeps and hands back: ``True`` once the epoch's iterator has ended.
ITERATOR_FINISHED = "_iterator_finished"


def _without_iterator_finished(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` without torchdata's ``_iterator_finished``, checked against what the state says:
    accelerate snapshots the state after the epoch's ``StopIteration`` and sets it ``True``; such a
    state is at the start of the next epoch (``position`` 0) already. A ``True`` with a position
    inside an epoch contradicts it: which one to resume is unknown, so it is refused."""
    if ITERATOR_FINISHED not in d:
        return d
    finished = d[ITERATOR_FINISHED]
    check_value(isinstance(finished, bool), ITERATOR_FINISHED, finished, "a bool (torchdata's key, added by accelerate)")
    if finished and d.get("position") != 0:
        raise ValueError(f"{STAGE}: {ITERATOR_FINISHED!r} is True (the epoch ended) but 'position' is "
                         f"{shown(d.get('position'))}, inside epoch {shown(d.get('epoch'))}; a state saved after the "
                         "epoch's end is at position 0 of the next epoch: this one cannot be resumed exactly")
    return {k: v for k, v in d.items() if k != ITERATOR_FINISHED}


def _check_records(d: dict[str, Any]) -> None:
    """A current state records its files and, map-style, its positions: ``None`` means "not
    recorded, not checked" only in a state upgraded from a version before those records."""
    check_value(d["files"] is not None, "files", d["files"],
                "a list (one description per source) in a version-5 state_dict: only states of version 2 "
                "or earlier, upgraded, have none")
    check_value(d["positions"] is not None or d["iterable"] is not None, "positions", d["positions"],
                "a dict in a version-5 state_dict of a map-style dataset: only states of version 4 or "
                "earlier, upgraded, have none")


def _migrate_1_to_2(d: dict[str, Any]) -> dict[str, Any]:
    if d.get("iterable") is not None:
        raise ValueError(f"{STAGE}: this version-1 state_dict was saved for an IterableDataset, which "
                         "seqloader 0.1 read on torch's workers with other random streams and stream "
                         f"states; this {reader()} but cannot resume this one exactly (restart the epoch, "
                         "or finish it with seqloader 0.1)")
    return {**d, "version": 2, "derivation": 1, "sampler_epoch": None, "ahead": []}


def _migrate_2_to_3(d: dict[str, Any]) -> dict[str, Any]:
    # reads values not validated yet: what is malformed is left for from_dict to name
    saved_with = d.get("saved_with")
    world = saved_with.get("world_size", 1) if isinstance(saved_with, dict) else 1
    batch_size: Any = d.get("batch_size")
    per_step = (batch_size if is_int_in(batch_size, 1) else 1) * (world if is_int_in(world, 1) else 1)
    position = d.get("position", 0)
    step = position // per_step if is_int_in(position) else 0
    return {**d, "version": 3, "step": step, "recipe": None, "files": None}


def _migrate_3_to_4(d: dict[str, Any]) -> dict[str, Any]:
    files = d.get("files")
    if isinstance(files, dict):
        old = files.get("fingerprint")
        files = [{**files, "fingerprint": f"{LEGACY_FINGERPRINT}{old}"}] if isinstance(old, str) else [files]
    return {**d, "version": 4, "files": files}


def _migrate_4_to_5(d: dict[str, Any]) -> dict[str, Any]:
    files = d.get("files")
    if isinstance(files, list):  # what is malformed is left for from_dict to name
        files = [{**f, "fingerprint": f"{V4_FINGERPRINT}{f['fingerprint']}"}
                 if isinstance(f, dict) and isinstance(f.get("fingerprint"), str)
                 and not f["fingerprint"].startswith(LEGACY_FINGERPRINT) else f for f in files]
    return {**d, "version": 5, "files": files, "positions": None}


#: The keys of a source's file-list description (``seqloader.sources.fingerprint.describe_files``):
#: those it always has, and those it may have.
DESCRIPTION_KEYS = ({"files", "fingerprint"}, {"files", "fingerprint", "chunk", "chunks"})


def _check_description(key: str, d: Any) -> None:
    """One entry of ``files``: the keys of a description, with values of the right types."""
    must, may = DESCRIPTION_KEYS
    check_value(isinstance(d, dict) and must <= set(d) <= may, key, d,
                f"a dict with the keys {sorted(must)} (and {sorted(may - must)})")
    check_int_in(f"{key}.files", d["files"])
    check_value(isinstance(d["fingerprint"], str) and len(d["fingerprint"]) <= 128, f"{key}.fingerprint",
                d["fingerprint"], "a str of hex digits")
    if "chunk" in d:
        check_int_in(f"{key}.chunk", d["chunk"], low=1)
    if "chunks" in d:
        check_value(isinstance(d["chunks"], list) and all(isinstance(c, str) for c in d["chunks"]), f"{key}.chunks",
                    d["chunks"], "a list of str")


def _check_positions(p: Any) -> None:
    """``positions``: ``None`` or ``{"digest": hex, "stages": ['name{params}' or 'name#digest', ...]}``."""
    check_value(p is None or isinstance(p, dict) and set(p) in ({"digest", "stages"}, {"digest", "stages", "chunk"}),
                "positions", p, "None or a dict with the keys 'digest' and 'stages' (and 'chunk')")
    if p is None:
        return
    if "chunk" in p:
        check_int_in("positions.chunk", p["chunk"], low=1)
    check_value(isinstance(p["digest"], str) and len(p["digest"]) <= 64, "positions.digest", p["digest"],
                "a str of hex digits")
    check_value(isinstance(p["stages"], list), "positions.stages", p["stages"], "a list of str")
    for k, stage in enumerate(p["stages"]):
        check_value(isinstance(stage, str) and len(stage) <= 1024, f"positions.stages[{k}]", stage,
                    "a str: a stage's name and its parameters")


@dataclasses.dataclass(frozen=True)
class LoaderState:
    """A validated, immutable loader state; :meth:`to_dict` gives the public dict.

    Example:
        >>> s = LoaderState(seed=7, epoch=0, position=0, dataset_len=10, batch_size=2, drop_last=False,
        ...                 shuffle=True, positions={"digest": "4f53cda18c2baa0c", "stages": []})
        >>> d = s.to_dict()
        >>> LoaderState.from_dict(d).to_dict() == d, d["saved_with"]  # the release that wrote it
        (True, {'seqloader': '...'})
        >>> LoaderState.from_dict({**d, "version": 99})
        Traceback (most recent call last):
        ValueError: load_state_dict: this state_dict has version 99, newer than this seqloader's version 5 (seqloader ... reads state_dict versions 1-5); upgrade seqloader to load it
        >>> LoaderState.from_dict({**d, "version": 1})   # an edited version: the upgrade would lose 'derivation'
        Traceback (most recent call last):
        ValueError: load_state_dict: 'version' is 1 in the state_dict, but it has the keys ['ahead', ...] of version-5 states, ...
        >>> LoaderState.from_dict({**d, "positions": None})
        Traceback (most recent call last):
        ValueError: load_state_dict: 'positions' must be a dict in a version-5 state_dict of a map-style dataset: ...
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
    positions: Optional[dict[str, Any]] = None
    saved_with: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The public state dict (JSON types, plus whatever the verbatim sub-states hold); ``saved_with``
        names the ``seqloader`` release that wrote it, unless it names one already (a loaded state's)."""
        return {
            "format": FORMAT, "version": VERSION, "seed": self.seed, "epoch": self.epoch,
            "position": self.position, "ahead": list(self.ahead), "step": self.step,
            "dataset_len": self.dataset_len,
            "batch_size": self.batch_size, "drop_last": self.drop_last, "shuffle": self.shuffle,
            "derivation": self.derivation, "sampler_len": self.sampler_len,
            "sampler_epoch": self.sampler_epoch, "sampler": self.sampler, "dataset": self.dataset,
            "iterable": None if self.iterable is None else self.iterable.to_dict(),
            "recipe": self.recipe, "files": None if self.files is None else [dict(f) for f in self.files],
            "positions": None if self.positions is None else copy.deepcopy(self.positions),
            "saved_with": {**self.saved_with, "seqloader": self.saved_with.get("seqloader", __version__)},
        }

    @classmethod
    def from_dict(cls, d: Any) -> "LoaderState":
        """Validate ``d`` (any supported version) and return the state; mutates nothing.

        Raises:
            TypeError: ``d`` is not a dict.
            ValueError: unknown format, newer version (naming both versions and this release),
                missing/unknown keys or a bad value (naming the key and the value).
        """
        if not isinstance(d, dict):
            raise TypeError(f"{STAGE}: expected a dict (got {type(d).__name__})")
        if d.get("format") != FORMAT:
            raise ValueError(f"{STAGE}: unknown format {d.get('format')!r} (expected {FORMAT!r}); "
                             "this is not a seqloader.DataLoader state_dict")
        version: Any = d.get("version")  # unvalidated until the _check below
        check_int_in("version", version, low=1)
        if version > VERSION:
            raise ValueError(f"{STAGE}: this state_dict has version {version}, newer than this "
                             f"seqloader's version {VERSION} ({reader()}); upgrade seqloader to load it")
        saved = version
        d = _without_iterator_finished(d)
        _check_keys_of_version(d, version)
        while version < VERSION:
            d = _MIGRATIONS[version](d)
            version = d["version"]
        missing = [k for k in KEYS if k not in d]
        unknown = sorted(k for k in d if k not in KEYS)
        if missing or unknown:
            was = f"; a version-{saved} state_dict, upgraded to version {VERSION}" if saved < VERSION else ""
            raise ValueError(f"{STAGE}: malformed state_dict (missing keys {missing}, unknown keys {unknown}){was}")
        check_value(is_int(d["seed"]) and 0 <= d["seed"] < 2**64, "seed", d["seed"], "an int in [0, 2**64)")
        for key in ("epoch", "position", "step"):
            check_int_in(key, d[key])
        check_int_in("dataset_len", d["dataset_len"], none_ok=True)
        check_int_in("batch_size", d["batch_size"], low=1, none_ok=True)
        check_int_in("sampler_len", d["sampler_len"], none_ok=True)
        check_value(isinstance(d["ahead"], list), "ahead", d["ahead"], "a list of distinct ints at or after 'position'")
        for k, key in enumerate(d["ahead"]):
            check_int_in(f"ahead[{k}]", key, low=d["position"])
        check_value(len(set(d["ahead"])) == len(d["ahead"]), "ahead", d["ahead"], "a list of distinct ints")
        check_int_in("sampler_epoch", d["sampler_epoch"], low=-2**63, none_ok=True)
        check_value(d["derivation"] in DERIVATIONS and is_int(d["derivation"]), "derivation",
                    d["derivation"], f"one of {list(DERIVATIONS)}")
        for key in ("drop_last", "shuffle"):
            check_value(isinstance(d[key], bool), key, d[key], "a bool")
        check_value(isinstance(d["saved_with"], dict), "saved_with", d["saved_with"], "a dict")
        check_int_in("saved_with.world_size", d["saved_with"].get("world_size", 1), low=1)
        check_int_in("saved_with.num_workers", d["saved_with"].get("num_workers", 0))
        release = d["saved_with"].get("seqloader", "")
        check_value(isinstance(release, str) and len(release) <= 64, "saved_with.seqloader", release,
                    "a str of at most 64 characters")
        check_value(d["recipe"] is None or isinstance(d["recipe"], dict) and set(d["recipe"]) <= {"weights", "skips"},
                    "recipe", d["recipe"], "None or a dict with the keys 'weights' and/or 'skips'")
        check_value(d["files"] is None or isinstance(d["files"], list), "files", d["files"],
                    "None or a list of file-list descriptions (one per source)")
        for k, description in enumerate(d["files"] or ()):
            _check_description(f"files[{k}]", description)
        _check_positions(d["positions"])
        if saved == VERSION:
            _check_records(d)
        iterable = None if d["iterable"] is None else IterableState.from_dict(d["iterable"])
        return cls(seed=d["seed"], epoch=d["epoch"], position=d["position"],
                   dataset_len=d["dataset_len"], batch_size=d["batch_size"],
                   drop_last=d["drop_last"], shuffle=d["shuffle"], derivation=d["derivation"],
                   ahead=tuple(d["ahead"]), step=d["step"], recipe=d["recipe"],
                   files=None if d["files"] is None else [dict(f) for f in d["files"]],
                   positions=None if d["positions"] is None else copy.deepcopy(d["positions"]),
                   sampler_len=d["sampler_len"], sampler_epoch=d["sampler_epoch"],
                   sampler=d["sampler"],
                   dataset=d["dataset"], iterable=iterable, saved_with=dict(d["saved_with"]))


_MIGRATIONS[1] = _migrate_1_to_2
_MIGRATIONS[2] = _migrate_2_to_3
_MIGRATIONS[3] = _migrate_3_to_4
_MIGRATIONS[4] = _migrate_4_to_5
