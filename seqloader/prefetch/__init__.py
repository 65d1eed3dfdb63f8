"""L2: evaluation of sequence items in worker processes, shared memory, global-RNG seeding."""
