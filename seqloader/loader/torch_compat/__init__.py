"""L3: every use of torch's private data-loading pieces, in one place.

A torch release is checked here and nowhere else. What seqloader borrows from
``torch.utils.data._utils`` and why:

* the worker's ``WorkerInfo`` (what ``torch.utils.data.get_worker_info()`` returns) and the numpy
  seed of torch's worker set-up (``_generate_state``), so that a dataset sees in seqloader's
  workers exactly what torch's own workers would show it: :func:`install_worker_info`;
* hiding that info around torch's default collate functions, which stack into a fresh
  shared-memory segment per batch whenever they see one (seqloader ships results through its
  own reused slots): :func:`collate_in_plain_memory`;
* torch's generic ``collate`` and ``default_collate_fn_map``, to run ``default_collate`` with its
  tensors stacked straight into regions of a worker's slot (:func:`collate_into_slot`);
* the map-style fetch (``_MapDatasetFetcher``: ``dataset.__getitems__`` when it exists):
  :func:`fetch` (:func:`fetcher`: made once for many batches); pinning (``pin_memory``): :func:`pin`;
* torch's words, which user code matches on: a dead worker, a timeout, running out of file
  descriptors, the ``pin_memory`` warnings (:func:`worker_error`, :func:`open_files_error`,
  :func:`pin_device`); a batch that killed a worker and its replacement starts with torch's
  words for the last death (:func:`poison_error`).

Checked against torch 2.13 and its development branch (2026-11): 2.13's ``WorkerInfo`` has the
fields ``rng`` and ``worker_method``, which torch's process workers leave at their defaults
(``None``, ``"multiprocessing"``); the development branch fills ``rng`` with the worker's global
generators (``_RNG(random._inst, torch.default_generator, numpy's global RandomState)``) and makes
``get_worker_info()`` look at a thread-local info (its thread workers) before the module global.
:func:`install_worker_info` follows whichever torch is installed, and the hiding clears both.

**Thread workers** (``worker_method="thread"``, and threads inside worker processes) need a
``WorkerInfo`` per thread: :func:`install_thread_worker_info` sets one with ``worker_method="thread"``
and the thread's own generators in ``rng`` (what ``torch.thread_safe_generator()`` returns), in the
thread-local storage torch's development branch reads. A torch without it (2.13) is patched only
while thread workers live: :func:`thread_worker_info` is held (a count, behind a lock) by the thread
executor from the start of its first thread until it is closed and its last thread has ended. The
first holder puts a ``threading.local`` in ``torch.utils.data._utils.worker`` as
``_thread_local_worker_info`` and gives ``get_worker_info`` that branch's body: its code object is
replaced in place (so references taken before, ``from torch.utils.data import get_worker_info``,
see it too), reading the thread-local info first and torch's module global otherwise. The last
holder restores the original code object and removes the attribute (only if seqloader put it
there); a forked child starts unpatched. The patched body changes nothing for a thread without an
info of its own (the main thread, torch's own workers). In a worker *process* whose threads compute
items (``threads_per_worker``) the patch lasts for the process's life: that process is seqloader's
own and ends with its loader. On a torch with its own thread-local info nothing is patched at all.
The plain route, a ``WorkerInfo`` in torch's module global, is what process workers use; for threads
it would show one thread's info to every thread: so the plain ``worker_info`` route
(``SEQLOADER_PLAIN_ROUTES=worker_info``, :mod:`seqloader.loader.plain_routes`) patches nothing and
refuses thread workers instead (:func:`refuse_thread_workers_on_plain_route`, a ``ValueError``
raised when a loader opens them). ``tests/loader/test_torch_compat.py`` compares the
info with the one torch's own workers build; ``tests/loader/rngs/test_worker_info_patch.py`` checks that
the patch ends with the last thread worker.
"""

from seqloader.loader.torch_compat.collate import (TORCH_COLLATES, collate_in_plain_memory, collate_into_slot, fetch,
                                                   fetcher,
                                                   has_arrays, is_default_collate)
from seqloader.loader.torch_compat.words import (open_files_error, pin, pin_device, poison_error,
                                                 worker_error)
from seqloader.loader.torch_compat.worker_info import (clear_worker_info, hold_thread_worker_info_for_process,
                                                       install_thread_worker_info, install_worker_info,
                                                       numpy_worker_seed, refuse_thread_workers_on_plain_route,
                                                       thread_generators, thread_worker_info,
                                                       thread_worker_info_holders, worker_dataset,
                                                       worker_info_hidden)

__all__ = ["TORCH_COLLATES", "clear_worker_info", "collate_in_plain_memory", "collate_into_slot", "fetch", "fetcher",
           "has_arrays", "hold_thread_worker_info_for_process", "install_thread_worker_info", "install_worker_info",
           "is_default_collate", "numpy_worker_seed", "open_files_error", "pin", "pin_device", "poison_error",
           "refuse_thread_workers_on_plain_route", "thread_generators", "thread_worker_info", "thread_worker_info_holders", "worker_dataset", "worker_error",
           "worker_info_hidden"]
