"""Index files: written once, loaded after, data only (no pickle), never trusted when stale or
damaged (a warning naming the file, then a rebuild), and what cannot be described is not cached."""

from __future__ import annotations

import json
import logging
import operator
import os
import pickle
import re
import struct
import warnings

import numpy as np
import pytest

import seqloader as sl
from packing_helpers import Docs, as_lists
from seqloader.packing import _store

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

LENGTHS = [5, 17, 3, 9, 30, 1, 12, 8, 2, 20, 7, 11]


def packed(lengths=LENGTHS, **kw):
    return sl.pack(Docs(lengths), 16, window=4, lengths=lengths, **kw)


def items(seq):
    return [as_lists(x) for x in seq]


def _read(path):
    with open(path, "rb") as f:
        raw = f.read()
    header, start = _store._parse(raw)
    return raw, header, start


def test_built_once_then_loaded_and_the_file_is_data(caplog):
    with caplog.at_level(logging.INFO, logger="seqloader"):
        first = packed()
        want = items(first)
    stats = first.index_stats()
    assert stats["index"] == "built" and stats["cache"] == "written" and stats["lengths"] == "argument"
    assert stats["items"] == len(first) and stats["documents"] == len(LENGTHS) and stats["windows"] == 3
    assert stats["tokens"] == sum(LENGTHS) and 0 < stats["padding"] < 1
    path = stats["cache_file"]
    assert any("index built in" in r.getMessage() and path in r.getMessage() for r in caplog.records)
    raw, header, start = _read(path)  # a JSON header and raw integer arrays: no pickle
    assert header["format"] == _store.FORMAT and set(header["arrays"]) == {"ends", "piece_ends", "bins"}
    assert _store._view(raw, start, header["arrays"]["ends"]).tolist() == first.blocks().tolist()
    again = packed()
    assert items(again) == want
    loaded = again.index_stats()
    assert loaded["index"] == "loaded" and loaded["cache"] == "hit" and loaded["items_read"] == 0
    assert loaded["built_in_seconds"] == stats["built_in_seconds"] and loaded["padding"] == stats["padding"]


def _write(path, raw, header, start):
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + raw[start:])


@pytest.mark.parametrize("damage", ["edited", "truncated", "garbage", "missing", "object dtype"])
def test_a_damaged_file_is_ignored_with_a_warning_and_rebuilt(damage):
    first = packed()
    want, path = items(first), first.index_stats()["cache_file"]
    raw, header, start = _read(path)
    where = start + header["arrays"]["ends"]["offset"]
    if damage == "edited":  # one count changed, the header left alone
        data = bytearray(raw)
        data[where] += 1
        with open(path, "wb") as f:
            f.write(bytes(data))
        why = "damaged: array 'ends' differs from its checksum"
    elif damage == "truncated":
        with open(path, "wb") as f:
            f.write(raw[: where + 4])
        why = "damaged: array 'ends': its data lies outside the file"
    elif damage == "garbage":
        with open(path, "wb") as f:
            f.write(b"\x80\x04 not an index")
        why = "damaged: not a readable index file"
    elif damage == "missing":
        del header["arrays"]["ends"]
        _write(path, raw, header, start)
        why = "damaged: array 'ends' is missing"
    else:
        header["arrays"]["ends"]["dtype"] = "|O"
        _write(path, raw, header, start)
        why = "damaged: array 'ends': dtype object is not an integer or bool dtype"
    again = packed()
    with pytest.warns(RuntimeWarning, match=re.escape(f"ignoring the index file {path} ({why}")):
        assert items(again) == want
    assert again.index_stats()["index"] == "built" and again.index_stats()["cache"] == "written"
    assert packed().index_stats()["index"] == "loaded"  # the rebuilt file is whole again


def test_stale_lengths_are_detected_and_rebuilt():
    first = packed()
    path = first.index_stats()["cache_file"]
    other = list(LENGTHS)
    other[3] = 10
    fresh = packed(other)
    with pytest.warns(RuntimeWarning, match=re.escape(f"{path} (stale: built from another input (lengths changed)")):
        n = len(fresh)
    assert fresh.index_stats()["index"] == "built"
    assert items(fresh) == items(packed(other, cache=False)) and n == len(fresh)


def _parquet(path, lengths):
    toks = [list(range(100 * i, 100 * i + n)) for i, n in enumerate(lengths)]
    pq.write_table(pa.table({"tokens": pa.array(toks, pa.list_(pa.int32()))}), path, row_group_size=5)


def test_lengths_read_from_a_source_are_cached_and_checked_against_its_files(tmp_path):
    path = str(tmp_path / "docs.parquet")
    _parquet(path, LENGTHS)

    def make():
        return sl.pack(sl.smap(operator.itemgetter("tokens"), sl.parquet(path, columns=["tokens"])), 16, window=4)

    first = make()
    want = items(first)
    stats = first.index_stats()
    assert stats["lengths"] == "read from the input" and stats["items_read"] == len(LENGTHS)
    assert stats["cache"] == "written"
    raw, header, start = _read(stats["cache_file"])
    assert _store._view(raw, start, header["arrays"]["lengths"]).tolist() == LENGTHS
    second = make()
    assert items(second) == want and second.index_stats()["items_read"] == 0
    _parquet(path, LENGTHS[::-1])  # the file changes: size or modification time
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))
    third = make()
    with pytest.warns(RuntimeWarning, match=r"stale: built from another input \(input changed\)"):
        assert third.index_stats()["items_read"] == len(LENGTHS)
    assert items(third) == items(sl.pack(sl.smap(operator.itemgetter("tokens"), sl.parquet(path, columns=["tokens"])),
                                         16, window=4, cache=False))


def test_another_function_in_the_pipeline_is_another_input(tmp_path):
    path = str(tmp_path / "docs.parquet")
    _parquet(path, LENGTHS)
    src = sl.parquet(path, columns=["tokens"])
    a = sl.pack(sl.smap(lambda r: r["tokens"], src), 16, window=4)
    b = sl.pack(sl.smap(lambda r: r["tokens"][:3], src), 16, window=4)
    len(a)
    with pytest.warns(RuntimeWarning, match=r"stale: built from another input"):
        assert len(b) == len(items(b))
    assert b.index_stats()["index"] == "built" and b.index_stats()["tokens"] == sum(min(3, n) for n in LENGTHS)


def test_an_edited_predicate_is_another_index():
    """A function is described by what it computes (code, constants, closure), not its name alone:
    two lambdas of one name that keep other items never share an index (``keep`` cannot check a
    loaded index against its items, as ``pack`` checks lengths)."""
    first = sl.keep(lambda d: len(d) > 8, Docs(LENGTHS), window=5)
    edited = sl.keep(lambda d: len(d) > 3, Docs(LENGTHS), window=5)
    assert len(first) == sum(n > 8 for n in LENGTHS)
    with pytest.warns(RuntimeWarning, match=r"stale: built from another input \(input changed\)"):
        assert [len(x) for x in edited] == [n for n in LENGTHS if n > 3]


def test_a_source_read_before_describes_itself_as_before(tmp_path):
    """What a source derives on its first read is not part of its description: a second op over
    the same, already read, source loads the first one's index (no stale warning, no rebuild)."""
    path = str(tmp_path / "docs.parquet")
    _parquet(path, LENGTHS)
    src = sl.parquet(path, columns=["tokens"])
    first = sl.pack(sl.smap(operator.itemgetter("tokens"), src), 16, window=4)
    want = items(first)  # reads src
    again = sl.pack(sl.smap(operator.itemgetter("tokens"), src), 16, window=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert items(again) == want
    assert again.index_stats()["index"] == "loaded" and again.index_stats()["items_read"] == 0


def test_stale_lengths_in_a_file_are_refused_when_an_item_is_read(tmp_path):
    """A file can only say what was true when it was built: each read checks the documents' lengths."""
    p = sl.pack(Docs([3, 4]), 8, lengths=[3, 5], cache=False)
    with pytest.raises(ValueError, match=r"document 1 has 4 tokens but lengths= says 5"):
        list(p)


def test_what_cannot_be_described_is_not_cached():
    docs = [np.arange(n) for n in LENGTHS]
    stats = sl.pack(docs, 16).index_stats()  # an in-memory list: describable (its bytes)
    assert stats["cache"] == "written"
    class Opaque(Docs):
        def __reduce__(self):
            raise TypeError("not picklable")

    stats = sl.pack(Opaque(LENGTHS), 16).index_stats()
    assert stats["cache"].startswith("off: the input cannot be described (TypeError: not picklable); give lengths=")
    assert stats["cache_file"] is None
    assert sl.pack(Docs(LENGTHS), 16, cache=False).index_stats()["cache"] == "off: cache=False"
    split = sl.pack(Docs(LENGTHS), 16, split=True, lengths=LENGTHS).index_stats()
    assert split["cache"].startswith("off: not needed")


def test_a_builtin_function_in_the_pipeline_is_described_by_its_name():
    """A builtin (``np.asarray``, ``len``) is described by its module and name; it used to be handed
    back to the describer without end (``RecursionError``), so nothing under it was cached."""
    docs = sl.smap(np.asarray, [list(range(n)) for n in LENGTHS])
    assert sl.pack(docs, 16).index_stats()["cache"] == "written"
    again = sl.pack(sl.smap(np.asarray, [list(range(n)) for n in LENGTHS]), 16)
    assert again.index_stats()["index"] == "loaded"


def test_an_unwritable_folder_is_reported(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    stats = packed(cache_dir=str(blocker / "sub")).index_stats()
    assert stats["index"] == "built" and stats["cache"].startswith("not written: ")


def test_pickled_ops_carry_their_index():
    first = packed(cache=False)
    len(first)
    clone = pickle.loads(pickle.dumps(first))
    assert clone.index_stats() == first.index_stats() and items(clone) == items(first)


CALLS = []


def counted_long(d):
    CALLS.append(1)
    return len(d) > 8


def test_keep_evaluates_its_predicate_once_across_processes_through_its_file():
    CALLS.clear()
    kept = sl.keep(counted_long, Docs(LENGTHS), window=5)
    assert len(kept) == sum(n > 8 for n in LENGTHS) and len(CALLS) == len(LENGTHS)
    again = sl.keep(counted_long, Docs(LENGTHS), window=5)
    assert [x.tolist() for x in again] == [x.tolist() for x in kept] and len(CALLS) == len(LENGTHS)
    assert again.index_stats()["index"] == "loaded" and again.index_stats()["kept"] == len(kept)
    # a file is keyed by the predicate too: another predicate is another index
    other = sl.keep(lambda d: len(d) > 8, Docs(LENGTHS), window=5)
    assert len(other) == len(kept) and other.index_stats()["index"] == "built"


def test_the_key_is_the_one_walk_of_the_input_each_stage_describing_itself(tmp_path):
    """A parameter that decides positions (``shuffle``'s seed) is another input; the same recipe
    built again is the same input; a user's lazy sequence is described by its own attributes."""
    first = sl.pack(sl.shuffle(Docs(LENGTHS), seed=1), 16, window=4, cache_dir=str(tmp_path))
    again = sl.pack(sl.shuffle(Docs(LENGTHS), seed=1), 16, window=4, cache_dir=str(tmp_path))
    other = sl.pack(sl.shuffle(Docs(LENGTHS), seed=2), 16, window=4, cache_dir=str(tmp_path))
    assert first.index_stats()["cache"] == "written" and again.index_stats()["cache"] == "hit"
    assert other.index_stats()["cache"] == "written"  # another file: the seed is part of where it is
    assert other.index_stats()["cache_file"] != first.index_stats()["cache_file"]
    longer = sl.pack(sl.shuffle(Docs(LENGTHS + [4]), seed=1), 16, window=4, cache_dir=str(tmp_path))
    assert longer.index_stats()["cache"] != "hit"
