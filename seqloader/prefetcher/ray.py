"""The Ray executor: workers that are Ray actors, placed by Ray on any node of a cluster.

:class:`RayExecutor` implements :class:`~seqloader.prefetcher.executor.Executor` with one actor
per worker number (:class:`~seqloader.prefetcher.ray_actor.RayWorker`), so a training process can
use the CPUs of other hosts for its input pipeline. The sequence decides what is computed, the
:class:`~seqloader.prefetcher.prefetch.Prefetch` above decides what is submitted and reads in
order, seeks, times out, notes errors, heals and counts, exactly as for processes and threads;
this module only starts actors, sends them jobs and reports what happened. ``ray`` is imported
on first use (``pip install seqloader[ray]``): ``import seqloader`` never imports it.

:class:`~seqloader.prefetcher.ray_options.RayWorkers` is the public options object, which builds
this executor (:meth:`~seqloader.prefetcher.ray_options.RayWorkers.build`; the connection is in
:mod:`~seqloader.prefetcher.ray_connect`): ``prefetch(seq, n, method=RayWorkers(...))`` or
``DataLoader(worker_method=RayWorkers(...))`` (``"ray"``: the defaults).

NOTE [ Ray executor: jobs, deaths and the shutdown protocol ]
1. Connecting (:func:`~seqloader.prefetcher.ray_connect.connect`): an existing ``ray.init()`` connection is used; else
   ``ray.init(address=...)`` with ``RayWorkers.address`` (default ``"auto"``: the cluster this
   host belongs to). No cluster is an error saying how to start one; a local one is never
   started silently.
2. Starting: the shared object (the dataset) is put in the object store once and handed to each
   actor at its set-up; sequences and ``worker_init_fn`` are pickled (cloudpickle) with that
   object referred to by id, so a new epoch's sequence is a few bytes per actor. An actor is
   created with ``max_restarts=0`` and ``max_task_retries=0``: Ray never re-runs a job on its own
   (a retry could compute a batch twice or out of order); the lineage of a batch is its position.
   Jobs for an actor are sent once its set-up has *answered* (:meth:`RayExecutor.submit` holds
   them until then, e.g. what a replacement owes): an actor runs its calls one after the other,
   and Ray sends a call's reply from another thread, so a job that ends the process right after
   the set-up returned could lose the set-up's reply with it, and the death would be blamed on the
   set-up ("while starting") instead of on the job, more often the busier the host.
3. Every wait is bounded: :meth:`RayExecutor.poll` is one ``ray.wait`` over the pending replies,
   set-ups, control calls and one ``watch`` call per actor (a call that never returns: it fails
   when the actor or its node dies), for at most its timeout. A reply is
   ready once its object is in this host's object store (``fetch_local``), so a node lost after
   it replied loses nothing we count on.
4. Deaths: an actor whose ``watch`` or any job fails with a Ray error (actor died, node died,
   object lost) is killed (``ray.kill``, so a half-alive actor cannot answer later), reported
   :class:`~seqloader.prefetcher.executor.Died` once, and its pending replies are forgotten. The
   :class:`~seqloader.prefetcher.healing.Healer` (``restarts``) then starts a replacement with
   the same worker number and set-up, placed by Ray on any live node (a node added meanwhile
   included), and resubmits what the dead one owed, in order.
5. ``close()`` (idempotent; the owner's ``weakref.finalize`` calls :meth:`RayExecutor.stop_nowait`,
   which only sends the kills): ``ray.kill`` every actor, then wait at most :data:`CLOSE_TIMEOUT`
   seconds for Ray to report each one dead. Values already returned are copies (see
   :func:`~seqloader.prefetcher.ray_actor.decode`) and stay valid. Actors belong to the driver
   process: if it exits without closing, Ray kills them.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any, Callable, Optional, Sequence

from seqloader.prefetcher.executor import Died, Done, Event, SetupFailed, Started
from seqloader.prefetcher.faults import rebuild_error
from seqloader.prefetcher.ray_actor import FAILED, SKIPPED, RayWorker, decode, dumps_shared, dumps_with_shared
from seqloader.prefetcher.ray_connect import check_feasible, connect

__all__ = ["CLOSE_TIMEOUT", "RayExecutor"]

#: ``close()`` waits at most this many seconds for Ray to report the killed actors dead.
CLOSE_TIMEOUT = 10.0


class _Actor:
    """One incarnation of a worker: its actor handle and the replies it owes."""

    __slots__ = ("handle", "setup", "watch", "jobs", "held", "controls", "started", "dead", "how", "where")

    def __init__(self, handle: Any, setup: Any, watch: Any):
        self.handle, self.setup, self.watch = handle, setup, watch
        self.jobs: dict[Any, tuple[int, int]] = {}  # reply ref -> (gen, index)
        self.held: list[tuple[int, int]] = []  # (gen, index) submitted before the set-up answered
        self.controls: dict[Any, str] = {}  # ref -> "reset" (must succeed) or "hint"
        self.started = self.dead = False
        self.how = "ended unexpectedly"
        self.where: Optional[tuple[int, str, str]] = None  # (pid, node id, node ip), once set up


class RayExecutor:
    """``num_workers`` Ray actors (see the module docstring and its NOTE).

    Args:
        num_workers: actors, ``>= 1``.
        worker_init_fn: ``worker_init_fn(worker_id)``, run first in each actor, or ``None``.
        shared: put in the object store once and sent to each actor at its set-up; sequences
            that reference it are pickled with a reference instead of a copy.
        options: a :class:`~seqloader.prefetcher.ray_options.RayWorkers` (not imported here: it
            builds this executor).
    """

    kind = "ray"
    concurrency = 1

    def __init__(self, num_workers: int, worker_init_fn: Optional[Callable[[int], None]], shared: Any,
                 options: Any):
        self.num_workers, self.options = num_workers, options
        self._warned: dict = {}  # the registry of the actors' warnings issued again here (once each)
        self._init, self._shared = worker_init_fn, shared
        self._ray: Any = None
        self._cls: Any = None  # the actor class
        self._refs: dict[str, Any] = {}  # "shared", "init": object refs put once
        self._seq: tuple[Any, Any] = (None, None)  # (the sequence, the ref of its pickle)
        self._actors: list[Optional[_Actor]] = [None] * num_workers
        self._latest = 0
        self._bytes = 0
        self._started = 0
        self._nodes: set[str] = set()
        self._closed = False
        self._owner_pid = os.getpid()

    @property
    def closed(self) -> bool:
        return self._closed

    # -- starting ----------------------------------------------------------------------------------

    def launch(self, seq: Sequence[Any], gen: int) -> None:
        ray = self._ray = connect(self.options)
        check_feasible(ray, self.options)
        opts = self.options
        self._cls = ray.remote(max_restarts=0, max_task_retries=0, max_concurrency=1,
                               concurrency_groups={"control": 1, "watch": 1})(RayWorker).options(
            num_cpus=opts.num_cpus, resources=opts.resources or None, scheduling_strategy=opts.scheduling_strategy)
        try:
            self._refs["shared"] = ray.put(dumps_shared(self._shared))
            self._refs["init"] = ray.put(dumps_with_shared(self._init, self._shared))
        except Exception as exc:
            raise TypeError(f"prefetch: cannot send the shared object or worker_init_fn to the Ray actors "
                            f"({type(exc).__name__}: {exc})") from exc
        self._latest = gen
        self._seq = (seq, self._put_seq(seq, "prefetch"))
        for w in range(self.num_workers):
            self._start(w)

    def _put_seq(self, seq: Any, op: str) -> Any:
        try:
            return self._ray.put(dumps_with_shared(seq, self._shared))
        except Exception as exc:
            raise TypeError(f"{op}: seq cannot be pickled for the Ray actors ({type(exc).__name__}: {exc})") from exc

    def _start(self, w: int) -> None:
        handle = self._cls.remote()
        setup = handle.setup.remote(w, self._refs["shared"], self._refs["init"], self._seq[1], self._latest)
        watch = handle.watch.options(concurrency_group="watch").remote()
        self._actors[w] = _Actor(handle, setup, watch)

    def replace(self, worker: int, seq: Sequence[Any]) -> None:
        """Start a replacement of the dead ``worker``: a new actor, placed by Ray on a live node,
        with the same number and set-up, reading ``seq``."""
        if seq is not self._seq[0]:
            self._seq = (seq, self._put_seq(seq, "prefetch"))
        self._start(worker)

    # -- jobs --------------------------------------------------------------------------------------

    def accepting(self, worker: int) -> bool:
        a = self._actors[worker]
        return a is not None and not a.dead and not self._closed

    def submit(self, worker: int, gen: int, index: int) -> None:
        a = self._actors[worker]
        if a is None or a.dead:
            return  # owed; the death is (or was) reported by poll
        self._latest = max(self._latest, gen)
        if not a.started:  # sent when its set-up answers (the NOTE above, 2)
            a.held.append((gen, index))
            return
        a.jobs[a.handle.compute.remote(gen, index)] = (gen, index)

    def new_generation(self, gen: int) -> None:
        """Tell every actor that queued jobs of older generations are stale (they answer
        :data:`~seqloader.prefetcher.ray_actor.SKIPPED`)."""
        self._latest = max(self._latest, gen)
        for a in self._actors:
            if a is not None and not a.dead and a.jobs:
                a.controls[a.handle.hint.options(concurrency_group="control").remote(gen)] = "hint"

    def reset(self, seq: Sequence[Any], gen: int) -> None:
        """Every actor reads ``seq`` from generation ``gen`` (a no-op before :meth:`launch`).

        Raises:
            TypeError: ``seq`` cannot be pickled (nothing is sent).
        """
        if self._ray is None:
            return
        self._seq = (seq, self._put_seq(seq, "prefetch.reset"))
        self._latest = max(self._latest, gen)
        for a in self._actors:
            if a is not None and not a.dead:
                a.controls[a.handle.retarget.remote(gen, self._seq[1])] = "reset"

    # -- what happened -------------------------------------------------------------------------------

    def poll(self, timeout: float) -> list[Event]:
        """Replies, set-ups and deaths, waiting up to ``timeout`` s (one ``ray.wait``)."""
        owner: dict[Any, tuple[int, _Actor]] = {}
        for w, a in enumerate(self._actors):
            if a is None or a.dead:
                continue
            owner[a.watch] = (w, a)
            if not a.started:
                owner[a.setup] = (w, a)
                continue  # its jobs wait behind the set-up: nothing of them before Started
            for ref in (*a.controls, *a.jobs):
                owner[ref] = (w, a)
        if not owner or self._closed:
            time.sleep(min(timeout, 0.05))
            return []
        refs = list(owner)
        ready, _ = self._ray.wait(refs, num_returns=1, timeout=timeout, fetch_local=True)
        if ready:
            ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=True)
        events: list[Event] = []
        dying: dict[int, BaseException] = {}
        for ref in ready:  # every reply that did come is used, also from an actor found dead here
            w, a = owner[ref]
            try:
                self._handle(w, a, ref, events)
            except self._ray.exceptions.RayError as exc:  # the actor, its node or its reply is gone
                dying.setdefault(w, exc)
        for w, error in dying.items():
            self._died(w, error, events)
        return events

    def _handle(self, w: int, a: _Actor, ref: Any, events: list[Event]) -> None:
        if ref is a.watch:
            self._ray.get(ref)  # never returns a value: ready means the actor died, and this raises
            return
        try:
            reply = self._ray.get(ref)
        except self._ray.exceptions.RayTaskError as exc:
            if ref not in a.jobs or not isinstance(exc.cause, BaseException):
                raise
            # Not reached by design (an item's error is part of its reply), but if Ray wraps one,
            # the caller gets the user's own exception type back, not Ray's wrapper.
            gen, index = a.jobs.pop(ref)
            events.append(Done(w, gen, index, exc.cause))
            return
        if ref is a.setup:
            if reply[0] == FAILED:
                events.append(SetupFailed(w, reply[1], rebuild_error(reply[2])))
                return
            a.started, a.where = True, tuple(reply[1:])
            self._started += 1
            self._nodes.add(reply[2])
            events.append(Started(w))
            held, a.held = a.held, []
            for gen, index in held:
                self.submit(w, gen, index)
        elif ref in a.controls:
            stage = a.controls.pop(ref)
            if stage == "reset" and reply[0] == FAILED:
                events.append(SetupFailed(w, reply[1], rebuild_error(reply[2])))
        else:
            gen, index = a.jobs.pop(ref)
            if reply[0] == SKIPPED:
                events.append(Done(w, gen, index, None))
                return
            _, ok, seconds, stages, data, buffers, warned, began = reply
            for category, message, filename, lineno in warned:  # an item's warning reaches the trainer
                warnings.warn_explicit(message, category, filename, lineno, registry=self._warned)
            self._bytes += len(data) + sum(b.nbytes for b in buffers)
            events.append(Done(w, gen, index, (ok, data, buffers), seconds, stages, began=began))

    def _died(self, w: int, exc: BaseException, events: list[Event]) -> None:
        a = self._actors[w]
        assert a is not None  # poll only handles live incarnations
        a.dead = True
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        a.how = f"was lost ({type(exc).__name__}: {first[:300]})"
        a.jobs.clear()
        a.held.clear()
        a.controls.clear()
        self._kill(a)
        events.append(Died(w))

    def _kill(self, a: _Actor) -> None:
        try:
            self._ray.kill(a.handle, no_restart=True)
        except Exception:  # already gone, or Ray is shutting down
            pass

    def outcome(self, reply: Any) -> tuple[bool, Any]:
        if isinstance(reply, BaseException):
            return False, reply
        ok, data, buffers = reply
        value = decode(data, buffers)
        return (True, value) if ok else (False, rebuild_error(value))

    def drop(self, reply: Any) -> None:
        pass  # the object store's copy went when the reply's ref was dropped in poll

    # -- naming ----------------------------------------------------------------------------------------

    def who(self, worker: int) -> str:
        a = self._actors[worker]
        if a is None or a.where is None:
            return f"worker {worker} (Ray actor, not started yet)"
        pid, _, ip = a.where
        return f"worker {worker} (Ray actor, pid {pid} on {ip})"

    def pid(self, worker: int) -> Optional[int]:
        """The actor's process id *on its node* (not this host's, unless it runs here)."""
        a = self._actors[worker]
        return None if a is None or a.where is None else a.where[0]

    def death(self, worker: int) -> tuple[str, Optional[int]]:
        a = self._actors[worker]
        return ("ended unexpectedly" if a is None else a.how), None

    def counters(self) -> dict:
        """``shm_bytes``: bytes of replies read from this host's object store (Ray's shared memory);
        ``actors_started`` (replacements included) and ``nodes`` (how many distinct nodes ran one)."""
        return {"shm_bytes": self._bytes, "actors_started": self._started, "nodes": len(self._nodes)}

    def forked(self) -> "RayExecutor":
        """The actors and the Ray connection belong to the process that started them."""
        raise RuntimeError("prefetch: this Prefetch was inherited by a forked child process, and its Ray actors "
                           "belong to the parent; build a new prefetch in the child")

    # -- closing -------------------------------------------------------------------------------------

    def close(self) -> None:
        """Kill every actor and wait (bounded) until Ray reports them dead; idempotent."""
        if self._closed or os.getpid() != self._owner_pid:
            return
        self._closed = True
        ray, actors = self._ray, [a for a in self._actors if a is not None]
        if ray is None or not ray.is_initialized():
            return  # never launched, or Ray is shut down (which killed the actors)
        for a in actors:
            self._kill(a)
        watches = [a.watch for a in actors]
        try:
            ray.wait(watches, num_returns=len(watches), timeout=CLOSE_TIMEOUT, fetch_local=False)
        except Exception:  # Ray shutting down under us
            pass
        for a in actors:
            a.jobs.clear()
            a.controls.clear()
        self._refs.clear()
        self._seq = (None, None)

    def stop_nowait(self) -> None:
        """What a finalizer may call: send the kills, wait for nothing."""
        if self._closed or os.getpid() != self._owner_pid:
            return
        self._closed = True
        if self._ray is not None and self._ray.is_initialized():
            for a in self._actors:
                if a is not None:
                    self._kill(a)
