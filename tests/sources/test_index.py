"""The index arithmetic: positions -> (block, offset) and (file, row group, row), against list oracles."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from seqloader.sources import parquet
from seqloader.sources.base import BlockIndex, group_by_block

from sources_helpers import write_parquet

lengths = st.lists(st.integers(0, 7), min_size=1, max_size=12)


def oracle(lengths):
    """``[(block, offset), ...]`` for every position, built by walking the blocks."""
    return [(b, r) for b, n in enumerate(lengths) for r in range(n)]


@given(lengths, st.data())
def test_locate_matches_the_oracle(lens, data):
    index, want = BlockIndex(lens), oracle(lens)
    assert len(index) == len(want) and index.num_blocks == len(lens)
    assert index.ends.tolist() == np.cumsum(lens).tolist()
    pos = data.draw(st.lists(st.integers(0, max(len(want) - 1, 0)), max_size=20 if want else 0))
    blocks, offsets = index.locate(pos)
    assert list(zip(blocks.tolist(), offsets.tolist())) == [want[p] for p in pos]


@given(st.lists(st.integers(0, 5), max_size=30))
def test_group_by_block_partitions_positions_and_keeps_their_order(blocks):
    groups = group_by_block(np.array(blocks, dtype=np.int64))
    assert [b for b, _ in groups] == sorted(set(blocks))
    for b, where in groups:
        assert where.tolist() == [k for k, x in enumerate(blocks) if x == b]


def test_block_index_rejects_negative_lengths_and_is_read_only():
    with pytest.raises(ValueError, match="block lengths must be >= 0"):
        BlockIndex([2, -1])
    with pytest.raises(ValueError, match="read-only"):
        BlockIndex([1, 2]).ends[0] = 5


layouts = st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=4), min_size=1, max_size=4).filter(
    lambda lay: sum(map(sum, lay)) > 0)


@settings(max_examples=25)
@given(layout=layouts, data=st.data())
def test_parquet_positions_map_to_file_row_group_and_row(tmp_path_factory, layout, data):
    folder = tmp_path_factory.mktemp("layout")
    write_parquet(folder, layout)
    src = parquet(str(folder), columns=["i"], num_threads=2)
    want = [(f, g, r) for f, groups in enumerate(layout) for g, n in enumerate(groups) for r in range(n)]
    assert len(src) == len(want)
    assert src.blocks().tolist() == np.cumsum([g for groups in layout for g in groups]).tolist()
    pos = data.draw(st.lists(st.integers(-len(want), len(want) - 1), min_size=1, max_size=12))
    blocks, rows = src._index.locate([p % len(want) for p in pos])
    assert [(*src._where[b], r) for b, r in zip(blocks.tolist(), rows.tolist())] == [want[p] for p in pos]
    # and the rows read there are those rows (rows are numbered across files)
    assert [int(r["i"]) for r in src.__getitems__(pos)] == [p % len(want) for p in pos]
    assert [int(src[p]["i"]) for p in pos] == [p % len(want) for p in pos]
