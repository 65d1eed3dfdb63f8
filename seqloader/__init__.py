"""seqloader: lazy, position-addressable sequences and a stateful, seekable DataLoader.

Public names are listed in ``__all__``; everything else is private.
"""

from seqloader.sequences.base import LazySequence

__version__ = "0.1.0"

__all__ = ["LazySequence", "__version__"]
