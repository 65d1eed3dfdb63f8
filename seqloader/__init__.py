"""seqloader: lazy, position-addressable sequences and a stateful, seekable DataLoader.

The public API is the names in ``__all__`` (import them from here: ``from seqloader import
shuffle, DataLoader``) and three public modules: :mod:`seqloader.rng` (seed derivations),
:mod:`seqloader.sampler` (torchdata's ``StatefulDistributedSampler`` and ``Stateful`` under the
path torchdata code imports them from) and :mod:`seqloader.testing` (test helpers). Every other
module is internal and may change without notice.

Names resolve lazily (PEP 562): ``import seqloader`` imports nothing else, and using only the
sequence ops (layers L0-L1) never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from seqloader._version import __version__  # the release, in one module (the build and the state read it there)

#: public name -> the module that defines it
_EXPORTS = {
    "LazySequence": "seqloader.sequences.base",
    "smap": "seqloader.sequences.mapping",
    "rng_map": "seqloader.sequences.mapping",
    "gather": "seqloader.sequences.reorder",
    "shuffle": "seqloader.sequences.reorder",
    "concatenate": "seqloader.sequences.reorder",
    "repeat": "seqloader.sequences.reorder",
    "batch": "seqloader.sequences.shape",
    "shard": "seqloader.sequences.shard",
    "mix": "seqloader.sequences.mix",
    "block_shuffle": "seqloader.sequences.blocks",
    "add_cache": "seqloader.sequences.cache",
    "unbatch": "seqloader.sequences.shape",
    "split": "seqloader.sequences.segments",
    "cycle": "seqloader.sequences.cycle",
    "interleave": "seqloader.sequences.select",
    "case": "seqloader.sequences.select",
    "switch": "seqloader.sequences.select",
    "collate": "seqloader.sequences.tuples",
    "starmap": "seqloader.sequences.tuples",
    "prefetch": "seqloader.prefetcher.api",
    "Prefetch": "seqloader.prefetcher.prefetch",
    "RayWorkers": "seqloader.prefetcher.ray_options",
    "ProcessWorkers": "seqloader.prefetcher.options",
    "ThreadWorkers": "seqloader.prefetcher.options",
    "DataLoader": "seqloader.loader.dataloader",
    "StatefulDataLoader": "seqloader.loader.dataloader",
    "BijectiveShuffleSampler": "seqloader.loader.samplers.shuffle",
    "BlockShuffleSampler": "seqloader.loader.samplers.shuffle",
    "WeightedSampler": "seqloader.loader.samplers.weighted",
    "StatefulDistributedSampler": "seqloader.sampler",
    "Stateful": "seqloader.sampler",
    "as_iterable_dataset": "seqloader.integrations.torch_iterable",
    "export_metrics": "seqloader.integrations.prometheus",
    "parquet": "seqloader.sources.parquet_files",
    "arrow_ipc": "seqloader.sources.arrow",
    "tar_shards": "seqloader.sources.tar",
    "image_folder": "seqloader.sources.folder",
    "megatron": "seqloader.sources.megatron",
    "token_windows": "seqloader.sources.token_windows",
    "decode_image": "seqloader.sources.images",
    "ImageDecoder": "seqloader.sources.images",
    "describe_files": "seqloader.sources.fingerprint",
    "check_same_files": "seqloader.sources.fingerprint",
    "pack": "seqloader.packing.pack",
    "keep": "seqloader.packing.keep",
}

#: public modules, imported on first access (``seqloader.testing.run_distributed``)
_SUBMODULES = ("rng", "sampler", "testing")

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"seqloader.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'seqloader' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once; later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what type checkers and IDEs see (`as` marks an explicit re-export)
    from seqloader.integrations.prometheus import export_metrics as export_metrics
    from seqloader.integrations.torch_iterable import as_iterable_dataset as as_iterable_dataset
    from seqloader.loader.dataloader import DataLoader as DataLoader, StatefulDataLoader as StatefulDataLoader
    from seqloader.loader.samplers.shuffle import BijectiveShuffleSampler as BijectiveShuffleSampler, BlockShuffleSampler as BlockShuffleSampler
    from seqloader.loader.samplers.weighted import WeightedSampler as WeightedSampler
    from seqloader.prefetcher.api import prefetch as prefetch
    from seqloader.prefetcher.prefetch import Prefetch as Prefetch
    from seqloader.prefetcher.options import ProcessWorkers as ProcessWorkers, ThreadWorkers as ThreadWorkers
    from seqloader.prefetcher.ray_options import RayWorkers as RayWorkers
    from seqloader.sampler import Stateful as Stateful, StatefulDistributedSampler as StatefulDistributedSampler
    from seqloader.packing.keep import keep as keep
    from seqloader.packing.pack import pack as pack
    from seqloader.sequences.base import LazySequence as LazySequence
    from seqloader.sequences.blocks import block_shuffle as block_shuffle
    from seqloader.sequences.cache import add_cache as add_cache
    from seqloader.sequences.cycle import cycle as cycle
    from seqloader.sequences.mapping import rng_map as rng_map, smap as smap
    from seqloader.sequences.mix import mix as mix
    from seqloader.sequences.reorder import concatenate as concatenate, gather as gather, repeat as repeat, shuffle as shuffle
    from seqloader.sequences.segments import split as split
    from seqloader.sequences.select import case as case, interleave as interleave, switch as switch
    from seqloader.sequences.shape import batch as batch
    from seqloader.sequences.shape import unbatch as unbatch
    from seqloader.sequences.shard import shard as shard
    from seqloader.sequences.tuples import collate as collate, starmap as starmap
    from seqloader.sources.arrow import arrow_ipc as arrow_ipc
    from seqloader.sources.fingerprint import check_same_files as check_same_files, describe_files as describe_files
    from seqloader.sources.folder import image_folder as image_folder
    from seqloader.sources.images import ImageDecoder as ImageDecoder, decode_image as decode_image
    from seqloader.sources.parquet_files import parquet as parquet
    from seqloader.sources.megatron import megatron as megatron
    from seqloader.sources.tar import tar_shards as tar_shards
    from seqloader.sources.token_windows import token_windows as token_windows
