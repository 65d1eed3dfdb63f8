"""Crash a training run mid-epoch, resume it in a fresh process, and check nothing changed.

Run ``python -m seqloader.demo`` (``--help`` for the options). It takes well under a minute on two
cores and does three things:

1. an *uninterrupted* reference run: a small CNN trained for one epoch on a synthetic dataset of
   3x32x32 images whose ``__getitem__`` draws a random augmentation from torch's *global* RNG,
   loaded by :class:`seqloader.DataLoader` with ``shuffle=True``, worker processes and a seed;
2. the same run in a subprocess that writes a checkpoint (model, optimizer and
   ``loader.state_dict()``) after ``--steps-before-crash`` batches and then dies with ``os._exit``,
   without closing anything, like a preempted job;
3. a resume in another fresh process: it loads the checkpoint, calls ``loader.load_state_dict``
   (a seek: no batch is replayed) and trains to the end of the epoch.

It then compares every batch (a hash of its tensors) and every loss of the crashed-and-resumed run
with the reference run, and prints ``PASS`` if all are bit-identical, else ``FAIL`` and exits 1.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn.functional as F
import torch.utils.data

import seqloader
from seqloader.prefetcher.wire import SHM_PREFIX

CRASH_EXIT_CODE = 75  # the simulated crash; any other exit code of the trainer is a real failure


class SyntheticImages(torch.utils.data.Dataset):
    """``size`` labelled 3x32x32 float images, fixed by ``seed``, with a random augmentation.

    Image ``i`` is a faint per-class colour plus noise, both fixed by ``(seed, i)``, so a small
    CNN learns the labels within an epoch. ``__getitem__`` then
    applies a random flip, a random shift and a little noise drawn from torch's *global* RNG, as
    torchvision transforms do: reproducing them after a resume is the loader's job.
    """

    def __init__(self, size: int, num_classes: int = 10, seed: int = 0):
        self.size = size
        self.num_classes = num_classes
        self.seed = seed
        self.colours = 0.3 * torch.randn(num_classes, 3, 1, 1, generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int):
        if not 0 <= i < self.size:
            raise IndexError(f"SyntheticImages: index {i} out of range [0, {self.size})")
        label = (i * 7919 + self.seed) % self.num_classes
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + i) % 2**63)
        x = self.colours[label] + torch.randn(3, 32, 32, generator=g)
        # The augmentation: torch's global RNG, as in torchvision's RandomHorizontalFlip/RandomCrop.
        if torch.rand(()) < 0.5:
            x = x.flip(-1)
        dy, dx = torch.randint(-3, 4, (2,)).tolist()
        x = torch.roll(x, shifts=(dy, dx), dims=(1, 2))
        return x + 0.1 * torch.randn_like(x), label


def make_model(seed: int) -> torch.nn.Module:
    """A small CNN for 3x32x32 inputs and 10 classes, initialised from ``seed``."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10),
    )


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    """SGD with momentum: its state must be checkpointed too, or the resumed losses drift."""
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def make_loader(args: argparse.Namespace) -> seqloader.DataLoader:
    """The loader under test: shuffled, with worker processes and a seed."""
    dataset = SyntheticImages(args.size, seed=args.seed)
    return seqloader.DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                                num_workers=args.workers, seed=args.seed)


def digest(x: torch.Tensor, y: torch.Tensor) -> str:
    """A short hash of a batch's bytes: equal hashes mean bit-identical batches."""
    h = hashlib.sha256(x.contiguous().numpy().tobytes())
    h.update(y.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class Progress:
    """A progress bar: tqdm (on stderr) when it is installed and stderr is a terminal, else one
    plain line per 10% (or ``\\r`` on a tty): a redirected log gets no bar frames."""

    def __init__(self, total: int, desc: str, initial: int = 0):
        self.total, self.desc, self.n = total, desc, initial
        self.start = time.perf_counter()
        self._last_decile = -1
        self._bar = None
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                self._bar = tqdm(total=total, initial=initial, desc=desc, unit="batch", file=sys.stderr)

    def update(self, postfix: str = "") -> None:
        self.n += 1
        if self._bar is not None:
            self._bar.set_postfix_str(postfix, refresh=False)
            self._bar.update(1)
            return
        decile = 10 * self.n // self.total
        tty = sys.stdout.isatty()
        if not tty and decile == self._last_decile and self.n != self.total:
            return
        self._last_decile = decile
        bar = "#" * (20 * self.n // self.total)
        line = f"  {self.desc} |{bar:<20}| {self.n}/{self.total} batches {postfix}"
        print(("\r" + line) if tty else line, end="" if tty and self.n < self.total else "\n", flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def train(args: argparse.Namespace, phase: str, workdir: Path) -> dict[str, Any]:
    """Train one epoch (or the rest of it) and return the record of every step.

    ``phase`` is ``"reference"`` (the uninterrupted run), ``"crash"`` (checkpoint after
    ``args.steps_before_crash`` batches, then ``os._exit``) or ``"resume"`` (start from the
    checkpoint).
    """
    torch.set_num_threads(1)  # two cores are shared with the workers; also keeps the math identical
    ckpt_path = workdir / "checkpoint.pt"
    model = make_model(args.seed)
    optimizer = make_optimizer(model)
    loader = make_loader(args)
    steps: list[dict[str, Any]] = []
    timings: dict[str, float] = {}
    if phase == "resume":
        t0 = time.perf_counter()
        ckpt = torch.load(ckpt_path, weights_only=True)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        t1 = time.perf_counter()
        loader.load_state_dict(json.loads(ckpt["loader"]))
        timings["load_state_dict_s"] = time.perf_counter() - t1
        timings["resume_start"] = t0
    total = len(loader)
    done = 0 if phase != "resume" else args.steps_before_crash
    bar = Progress(total, {"reference": "uninterrupted", "crash": "until crash", "resume": "resumed"}[phase],
                   initial=done)
    start = time.perf_counter()
    samples = 0
    for x, y in loader:
        if phase == "resume" and "first_batch_s" not in timings:
            timings["first_batch_s"] = time.perf_counter() - timings["resume_start"]
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps.append({"step": done, "batch": digest(x, y), "loss": loss.item()})
        done += 1
        samples += len(y)
        bar.update(f"loss {loss.item():.3f}")
        if phase == "crash" and done == args.steps_before_crash:
            bar.close()
            state = loader.state_dict()
            ckpt = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "loader": json.dumps(state), "steps": json.dumps(steps)}
            torch.save(ckpt, workdir / "checkpoint.tmp")
            os.replace(workdir / "checkpoint.tmp", ckpt_path)  # atomic: a checkpoint is whole or absent
            print(f"  checkpoint after {done} batches: model + optimizer + loader.state_dict() "
                  f"({len(json.dumps(state))} bytes of JSON):\n    {json.dumps(state)}", flush=True)
            os._exit(CRASH_EXIT_CODE)  # no cleanup, no atexit, workers left running: a hard crash
    bar.close()
    elapsed = time.perf_counter() - start
    return {"steps": steps, "samples_per_s": samples / elapsed if elapsed else float("nan"),
            "load_state_dict_s": timings.get("load_state_dict_s"), "first_batch_s": timings.get("first_batch_s"),
            "stats": loader.stats()}


def _process_group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - a reused id owned by someone else
        return False
    return True


def _shm_segments() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(SHM_PREFIX)}
    except OSError:
        return set()


def _child(args: argparse.Namespace, phase: str, workdir: Path) -> tuple[int, int]:
    """Run ``python -m seqloader.demo --phase <phase>`` in a fresh process in its own process group.

    Returns ``(exit code, pid)``; the pid is also the id of the process group, which the child's
    worker processes share.
    """
    cmd = [sys.executable, "-m", "seqloader.demo", "--phase", phase, "--workdir", str(workdir),
           "--size", str(args.size), "--batch-size", str(args.batch_size), "--workers", str(args.workers),
           "--seed", str(args.seed), "--steps-before-crash", str(args.steps_before_crash)]
    # The child imports this very seqloader, installed or not.
    root = str(Path(seqloader.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    sys.stdout.flush()
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    return proc.wait(), proc.pid


def _wait_for_orphans(pgid: int, timeout: float) -> bool:
    """Wait until no process of group ``pgid`` is left; kill the group after ``timeout`` s."""
    if not hasattr(os, "killpg"):  # pragma: no cover - Windows: no process groups to check
        return True
    deadline = time.monotonic() + timeout
    while _process_group_alive(pgid):
        if time.monotonic() > deadline:
            os.killpg(pgid, signal.SIGKILL)  # the demo started them; do not leave them behind
            return False
        time.sleep(0.05)
    return True


def run_demo(args: argparse.Namespace) -> bool:
    """The whole demo; returns whether the resumed run matched the reference exactly."""
    n_batches = -(-args.size // args.batch_size)
    print(f"seqloader demo: {args.size} synthetic 3x32x32 images with a global-RNG augmentation, "
          f"batch {args.batch_size}, {args.workers} workers, seed {args.seed}, shuffle=True")
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="seqloader_demo_") as tmp:
        workdir = Path(tmp)

        print("[1/3] uninterrupted run (the reference), in this process")
        ref = train(args, "reference", workdir)
        print(f"  throughput: {ref['samples_per_s']:.0f} samples/s"
              + (" (worker start-up included)" if args.workers else ""))
        print("  " + _input_bound_line(ref["stats"]))

        print(f"[2/3] the same run in a subprocess that checkpoints after {args.steps_before_crash} "
              f"of {n_batches} batches and then crashes (os._exit)")
        shm_before = _shm_segments()
        rc, pid = _child(args, "crash", workdir)
        if rc != CRASH_EXIT_CODE:
            print(f"FAIL: the trainer exited with code {rc}, not the simulated crash ({CRASH_EXIT_CODE})")
            return False
        # The crashed trainer's workers notice their parent is gone and exit by themselves.
        workers_gone = _wait_for_orphans(pid, 15.0)
        if args.workers:
            print(f"  trainer died with exit code {rc}; its worker processes "
                  + ("exited by themselves" if workers_gone else "were still running after 15 s (killed)"))
        else:
            print(f"  trainer died with exit code {rc}")
        if not workers_gone:
            failures.append("worker processes outlived the crashed trainer by more than 15 s")
        leaked = sorted(n for n in _shm_segments() - shm_before if n.startswith(f"{SHM_PREFIX}{pid}_"))
        if leaked:
            for name in leaked:  # the crashed trainer's segments (named after its pid): remove them
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join("/dev/shm", name))
            print(f"  WARNING: the crash left {len(leaked)} shared-memory segment(s) in /dev/shm "
                  f"(removed them): {leaked}")
        else:
            print("  the crash left no shared-memory segment in /dev/shm")

        print("[3/3] resume from the checkpoint in a fresh process")
        rc, pid = _child(args, "resume", workdir)
        _wait_for_orphans(pid, 15.0)
        if rc != 0:
            print(f"FAIL: the resumed trainer exited with code {rc}")
            return False
        result = json.loads((workdir / "resumed.json").read_text())
        ckpt = torch.load(workdir / "checkpoint.pt", weights_only=True)
        before = json.loads(ckpt["steps"])

    after = result["steps"]
    print(f"  resume latency: {result['first_batch_s']:.2f} s from reading the checkpoint to the first "
          f"resumed batch (loader.load_state_dict: {1e3 * result['load_state_dict_s']:.2f} ms; the rest is "
          f"torch.load, building the model" + (f" and starting {args.workers} workers)" if args.workers else ")"))
    print(f"  throughput after resume: {result['samples_per_s']:.0f} samples/s")
    failures += _compare(before + after, ref["steps"])
    if failures:
        print("FAIL: " + "; ".join(failures))
        return False
    print("PASS: the crashed and resumed run saw the same batches and losses as the uninterrupted run")
    return True


def _input_bound_line(stats: dict) -> str:
    """What ``loader.stats()`` says about the run: is the training loop waiting for data?"""
    cur = stats["current"]
    line = (f"input-bound: {cur['input_bound']:.0%} of wall time waiting for data "
            f"({cur['wait_s']:.2f} s in next(), {cur['work_s']:.2f} s training; loader.stats())")
    return line + (f"; hint: {stats['hint']}" if stats["hint"] else "")


def _compare(interrupted: list, reference: list) -> list[str]:
    """Print the step-by-step comparison with the uninterrupted run; return what differs."""
    failures = []
    same_batches = sum(a["batch"] == b["batch"] for a, b in zip(interrupted, reference))
    same_losses = sum(a["loss"] == b["loss"] for a, b in zip(interrupted, reference))
    print("checks against the uninterrupted run:")
    print(f"  batches: {len(interrupted)} in the crashed+resumed run, {len(reference)} in the reference")
    print(f"  bit-identical batches: {same_batches}/{len(reference)}")
    print(f"  identical losses: {same_losses}/{len(reference)} "
          f"(final loss {reference[-1]['loss']:.4f} vs {interrupted[-1]['loss']:.4f})")
    if len(interrupted) != len(reference):
        failures.append(f"{len(interrupted)} batches after the resume, {len(reference)} without a crash")
    if same_batches != len(reference):
        first = next(i for i, (a, b) in enumerate(zip(interrupted + [{}] * len(reference), reference)) if a != b)
        failures.append(f"batches differ from step {first} on")
    if same_losses != len(reference):
        failures.append("losses differ")
    return failures


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m seqloader.demo",
        description="Train, crash mid-epoch, resume in a fresh process, and check that the batches "
                    "and losses equal an uninterrupted run's (prints PASS or FAIL).")
    p.add_argument("--size", type=int, default=4096, help="number of images in the dataset (default 4096)")
    p.add_argument("--batch-size", type=int, default=64, help="batch size (default 64)")
    p.add_argument("--workers", type=int, default=2, help="loader worker processes (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data, the model and the loader (default 0)")
    p.add_argument("--steps-before-crash", type=int, default=None,
                   help="batches trained before the checkpoint and the crash (default: 40%% of the epoch)")
    p.add_argument("--phase", choices=["crash", "resume"], help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("size", "batch_size"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be a positive int (got {getattr(args, name)})")
    if args.workers < 0:
        p.error(f"--workers must be a non-negative int (got {args.workers})")
    n_batches = -(-args.size // args.batch_size)
    if args.steps_before_crash is None:
        args.steps_before_crash = max(1, (2 * n_batches) // 5)
    if not 0 < args.steps_before_crash < n_batches:
        p.error(f"--steps-before-crash must be in [1, {n_batches - 1}] for {n_batches} batches per epoch "
                f"(got {args.steps_before_crash})")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if args.phase is not None:
        workdir = Path(args.workdir)
        result = train(args, args.phase, workdir)  # "crash" never returns
        (workdir / "resumed.json").write_text(json.dumps(result))
        return 0
    return 0 if run_demo(args) else 1


if __name__ == "__main__":
    sys.exit(main())
