"""seqloader: lazy, position-addressable sequences and a stateful, seekable DataLoader.

Public names are listed in ``__all__``; everything else is private.
"""

from seqloader.sequences.base import LazySequence
from seqloader.integrations.torch_iterable import as_iterable_dataset

__version__ = "0.1.0"

__all__ = ["LazySequence", "as_iterable_dataset", "__version__"]
