"""L1 orders: which index sits where. Pure index arithmetic, importable without torch.

The wing holds everything that maps a position to an index and nothing that reads data:

* :mod:`~seqloader.orders.permutation`: the keyed Feistel permutation of ``[0, n)`` behind
  ``shuffle`` and the loader's shuffled epochs (O(1) memory and seek);
* :mod:`~seqloader.orders.block_permutation` and :mod:`~seqloader.orders.block_quality`: the
  locality-aware block permutation behind ``block_shuffle`` and ``BlockShuffleSampler``, and the
  measures of an order's locality and mixing;
* :mod:`~seqloader.orders.orders`: the loader's ``Order`` protocol and its built-in orders (and
  ``DERIVATION``, the number of the scheme that turns seeds into orders);
* :mod:`~seqloader.orders.steps`: a step number to a sample position (batch-size schedules);
* :mod:`~seqloader.orders.plans`: an order cut into one rank's batches from a position;
* :mod:`~seqloader.orders.holes`: skipped positions backfilled from the epoch's tail.

The wing imports only :mod:`seqloader.errors`, :mod:`seqloader.rng` and numpy (checked by
``tests/test_layers.py``): the sequence ops (L0) and the loader (L3) both build on it, and the
samplers that hand an order to the loader live in :mod:`seqloader.loader`.
"""
