"""L4: a torchtitan ``BaseDataLoader`` on :class:`seqloader.DataLoader` that reshards on resume.

torchtitan 0.3.0's ``ParallelAwareDataloader(dataset, dp_rank, dp_world_size, **kwargs)`` wraps a
torchdata ``StatefulDataLoader`` over a dataset that shards itself, and its
``load_state_dict`` asserts that the data-parallel degree is the one it was saved with. This
module's class of the same name takes the same arguments and keeps the same state layout,

    ``{"dp_rank_<r>": <bytes>, "world_size": W}``

(``torch.distributed.checkpoint`` merges the ranks' ``dp_rank_<r>`` keys into one checkpoint),
but it reads rank ``dp_rank``'s shard of the *global* order of ``seqloader.DataLoader``, whose
state is the same on every rank: ``<bytes>`` is that state as JSON (UTF-8), not a pickle. So a
state saved under one ``dp_world_size`` loads under any other: every rank finds the saved global
position in any rank's entry, the new ranks split the rest of the epoch as the loader always does
(each remaining sample read once, plus the padding of the last step with ``drop_last=False``),
and they take equal steps.

Batches of windows of ``L + 1`` tokens (a 2-D tensor ``x``, such as the default collate of
``seqloader.token_windows(path, L + 1, stride=L)``) are yielded as torchtitan's training loop
takes them, ``({"input": x[:, :-1]}, x[:, 1:])``; a batch already shaped ``(dict, labels)`` (from
a ``collate_fn``) is yielded as it is.

The data-parallel group need not be the whole world (tensor or pipeline parallel ranks share a
``dp_rank``): the inner loader is driven inside ``seqloader.loader.world.topology(dp_rank,
dp_world_size)``, so it never asks ``torch.distributed`` which rank it is.

A state saved by torchtitan's own loader (a pickled ``StatefulDataLoader`` state: per-rank
progress of a dataset that sharded itself, at the old degree) has no global position to
translate, so it is refused with a ``ValueError`` that says so (``load_state_dict`` never
unpickles it); exclude ``"dataloader"`` from that checkpoint's loading to start the data over.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Iterator, Optional

import torch

from seqloader.loader import world
from seqloader.loader.dataloader import DataLoader

try:
    from torchtitan.components.dataloader import BaseDataLoader
except ImportError as error:  # pragma: no cover - the message is the point
    raise ImportError("seqloader.integrations.torchtitan needs torchtitan (0.3): pip install seqloader[torchtitan] "
                      "(see setup.cfg: torchtitan is installed with --no-deps)") from error

__all__ = ["ParallelAwareDataloader", "TokenWindowsDataLoader"]

_OP = "ParallelAwareDataloader"
_RANK_KEY = re.compile(r"dp_rank_(\d+)\Z")
_PICKLE = b"\x80"  # every pickle of protocol >= 2 starts with the PROTO opcode


def _check_topology(dp_rank: Any, dp_world_size: Any) -> tuple[int, int]:
    for name, value in (("dp_rank", dp_rank), ("dp_world_size", dp_world_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{_OP}: {name} must be an int (got {type(value).__name__})")
    if dp_world_size < 1:
        raise ValueError(f"{_OP}: dp_world_size must be >= 1 (got {dp_world_size})")
    if not 0 <= dp_rank < dp_world_size:
        raise ValueError(f"{_OP}: dp_rank {dp_rank} out of range [0, {dp_world_size}) (dp_world_size={dp_world_size})")
    return dp_rank, dp_world_size


def _to_pair(batch: Any) -> tuple[dict, torch.Tensor]:
    """torchtitan's ``(input_dict, labels)`` from a batch of windows (or a batch already shaped so)."""
    if isinstance(batch, torch.Tensor):
        if batch.dim() != 2 or batch.shape[1] < 2:
            raise ValueError(f"{_OP}: a batch of windows must be a 2-D tensor of windows of L + 1 >= 2 tokens "
                             f"(got shape {tuple(batch.shape)}); use token_windows(path, L + 1, stride=L)")
        return {"input": batch[:, :-1]}, batch[:, 1:]
    if isinstance(batch, (tuple, list)) and len(batch) == 2 and isinstance(batch[0], dict):
        return batch[0], batch[1]
    raise TypeError(f"{_OP}: a batch must be a 2-D tensor of windows or an (input_dict, labels) pair "
                    f"(got {type(batch).__name__}); give a collate_fn that returns one of them")


def _decode(key: str, value: Any) -> dict:
    """A ``dp_rank_<r>`` entry as seqloader's state, or a ValueError naming what it holds."""
    if isinstance(value, (bytes, bytearray)) and bytes(value[:1]) == _PICKLE:
        raise ValueError(
            f"{_OP}.load_state_dict: {key!r} holds a pickle, as torchtitan's own ParallelAwareDataloader saves "
            "its torchdata StatefulDataLoader state: per-rank progress of a dataset that shards itself, which "
            "has no position in seqloader's global order and is not translated (nor unpickled); start the data "
            "over by excluding 'dataloader' from loading (torchtitan: checkpoint.exclude_from_loading)")
    if isinstance(value, (bytes, bytearray)):
        try:
            state = json.loads(bytes(value).decode("utf-8"))
        except ValueError as error:
            raise ValueError(f"{_OP}.load_state_dict: {key!r} is not a seqloader state (JSON bytes): {error}") from None
    elif isinstance(value, dict):
        state = value
    else:
        raise TypeError(f"{_OP}.load_state_dict: {key!r} must be bytes (got {type(value).__name__})")
    if not isinstance(state, dict) or state.get("format") != "seqloader.DataLoader":
        raise ValueError(f"{_OP}.load_state_dict: {key!r} is not a seqloader.DataLoader state "
                         f"(format {state.get('format') if isinstance(state, dict) else None!r})")
    return state


def _without_saved_with(state: dict) -> dict:
    """A state less its informational ``saved_with`` (the ranks' entries agree on the rest)."""
    return {k: v for k, v in state.items() if k != "saved_with"}


class ParallelAwareDataloader(BaseDataLoader):
    """torchtitan's ``ParallelAwareDataloader`` on :class:`seqloader.DataLoader`: same arguments and
    state layout, and a state saved under one ``dp_world_size`` resumes under any other.

    Args:
        dataset: a map-style dataset or seqloader pipeline (such as
            ``seqloader.token_windows(path, L + 1, stride=L)``), the same on every rank: the loader
            shards its global order, so the dataset must not shard itself.
        dp_rank: this rank's data-parallel rank, in ``[0, dp_world_size)``.
        dp_world_size: the data-parallel degree.
        **kwargs: :class:`seqloader.DataLoader`'s (``batch_size``, ``shuffle``, ``num_workers``,
            ``seed``, ...). ``seed=None`` draws one seed on the global rank 0 and broadcasts it
            (every rank must then build the loader, after ``init_process_group``).

    Raises:
        TypeError, ValueError: a bad ``dp_rank``/``dp_world_size``, or as ``seqloader.DataLoader``.

    Example:
        >>> import seqloader
        >>> data = seqloader.smap(lambda i: torch.arange(i, i + 5), range(8))
        >>> ranks = [ParallelAwareDataloader(data, r, 2, batch_size=2, seed=0) for r in range(2)]
        >>> inputs, labels = next(iter(ranks[1]))
        >>> inputs["input"].tolist(), labels.tolist()
        ([[1, 2, 3, 4], [3, 4, 5, 6]], [[2, 3, 4, 5], [4, 5, 6, 7]])
        >>> sorted(ranks[1].state_dict())
        ['dp_rank_1', 'world_size']
        >>> one = ParallelAwareDataloader(data, 0, 1, batch_size=4, seed=0)
        >>> one.load_state_dict(ranks[1].state_dict())    # saved with 2 ranks, resumed on 1
        >>> [b[1][:, 0].tolist() for b in one]             # the rest of the epoch: samples 4..7
        [[5, 6, 7, 8]]
        >>> ParallelAwareDataloader(data, 2, 2)
        Traceback (most recent call last):
        ValueError: ParallelAwareDataloader: dp_rank 2 out of range [0, 2) (dp_world_size=2)
    """

    def __init__(self, dataset: Any, dp_rank: int, dp_world_size: int, **kwargs: Any):
        if "dataset" in kwargs:
            raise ValueError(f"{_OP}: 'dataset' should not be passed in kwargs; it must be provided as the "
                             "first positional argument")
        self.dp_rank, self.dp_world_size = _check_topology(dp_rank, dp_world_size)
        self._rank_id = f"dp_rank_{dp_rank}"
        if kwargs.get("seed") is None:  # one seed for the whole world, drawn outside the dp topology
            kwargs["seed"] = world.draw_seed(kwargs.get("generator"))
        #: the seqloader.DataLoader that reads this rank's shard
        self.loader: DataLoader[Any] = DataLoader(dataset, **kwargs)

    def _here(self) -> Any:
        return world.topology(self.dp_rank, self.dp_world_size)

    def __len__(self) -> int:
        with self._here():
            return len(self.loader)

    def __iter__(self) -> Iterator[tuple[dict, torch.Tensor]]:
        with self._here():
            batches = iter(self.loader)
        return _Batches(batches, self._here)

    def state_dict(self) -> dict[str, Any]:
        """``{"dp_rank_<r>": <the loader's state as JSON bytes>, "world_size": dp_world_size}``."""
        with self._here():
            state = self.loader.state_dict()
        return {self._rank_id: json.dumps(state, sort_keys=True).encode("utf-8"), "world_size": self.dp_world_size}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from one rank's state or the ranks' merged states, saved under any ``dp_world_size``.

        An empty dict is a fresh start (as torchtitan's). Every ``dp_rank_<r>`` entry present must
        hold the same global state (its ``saved_with`` aside); this rank reads its own entry if
        present, else any other (a different degree).

        Raises:
            ValueError: no ``dp_rank_<r>`` entry; a state of torchtitan's own loader (a pickle); entries
                that disagree; or as ``seqloader.DataLoader.load_state_dict``.
        """
        if not state_dict:
            return
        entries = {key: value for key, value in state_dict.items() if _RANK_KEY.match(key)}
        if not entries:
            raise ValueError(f"{_OP}.load_state_dict: no 'dp_rank_<r>' entry (keys {sorted(state_dict)}); "
                             "this is not a ParallelAwareDataloader state")
        states = {key: _decode(key, value) for key, value in sorted(entries.items())}
        first_key = min(states, key=lambda k: int(_RANK_KEY.match(k).group(1)))  # type: ignore[union-attr]
        for key, state in states.items():
            if _without_saved_with(state) != _without_saved_with(states[first_key]):
                differ = sorted(k for k in set(state) | set(states[first_key])
                                if k != "saved_with" and state.get(k) != states[first_key].get(k))
                raise ValueError(f"{_OP}.load_state_dict: {key!r} and {first_key!r} hold different states "
                                 f"(keys {differ}); the ranks were not at the same step")
        with self._here():
            self.loader.load_state_dict(states.get(self._rank_id, states[first_key]))

    def set_epoch(self, epoch: int) -> None:
        """The loader's ``set_epoch`` (the epoch's global order; not needed between epochs)."""
        self.loader.set_epoch(epoch)


class TokenWindowsDataLoader(ParallelAwareDataloader):
    """:class:`ParallelAwareDataloader` over ``token_windows(dataset_path, seq_len + 1, stride=seq_len)``,
    built by torchtitan's trainer from its config (``config.dataloader.build(dp_world_size=,
    dp_rank=, tokenizer=, seq_len=, local_batch_size=, ...)``).

    ``Config`` fields: ``dataset_path`` (a token file, a glob or a comma-separated list), ``dtype``
    of raw files (``"uint16"``; ``""`` for ``.npy`` files), ``shuffle``, ``seed`` and
    ``num_workers``. The tokenizer is not used: the files hold token ids already.

    Example:
        >>> import numpy as np, os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "train.bin")
        >>> np.arange(41, dtype=np.uint16).tofile(path)
        >>> config = TokenWindowsDataLoader.Config(dataset_path=path, seed=0, shuffle=False)
        >>> loader = config.build(dp_world_size=2, dp_rank=1, tokenizer=None, seq_len=4, local_batch_size=2)
        >>> inputs, labels = next(iter(loader))
        >>> inputs["input"].tolist(), labels[:, -1].tolist()
        ([[4, 5, 6, 7], [12, 13, 14, 15]], [8, 16])
    """

    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        dtype: str = "uint16"
        """dtype of raw token files (``""`` for ``.npy`` files, whose header says it)"""

        shuffle: bool = True
        """a shuffled global order per epoch"""

        seed: Optional[int] = None
        """the order's seed (``None``: drawn on global rank 0 and broadcast)"""

        num_workers: int = 0
        """seqloader worker processes"""

    def __init__(self, config: Config, *, dp_world_size: int, dp_rank: int, seq_len: int, local_batch_size: int,
                 tokenizer: Any = None, snapshot_every_n_steps: Optional[int] = None, **kwargs: Any):
        from seqloader.sources.token_windows import token_windows

        if not config.dataset_path:
            raise ValueError("TokenWindowsDataLoader: Config.dataset_path must name the token files (got "
                             f"{config.dataset_path!r})")
        paths = [p.strip() for p in config.dataset_path.split(",") if p.strip()]
        windows = token_windows(paths if len(paths) > 1 else paths[0], seq_len + 1,
                                dtype=config.dtype or None, stride=seq_len)
        super().__init__(windows, dp_rank, dp_world_size, batch_size=local_batch_size, shuffle=config.shuffle,
                         seed=config.seed, num_workers=config.num_workers, **kwargs)


class _Batches:
    """The loader's iterator, each ``next`` inside the rank's topology, batches as torchtitan's pairs."""

    def __init__(self, batches: Iterator[Any], here: Any):
        self._batches, self._here = batches, here

    def __iter__(self) -> "_Batches":
        return self

    def __next__(self) -> tuple[dict, torch.Tensor]:
        with self._here():
            batch = next(self._batches)
        return _to_pair(batch)
