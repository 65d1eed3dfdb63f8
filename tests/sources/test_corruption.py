"""A corruption fuzzer: truncated files, flipped bits in headers and footers, tampered caches.

Each case ends in the true data or in an error that names the file: never another sample's
bytes, never a hang, never an exception without the path. What the formats cannot protect
(a flipped bit inside a payload: pixels, values; Arrow and Parquet page *headers*, which carry no
checksum) is not fuzzed; docs/data.md, "What seqloader checks, and what it cannot", lists it.
The tampered tar index caches have their own property test in ``test_tar_cache.py``.
"""

from __future__ import annotations

import io
import os
import struct
import tarfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from seqloader.sources import arrow_ipc, parquet, tar_shards

from sources_helpers import pa, pq

feather = pytest.importorskip("pyarrow.feather")

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _text(exc):
    return str(exc) + "\n" + "\n".join(getattr(exc, "__notes__", []))


def outcome(path, read):
    """``("data", value)`` or ``("named", exc)``; an error that does not name ``path`` fails the test."""
    try:
        return "data", read()
    except Exception as exc:  # noqa: BLE001 - what is asserted: any error names the file
        assert path in _text(exc), f"an error without the path: {type(exc).__name__}: {_text(exc)}"
        return "named", exc


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The good bytes of a tar shard, a Parquet file and an Arrow IPC file, and what they hold."""
    d = tmp_path_factory.mktemp("good")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for j in range(6):
            for ext, data in (("txt", f"text {j}".encode() * (j + 1)), ("cls", str(j).encode())):
                info = tarfile.TarInfo(f"k{j:02d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    tar = buf.getvalue()
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        headers = [m.offset_data - 512 for m in tf.getmembers()]
        samples: dict[str, dict] = {}
        for m in tf.getmembers():
            key, ext = m.name.split(".")
            samples.setdefault(key, {"__key__": key})[ext] = tf.extractfile(m).read()
    rows = [(k, f"r{k}") for k in range(15)]
    path = str(d / "f.parquet")
    with pq.ParquetWriter(path, pa.schema([("i", pa.int64()), ("s", pa.string())]), write_page_checksum=True) as w:
        for lo, hi in ((0, 3), (3, 8), (8, 15)):   # row groups of distinct sizes
            w.write_table(pa.table({"i": np.arange(lo, hi), "s": [f"r{k}" for k in range(lo, hi)]}))
    with open(path, "rb") as f:
        parquet_bytes = f.read()
    out = io.BytesIO()
    feather.write_feather(pa.table({"i": np.arange(15), "s": [f"r{k}" for k in range(15)]}), out, chunksize=4,
                          compression="uncompressed")
    return {"tar": tar, "headers": headers, "samples": list(samples.values()), "parquet": parquet_bytes,
            "arrow": out.getvalue(), "rows": rows}


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def flip(data, byte, bit):
    b = bytearray(data)
    b[byte] ^= 1 << bit
    return bytes(b)


@FUZZ
@given(data=st.data())
def test_tar_shards_truncated_or_with_flipped_header_bits(corpus, tmp_path, data):
    good, path = corpus["tar"], str(tmp_path / "s.tar")
    if data.draw(st.booleans(), label="truncate"):
        bad = good[:data.draw(st.integers(0, len(good) - 1), label="cut")]
    else:
        header = data.draw(st.sampled_from(corpus["headers"]), label="header")
        bad = flip(good, header + data.draw(st.integers(0, 511), label="byte"), data.draw(st.integers(0, 7)))
    cached = data.draw(st.booleans(), label="cached index first")
    write(path, good)
    if cached:
        tar_shards(path)
    write(path, bad)
    kind, got = outcome(path, lambda: list(tar_shards(path, use_cache=cached)))
    if kind == "data":
        assert got == corpus["samples"]


def _values(rows):
    """Rows as tuples of values (bytes for text): a flipped bit in a column *name* or in a string's
    logical type changes neither the samples nor their order, which is what is checked here."""
    return [tuple(v.item() if hasattr(v, "item") else v.encode() if isinstance(v, str) else v for v in r.values())
            for r in rows]


@FUZZ
@given(data=st.data())
def test_parquet_truncated_or_with_flipped_footer_bits(corpus, tmp_path, data):
    good, path = corpus["parquet"], str(tmp_path / "f.parquet")
    footer = struct.unpack("<I", good[-8:-4])[0] + 8
    if data.draw(st.booleans(), label="truncate"):
        bad = good[:data.draw(st.integers(0, len(good) - 1), label="cut")]
    else:
        bad = flip(good, data.draw(st.integers(len(good) - footer, len(good) - 1), label="byte"),
                   data.draw(st.integers(0, 7), label="bit"))
    write(path, bad)
    kind, got = outcome(path, lambda: _values(parquet(path, num_threads=1)))
    if kind == "data":
        assert got == [(i, s.encode()) for i, s in corpus["rows"]]


@FUZZ
@given(data=st.data())
def test_arrow_truncated_or_with_flipped_footer_bits(corpus, tmp_path, data):
    good, path = corpus["arrow"], str(tmp_path / "f.arrow")
    footer = struct.unpack("<I", good[-10:-6])[0] + 10
    if data.draw(st.booleans(), label="truncate"):
        bad = good[:data.draw(st.integers(0, len(good) - 1), label="cut")]
    else:
        bad = flip(good, data.draw(st.integers(len(good) - footer, len(good) - 1), label="byte"),
                   data.draw(st.integers(0, 7), label="bit"))
    write(path, bad)
    kind, got = outcome(path, lambda: [{k: v.item() if hasattr(v, "item") else v for k, v in r.items()}
                                       for r in arrow_ipc(path, num_threads=1)])
    if kind == "data":
        assert got == [{"i": i, "s": s} for i, s in corpus["rows"]]


def test_a_sweep_of_single_bit_flips_over_the_footers_and_a_tar_header(corpus, tmp_path):
    """A systematic sweep beside the random cases above: every 16th byte of a tar header (all bits),
    every 6th byte of the Parquet and Arrow footers (three bits each): about a thousand cases."""
    cases = [("tar", str(tmp_path / "s.tar"), corpus["headers"][-1] + b, range(8)) for b in range(0, 512, 16)]
    for kind, ext, tail in (("parquet", "f.parquet", 8), ("arrow", "f.arrow", 10)):
        good = corpus[kind]
        n = struct.unpack("<I", good[-tail:-tail + 4])[0] + tail
        cases += [(kind, str(tmp_path / ext), b, (0, 4, 7)) for b in range(len(good) - n, len(good), 6)]
    readers = {"tar": lambda p: list(tar_shards(p, use_cache=False)),
               "parquet": lambda p: _values(parquet(p, num_threads=1)),
               "arrow": lambda p: _values(arrow_ipc(p, num_threads=1))}
    truth = {"tar": corpus["samples"], "parquet": [(i, s.encode()) for i, s in corpus["rows"]],
             "arrow": [(i, s.encode()) for i, s in corpus["rows"]]}
    for kind, path, byte, bits in cases:
        for bit in bits:
            write(path, flip(corpus[kind], byte, bit))
            what, got = outcome(path, lambda: readers[kind](path))
            assert what == "named" or got == truth[kind], (kind, byte, bit)
