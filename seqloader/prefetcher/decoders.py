"""L2: decode processes: a columnar source's blocks decoded in worker processes, into shared buffers.

Under worker processes over a block shuffle of a columnar source (``parquet(...)``,
``arrow_ipc(...)``: :mod:`seqloader.loader.epoch.read_ahead` says when), a batch is a gather of
rows from a few decoded blocks, tens of microseconds, and a block's decode is milliseconds. So the
``num_workers`` processes decode *blocks*, and the training thread cuts the batches from them, as
at ``num_workers=0``: one message each way per block (a row group of 1,000 rows is 15 batches of
64), nothing per batch, and batches that are those of ``num_workers=0`` by construction.

:class:`BlockDecoders` starts the processes (``seqloader-decode-<w>``, the loader's
``multiprocessing_context``); each holds a copy of the source and runs :func:`serve`. The
source's arena in the training process keeps its column buffers in anonymous shared files
(:meth:`~seqloader.sources._table.TableSource.share_slots`); a process is sent each buffer's
descriptor once (``SCM_RIGHTS`` over its pipe, :func:`multiprocessing.reduction.send_handle`),
maps it, and writes a decoded block straight into the slot the arena reserved for it. The reply
is the block's row count, bytes, the columns written, and any column that does not fit a
buffer (strings, ragged lists, another dtype), pickled. The arena's background threads
(:meth:`~seqloader.sources._arena.Arena.ahead`) make the requests, one process each, and wait
for the reply without the GIL.

Every wait is bounded and checks the process is alive: a process that dies raises
``RuntimeError`` naming it, its exit and the block, in the thread that waited, and
:meth:`BlockDecoders.check` raises it again in the training thread (the loader calls it at each
look ahead) and stops the other processes (as torch's loader does when a worker dies), so an
epoch never goes on silently without its workers. An error raised by the decode
itself (a corrupt file) comes back with its type; the block is not kept, and the batch that needs
it decodes it again in the training thread, where the error is raised with its note. A process
whose exchange broke off midway (an exception between a request and its reply) is stopped, never
asked again: a reply is never read for the wrong request.
"""

from __future__ import annotations

import os
import queue
import signal
import time
import weakref
from multiprocessing import reduction
from typing import Any, Callable, Optional

import numpy as np

from seqloader.prefetcher.checks import resolve_context
from seqloader.prefetcher.processes.handle import describe_exit
from seqloader.sources._slots import fits, shared_array

__all__ = ["BlockDecoders", "serve"]

#: The longest a thread waits for a decode process's reply (or for a free process), in seconds.
WAIT_TIMEOUT = 600.0
#: How often a waiting thread checks that its process lives, in seconds.
POLL_S = 1.0
#: How long :meth:`BlockDecoders.close` lets a process exit before SIGTERM, in seconds.
JOIN_S = 5.0


def serve(conn: Any, source: Any) -> None:
    """A decode process's loop: ``("map", key, dtype, shape)`` + a descriptor maps a shared
    buffer; ``("decode", block, slot, rows, {column: key})`` decodes a block into the buffers
    named, replying ``("ok", n, nbytes, written, rest)`` or ``("error", exception)``; ``None`` or
    a closed pipe ends it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # (the training process stops us on Ctrl-C)
    buffers: dict[int, np.ndarray] = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        if msg[0] == "map":
            _, key, dtype, shape = msg
            fd = reduction.recv_handle(conn)
            try:
                buffers[key] = shared_array(fd, shape, dtype)
            finally:
                os.close(fd)
            continue
        _, b, slot, rows, keys = msg
        try:
            cols, nbytes = source.decode_block(b)
            n = len(next(iter(cols.values()))) if cols else 0
            written, rest = [], {}
            for name, col in cols.items():
                buf = buffers.get(keys.get(name, 0))
                if buf is not None and fits(buf, col, rows):
                    np.copyto(buf[slot * rows:slot * rows + n], col)
                    written.append(name)
                else:
                    rest[name] = col
            reply: tuple = ("ok", n, nbytes, tuple(written), rest)
        except Exception as exc:
            reply = ("error", exc)
        try:
            conn.send(reply)
        except Exception as exc:   # (an exception that does not pickle: its words travel)
            conn.send(("error", RuntimeError(f"decode of block {b} failed: {reply[1]!r} (unpicklable: {exc!r})")))


class _Decoder:
    """One decode process and the parent's end of its pipe."""

    def __init__(self, ctx: Any, w: int, source: Any):
        self.worker_id = w
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=serve, args=(child, source), name=f"seqloader-decode-{w}", daemon=True)
        try:
            self.process.start()
        except BaseException:
            self.conn.close()
            raise
        finally:
            child.close()
        self.mapped: set[int] = set()   # keys of the buffers it was sent

    def name(self) -> str:
        return f"decode worker {self.worker_id} (pid {self.process.pid})"

    def gone(self, what: str) -> RuntimeError:
        """The error of this process's death, found ``what`` (``"while decoding row group 3 of a.parquet"``)."""
        self.process.join(timeout=1.0)   # (the exit code follows the pipe's end by a moment)
        return RuntimeError(f"DataLoader: {self.name()} {describe_exit(self.process.exitcode)} ({what}); the "
                            "batches read so far are right, the epoch cannot go on without it")

    def decode(self, b: int, slot: Optional[int], rows: int, buffers: dict[str, tuple[int, int, str, tuple]],
               block: str) -> tuple:
        what = f"while decoding {block}"
        try:
            for key, fd, dtype, shape in buffers.values():
                if key not in self.mapped:
                    self.conn.send(("map", key, dtype, shape))
                    reduction.send_handle(self.conn, fd, self.process.pid)
                    self.mapped.add(key)
            self.conn.send(("decode", b, slot, rows, {name: v[0] for name, v in buffers.items()}))
            deadline = time.monotonic() + WAIT_TIMEOUT
            while not self.conn.poll(POLL_S):
                if not self.process.is_alive():
                    raise self.gone(what)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"DataLoader: {self.name()} did not finish decoding {block} within "
                                       f"{WAIT_TIMEOUT:g} s; is a read hanging (a stalled file system)?")
            return self.conn.recv()
        except (EOFError, OSError) as exc:   # (its pipe closed: the process is gone)
            raise self.gone(what) from exc


def _stop(decoders: list[_Decoder]) -> None:
    """Ask each process to exit, then SIGTERM, then SIGKILL; close the pipes (idempotent)."""
    for d in decoders:
        try:
            d.conn.send(None)
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + JOIN_S
    for d in decoders:
        p = d.process
        p.join(timeout=max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.terminate()
            p.join(timeout=JOIN_S)
        if p.is_alive():  # pragma: no cover - ignores SIGTERM
            p.kill()
            p.join(timeout=JOIN_S)
        d.conn.close()


def _close(decoders: list[_Decoder], source: Any) -> None:
    _stop(decoders)
    source.unshare_slots()


class BlockDecoders:
    """``num_workers`` processes decoding blocks of ``source`` (see the module docstring).

    Args:
        source: a columnar source (``decode_block``, ``share_slots``, ``unshare_slots``).
        num_workers: processes, ``>= 1``.
        context: a ``multiprocessing`` context or start method (``None``: the platform's).

    Example:
        >>> import os, tempfile, numpy as np, pyarrow as pa, pyarrow.parquet as pq, seqloader
        >>> path = os.path.join(tempfile.mkdtemp(), "a.parquet")
        >>> pq.write_table(pa.table({"x": np.arange(10)}), path, row_group_size=5)
        >>> src = seqloader.parquet(path, columnar=True)
        >>> decoders = BlockDecoders(src, 2)
        >>> src.decode_ahead([7], threads=2, decoders=decoders)       # row group 1, in a process
        1
        >>> src.__getitems__([9, 7, 0])["x"].tolist()
        [9, 7, 0]
        >>> decoders.close(); decoders.closed
        True
    """

    def __init__(self, source: Any, num_workers: int, context: Any = None):
        ctx = resolve_context(context)
        self.source = source
        self.failure: Optional[BaseException] = None
        self._free: queue.SimpleQueue[_Decoder] = queue.SimpleQueue()
        decoders: list[_Decoder] = []
        self._decoders = decoders
        #: what to hand to a source (its arena keeps claims, and their decode, beyond an epoch):
        #: a weak reference, so that dropping the iterator that owns these processes stops them
        self.handle: Any = weakref.proxy(self)
        source.share_slots()
        self._finalizer = weakref.finalize(self, _close, decoders, source)
        for w in range(num_workers):   # (a failed start closes those started: the finalizer's list)
            try:
                decoders.append(_Decoder(ctx, w, source))
            except BaseException:
                self.close()
                raise
            self._free.put(decoders[-1])
        self.pids = [d.process.pid for d in decoders]

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def check(self) -> None:
        """Raise the error of a process that died (or was stopped midway), if one did; a process
        found dead here is one (``waitpid`` without waiting: a few µs a process)."""
        if self.failure is None and not self.closed:
            dead = next((d for d in self._decoders if not d.process.is_alive()), None)
            if dead is not None:
                self.failure = dead.gone("found at a look ahead")
        if self.failure is not None:
            self.close()   # (the others too, as torch's loader does when a worker dies)
            raise self.failure

    def decode(self, b: int, slot: Optional[int], rows: int, buffers: dict[str, tuple[int, int, str, tuple]],
               describe: Callable[[int], str]) -> tuple[int, int, tuple[str, ...], dict[str, np.ndarray]]:
        """Block ``b`` decoded by a free process into ``slot`` of ``buffers`` (``rows`` per slot):
        ``(rows, nbytes, columns written, the other columns)``; raises the decode's error, or
        ``RuntimeError`` if the process died (see the module docstring)."""
        self.check()
        if self.closed:   # (the iterator that owned them ended while a claim was queued)
            raise RuntimeError(f"DataLoader: the decode workers were closed; {describe(b)} was not decoded")
        try:
            decoder = self._free.get(timeout=WAIT_TIMEOUT)
        except queue.Empty:
            raise TimeoutError(f"DataLoader: no decode worker was free for {WAIT_TIMEOUT:g} s to decode "
                               f"{describe(b)}") from None
        try:
            reply = decoder.decode(b, slot, rows, buffers, describe(b))
        except BaseException as exc:   # (midway: its pipe may hold a reply; it is never asked again)
            if self.failure is None:
                self.failure = exc if isinstance(exc, (RuntimeError, TimeoutError)) else RuntimeError(
                    f"DataLoader: {decoder.name()} was stopped midway ({exc!r}) while decoding {describe(b)}")
            self.close()
            raise
        self._free.put(decoder)
        if reply[0] == "error":
            raise reply[1]
        return reply[1], reply[2], reply[3], reply[4]

    def close(self) -> None:
        """Stop the processes (idempotent); the source's buffers stay valid where they are read."""
        self._finalizer()
