"""L4: a ``seqloader.DataLoader`` under the Hugging Face transformers ``Trainer``, resumed exactly.

The ``Trainer`` resumes data by *replaying*: ``train(resume_from_checkpoint=...)`` rebuilds the
train loader with accelerate's ``skip_first_batches`` (a torch ``DataLoader`` over torch's
samplers), which is not seqloader's order, and its next epoch starts over from seqloader's epoch
0. :class:`SeqloaderCallback` resumes by *seeking* instead:

* it stores the loader's ``state_dict()`` in every checkpoint: in ``checkpoint-N/trainer_state.json``
  under ``"stateful_callbacks" -> "SeqloaderCallback" -> "attributes" -> "loader_state"``,
  written by the Trainer together with ``global_step`` (transformers' ``ExportableState``);
* on ``resume_from_checkpoint`` it loads that state into the loader before the first batch, checks
  that the loader's epoch agrees with the Trainer's, and keeps ``state.epoch`` right during the
  resumed epoch (the Trainer counts that epoch's steps from the resume, not from its start);
* it requires ``TrainingArguments(ignore_data_skip=True)``, which turns the Trainer's own skip off.

The Trainer must iterate the seqloader loader: return it from ``get_train_dataloader`` (the
Trainer then moves each batch to its device itself, and seqloader shards over ``torch.distributed``
under ``torchrun``).
"""

from __future__ import annotations

import math
from typing import Any, Optional

try:
    from transformers.trainer_callback import ExportableState, TrainerCallback
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("seqloader.integrations.transformers needs Hugging Face transformers; install it with "
                      "`pip install seqloader[transformers]` (or `pip install transformers`)") from exc

from seqloader.loader.dataloader import DataLoader
from seqloader.loader.saving import len_or_none

__all__ = ["SeqloaderCallback"]

_NAME = "SeqloaderCallback"
_DONE = object()  # "the iterator had nothing left" (a batch can be anything)


class SeqloaderCallback(TrainerCallback, ExportableState):
    """Saves the train loader's state in each checkpoint and resumes it exactly; see the module docstring.

    Add it to the ``Trainer`` (``callbacks=[SeqloaderCallback()]``) and return a
    ``seqloader.DataLoader`` from ``get_train_dataloader``. It finds the loader in the Trainer's
    callback arguments when training begins, so it takes no arguments (which is also what
    ``restore_callback_states_from_checkpoint=True`` needs to rebuild it).

    Raises (when training begins):
        TypeError: the Trainer's train dataloader is not a ``seqloader.DataLoader`` (for example
            the Trainer built its own because ``get_train_dataloader`` was not overridden).
        ValueError: ``ignore_data_skip`` is ``False``; ``gradient_accumulation_steps`` does not
            divide the number of batches per epoch (the Trainer would not step the optimizer on
            the last, partial accumulation of a resumed epoch); or, on resume, the checkpoint
            has no loader state, or the loader's epoch disagrees with the Trainer's.

    Example:
        >>> import seqloader
        >>> from transformers import TrainingArguments
        >>> from transformers.trainer_callback import TrainerControl, TrainerState
        >>> loader = seqloader.DataLoader(list(range(12)), batch_size=4, seed=0)
        >>> callback = SeqloaderCallback()
        >>> args = TrainingArguments("out", ignore_data_skip=True, report_to="none", use_cpu=True)
        >>> state = TrainerState(global_step=0)
        >>> callback.on_train_begin(args, state, TrainerControl(), train_dataloader=loader)
        >>> callback.state()["attributes"]["loader_state"]["position"]
        0
        >>> bad = TrainingArguments("out", report_to="none", use_cpu=True)   # ignore_data_skip=False
        >>> callback.on_train_begin(bad, state, TrainerControl(), train_dataloader=loader)
        Traceback (most recent call last):
        ValueError: SeqloaderCallback: TrainingArguments(ignore_data_skip=False) ...
    """

    def __init__(self) -> None:
        self.loader: Optional[DataLoader] = None
        #: the loader's state as last exported (what a checkpoint holds)
        self.loader_state: Optional[dict] = None
        self._epoch = 0            # the resumed epoch
        self._offset = 0           # batches of the resumed epoch consumed before the checkpoint
        self._steps_in_epoch = 0   # len(loader)

    # -- ExportableState: what goes into checkpoint-N/trainer_state.json -------------------------

    def state(self) -> dict:
        """``{"args": {}, "attributes": {"loader_state": loader.state_dict()}}`` (transformers'
        ``ExportableState``; the Trainer calls it when it writes a checkpoint)."""
        if self.loader is not None:
            self.loader_state = self.loader.state_dict()
        return {"args": {}, "attributes": {"loader_state": self.loader_state}}

    # -- events ---------------------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, train_dataloader: Any = None,
                       **kwargs: Any) -> None:
        """Check the set-up; on resume, load the checkpoint's loader state into the loader."""
        loader = train_dataloader
        if not isinstance(loader, DataLoader):
            raise TypeError(f"{_NAME}: the Trainer's train dataloader is {type(loader).__name__}, not a "
                            "seqloader.DataLoader; override Trainer.get_train_dataloader() to return the "
                            "seqloader loader")
        if not args.ignore_data_skip:
            raise ValueError(f"{_NAME}: TrainingArguments(ignore_data_skip=False) makes the Trainer "
                             "replay the resumed epoch with accelerate's skip_first_batches, which rebuilds a "
                             "torch DataLoader; set ignore_data_skip=True (the loader's state seeks instead)")
        steps, accum = len_or_none(loader), args.gradient_accumulation_steps
        if steps is not None and accum > 1 and steps % accum:
            raise ValueError(f"{_NAME}: gradient_accumulation_steps={accum} does not divide the {steps} "
                             "batches of an epoch; with ignore_data_skip=True the Trainer skips the "
                             "optimizer step of the last, partial accumulation of a resumed epoch. Use a "
                             "batch count that gradient_accumulation_steps divides (drop_last=True, or "
                             "another batch_size)")
        self.loader, self._steps_in_epoch, self._offset = loader, steps or 0, 0
        if state.global_step == 0:
            return
        saved = _saved_loader_state(state)
        loader.load_state_dict(saved)
        if steps is None:  # no epochs to reconcile: the Trainer counts max_steps over one long "epoch"
            return
        per_epoch = max(math.ceil(steps / accum), 1)
        epoch, done = divmod(state.global_step, per_epoch)
        if saved["epoch"] == epoch - 1 and done == 0:
            _finish_epoch(loader, saved)  # saved after the last batch of the previous epoch
        elif saved["epoch"] != epoch:
            raise ValueError(f"{_NAME}: the checkpoint's loader state is in epoch {saved['epoch']} but the "
                             f"Trainer resumes global step {state.global_step} in epoch {epoch} "
                             f"({per_epoch} steps per epoch); was the loader built with other arguments?")
        self._epoch, self._offset = epoch, done * accum

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Count the batches of the resumed epoch read before the checkpoint in ``state.epoch``."""
        if self._offset and self._steps_in_epoch:
            # the Trainer set epoch + (batches since the resume) / steps; make it the uninterrupted
            # run's epoch + (batches since the epoch began) / steps, with the same float arithmetic
            since_resume = round((state.epoch - self._epoch) * self._steps_in_epoch)
            state.epoch = self._epoch + (since_resume + self._offset) / self._steps_in_epoch

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The resumed epoch is over: later epochs count from their start."""
        self._offset = 0


def _saved_loader_state(state: Any) -> dict:
    """The loader state in the ``TrainerState`` loaded from the checkpoint being resumed."""
    entry = (getattr(state, "stateful_callbacks", None) or {}).get(_NAME)
    if isinstance(entry, list):
        if len(entry) != 1:
            raise ValueError(f"{_NAME}: the checkpoint holds {len(entry)} SeqloaderCallback states; use one "
                             "SeqloaderCallback per Trainer")
        entry = entry[0]
    saved = None if entry is None else entry.get("attributes", {}).get("loader_state")
    if saved is None:
        raise ValueError(f"{_NAME}: the checkpoint being resumed (global step {state.global_step}) has no "
                         "seqloader state in its trainer_state.json; it was written without "
                         "SeqloaderCallback, so the loader's position is unknown")
    return saved


def _finish_epoch(loader: DataLoader, saved: dict) -> None:
    """Read the (empty) rest of a state saved after an epoch's last batch, so the next ``iter()``
    starts the next epoch as in the uninterrupted run. Reads no data."""
    it = iter(loader)
    if next(it, _DONE) is not _DONE:
        raise ValueError(f"{_NAME}: the checkpoint's loader state (epoch {saved['epoch']}, position "
                         f"{saved['position']}) is not at the end of its epoch, but the Trainer finished that "
                         "epoch; was the loader built with other arguments?")
