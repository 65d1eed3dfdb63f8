"""L3, torch_compat: pinning, and torch's words for a dead worker, a timeout, running out of file
descriptors and the ``pin_memory`` warnings, which user code matches on."""

from __future__ import annotations

import signal
import warnings
from typing import Any, Optional

import torch
from torch.utils.data._utils.pin_memory import pin_memory as _pin_memory

def pin(batch: Any, device: str) -> Any:
    """torch's ``pin_memory`` of a (nested) batch for ``device``."""
    return _pin_memory(batch, device)


def pin_device(pin_memory: bool, pin_memory_device: str) -> Optional[str]:
    """The device to pin batches for, or ``None``; warns like torch's iterator does.

    Example:
        >>> pin_device(False, "") is None
        True
    """
    if not pin_memory:
        return None
    if pin_memory_device:
        warnings.warn("pin_memory_device is deprecated, the current accelerator will be used as the "
                      f"device,ignore pin_memory_device='{pin_memory_device}'.", stacklevel=3)
    if not torch.accelerator.is_available():
        warnings.warn("'pin_memory' argument is set as true but no accelerator is found, then device "
                      "pinned memory won't be used.", stacklevel=3)
        return None
    acc = torch.accelerator.current_accelerator()
    if acc is None or acc.type == "mps":
        return None
    return acc.type


# --------------------------------------------------------------------------- torch's words


def worker_error(*, timed_out: bool, timeout: float, batch: str, worker_id: Optional[int],
                 pid: Optional[int], exitcode: Optional[int], doing: str, detail: str) -> RuntimeError:
    """torch's message for a timeout or a dead worker (code matches on it), then seqloader's details
    (``batch``: the batch waited for, in words).

    Example:
        >>> str(worker_error(timed_out=True, timeout=5, batch="batch 3", worker_id=1, pid=42, exitcode=None,
        ...                  doing="", detail=""))
        'DataLoader timed out after 5 seconds; seqloader: waiting for batch 3 from worker 1 (pid 42)'
        >>> str(worker_error(timed_out=False, timeout=0, batch="batch 3", worker_id=1, pid=42, exitcode=-9,
        ...                  doing="while producing batch 3", detail="...")).split(". ")[0]
        'DataLoader worker (pid 42) is killed by signal: Killed'
    """
    if timed_out:
        who = "" if worker_id is None else f" from worker {worker_id}" + (f" (pid {pid})" if pid is not None else "")
        return RuntimeError(f"DataLoader timed out after {timeout} seconds; seqloader: waiting for "
                            f"{batch}{who}")
    return RuntimeError(f"{_death_head(pid, exitcode)}seqloader: worker {worker_id} (pid {pid}) died {doing} "
                        f"({detail})")


def _death_head(pid: Optional[int], exitcode: Optional[int]) -> str:
    """torch's first sentence for a dead worker."""
    if exitcode is not None and exitcode < 0:
        name = signal.strsignal(-exitcode) or f"signal {-exitcode}"
        return f"DataLoader worker (pid {pid}) is killed by signal: {name}. "
    return f"DataLoader worker (pid(s) {pid}) exited unexpectedly. "


def poison_error(*, what: str, worker_id: Optional[int], pid: Optional[int], exitcode: Optional[int],
                 detail: str) -> RuntimeError:
    """A batch that killed a worker and its replacement (``max_worker_restarts``): torch's first
    sentence for the last death, then the batch (``what``: its number and dataset indices).

    Example:
        >>> e = poison_error(what="batch 3 (dataset indices [6, 7])", worker_id=1, pid=42, exitcode=-9, detail="...")
        >>> str(e).split(". seqloader: ")[1].split(";")[0]
        'batch 3 (dataset indices [6, 7]) killed worker 1 twice (the worker, then its replacement, pid 42)'
    """
    return RuntimeError(f"{_death_head(pid, exitcode)}seqloader: {what} killed worker {worker_id} twice (the "
                        f"worker, then its replacement, pid {pid}); it is a poison batch and is not computed "
                        f"again: look at what its samples do (memory use, a crashing decoder) ({detail})")


def open_files_error(exc: OSError) -> RuntimeError:
    """torch's advice for running out of file descriptors (code matches on it), made true for
    seqloader's slots.

    Example:
        >>> "ulimit -n" in str(open_files_error(OSError(24, "Too many open files")))
        True
    """
    return RuntimeError(
        "Too many open files: every batch still referenced holds a shared-memory slot (one file "
        "descriptor in the reading process and one in its worker). Please increase the limit "
        "using `ulimit -n` in the shell, or keep copies (`batch.clone()`) instead of the batches; "
        "torch's `torch.multiprocessing.set_sharing_strategy('file_system')` does not apply to "
        f"seqloader's slots ({exc})")


def iterable_length_warning(dataset: Any, reported: int, fetched: int, num_workers: int) -> str:
    """torch's warning when an ``IterableDataset`` yields more than ``len(loader)`` said (its
    ``__len__`` when ``len(dataloader)`` was read), word for word: code filters on it.

    Example:
        >>> iterable_length_warning("ds", 3, 4, 0)
        'Length of IterableDataset ds was reported to be 3(when accessing len(dataloader)), but 4 samples have been fetched. '
    """
    message = (f"Length of IterableDataset {dataset} was reported to be {reported}(when accessing "
               f"len(dataloader)), but {fetched} samples have been fetched. ")
    if num_workers > 0:
        message += ("For multiprocessing data-loading, this could be caused by not properly configuring the "
                    "IterableDataset replica at each worker. Please see "
                    "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for examples.")
    return message
