"""Decode processes (``seqloader.prefetcher.decoders``): a block decoded in another process is the
block decoded here; the columns that fit the shared buffers are written there, the others come
back; a decode's error keeps its type; the processes end with ``close`` (or with the last
reference), under every start method."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import seqloader
from forking import wait_until
from leaks import children
from parquet_files import write_token_files
from seqloader.prefetcher.decoders import BlockDecoders


@pytest.fixture
def folder(tmp_path):
    """2 files x 3 row groups of 40 rows: ``id`` int64, ``tokens`` 8 x int32, ``name`` strings."""
    return write_token_files(tmp_path, files=2, rows=120, row_group=40, width=8, high=99, seed=3, names=True)


def _rows(src, positions):
    out = src.__getitems__(positions)
    return {k: np.asarray(v).tolist() for k, v in out.items()}


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_blocks_decoded_in_processes_are_the_blocks_decoded_here(folder, context):
    plain = seqloader.parquet(folder, columnar=True)
    src = seqloader.parquet(folder, columnar=True)
    decoders = BlockDecoders(src, 2, context)
    try:
        positions = list(range(0, 240, 7))
        assert src.decode_ahead(positions, threads=2, decoders=decoders.handle) == 6
        assert _rows(src, positions) == _rows(plain, positions)
        assert src.counters()["blocks_decoded"] == 6
        assert len(children()) == 2
    finally:
        decoders.close()
    assert decoders.closed and wait_until(lambda: not children(), 60)
    assert _rows(src, positions[::-1]) == _rows(plain, positions[::-1])   # views still readable after close


def test_numbers_are_written_into_the_shared_buffers_and_strings_come_back(folder):
    src = seqloader.parquet(folder, columnar=True)
    decoders = BlockDecoders(src, 1)
    try:
        src.__getitems__([0])                       # block 0 decoded here: the buffers exist
        state = src._slots.get()                    # (the test looks inside the source's arena)
        assert state.shared and set(state.shared_buffers()) == {"id", "tokens"}
        rows = src._slot_rows()
        n, nbytes, written, rest = decoders.decode(4, 3, rows, state.shared_buffers(), str)
        assert (n, set(written), set(rest)) == (40, {"id", "tokens"}, {"name"})
        cols, want = src.decode_block(4)
        assert nbytes == want and list(rest["name"]) == list(cols["name"])
        block = state.store(rest, 3, rows, 4, 6, written, n)
        assert np.array_equal(block.cols["id"], cols["id"]) and np.array_equal(block.cols["tokens"], cols["tokens"])
        assert block.slotted == {"id", "tokens"}
    finally:
        decoders.close()


def test_a_decode_error_keeps_its_type_and_the_processes_serve_on(folder):
    src = seqloader.parquet(folder, columnar=True)
    decoders = BlockDecoders(src, 1)
    try:
        with pytest.raises(IndexError):
            decoders.decode(99, None, 40, {}, str)  # no block 99
        n, _, written, rest = decoders.decode(1, None, 40, {}, str)   # no slot: every column comes back
        assert n == 40 and written == () and set(rest) == {"id", "tokens", "name"}
        decoders.check()
    finally:
        decoders.close()


def test_the_processes_end_with_the_last_reference(folder):
    src = seqloader.parquet(folder, columnar=True)
    decoders = BlockDecoders(src, 2)
    handle = decoders.handle
    assert len(children()) == 2
    del decoders
    gc.collect()
    assert wait_until(lambda: not children(), 60)
    with pytest.raises(ReferenceError):
        handle.decode(0, None, 40, {}, str)
