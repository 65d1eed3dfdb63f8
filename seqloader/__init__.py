"""seqloader: lazy, position-addressable sequences and a stateful, seekable DataLoader.

Public names are listed in ``__all__``; everything else is private.
"""

from seqloader.sequences.base import LazySequence
from seqloader.sequences.mapping import rng_map, smap
from seqloader.sequences.reorder import concatenate, gather, repeat, shuffle
from seqloader.sequences.shape import batch
from seqloader.sequences.shard import shard
from seqloader.prefetch import Prefetch, prefetch
from seqloader.integrations.torch_iterable import as_iterable_dataset
from seqloader.integrations.distributed import run_distributed
from seqloader.loader.dataloader import DataLoader, StatefulDataLoader
from seqloader.loader.sampling import BijectiveShuffleSampler

__version__ = "0.1.0"

__all__ = ["LazySequence", "smap", "rng_map", "gather", "shuffle", "concatenate", "repeat", "batch", "shard", "prefetch", "Prefetch", "as_iterable_dataset", "run_distributed", "DataLoader", "StatefulDataLoader", "BijectiveShuffleSampler", "__version__"]
