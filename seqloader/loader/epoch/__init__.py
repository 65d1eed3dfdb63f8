"""L3: one epoch: its iterators, how it opens, the sequence of its batches (and the sources' caches, sized when it opens), and the tuned iterator of ``autotune=True``."""
