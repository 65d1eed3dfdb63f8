"""L3: a thread worker's own generators, and the probe of its draws from the shared global ones.

Draws from the *global* generators inside a thread worker cannot be reproduced: another thread
(or the training loop) may draw or reseed in between. They are not seeded per batch there, and a
:class:`GlobalDrawProbe` watches, in the worker thread itself, the first batch each thread worker
computes in an epoch: a profile hook of that thread only (``sys.setprofile``) sees each call into C
and recognises a draw from ``random``'s global instance (exact: what other threads do is never
attributed to the worker), or a torch random function that moved torch's default generator
during the call. numpy's functions do not show in a profile (Cython): its global state is
compared before and after the batch instead. Both compares are the one draw check
(:class:`~seqloader.loader.rngs.generators.DrawCheck`); the hook only narrows the window, and cannot go:
a compare around the whole batch blames the training loop's own draws on the worker (issue 42
measured it, ``docs/design.md``). For torch and numpy, seqloader's own settings of the global
states (a ``num_workers=0`` loader of the same process) are told apart
(:func:`~seqloader.loader.rngs.snapshots.reseeds`), but a draw from those globals by another thread
at that moment is blamed on the worker (torch's functions release the GIL): a warning too many,
never a batch changed. The first such batch logs a ``RuntimeWarning`` (once per loader) naming
the generator and the fix; batches after the first of each epoch cost nothing.

On the plain ``probe`` route (``SEQLOADER_PLAIN_ROUTES=probe``,
:mod:`seqloader.loader.plain_routes`) the probe is off, decided when it is made: no profile hook is
set, and a draw from the global generators in a thread worker is not reported (batches are the
same). On the plain ``worker_info`` route thread workers are refused (:class:`ThreadWorkerSetup`).
"""

from __future__ import annotations

import random
import sys
import threading
import warnings
from typing import Any, Callable, Optional

from seqloader.loader.plain_routes import plain_routes
from seqloader.loader.rngs.generators import DrawCheck

__all__ = ["TORCH_DRAWS", "GlobalDrawProbe", "ThreadRNGs", "current_thread_rngs", "use_thread_rngs"]

_local = threading.local()  # .rngs: the ThreadRNGs of a thread worker

_NUMPY, _TORCH = ("numpy.random",), ("torch",)  # what the probe's checks watch

#: Names of torch's functions and tensor methods that draw from a generator.
TORCH_DRAWS = frozenset({
    "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "normal", "bernoulli",
    "multinomial", "poisson", "dropout", "feature_dropout", "alpha_dropout", "native_dropout", "rrelu",
    "rrelu_with_noise", "uniform_", "normal_", "random_", "bernoulli_", "exponential_", "geometric_", "cauchy_",
    "log_normal_", "rrelu_"})


class _Hook:
    """The profile hook of one watched batch: what it saw drawn from the global generators. It
    says *when* to compare (:class:`~seqloader.loader.rngs.generators.DrawCheck`, the one draw check): torch's
    state around each call of this thread to a torch random function, numpy's around the batch."""

    __slots__ = ("found", "_random", "_torch", "_numpy")

    def __init__(self) -> None:
        self.found: list[str] = []
        self._random = random._inst
        self._torch: Optional[DrawCheck] = None
        self._numpy = DrawCheck(_NUMPY)

    def numpy_changed(self) -> bool:
        """numpy's global state moved during the batch, and not by seqloader's own setting."""
        return bool(self._numpy.drawn())

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event == "c_call":
            if getattr(arg, "__self__", None) is self._random:
                self.found.append("random")
            elif getattr(arg, "__name__", None) in TORCH_DRAWS:
                self._torch = DrawCheck(_TORCH)
        elif event in ("c_return", "c_exception") and self._torch is not None:
            if self._torch.drawn():
                self.found.append("torch")
            self._torch = None


class GlobalDrawProbe:
    """Reports, once per loader, a batch computed in a thread worker that drew from a global
    generator (see the module docstring). Shared by the loader's thread workers.

    ``enabled``: whether it watches at all (``None``: unless the plain ``probe`` route is in force
    now); decided once, when it is made, and carried to the copies a worker process gets.
    """

    def __init__(self, enabled: Optional[bool] = None) -> None:
        self.enabled = not plain_routes().probe if enabled is None else bool(enabled)
        self._lock = threading.Lock()
        self._warned = False
        self._init_warned = False  # worker_init_fn changed the globals (ThreadWorkerSetup): warned once

    def first_init_warning(self) -> bool:
        """Whether this is the first time the worker_init_fn warning is due (then it is given)."""
        with self._lock:
            first, self._init_warned = not self._init_warned, True
            return first

    def __reduce__(self) -> tuple:
        return GlobalDrawProbe, (self.enabled,)  # a copy (a copied loader, a worker process) watches afresh

    def watch(self, rngs: "ThreadRNGs", epoch: int) -> Optional[tuple]:
        """Start watching this thread's batch if it is its first of ``epoch``; pass the result to
        :meth:`check` (``None``: nothing watched)."""
        if not self.enabled or self._warned or rngs.probed_epoch == epoch:
            return None
        rngs.probed_epoch = epoch
        hook, previous = _Hook(), sys.getprofile()
        sys.setprofile(hook)
        return hook, previous

    def check(self, watched: tuple, what: Callable[[], str]) -> None:
        """Stop watching; warn (once) if the batch drew from a global generator."""
        hook, previous = watched
        sys.setprofile(previous)
        if hook.numpy_changed():
            hook.found.append("numpy.random")
        if not hook.found:
            return
        with self._lock:
            if self._warned:
                return
            self._warned = True
        names = " and ".join(dict.fromkeys(hook.found))
        warnings.warn(
            f"seqloader.DataLoader: {what()} drew from the global {names} generator(s) in a thread worker; "
            "threads share those generators (with each other and the training loop), so these draws are not "
            "reproducible and a resume will not repeat them. Draw from seqloader.rng_map(...) or "
            "torch.thread_safe_generator() instead (seeded per batch: the same numbers under every executor, "
            "num_workers=0 included), or use worker_method='multiprocessing' with threads_per_worker=1",
            RuntimeWarning, stacklevel=2)


class ThreadRNGs:
    """A thread worker's generators (torch's ``_RNG``: ``rng``), its loader's probe, and the last
    epoch whose first batch the probe watched in this thread."""

    __slots__ = ("rng", "probe", "probed_epoch")

    def __init__(self, rng: Any, probe: Optional[GlobalDrawProbe]):
        self.rng, self.probe, self.probed_epoch = rng, probe, -1


def use_thread_rngs(rngs: Optional[ThreadRNGs]) -> None:
    """Make ``rngs`` this thread's (``None``: the globals again)."""
    _local.rngs = rngs


def current_thread_rngs() -> Optional[ThreadRNGs]:
    """This thread's :class:`ThreadRNGs` if it is a thread worker, else ``None``."""
    return getattr(_local, "rngs", None)
