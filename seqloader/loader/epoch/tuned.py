"""L3, the mechanism of ``DataLoader(autotune=True)``: switch configurations at batch boundaries.

A batch does not depend on what computes it, and a loader's progress is a position, so a switch
is a seek: at a batch boundary, the iterator (:class:`TunedIterator`) closes its current workers
(bounded, as at an epoch's end: the batches they computed ahead are dropped, never delivered)
and opens the epoch again from the position the user has consumed, as ``load_state_dict`` resumes
one, with the next configuration. No batch is delivered twice or skipped, and ``state_dict()`` is
the one of a fixed loader: the progress is the only state, and it never sees a switch.

:class:`Tuning` is the loader's one part for it: the policy (``loader/tuning/policy.py``:
:class:`~seqloader.loader.tuning.policy.Tuner`, or a test's
:class:`~seqloader.loader.tuning.policy.Schedule`), the configuration in force, the
measurements (``loader/tuning/usage.py``) and the report of ``stats()["autotune"]``. It lends
the loader's other parts a :class:`TunedView`: the loader's settings with ``num_workers``,
``executor`` and ``prefetch_factor`` of the configuration in force, so that opening an epoch,
reopening it after ``set_epoch`` and starting workers read one configuration. Each switch is
logged once (``seqloader.autotune``, INFO), and so is each kind of configuration it will not try.

What the user asked for is kept whatever it tries: with ``max_worker_restarts`` only worker
processes compute the batches (the policy is told, and a configuration without them is refused
here); with the ``spawn`` or ``forkserver`` start method, processes are tried only if what they
would be sent (the epoch's batches, the dataset, ``worker_init_fn``) pickles
(:func:`~seqloader.loader.tuning.pickles.unpicklable`, checked once, before the first batch). CPU is counted for this loader's
own workers only (:func:`~seqloader.loader.tuning.usage.worker_pids`).
"""

from __future__ import annotations

import functools
import logging
import os
import random  # (the doctests)
import time
from typing import Any, Callable, Optional

import numpy as np

from seqloader.errors import check_int
from seqloader.loader.tuning.pickles import unpicklable
from seqloader.loader.tuning.policy import BatchTiming, Config, Policy, Tuner
from seqloader.loader.tuning.rules import not_tried_words
from seqloader.loader.tuning.usage import ProcessTree, batch_bytes, check_proc, default_memory_budget, worker_pids
from seqloader.loader.epoch.block_caches import window_batches
from seqloader.loader.epoch.map_iterator import MapIterator
from seqloader.loader.rngs.snapshots import Snapshot
from seqloader.loader.epoch.opening import new_iterator, open_map_epoch
from seqloader.loader.state.progress import NONE
from seqloader.loader.rngs.generators import DrawCheck
from seqloader.loader.rngs.seeding import seed_globals
from seqloader.prefetcher.checks import resolve_context
from seqloader.prefetcher.options import ExecutorOptions, ProcessWorkers, ThreadWorkers

__all__ = ["TunedIterator", "TunedView", "Tuning", "computed_watching", "make_tuning"]

_log = logging.getLogger("seqloader.autotune")


def computed_watching(seq: Any, b: int, seed: int, epoch: int, derivation: int) -> tuple[Any, bool]:
    """Batch ``b`` of an epoch's batches ``seq``, computed in this process, and whether it drew from
    the global generators (``random``, ``numpy.random``, torch's): their states after the batch
    are compared with their states right after the batch's seeding (or, for a batch that is not
    seeded because seqloader's own code alone computes it, :mod:`seqloader.loader.rngs.draws`,
    with their states before it). Exact, whatever draws. The caller's states are restored.

    Example:
        >>> from seqloader.orders.plans import OrderPlan
        >>> from seqloader.orders.orders import RangeOrder
        >>> from seqloader.loader.epoch.batches import EpochBatches
        >>> from seqloader.loader.rngs.seeding import DERIVATION
        >>> plain = EpochBatches(list(range(4)), OrderPlan(RangeOrder(4), 0, 2, False), list, seed=0, epoch=0)
        >>> computed_watching(plain, 1, 0, 0, DERIVATION)
        ([2, 3], False)
        >>> class Noisy:
        ...     def __len__(self): return 4
        ...     def __getitem__(self, i): return i + random.random()
        >>> drawn = EpochBatches(Noisy(), OrderPlan(RangeOrder(4), 0, 2, False), list, seed=0, epoch=0)
        >>> computed_watching(drawn, 1, 0, 0, DERIVATION)[1]
        True
    """
    snapshot = Snapshot()
    try:
        if not getattr(seq, "draws_globals", True):   # not seeded: nothing to seed again
            check = DrawCheck()
            out = seq[b]
            return out, bool(check.moved())
        out = seq[b]
        check = DrawCheck()   # the states after the batch, against those right after its seeding
        seed_globals(seed, epoch, seq.key(b), derivation)
        return out, bool(check.moved())
    finally:
        snapshot.restore()


def make_tuning(autotune: Any, memory_budget: Any, num_workers: int, executor: ExecutorOptions,
                iterable: bool, in_order: bool, restarts: int = 0) -> Optional["Tuning"]:
    """``DataLoader(autotune=, memory_budget=)`` checked against the other arguments: ``None``
    (off), or the loader's :class:`Tuning`. With ``restarts`` (``max_worker_restarts``, which
    needs ``num_workers > 0``, as without autotune), only worker processes are tried.

    ``autotune`` is ``True`` (the measuring :class:`~seqloader.loader.tuning.policy.Tuner`,
    with at most ``num_workers`` worker processes, or the cores at ``num_workers=0``) or a policy
    object (``first``, ``observe``, ``report``). The tuner chooses the executor, so a
    ``worker_method`` other than torch's default or ``threads_per_worker`` is refused; so are an
    ``IterableDataset`` (its streams are ``num_workers``: what it reads) and ``in_order=False``
    (no fixed order to keep).

    Example:
        >>> make_tuning(False, None, 2, ProcessWorkers(), False, True) is None
        True
        >>> make_tuning(True, 2**30, 2, ThreadWorkers(), False, True)
        Traceback (most recent call last):
        ValueError: DataLoader: autotune=True chooses the executor: leave worker_method at its default (got worker_method='thread')
        >>> make_tuning(False, 2**30, 2, ProcessWorkers(), False, True)
        Traceback (most recent call last):
        ValueError: DataLoader: memory_budget applies with autotune=True only (got memory_budget=1073741824 with autotune=False)
    """
    if isinstance(autotune, np.bool_):   # numpy's bool is a bool here (it is not a subclass of Python's)
        autotune = bool(autotune)
    if autotune is False or autotune is None:
        if memory_budget is not None:
            raise ValueError(f"DataLoader: memory_budget applies with autotune=True only (got "
                             f"memory_budget={memory_budget!r} with autotune={autotune!r})")
        return None
    policy = autotune if autotune is not True and all(hasattr(autotune, m) for m in ("first", "observe", "report")) \
        else None
    if autotune is not True and policy is None:
        kind = type(autotune)
        raise TypeError(f"DataLoader: autotune must be a bool or a policy with first/observe/report (got "
                        f"{kind.__qualname__ if kind.__module__ == 'builtins' else f'{kind.__module__}.{kind.__qualname__}'}"
                        f" {autotune!r})")
    if not isinstance(num_workers, int) or num_workers < 0:   # torch's words (its own check comes later)
        raise ValueError("num_workers option should be non-negative; use num_workers=0 to disable multiprocessing.")
    if not isinstance(executor, ProcessWorkers):
        raise ValueError(f"DataLoader: autotune=True chooses the executor: leave worker_method at its default "
                         f"(got worker_method={getattr(executor, 'name', executor)!r})")
    if executor.threads != 1:
        raise ValueError(f"DataLoader: autotune=True chooses the threads: leave threads_per_worker at 1 (got "
                         f"{executor.threads})")
    if iterable:
        raise ValueError("DataLoader: autotune=True needs a map-style dataset (got an IterableDataset: its "
                         "streams are num_workers, so the number of workers decides what it reads)")
    if not in_order:
        raise ValueError("DataLoader: autotune=True keeps the batches of a fixed loader in their order; "
                         "in_order=False has no fixed order (got in_order=False)")
    check_proc()
    tree = ProcessTree()
    needs = f"max_worker_restarts={restarts} needs worker processes" if restarts else ""
    if policy is not None:
        if memory_budget is not None:
            raise ValueError("DataLoader: memory_budget goes to the policy given as autotune=, not beside it")
        return Tuning(policy, executor.context, tree, needs)
    budget = default_memory_budget() if memory_budget is None else check_int("DataLoader", "memory_budget",
                                                                            memory_budget)
    if budget < 0:
        raise ValueError(f"DataLoader: memory_budget must be >= 0 bytes (got {budget})")
    cores = len(os.sched_getaffinity(0))
    return Tuning(Tuner(num_workers or cores, budget, worker_bytes=tree.own_bytes(), cores=cores, needs_processes=needs),
                  executor.context, tree, needs)


class Tuning:
    """The loader's autotune: its policy, the configuration in force, what it measured.

    Args:
        policy: decides (:class:`~seqloader.loader.tuning.policy.Tuner` or another policy).
        context: the start method of worker processes (torch's ``multiprocessing_context``).
        tree: measures this process and its workers.
        needs_processes: why only worker processes may compute the batches
            (``max_worker_restarts``), or ``""``: a configuration without them is refused.
    """

    def __init__(self, policy: Policy, context: Any, tree: ProcessTree, needs_processes: str = ""):
        self.policy, self._context, self.tree, self._needs = policy, context, tree, needs_processes
        self.config: Config = self._kept(policy.first())
        self.switches: list[dict] = []
        #: whether batches draw from the global generators (``None``: not known yet): threads,
        #: which share those generators, are tried only when they do not
        self.draws_globals: Optional[bool] = None
        self._pickles_checked = bool(needs_processes)   # (processes only: a pickling error raises, as without)
        for words in not_tried_words(getattr(policy, "not_tried", {})):
            _log.info("seqloader autotune: %s", words)

    def _kept(self, config: Config) -> Config:
        if self._needs and config.method != "process":
            raise ValueError(f"DataLoader: the autotune policy asked for {config.label}, but {self._needs}; "
                             "give it worker processes only (Tuner(needs_processes=...))")
        return config

    def _rule_out(self, verb: str, why: str, level: int = logging.INFO) -> None:
        """Tell the policy never to try a kind of configuration (``no_threads``, ``no_processes``),
        if it takes the verb; logged once."""
        if hasattr(self.policy, verb):
            getattr(self.policy, verb)(why)
            what = "threads" if verb == "no_threads" else "processes"
            _log.log(level, "seqloader autotune: %s not tried: %s", what, why)

    def checked(self, drew: bool) -> None:
        """A batch computed here drew from the global generators (``drew``) or not."""
        if self.draws_globals is None or drew:
            self.draws_globals = drew
            if drew:
                self._rule_out("no_threads", "the batches draw from the global random, numpy.random or torch "
                                             "generators, which threads share (draw from seqloader.rng_map or "
                                             "torch.thread_safe_generator() to let autotune try threads)")

    def check_pickles(self, seq: Any, dataset: Any, worker_init_fn: Any) -> None:
        """Once, before the first batch: under ``spawn`` or ``forkserver``, if what worker processes
        would be sent does not pickle, they are never tried (``fork`` sends nothing)."""
        if self._pickles_checked:
            return
        self._pickles_checked = True
        method = resolve_context(self._context).get_start_method()
        if method in ("spawn", "forkserver") and hasattr(self.policy, "no_processes"):
            why = unpicklable((seq, dataset, worker_init_fn))
            if why is not None:
                self._rule_out("no_processes", f"the pipeline does not pickle under {method!r} ({why}); make "
                                               "the dataset, collate_fn and worker_init_fn picklable (module-level "
                                               "functions), or use multiprocessing_context='fork'",
                               logging.WARNING)   # (the start method asked for processes the pipeline cannot have)

    def set_period(self, batches: int) -> None:
        """The loader's cycle in batches (a block shuffle's windows), for a policy that takes it
        (:meth:`Tuner.set_period <seqloader.loader.tuning.policy.Tuner.set_period>`)."""
        if hasattr(self.policy, "set_period"):
            self.policy.set_period(batches)

    def executor(self) -> ExecutorOptions:
        """The executor of the configuration in force."""
        if self.config.method == "thread":
            return ThreadWorkers()
        return ProcessWorkers(context=self._context, threads=self.config.threads)

    def observe(self, timing: BatchTiming, pids: Callable[[], list]) -> Optional[Config]:
        """A batch was delivered: the configuration to switch to, or ``None``; ``pids()``: the
        worker processes reading now (their CPU and memory are the loader's)."""
        new = self.policy.observe(timing, lambda memory=True: self.tree.usage(memory, pids()))
        return None if new is None or new == self.config else self._kept(new)

    def set(self, config: Config) -> None:
        """``config`` is in force from now on; logged once."""
        why = self.policy.report().get("reason", "")
        _log.info("seqloader autotune: %s -> %s (%s)", self.config.label, config.label, why)
        self.switches.append({"from": self.config.label, "to": config.label, "reason": why})
        self.config = config

    def report(self) -> dict:
        """``stats()["autotune"]``: the policy's report, the configuration in force and the memory held."""
        return {**self.policy.report(), "current": self.config.label, "current_config": self.config.as_dict(),
                "peak_bytes": self.tree.peak_bytes, "log": list(self.switches[-20:])}

    def iterator(self, loader: Any, reading: Any, epochs: Any, workers: Any, stats: Any,
                 reported_len: Optional[int] = None) -> Any:
        """``iter(loader)`` with autotune: a :class:`TunedIterator` over the configuration in force."""
        view: Any = TunedView(loader, self)   # a Settings whose workers' settings are read-only
        make = functools.partial(TunedIterator, tuning=self, view=view, reading=reading, workers=workers,
                                 epoch_of=lambda: epochs.progress.epoch)
        return new_iterator(view, reading, epochs, workers, stats, reported_len=reported_len, map_iterator=make)


class TunedView:
    """A loader's settings, with the workers' ones (``num_workers``, ``executor``,
    ``worker_method``, ``threads_per_worker``, ``prefetch_factor``) of the configuration in force.

    Example:
        >>> class L: num_workers, seed = 4, 7
        >>> class T:
        ...     config = Config("thread", 16)
        ...     def executor(self): return ThreadWorkers()
        >>> v = TunedView(L(), T())
        >>> v.num_workers, v.worker_method, v.seed, v.prefetch_factor
        (16, 'thread', 7, 2)
    """

    def __init__(self, loader: Any, tuning: Any):
        self._loader, self._tuning = loader, tuning

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    @property
    def num_workers(self) -> int:
        return self._tuning.config.workers

    @property
    def executor(self) -> ExecutorOptions:
        return self._tuning.executor()

    @property
    def worker_method(self) -> str:
        return "thread" if self._tuning.config.method == "thread" else "multiprocessing"

    @property
    def threads_per_worker(self) -> int:
        return self._tuning.config.threads

    @property
    def prefetch_factor(self) -> Optional[int]:
        c = self._tuning.config
        return c.prefetch if c.workers else None

    @property
    def prefetch_factor_given(self) -> bool:
        return True   # (the configuration's read-ahead is the tuner's choice)


class TunedIterator(MapIterator):
    """A map-style epoch whose workers change between batches; see the module docstring.

    Each delivered batch is shown to the policy as the loader's one clock timed it
    (:class:`~seqloader.loader.tuning.stats.BatchClock`: the wait inside ``next()``, a switch
    included, and the loop's work before it); a configuration the policy asks for is put in force
    at the start of the next ``next()``.
    """

    def __init__(self, *args: Any, tuning: Tuning, view: Any, reading: Any, workers: Any,
                 epoch_of: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._tuning, self._view, self._reading, self._workers = tuning, view, reading, workers
        self._epoch_of = epoch_of
        self._pending: Optional[Config] = None
        self._cpu: Optional[float] = None   # the CPU seconds of this thread over the latest batch computed here
        self._delivered = 0
        seq = self._opened.seq if self._opened.unread is None else view.collate_fn  # (unread: a custom sampler's)
        tuning.check_pickles(seq, view.dataset, view.worker_init_fn)
        tuning.set_period(window_batches(reading.seekable, view.batch_size) or 1)

    def _next(self) -> Any:
        """The pending switch (inside ``next()``: part of the loop's wait for this batch), then the
        batch; one computed by this thread has its CPU seconds measured (the share of a core it kept busy)."""
        if self._pending is not None:
            config, self._pending = self._pending, None
            self._switch(config)
        self._cpu = None
        if self._tuning.config.method != "main":
            return super()._next()
        cpu = time.thread_time()
        batch = super()._next()
        self._cpu = time.thread_time() - cpu
        return batch

    def _deliver(self) -> Any:
        batch = super()._deliver()
        clock = self._stats.clock   # the loader's one clock timed this next()
        now = clock.returned_at
        assert now is not None, "LoaderStats.returned() sets it for every batch delivered"
        # a batch's bytes predict the memory in flight; batches are alike, so one in 16 is walked
        size = batch_bytes(batch) if self._delivered % 16 == 0 else 0
        self._delivered += 1
        self._pending = self._tuning.observe(BatchTiming(now, clock.wait_s, clock.work_s, size, self._cpu),
                                             lambda: worker_pids(self._opened.source))
        return batch

    def _read(self) -> tuple[int, Any]:
        """As the base's; a batch computed here, while it is not known whether batches draw from
        the global generators, is watched (:func:`computed_watching`)."""
        opened = self._opened
        if self._tuning.draws_globals is not None or opened.source is not opened.seq:
            return super()._read()
        low = opened.watermark.low
        try:
            out, drew = computed_watching(opened.seq, low, self._view.seed, self._epoch_of(),
                                          self._reading.derivation)
        except Exception:
            self._consumed(low)
            raise
        self._consumed(low)
        self._tuning.checked(drew)
        return low, out

    def _switch(self, config: Config) -> None:
        """Put ``config`` in force: close the current workers, open the epoch's rest on new ones."""
        tuning, workers, opened = self._tuning, self._workers, self._opened
        tuning.set(config)
        live = opened.source is not opened.seq and not opened.source.closed
        if live:
            self._stats.refresh()
            if workers.is_persistent(opened.source):
                workers.close()
            else:
                opened.source.close()
        if self._done or self._left == 0 or self._progress.mark().since(opened.mark) is not NONE:
            return   # nothing left here (or the epoch changed): the next epoch opens with config
        replacement = open_map_epoch(self._view, self._reading, self._progress, workers, self._stats)
        self._opened, self._left = replacement, self._remaining(replacement)
