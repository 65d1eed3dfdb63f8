"""Shared by the framework tests (Lightning, accelerate, the transformers Trainer, DCP).

* :class:`AugItems`: a map-style dataset whose item ``i`` is a pure function of ``i`` plus an
  augmentation drawn from torch's *global* RNG in ``__getitem__``, so a resume is exact only if
  the loader reseeds that RNG per batch exactly as in the uninterrupted run;
* :class:`Recorder`: one JSON line per training step (sample indices, the augmentation's bytes,
  the loss), flushed at once so that a run killed with ``os._exit`` leaves what it did;
* :func:`assert_same_steps`: compares a resumed run's steps with an uninterrupted run's;
* :func:`run_script`: runs a ``_*_run.py`` driver in a fresh interpreter.

The drivers are scripts (run as ``python tests/integrations/_x_run.py CONFIG``), so they import
this module as ``_common``; the tests import it as ``tests.integrations._common``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import torch

N = 200          # samples
BATCH = 8        # batch size
CRASH_RC = 17    # the exit code of a run that "crashed" with os._exit on purpose
ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
_W = torch.tensor([1.0, -2.0, 0.5, 3.0])


class AugItems(torch.utils.data.Dataset):
    """Item ``i``: ``{"x", "labels", "index", "aug"}``; ``aug`` comes from torch's global RNG."""

    def __init__(self, n: int = N):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(int(i))
        x = torch.randn(4, generator=g)
        y = x @ _W + 0.01 * torch.randn((), generator=g)
        aug = torch.rand(4)  # an augmentation: the global RNG, as user code does
        return {"x": x + 0.1 * aug, "labels": y.reshape(1), "index": int(i), "aug": aug}


class Stream(torch.utils.data.IterableDataset):
    """``AugItems`` as a stream without ``__len__`` (split over workers like torch's examples)."""

    def __init__(self, n: int = N):
        self.items = AugItems(n)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, k = (0, 1) if info is None else (info.id, info.num_workers)
        for j in range(w, len(self.items), k):
            yield self.items[j]


class SizedStream(Stream):
    """``Stream`` with a ``__len__``: frameworks then know how many batches an epoch has."""

    def __len__(self) -> int:
        return len(self.items)


DATASETS = {"map": AugItems, "stream": Stream, "sized_stream": SizedStream}


def make_model() -> torch.nn.Module:
    """A tiny regression model, the same weights for the same torch seed."""
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1)


def step_record(batch: dict, loss: Any, **extra: Any) -> dict:
    """What a step is compared on: the samples, the augmentation bytes, the exact loss."""
    return {**extra, "index": [int(i) for i in batch["index"]],
            "aug": batch["aug"].detach().cpu().contiguous().numpy().tobytes().hex(),
            "loss": float(loss.detach() if isinstance(loss, torch.Tensor) else loss)}


class Recorder:
    """Appends one JSON line per step to ``path``; each line reaches the OS before the next step."""

    def __init__(self, path: str | os.PathLike):
        self._f = open(path, "a", encoding="utf-8")

    def write(self, rec: dict) -> None:
        self._f.write(json.dumps(rec) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def read_records(path: str | os.PathLike) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def assert_same_steps(resumed: list[dict], reference: list[dict], *, key: str = "step",
                      what: str = "resumed run") -> None:
    """Every step of ``resumed`` equals the reference step with the same ``key`` (indices,
    augmentation bytes, loss), and ``resumed`` runs to the reference's last step."""
    assert resumed, f"{what}: no step was recorded"
    by_key = {r[key]: r for r in reference}
    first = resumed[0][key]
    want = [r for r in reference if r[key] >= first]
    assert [r[key] for r in resumed] == [r[key] for r in want], (
        f"{what}: steps {[r[key] for r in resumed]} but the uninterrupted run has {[r[key] for r in want]}")
    for r in resumed:
        ref = by_key[r[key]]
        for field in ("index", "aug", "loss"):
            assert r[field] == ref[field], (
                f"{what}: {key} {r[key]}: {field} is {r[field]!r} but the uninterrupted run has {ref[field]!r}")


def run_script(script: str, config: dict, cwd: str | os.PathLike, *, expect_rc: int = 0,
               timeout: float = 200, env: Optional[dict] = None,
               argv: Optional[list[str]] = None) -> subprocess.CompletedProcess:
    """Run ``tests/integrations/<script>`` with ``config`` (JSON) in a fresh interpreter."""
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                    OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
                    HF_HUB_OFFLINE="1", TRANSFORMERS_NO_ADVISORY_WARNINGS="1", PL_DISABLE_FORK="0")
    full_env.update(env or {})
    cmd = [sys.executable, *(argv or []), str(HERE / script), json.dumps(config)]
    proc = subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == expect_rc, (
        f"{script} {config.get('mode')} exited with {proc.returncode} (expected {expect_rc}):\n"
        f"{proc.stdout[-3000:]}\n{proc.stderr[-8000:]}")
    return proc
