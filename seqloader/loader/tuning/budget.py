"""L3, pure: the memory a configuration holds, predicted before it runs and measured while it does.

``autotune`` never starts a configuration whose predicted memory exceeds ``memory_budget``
(:meth:`Budget.over`): a worker process is predicted at the size measured for one in an earlier
trial (before any, at ``worker_bytes``, the training process's own size), and each batch in flight
(:attr:`~seqloader.loader.tuning.trials.Config.in_flight`) at the size of the largest delivered
batch. What the loader is measured to hold (a :class:`~seqloader.loader.tuning.trials.Usage`)
refuses the configuration that holds it (:meth:`Budget.held`, :meth:`Budget.measured`) and
corrects the prediction of the others.
"""

from __future__ import annotations

from typing import Optional

from seqloader.loader.tuning.trials import Config, Usage

__all__ = ["Budget"]


class Budget:
    """``memory_budget`` and what each configuration is predicted or measured to hold.

    Example:
        >>> b = Budget(700, worker_bytes=100)
        >>> b.saw(50); b.over(Config("process", 2)) is None          # 2 x 100 + 4 batches in flight x 50
        True
        >>> b.over(Config("process", 4))
        'predicted 800 bytes > memory_budget 700'
        >>> b.measured(Usage(cpu_s=0.0, loader_bytes=1500, worker_bytes=300))
        'measured 1500 bytes > memory_budget 700'
        >>> b.over(Config("process", 2)), b.over(Config("thread", 2)) is None   # a worker is now 300
        ('predicted 800 bytes > memory_budget 700', True)
    """

    def __init__(self, budget: int, worker_bytes: int):
        self.budget, self.worker_bytes, self.batch_bytes = budget, worker_bytes, 0

    def saw(self, nbytes: int) -> None:
        """A batch of ``nbytes`` was delivered (0: not measured)."""
        if nbytes > self.batch_bytes:
            self.batch_bytes = nbytes

    def predicted(self, c: Config) -> int:
        """The bytes ``c`` is predicted to hold: its worker processes and its batches in flight."""
        procs = c.workers if c.method == "process" else 0
        return procs * self.worker_bytes + c.in_flight * self.batch_bytes

    def over(self, c: Config) -> Optional[str]:
        """Why ``c`` is not started (its prediction exceeds the budget), or ``None``."""
        predicted = self.predicted(c)
        return f"predicted {predicted} bytes > memory_budget {self.budget}" if predicted > self.budget else None

    def held(self, loader_bytes: int) -> Optional[str]:
        """The loader was measured holding ``loader_bytes``: why the configuration in force is
        refused, or ``None``."""
        return f"measured {loader_bytes} bytes > memory_budget {self.budget}" if loader_bytes > self.budget else None

    def measured(self, used: Usage) -> Optional[str]:
        """``used`` was measured at a trial's end: :meth:`held`, and a worker process measured
        there predicts the others."""
        if used.worker_bytes:
            self.worker_bytes = used.worker_bytes
        return self.held(used.loader_bytes)
