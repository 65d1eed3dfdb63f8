"""``sources/_schema.py``: one check of the files' columns for Parquet and Arrow IPC, seen through both sources."""

from __future__ import annotations

import pytest

from seqloader.sources import arrow_ipc, parquet

from sources_helpers import pq, table

feather = pytest.importorskip("pyarrow.feather")


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_both_formats_read_the_same_columns_whatever_their_order_in_each_file(tmp_path, fmt):
    t = table(0, 4)
    reordered = table(4, 3).select(["s", "i", "vec", "x", "ragged"])
    paths = [str(tmp_path / f"a.{fmt}"), str(tmp_path / f"b.{fmt}")]
    write = (lambda tab, p: pq.write_table(tab, p)) if fmt == "parquet" else feather.write_feather
    write(t, paths[0])
    write(reordered, paths[1])
    src = parquet(paths) if fmt == "parquet" else arrow_ipc(paths)
    assert src.columns == ["i", "x", "s", "vec", "ragged"]   # the first file's order
    assert [int(src[k]["i"]) for k in range(len(src))] == list(range(7))
    assert list(src[5]) == ["i", "x", "s", "vec", "ragged"] and src[5]["s"] == "row5"


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_both_formats_refuse_a_missing_column_with_the_same_message(tmp_path, fmt):
    paths = [str(tmp_path / f"a.{fmt}"), str(tmp_path / f"b.{fmt}")]
    write = (lambda tab, p: pq.write_table(tab, p)) if fmt == "parquet" else feather.write_feather
    write(table(0, 2), paths[0])
    write(table(2, 2).drop_columns(["s"]), paths[1])
    build = parquet if fmt == "parquet" else arrow_ipc
    with pytest.raises(ValueError, match=r"a\.\w+ and .*b\.\w+ have different columns \(first difference: 's': "
                                         r"column 's' is in .*a\.\w+ but not in .*b\.\w+\)"):
        build(paths)
    with pytest.raises(ValueError, match=r"column 's' is in .*a\.\w+ but not in .*b\.\w+$"):
        build(paths, columns=["i", "s"])
    assert len(build(paths, columns=["i", "vec"])) == 4
