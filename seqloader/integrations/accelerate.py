"""L4: a ``seqloader.DataLoader`` in a Hugging Face accelerate training loop.

``accelerator.prepare(loader)`` rebuilds every ``torch.utils.data.DataLoader`` it is given out of
torch's classes (the dataset, torch's default sampler, a ``BatchSamplerShard``): seqloader's order,
seed, sharding and state would be gone. :func:`prepare_loader` gives the loader what ``prepare()``
gives a loader instead, and leaves the rest to seqloader:

* each batch is moved to ``accelerator.device`` (``accelerate.utils.send_to_device``);
* the iteration is registered with accelerate's ``GradientState``, so ``accelerator.accumulate()``
  syncs gradients on the last batch of an epoch, as with a prepared loader;
* the returned :class:`AcceleratedLoader` is registered with
  ``accelerator.register_for_checkpointing``: ``accelerator.save_state()`` writes the loader's
  ``state_dict()`` and ``accelerator.load_state()`` makes the next epoch resume from it, exactly;
* seqloader keeps sharding over ``torch.distributed`` (which accelerate initialises) and its seed.

Like a prepared loader, the wrapper reads one batch ahead (to know which batch is the last), so
its ``state_dict()`` is the loader's state as of the batches it has *handed out*, not the batches
it has read: save the wrapper's state (``prepare_loader`` registers the wrapper), not the inner
loader's.

After ``prepare_loader(accelerator, loader)``, ``accelerator.prepare(loader)`` raises a
``TypeError`` instead of replacing the loader (accelerate asks a loader whether it was prepared
already; this one answers with the error). ``accelerator.prepare(wrapper)`` returns the wrapper
unchanged. Without ``prepare_loader``, accelerate has no hook that would let seqloader object.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

try:
    import accelerate
    from accelerate.data_loader import DataLoaderStateMixin
    from accelerate.utils import send_to_device
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("seqloader.integrations.accelerate needs Hugging Face accelerate; install it with "
                      "`pip install seqloader[accelerate]` (or `pip install accelerate`)") from exc

from seqloader.loader.dataloader import DataLoader

__all__ = ["AcceleratedLoader", "prepare_loader"]

_OP = "prepare_loader"

#: attributes of the inner loader that the wrapper does not pass on: torch's default samplers of a
#: seqloader.DataLoader are not what it reads, and accelerate's ``skip_first_batches`` would
#: rebuild a torch DataLoader from them (a resumed seqloader loader needs no skipping).
_REFUSED = {
    "sampler": "a seqloader.DataLoader's torch `sampler` attribute is not its order (use "
               "`.loader.sampler` for the sampler you passed)",
    "batch_sampler": "a seqloader.DataLoader's torch `batch_sampler` attribute is not its order (use "
                     "`.loader.batch_sampler` for the one you passed)",
}
_SKIP_HINT = ("; after accelerator.load_state() the loader already resumes at the saved batch, so "
              "accelerator.skip_first_batches() is not needed (it would rebuild a torch DataLoader "
              "and skip batches a second time)")


class _RefusePrepare:
    """Set as a loader's ``_is_accelerate_prepared``: ``Accelerator.prepare_data_loader`` asks
    ``if getattr(loader, "_is_accelerate_prepared", False)``, and this answer raises."""

    def __bool__(self) -> bool:
        raise TypeError(
            "accelerator.prepare() was given a seqloader.DataLoader: it would rebuild it as accelerate's "
            "own torch DataLoader, losing seqloader's order, seed, sharding and state; iterate the "
            "AcceleratedLoader returned by seqloader.integrations.accelerate.prepare_loader(accelerator, "
            "loader) instead, and leave the loader out of prepare()")

    def __repr__(self) -> str:
        return "<seqloader: do not prepare() this loader; see prepare_loader>"


class AcceleratedLoader(DataLoaderStateMixin):
    """A ``seqloader.DataLoader`` as accelerate would serve it; built by :func:`prepare_loader`.

    Iterating it iterates the loader (one epoch per ``iter()``, resuming a loaded state) and
    yields each batch on ``device``. ``state_dict()``/``load_state_dict()`` are the loader's, as of
    the batches handed out so far; ``len()`` and other attributes are the loader's (the loader
    itself is :attr:`loader`), except ``sampler`` and ``batch_sampler`` (see the module docstring).

    Args:
        loader: the ``seqloader.DataLoader``.
        accelerator: the ``accelerate.Accelerator`` whose ``GradientState`` is told where the
            epoch stands.
        device: where batches go (``None``: left where the loader puts them).
        non_blocking: passed to ``send_to_device``.

    Example:
        >>> import accelerate, seqloader
        >>> loader = seqloader.DataLoader(list(range(6)), batch_size=4, seed=0)
        >>> train = prepare_loader(accelerate.Accelerator(cpu=True), loader, register=False)
        >>> it = iter(train); first = next(it)
        >>> train.state_dict()["position"], loader.state_dict()["position"]  # the loader read ahead
        (4, 6)
    """

    def __init__(self, loader: DataLoader, accelerator: Any, device: Any = None,
                 non_blocking: bool = False):
        self.loader = loader
        self.device = device
        self.non_blocking = non_blocking
        self.gradient_state = accelerator.gradient_state
        self._handed_out: Optional[dict] = None  # the state as of the batches yielded, while iterating

    # -- what DataLoaderStateMixin reads --------------------------------------------------------

    @property
    def _drop_last(self) -> bool:
        return self.loader.drop_last

    def begin(self) -> None:
        """Register this epoch with accelerate's ``GradientState`` (as a prepared loader does)."""
        super().begin()
        # seqloader pads a distributed epoch's last round strided over the ranks (like
        # DistributedSampler), not at the end of the gathered batch, so gather_for_metrics must
        # not cut a "remainder" off it: -1 means "no remainder known".
        self.remainder = -1

    # -- iteration ------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        self.begin()
        try:
            it = iter(self.loader)
            self._handed_out = None
            try:
                current = next(it)
            except StopIteration:
                return
            while True:
                # the state once `current` has been handed out; read before the look-ahead
                self._handed_out = self.loader.state_dict()
                if self.device is not None:
                    current = send_to_device(current, self.device, non_blocking=self.non_blocking)
                try:
                    ahead = next(it)
                except StopIteration:
                    self.end_of_dataloader = True
                    self._handed_out = self.loader.state_dict()  # the epoch is over
                    yield current
                    return
                yield current
                current = ahead
        finally:
            self._handed_out = None
            self.end()

    def __len__(self) -> int:
        return len(self.loader)

    # -- state ----------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The loader's ``state_dict()`` as of the batches this wrapper has handed out.

        Returns:
            The same dict format as ``seqloader.DataLoader.state_dict()`` (it loads into either).
        """
        if self._handed_out is not None:
            return dict(self._handed_out)
        return self.loader.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        """Make the next ``iter()`` resume from ``state_dict`` (``seqloader.DataLoader.load_state_dict``).

        Raises:
            TypeError, ValueError: as ``seqloader.DataLoader.load_state_dict``.
        """
        self.loader.load_state_dict(state_dict)
        self._handed_out = None

    # -- everything else is the loader's --------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        if name in _REFUSED:
            raise AttributeError(f"AcceleratedLoader has no {name!r}: {_REFUSED[name]}{_SKIP_HINT}")
        if name.startswith("__") or name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __repr__(self) -> str:
        return f"AcceleratedLoader({self.loader!r}, device={self.device})"


def prepare_loader(accelerator: Any, loader: DataLoader, *, device_placement: Optional[bool] = None,
                   register: bool = True) -> AcceleratedLoader:
    """What ``accelerator.prepare(loader)`` gives a loader, for a ``seqloader.DataLoader``.

    Returns a wrapper that iterates ``loader`` and moves batches to ``accelerator.device``,
    registers it with ``accelerator.register_for_checkpointing`` (so ``save_state``/``load_state``
    save and restore the loader's position), and makes a later ``accelerator.prepare(loader)``
    raise instead of replacing the loader. seqloader keeps sharding over the ranks accelerate
    started, and the seed. Call it once per loader, in the same order in a resumed run (accelerate
    numbers registered objects in order).

    Args:
        accelerator: an ``accelerate.Accelerator``, after ``init`` (it sets up ``torch.distributed``).
        loader: a ``seqloader.DataLoader`` (not one returned by ``accelerator.prepare``).
        device_placement: move batches to ``accelerator.device``; ``None`` follows
            ``accelerator.device_placement``.
        register: call ``accelerator.register_for_checkpointing(wrapper)``.

    Returns:
        An :class:`AcceleratedLoader`.

    Raises:
        TypeError: ``loader`` is not a ``seqloader.DataLoader`` (e.g. it is accelerate's rebuilt
            loader from ``accelerator.prepare``), or ``accelerator`` is not an ``Accelerator``.
        ValueError: the accelerator splits or dispatches batches (``split_batches=True`` or
            ``dispatch_batches=True``), which is accelerate's own sharding; seqloader's
            ``batch_size`` is per process.

    Example:
        >>> import accelerate, seqloader
        >>> from seqloader.integrations.accelerate import prepare_loader
        >>> accelerator = accelerate.Accelerator(cpu=True)
        >>> loader = seqloader.DataLoader(list(range(10)), batch_size=4, shuffle=True, seed=0)
        >>> train = prepare_loader(accelerator, loader)
        >>> [b.tolist() for b in train], len(train), train.state_dict()["epoch"]
        ([[3, 4, 7, 2], [8, 6, 5, 0], [9, 1]], 3, 1)
        >>> accelerator.prepare(loader)
        Traceback (most recent call last):
        TypeError: accelerator.prepare() was given a seqloader.DataLoader: ...
        >>> prepare_loader(accelerator, [1, 2, 3])
        Traceback (most recent call last):
        TypeError: prepare_loader: loader must be a seqloader.DataLoader (got list)
    """
    if not isinstance(accelerator, accelerate.Accelerator):
        raise TypeError(f"{_OP}: accelerator must be an accelerate.Accelerator (got {type(accelerator).__name__})")
    if not isinstance(loader, DataLoader):
        hint = ""
        if hasattr(loader, "base_dataloader") or "accelerate" in type(loader).__module__:
            hint = ("; this is the loader accelerator.prepare() built, which is no longer seqloader's: pass "
                    "the seqloader.DataLoader itself and leave it out of prepare()")
        raise TypeError(f"{_OP}: loader must be a seqloader.DataLoader (got {type(loader).__name__}){hint}")
    for option in ("split_batches", "dispatch_batches"):
        if getattr(accelerator, option, None):
            raise ValueError(f"{_OP}: the accelerator has {option}=True, accelerate's own way of sharding "
                             "batches; a seqloader.DataLoader shards by itself and its batch_size is per "
                             f"process: build the Accelerator with {option}=False")
    if device_placement is None:
        device_placement = accelerator.device_placement
    wrapper = AcceleratedLoader(loader, accelerator, accelerator.device if device_placement else None,
                                non_blocking=bool(getattr(accelerator, "non_blocking", False)))
    loader._is_accelerate_prepared = _RefusePrepare()
    if register:
        accelerator.register_for_checkpointing(wrapper)
    return wrapper
