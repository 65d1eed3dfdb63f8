"""Columnar sources (Parquet, Arrow IPC): decoded blocks, rows, and the columnar fast path.

A subclass supplies its index and ``_read_blocks(blocks) -> list[pyarrow.Table]``. This base
turns each decoded block into numpy columns once (zero-copy where Arrow allows; see
:func:`to_numpy`), keeps the last ``cache_blocks`` of them per process in an
:class:`~seqloader.sources._arena.Arena` shared by the process's threads (a block is decoded
once even when several threads need it at once, and different blocks decode in parallel), and
answers:

* ``src[i]``: a row, ``{column: value}`` (numpy scalars; arrays for list columns), or
  ``transform(row)``;
* ``src.__getitems__(positions)``: a list of rows, or, with ``columnar=True``, one dict of
  column arrays in the order of ``positions`` (sliced out of the decoded blocks with one numpy
  ``take`` per column and block, no Python step per row). A list column whose rows all have
  the same length (and a fixed-size list) is a 2-D array, so
  ``torch.utils.data.default_convert`` turns the dict into tensors, a token column into one
  ``(batch, length)`` tensor: ``collate_fn=default_convert`` is the matching collate.

How many blocks to keep (``cache_blocks``): by default (``None``) the loader decides, when an
epoch opens (:meth:`TableSource.size_cache`, called by ``seqloader.DataLoader`` through
:mod:`seqloader.loader.epoch.block_caches`): a block shuffle (``BlockShuffleSampler(window=w)``) reads
the ``w`` blocks of one window at a time in each lane, and with ``lanes`` equal to the loader's
``num_workers`` each worker reads its own lane, one window after another. So:

* worker processes: ``w`` (each process has its own arena and lane);
* ``threads_per_worker=k``: ``2 * w`` (the threads of a process read the batches of its lane:
  while some finish a window, others begin the next);
* thread workers (``worker_method="thread"``, one arena for every lane):
  ``w * (num_workers + 1)``: a window per thread, and one for the thread that moves on to its
  next window while the others read theirs (with ``w * num_workers`` the least recently used
  blocks evicted then can be another thread's current window, decoded again).

Until a loader says (the source read directly, or by torch's ``DataLoader``), and for orders
other than a block shuffle, :data:`DEFAULT_CACHE_BLOCKS`. An explicit ``cache_blocks=N`` is
kept as given, whatever the loader: fewer than the above, and a window's blocks are decoded
again while it is read (the arena warns once, :class:`~seqloader.sources._arena.ArenaTooSmall`).

A decoded block must hold as many rows as the index says (a footer that promises other counts
than its pages hold is refused, naming the file and the block), and an error raised while
decoding one keeps its type and gains a note naming the file and the block.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import numpy as np

from seqloader.errors import add_note, annotate, check_positive_int
from seqloader.sequences._util import check_bool, check_callable, fname
from seqloader.sources._slots import Block, Slots, slot_rows
from seqloader.sources._to_numpy import to_numpy
from seqloader.sources._process import ProcessLocal
from seqloader.sources.base import Positions, Source, group_by_block, transform_items

__all__ = ["DEFAULT_CACHE_BLOCKS", "TableSource", "to_numpy"]

#: Blocks kept per process by a source built with ``cache_blocks=None`` until a loader sizes it.
DEFAULT_CACHE_BLOCKS = 8


class TableSource(Source[Any]):
    """Shared by :func:`~seqloader.parquet` and :func:`~seqloader.arrow_ipc` (see the module docstring)."""

    _op = "table"
    _block_word = "block"
    #: copy decoded blocks into the process's slot buffers (:mod:`seqloader.sources._slots`); a
    #: source whose blocks are views of a memory map keeps them there instead
    _slot_buffers = True

    _schema_names: list[str]  # the columns read, set by the subclass once the files' schemas are known

    @property
    def draws_globals(self) -> bool:
        """Whether reading may draw from the global RNGs: only through a ``transform`` or a remote
        file system's client (``seqloader.loader.rngs.draws``: otherwise the loader skips seeding them)."""
        return self._transform is not None or bool(self._files.remote)
    _where: list[tuple[int, int]]  # per block: (file, block of that file)

    def _init_output(self, columns: Sequence[str] | None, transform: Callable[..., Any] | None, columnar: bool,
                     cache_blocks: int | None) -> None:
        if columns is not None and (isinstance(columns, str) or not all(isinstance(c, str) for c in columns)):
            raise TypeError(f"{self._op}: columns must be a list of column names or None (got {columns!r})")
        check_callable(self._op, "transform", transform, allow_none=True)
        self._columnar = check_bool(self._op, "columnar", columnar)
        if columnar and transform is not None:
            raise TypeError(f"{self._op}: transform is called on rows and columnar=True returns batches of "
                            "columns; transform the batch in the loader's collate_fn instead")
        self._columns = None if columns is None else list(columns)
        self._transform = transform
        #: the explicit ``cache_blocks`` (a cap the loader keeps), or ``None``: sized by the loader
        self._cache_cap = None if cache_blocks is None else check_positive_int(self._op, "cache_blocks", cache_blocks)
        self._cache_blocks: int = DEFAULT_CACHE_BLOCKS if self._cache_cap is None else self._cache_cap
        self._cache_sized = False   # a loader has sized it (from then on it only grows)
        self._slots: ProcessLocal[Slots] = ProcessLocal(functools.partial(Slots, self._cache_blocks, self._op))
        self._rows_per_slot: int | None = None   # slot_rows of the index, computed on first use

    def _cap_cache(self) -> None:
        """An explicit ``cache_blocks`` beyond the source's blocks keeps them all: no more (called
        once the index is built; ``cache_blocks=10**12`` would size the arena for 10**12 blocks)."""
        blocks = max(len(self._where), 1)
        if self._cache_cap is not None and self._cache_cap > blocks:
            self._cache_cap = self._cache_blocks = blocks
            self._slots = ProcessLocal(functools.partial(Slots, blocks, self._op))

    def __getstate__(self) -> dict[str, Any]:
        # _rows_per_slot is derived on first use in each process: not pickled, so that a source
        # read before describes itself (a packing index's key) as one not yet read
        return {**self.__dict__, "_rows_per_slot": None}

    @property
    def columns(self) -> list[str]:
        """The columns read, in order."""
        return list(self._schema_names)

    @property
    def cache_blocks(self) -> int:
        """Decoded blocks kept per process: the explicit ``cache_blocks``, else what the loader
        asked for (:meth:`size_cache`), else :data:`DEFAULT_CACHE_BLOCKS`."""
        return self._cache_blocks

    def size_cache(self, blocks: int) -> int:
        """Keep at least ``blocks`` decoded blocks per process from now on, unless ``cache_blocks``
        was given (then it stays as given); returns the number kept. ``seqloader.DataLoader`` calls
        it when an epoch opens, before its workers start (:mod:`seqloader.loader.epoch.block_caches`).
        The first call replaces :data:`DEFAULT_CACHE_BLOCKS`; later ones only grow the number:
        two loaders over one source each get what they need. This
        process's decoded blocks move to a larger arena (its counters go on; a batch being read
        finishes in the arena it began in).

        Example:
            >>> import os, tempfile, pyarrow as pa, pyarrow.parquet as pq, seqloader
            >>> path = os.path.join(tempfile.mkdtemp(), "a.parquet")
            >>> pq.write_table(pa.table({"x": list(range(10))}), path, row_group_size=2)
            >>> src = seqloader.parquet(path)
            >>> src.cache_blocks, src.size_cache(4), src.size_cache(24), src.size_cache(16)
            (8, 4, 24, 24)
            >>> seqloader.parquet(path, cache_blocks=4).size_cache(24)    # a cap stays as given
            4
            >>> src.size_cache(0)
            Traceback (most recent call last):
            ValueError: parquet: blocks must be a positive int (got 0)
        """
        blocks = check_positive_int(self._op, "blocks", blocks)
        if self._cache_cap is not None or blocks == self._cache_blocks or (self._cache_sized and
                                                                           blocks < self._cache_blocks):
            return self._cache_blocks
        self._cache_sized = True
        old = self._slots.peek()
        slots: ProcessLocal[Slots] = ProcessLocal(functools.partial(Slots, blocks, self._op))
        if old is not None:   # (this process's counters go on; other processes build their own)
            slots.put(Slots(blocks, self._op, old.arena.counters(), shared=old.shared))
        self._cache_blocks, self._slots = blocks, slots
        return blocks

    def _read_blocks(self, blocks: list[int]) -> list[Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _block_name(self, b: int) -> str:
        """``"row group 3 of /data/part-0.parquet"``: block ``b``, for messages."""
        k, g = self._where[b]
        return f"{self._block_word} {g} of {self._files.infos[k].path}"

    def _noted(self, exc: BaseException, b: int) -> BaseException:
        """``exc`` with a note naming block ``b`` and its file (unless its message names the file)."""
        k, _ = self._where[b]
        if self._files.infos[k].path not in str(exc):
            add_note(exc, f"{self._op}: while reading {self._block_name(b)}")
        return exc

    def counters(self) -> dict[str, int]:
        """This process's counts: blocks decoded, their bytes (Arrow's ``nbytes``), blocks a thread
        took from another thread's decode (``blocks_waited``), items read, blocks decoded again
        soon after they were evicted (``blocks_decoded_again``: an arena too small)."""
        return self._slots.get().arena.counters()

    def _pinned(self, blocks: Sequence[int], items: int = 0, state: Slots | None = None) -> Any:
        """``with self._pinned(blocks) as decoded:`` ``{block: Block}``, decoded at most once while
        they stay in the arena of ``state`` (default: this process's), and not reused while the
        ``with`` block runs (``items``: items read). A batch reads one ``state``
        (``self._slots.get()``, taken once: :meth:`size_cache` may replace it meanwhile)."""
        state = self._slots.get() if state is None else state
        return state.arena.pinned(blocks, functools.partial(self._decode, state), self._block_name, items)

    def decodes_ahead(self) -> bool:
        """Whether :meth:`decode_ahead` decodes anything: local files, and a cache the loader sizes
        (a remote read may retry with random jitter, a draw the loader's seeding must see, so it
        stays in the reading thread; an explicit ``cache_blocks`` may have no room for another window)."""
        return not self._files.remote and self._cache_cap is None

    def decodes_in_processes(self) -> bool:
        """Whether decode processes help (:meth:`decode_block` into shared buffers): where
        :meth:`decodes_ahead`, for blocks copied into slot buffers (not views of a memory map),
        without a ``transform`` (code of the user's, per row: it stays in worker processes)."""
        return self.decodes_ahead() and self._slot_buffers and self._transform is None

    def decode_ahead(self, positions: Sequence[int], threads: int = 2, decoders: Any = None) -> int:
        """Begin decoding, on at most ``threads`` background threads of this process, the blocks
        that reading ``positions`` will need and that are neither kept nor being decoded; returns
        how many (:meth:`~seqloader.sources._arena.Arena.ahead`; 0 where :meth:`decodes_ahead`
        is false). Nothing is read here, and what a later read returns is the same.
        ``seqloader.DataLoader``'s workers call it a window ahead of a block shuffle
        (:mod:`seqloader.loader.epoch.read_ahead`); with ``decoders`` (decode processes,
        :class:`~seqloader.prefetcher.decoders.BlockDecoders`) each thread has a process decode
        its block into the shared buffers (:meth:`share_slots`).

        Example:
            >>> import os, tempfile, pyarrow as pa, pyarrow.parquet as pq, seqloader
            >>> path = os.path.join(tempfile.mkdtemp(), "a.parquet")
            >>> pq.write_table(pa.table({"x": list(range(10))}), path, row_group_size=2)
            >>> src = seqloader.parquet(path, columnar=True)
            >>> src.decode_ahead([4, 5, 9]), src.decode_ahead([5])    # row groups 2 and 4; then nothing new
            (2, 0)
            >>> src.__getitems__([4, 9])["x"].tolist(), src.counters()["blocks_decoded"]
            ([4, 9], 2)
        """
        if not self.decodes_ahead():
            return 0
        blocks, _ = self._index.locate(self._positions(positions))
        state = self._slots.get()
        decode = functools.partial(self._decode, state) if decoders is None else \
            functools.partial(self._decode_by, decoders, state)
        return state.arena.ahead(sorted(set(blocks.tolist())), decode, threads)

    def _slot_rows(self) -> int:
        if self._rows_per_slot is None:   # (threads racing here compute the same number)
            self._rows_per_slot = slot_rows(self._index.ends - self._index.starts) if self._slot_buffers else 0
        return self._rows_per_slot

    def _decode(self, state: Slots, blocks: list[int], slots: list[int | None]) -> list[tuple[Block, int]]:
        """Read and convert ``blocks``, into their slots of ``state`` (called by the arena without its lock)."""
        rows = self._slot_rows()
        out = []
        for b, slot, table in zip(blocks, slots, self._read_blocks(blocks)):
            cols, nbytes = self._block_columns(b, table)
            out.append((state.store(cols, slot, rows, b, self._index.num_blocks), nbytes))
        return out

    def _block_columns(self, b: int, table: Any) -> tuple[dict[str, np.ndarray], int]:
        """Block ``b`` read as ``table``: its numpy columns and Arrow's ``nbytes``, its rows checked."""
        want = int(self._index.ends[b] - self._index.starts[b])
        if table.num_rows != want:
            raise ValueError(f"{self._op}: {self._block_name(b)} holds {table.num_rows} rows but the file's "
                             f"footer says {want}; the file is corrupt: write it again")
        return {name: to_numpy(table.column(name)) for name in self._schema_names}, int(table.nbytes)

    def decode_block(self, b: int) -> tuple[dict[str, np.ndarray], int]:
        """Block ``b``'s numpy columns and bytes decoded, read here (what a decode process runs:
        :mod:`seqloader.prefetcher.decoders`)."""
        return self._block_columns(b, self._read_blocks([b])[0])

    def _decode_by(self, decoders: Any, state: Slots, blocks: list[int],
                   slots: list[int | None]) -> list[tuple[Block, int]]:
        """:meth:`_decode`, each block decoded by one of ``decoders``' processes, into ``state``'s
        shared buffers where they fit (the other columns come back pickled and are stored here)."""
        rows, out = self._slot_rows(), []
        for b, slot in zip(blocks, slots):
            n, nbytes, written, rest = decoders.decode(b, slot, rows, state.shared_buffers() if slot is not None else {},
                                                       self._block_name)
            out.append((state.store(rest, slot, rows, b, self._index.num_blocks, written, n), nbytes))
        return out

    def share_slots(self) -> None:
        """Keep this process's decoded blocks in buffers other processes can write from now on
        (a new arena, the counters going on; :mod:`seqloader.sources._slots`, "Shared buffers")."""
        old = self._slots.get()
        if not old.shared:
            self._slots.put(Slots(self._cache_blocks, self._op, old.arena.counters(), shared=True))

    def unshare_slots(self) -> None:
        """No process writes this process's buffers any more (:meth:`Slots.unshare`)."""
        state = self._slots.peek()
        if state is not None:
            state.unshare()

    def _row(self, cols: dict[str, np.ndarray], r: int) -> dict[str, Any]:
        # a row of a 2-D column is copied: a view would see its slot reused (and be read-only)
        return {name: col[r] if col.ndim == 1 else col[r].copy() for name, col in cols.items()}

    def _item(self, i: int) -> Any:
        b, r = self._index.locate([i])
        block = int(b[0])
        with self._pinned([block], 1) as decoded:
            row = self._row(decoded[block].cols, int(r[0]))
        if self._transform is None:
            return row
        try:
            with annotate(self, i):
                return self._transform(row)
        except Exception as exc:
            add_note(exc, f"{self._op}: row {int(r[0])} of {self._block_name(block)}")
            raise

    def _items(self, positions: Positions) -> Any:
        blocks, rows = self._index.locate(positions)
        state = self._slots.get()
        if self._columnar:
            keys = sorted(set(blocks.tolist()))   # (a set of 64 ints: cheaper than numpy.unique)
            with self._pinned(keys, int(positions.size), state) as decoded:
                return state.gather(self._schema_names, decoded, keys, blocks, rows)
        groups = group_by_block(blocks)
        out: list[Any] = [None] * positions.size
        with self._pinned([b for b, _ in groups], int(positions.size), state) as decoded:
            for b, where in groups:
                cols = decoded[b].cols
                for w, r in zip(where.tolist(), rows[where].tolist()):
                    out[w] = self._row(cols, r)
        if self._transform is not None:
            transform_items(self, self._transform, out, positions,
                            lambda w: f"{self._op}: row {int(rows[w])} of {self._block_name(int(blocks[w]))}")
        return out

    def _repr_args(self) -> str:
        extra = ", columnar=True" if self._columnar else ""
        if self._transform is not None:
            extra += f", transform={fname(self._transform)}"
        return f"files={len(self._files)}, blocks={self._index.num_blocks}{extra}, len={len(self)}"
