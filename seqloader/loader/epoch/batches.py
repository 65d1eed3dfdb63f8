"""The batches of one epoch as a lazy sequence: seed the global RNGs, fetch, collate.

``EpochBatches[b]`` is batch ``b`` of an epoch plan (``seqloader.orders.plans``). It is a pure
function of ``(dataset, plan, seed, epoch, b)``: right before the dataset is read, ``random``,
``numpy.random`` and torch's generator are seeded from ``(seed, epoch, key)`` where ``key`` is the
global position of the batch's first sample (skipped where seqloader's own code alone computes
the batch and draws nothing: :mod:`seqloader.loader.rngs.draws`). Whichever process computes it (the main process
at ``num_workers=0``, any worker otherwise) and whether the run was resumed or not, the batch is
the same. Fetching follows torch's ``_MapDatasetFetcher`` (:func:`~seqloader.loader.torch_compat.fetch`): ``dataset.__getitems__(indices)``
when the dataset has it, else ``[dataset[i] for i in indices]``, then ``collate_fn``; with
``batch_size=None`` one sample ``dataset[i]`` goes through ``collate_fn`` (``default_convert``).
In a worker, the dataset sees ``get_worker_info()`` as in torch, but torch's default collate
functions run with it hidden, so they stack into ordinary memory rather than a fresh
shared-memory segment per batch (``Prefetch`` ships results through its own reused slots).

**Collating into the slot.** In a worker process, which asks for ``slot_item(b)``, with torch's
``default_collate`` (and ``batch_size`` set) and samples that hold tensors or arrays (a batch of
numbers is one small ``torch.tensor(list)``: the two passes would cost more than they save), the
item is a :class:`SlotCollate` holding the fetched samples: the worker then runs
``default_collate`` with every stacked tensor written straight into its job's shared-memory slot
(:func:`~seqloader.loader.torch_compat.collate_into_slot`, the L2 protocol of
:class:`~seqloader.prefetcher.wire.SlotWriter`), so each byte of a batch is written once and no buffer is
allocated per batch. The values are ``default_collate``'s; a batch the slot path cannot place
goes through ``default_collate`` as before. Another ``collate_fn``, ``num_workers=0`` and a
loader nested in a dataset's code take the ordinary path.

With stage timing on (``DataLoader(profile_stages=True)``, :mod:`seqloader.sequences.stage_times`)
the dataset read counts as the stage ``"fetch"`` and ``collate_fn`` as ``"collate"``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from seqloader.errors import add_note, note_stage
from seqloader.loader.rngs.draws import batch_draws_globals
from seqloader.loader.rngs.seeding import DERIVATION, seed_globals, watch_globals
from seqloader.loader.torch_compat import (collate_in_plain_memory, collate_into_slot, fetcher, has_arrays,
                                           is_default_collate)
from seqloader.prefetcher.wire import SlotWriter
from seqloader.sequences import stage_times
from seqloader.sequences.base import LazySequence

__all__ = ["COLLATE", "COLUMNAR_HINT", "FETCH", "EpochBatches", "SlotCollate", "epoch_batches", "note_batch_error"]

#: Added to the error of torch's default collate over a batch that came back as one dict.
COLUMNAR_HINT = ("seqloader: the dataset's __getitems__ returned one dict for the whole batch (a columnar "
                 "batch, e.g. parquet(..., columnar=True)), which torch's default_collate cannot take: "
                 "pass collate_fn=torch.utils.data.default_convert")

#: Stage names (``profile_stages``): reading the dataset, and ``collate_fn``.
FETCH, COLLATE = "fetch", "collate"


def failing_index(exc: BaseException, dataset: Any) -> Optional[Any]:
    """The index ``dataset.__getitem__`` was called with when it raised ``exc``, read from the
    traceback (free on the happy path; ``None`` when no frame of that method is in it: a builtin
    container, ``__getitems__``, or an error outside the item's code).

    Example:
        >>> class D:
        ...     def __getitem__(self, i):
        ...         raise KeyError(i)
        >>> try:
        ...     [D()[k] for k in (4, 5)]
        ... except KeyError as e:
        ...     failing_index(e, D())
        4
    """
    code = getattr(getattr(type(dataset), "__getitem__", None), "__code__", None)
    if code is None or code.co_argcount < 2:
        return None
    tb, found = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code is code:
            found = tb.tb_frame.f_locals.get(code.co_varnames[1])  # the innermost call's argument
        tb = tb.tb_next
    return found if isinstance(found, int) or (hasattr(found, "__index__") and not isinstance(found, bool)) else None


def note_batch_error(exc: BaseException, dataset: Any, indices: Any, batch: int, epoch: int, fetching: bool) -> None:
    """Add to a batch's error the note that names where it failed: the dataset index whose
    ``__getitem__`` raised (``fetching`` and found in the traceback), else the batch and its
    dataset indices. The same words on every executor (the batch is computed the same way).

    Example:
        >>> e = ValueError("bad"); note_batch_error(e, [], [12, 13], 6, 0, fetching=False); e.__notes__
        ['seqloader: raised in DataLoader in batch 6 (epoch 0, dataset indices [12, 13])']
    """
    if getattr(exc, "_seqloader_annotated", False):
        return  # an inner stage (an smap of the dataset) named the item already
    index = failing_index(exc, dataset) if fetching else None
    if index is not None:
        note_stage(exc, "DataLoader", int(index), batch=batch, epoch=epoch)
        return
    shown = indices if isinstance(indices, int) else _listed(list(indices))
    add_note(exc, f"seqloader: raised in DataLoader in batch {batch} (epoch {epoch}, dataset indices {shown})")
    try:
        setattr(exc, "_seqloader_annotated", True)
    except AttributeError:  # pragma: no cover - exceptions with __slots__
        pass


def _listed(indices: list, most: int = 16) -> str:
    return str(indices) if len(indices) <= most else f"[{', '.join(map(str, indices[:most]))}, ... ({len(indices)} in all)]"


class SlotCollate(SlotWriter):
    """``default_collate(data)`` written into the worker's slot (see the module docstring).

    An error gets the note a batch's error gets (``"DataLoader"`` at ``index``, with ``context``);
    ``then(batch)``, if given, turns the batch into the value to send.
    """

    __slots__ = ("_data", "_index", "_context", "_then", "_indices")

    def __init__(self, data: Any, index: int, context: dict, then: Optional[Callable[[Any], Any]] = None,
                 indices: Any = None):
        self._data, self._index, self._context, self._then = data, index, context, then
        self._indices = indices  # a map-style batch's dataset indices: its error names them

    def write_into_slot(self, reserve: Callable[..., list]) -> Any:
        times = stage_times.current()
        token = times.begin() if times is not None else None
        try:
            batch = collate_into_slot(self._data, reserve)
        except Exception as exc:
            if self._indices is None:
                note_stage(exc, "DataLoader", self._index, **self._context)
            else:
                note_batch_error(exc, None, self._indices, self._context["batch"], self._context["epoch"], False)
            raise
        finally:
            if times is not None and token is not None:
                times.end(COLLATE, token)
        return batch if self._then is None else self._then(batch)


class EpochBatches(LazySequence):
    """Batch ``b`` of ``plan`` read from ``dataset`` (see the module docstring).

    Example:
        >>> from seqloader.orders.plans import OrderPlan
        >>> from seqloader.orders.orders import RangeOrder
        >>> from torch.utils.data import default_collate
        >>> seq = EpochBatches(list(range(10, 20)), OrderPlan(RangeOrder(10), 0, 4, False),
        ...                    default_collate, seed=0, epoch=0)
        >>> len(seq), seq[0].tolist(), seq[-1].tolist()
        (3, [10, 11, 12, 13], [18, 19])
    """

    def __init__(self, dataset: Any, plan: Any, collate_fn: Callable, seed: int, epoch: int,
                 derivation: int = DERIVATION):
        self._dataset = dataset
        self._plan = plan
        self._collate_fn = collate_fn
        self._seed = seed
        self._epoch = epoch
        self._derivation = derivation
        self._auto_collation = not getattr(plan, "single", False)
        self._fetch: Optional[Callable[[Any], Any]] = None   # torch's fetcher of the dataset, made once per process
        #: a batch may draw from the global RNGs: seed them (and keep the caller's) per batch
        #: (:mod:`seqloader.loader.rngs.draws`)
        self.draws_globals = batch_draws_globals(dataset, collate_fn)
        #: the next window's blocks asked for early (:mod:`seqloader.loader.epoch.read_ahead`), or None
        self.read_ahead: Optional[Callable[[Any, Any, int], None]] = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fetch": None}   # (made again where it is unpickled)

    def __len__(self) -> int:
        return len(self._plan)

    @property
    def dataset(self) -> Any:
        """The dataset the batches read (the epoch's: a recipe change may have replaced the loader's)."""
        return self._dataset

    def _item(self, b: int) -> Any:
        return self._batch(b, False)

    def slot_item(self, b: int) -> Any:
        """Batch ``b`` as a worker computes it for its slot: with torch's ``default_collate``, a
        :class:`SlotCollate` that the worker writes straight into the slot (the explicit request
        of :data:`seqloader.prefetcher.wire.SLOT_ITEM`; reads inside the dataset index as usual)."""
        return self._batch(b, True)

    def _batch(self, b: int, in_slot: bool) -> Any:
        key, indices = self._plan.batch(b)
        if self.read_ahead is not None:
            self.read_ahead(self._dataset, self._plan, b)
        if self.draws_globals:
            seed_globals(self._seed, self._epoch, key, self._derivation)
        watched = watch_globals(self._epoch)  # a thread worker: does it draw from the shared globals?
        times = stage_times.current() if stage_times.ACTIVE is not None else None
        data: Any = None
        read = self._fetch
        if read is None:   # (threads sharing this object may each make one: equal fetchers)
            read = self._fetch = fetcher(self._dataset, self._auto_collation)
        try:  # (try/except rather than annotate(): this runs once per batch, ~2 µs saved)
            data = read(indices) if times is None else times.call(FETCH, read, indices)
            if in_slot and self._auto_collation and is_default_collate(self._collate_fn) and data \
                    and has_arrays(data[0]):
                out: Any = SlotCollate(data, key, {"batch": self.epoch_batch(b), "epoch": self._epoch}, indices=indices)
            elif times is None:
                out = collate_in_plain_memory(self._collate_fn, data)
            else:
                out = times.call(COLLATE, collate_in_plain_memory, self._collate_fn, data)
        except BaseException as exc:  # SystemExit, KeyboardInterrupt too: every executor names the item
            if isinstance(data, dict) and self._auto_collation and is_default_collate(self._collate_fn):
                add_note(exc, COLUMNAR_HINT)
            note_batch_error(exc, self._dataset, indices, self.epoch_batch(b), self._epoch, fetching=data is None)
            raise
        finally:
            if watched is not None:
                watched[0].check(watched[1], lambda: f"batch {self.epoch_batch(b)} of epoch {self._epoch}")
        return out

    def epoch_batch(self, b: int) -> int:
        """Batch ``b``'s number in its epoch, as messages name it (``b`` counts from where the epoch
        was opened: a resume, or an autotune switch)."""
        return self._plan.epoch_batch(b)

    def indices(self, b: int) -> Any:
        """The dataset indices batch ``b`` reads (one index with ``batch_size=None``)."""
        return self._plan.batch(b)[1]

    def key(self, b: int) -> int:
        """The global position of batch ``b``'s first sample (its seeding key)."""
        return self._plan.key(b)

    def batch_of(self, key: int) -> Any:
        """The batch whose key is ``key``, or ``None``."""
        return self._plan.batch_of(key)

    def end_position(self, b: int) -> int:
        """The epoch's global sample position once batch ``b`` has been yielded."""
        return self._plan.end_position(b)

    def __repr__(self) -> str:
        return (f"epoch_batches(dataset={type(self._dataset).__name__}, epoch={self._epoch}, "
                f"len={len(self)})")


def epoch_batches(recipe: Any, progress: Any) -> tuple[Any, frozenset]:
    """The batches of the progress's epoch from its position, and those to skip (``ahead``):
    ``recipe`` a :class:`~seqloader.loader.recipe.recipe.Recipe`, ``progress`` the loader's
    :class:`~seqloader.loader.state.progress.Progress`."""
    epoch = progress.epoch
    seq = EpochBatches(recipe.dataset_for(epoch), recipe.plan(epoch, progress.position, step=progress.step),
                       recipe.collate_fn, recipe.seed, epoch, recipe.derivation)
    skip = frozenset(seq.batch_of(k) for k in progress.ahead)
    if None in skip:
        raise ValueError(f"DataLoader: the loaded state's 'ahead' keys {list(progress.ahead)} are not all "
                         f"batches of epoch {progress.epoch} from position {progress.position}; the state "
                         "is corrupt or was saved for a different loader")
    return seq, skip
