"""L0: lazy, position-addressable sequences (no torch, no multiprocessing)."""
