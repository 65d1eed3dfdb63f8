"""``seqloader.megatron``: a Megatron indexed dataset (``prefix.bin`` + ``prefix.idx``) as a source.

The files are written by megatron-core's own ``IndexedDatasetBuilder`` where it is installed (the
``test`` extra), and by :func:`write_megatron` otherwise: a writer that follows the format byte
by byte (checked against megatron-core's output below).
"""

from __future__ import annotations

import os
import pickle
import struct
import warnings

import numpy as np
import pytest
import torch

import seqloader
from seqloader.testing import assert_batches_equal, assert_resumes_exactly, json_round_trip, run_saving_after

MAGIC = b"MMIDIDX\x00\x00"
CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.float64: 6, np.float32: 7, np.uint16: 8}


def write_megatron(prefix, documents, dtype=np.uint16, modes=None):
    """Write ``documents`` (lists of sequences, each a list of ints) as megatron-core 0.16 does."""
    seqs = [np.asarray(s, dtype=dtype) for doc in documents for s in doc]
    lengths = np.array([s.size for s in seqs], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths.astype(np.int64) * np.dtype(dtype).itemsize)[:-1]]).astype(
        np.int64) if seqs else np.zeros(0, np.int64)
    doc_idx = np.concatenate([[0], np.cumsum([len(d) for d in documents])]).astype(np.int64)
    with open(prefix + ".bin", "wb") as f:
        for s in seqs:
            f.write(s.tobytes())
    with open(prefix + ".idx", "wb") as f:
        f.write(MAGIC + struct.pack("<QBQQ", 1, CODES[dtype], lengths.size, doc_idx.size))
        f.write(lengths.tobytes() + pointers.tobytes() + doc_idx.tobytes())
        if modes is not None:
            f.write(np.asarray(modes, dtype=np.int8).tobytes())
    return seqs


def corpus(n_docs=30, seed=0, vocab=50000):
    rng = np.random.default_rng(seed)
    return [[rng.integers(0, vocab, rng.integers(1, 40)).tolist() for _ in range(rng.integers(1, 4))]
            for _ in range(n_docs)]


@pytest.fixture
def prefix(tmp_path):
    p = str(tmp_path / "data" / "corpus_text_document")
    os.makedirs(os.path.dirname(p))
    write_megatron(p, corpus())
    return p


def megatron_core():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip("megatron.core.datasets.indexed_dataset")


def test_items_are_numpy_slices_of_the_bin_and_lengths_come_from_the_index(prefix):
    src = seqloader.megatron(prefix)
    tokens = np.fromfile(prefix + ".bin", dtype=np.uint16)
    docs = corpus()
    seqs = [s for d in docs for s in d]
    assert len(src) == len(seqs) and src.dtype == np.uint16
    ends = np.cumsum([len(s) for s in seqs])
    for i in range(len(src)):
        item = src[i]
        assert item.dtype == np.uint16 and item.ndim == 1 and item.flags.writeable
        np.testing.assert_array_equal(item, tokens[ends[i] - len(seqs[i]):ends[i]])
        assert item.tolist() == seqs[i]
    assert src.lengths.tolist() == [len(s) for s in seqs] and src.lengths.dtype == np.int32
    assert src.document_indices.tolist() == [0, *np.cumsum([len(d) for d in docs]).tolist()]
    assert src.blocks().tolist() == src.document_indices[1:].tolist() and src.modes is None
    got = src.__getitems__([5, -1, 0, 5])
    assert [g.tolist() for g in got] == [seqs[5], seqs[-1], seqs[0], seqs[5]]
    assert [x.tolist() for x in src[3:7]] == seqs[3:7]
    with pytest.raises(IndexError, match=r"megatron\('.*corpus_text_document', sequences=\d+"):
        src[len(src)]


def test_the_writer_of_these_tests_writes_what_megatron_core_writes(tmp_path):
    m = megatron_core()
    docs = corpus(8, seed=1)
    for dtype in (np.uint16, np.int32):
        ours, theirs = str(tmp_path / f"ours_{dtype.__name__}"), str(tmp_path / f"theirs_{dtype.__name__}")
        write_megatron(ours, docs, dtype)
        builder = m.IndexedDatasetBuilder(theirs + ".bin", dtype=dtype)
        for doc in docs:
            for s in doc:
                builder.add_item(torch.tensor(s))
            builder.end_document()
        builder.finalize(theirs + ".idx")
        for ext in (".bin", ".idx"):
            with open(ours + ext, "rb") as a, open(theirs + ext, "rb") as b:
                assert a.read() == b.read(), ext


@pytest.mark.parametrize("multimodal", [False, True])
def test_a_dataset_megatron_core_wrote_reads_as_megatron_core_reads_it(tmp_path, multimodal):
    m = megatron_core()
    p = str(tmp_path / "mc")
    builder = m.IndexedDatasetBuilder(p + ".bin", dtype=np.int32, multimodal=multimodal)
    rng = np.random.default_rng(3)
    for d in range(12):
        for k in range(1 + d % 3):
            builder.add_item(torch.tensor(rng.integers(0, 2 ** 31 - 1, 1 + (d * 7 + k) % 23)), mode=(d + k) % 2)
        builder.end_document()
    builder.finalize(p + ".idx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = m.IndexedDataset(p, multimodal=multimodal)
    src = seqloader.megatron(p)
    assert len(src) == len(theirs) and src.dtype == np.int32
    for i in range(len(src)):
        np.testing.assert_array_equal(src[i], theirs[i][0] if multimodal else theirs[i])   # (multimodal: +mode)
    np.testing.assert_array_equal(src.lengths, theirs.sequence_lengths)
    np.testing.assert_array_equal(src.document_indices, theirs.document_indices)
    if multimodal:
        np.testing.assert_array_equal(src.modes, theirs.index.sequence_modes)   # (its property asserts on an array)
        assert "modes" in repr(src)
    else:
        assert src.modes is None


def test_pack_takes_the_lengths_of_the_index_and_reads_only_what_it_packs(prefix):
    src = seqloader.megatron(prefix)
    packed = seqloader.pack(src, 64, lengths=src.lengths, cache=False)
    assert len(packed) > 0 and packed.index_stats()["items_read"] == 0
    flat = np.concatenate([src[i] for i in range(len(src))])
    got = np.concatenate([x["tokens"][x["loss_mask"]] for x in packed])
    assert sorted(got.tolist()) == sorted(flat.tolist())
    assert packed.index_stats()["lengths"] == "argument"


def pad_collate(items):
    out = torch.zeros(len(items), 40, dtype=torch.int64)
    for k, x in enumerate(items):
        out[k, :len(x)] = torch.from_numpy(x.astype(np.int64))
    return out


def _loader(prefix, num_workers):
    return seqloader.DataLoader(seqloader.megatron(prefix), batch_size=4, shuffle=True, num_workers=num_workers,
                                seed=0, collate_fn=pad_collate)


def test_a_loader_resumes_mid_epoch_exactly(prefix):
    whole, state = run_saving_after(_loader(prefix, 0), 4)   # (seqloader.testing, as test_token_windows.py)
    state = json_round_trip(state)
    assert state["files"][0]["files"] == 2
    resumed = _loader(prefix, 0)
    resumed.load_state_dict(state)
    assert_batches_equal(whole[:5] + list(resumed), whole)


@pytest.mark.mp
def test_two_worker_processes_give_the_batches_of_none_and_resume_exactly(prefix):
    import functools

    assert_resumes_exactly(functools.partial(_loader, prefix), stops=[3, -1])


@pytest.mark.parametrize("which", [".bin", ".idx"])
def test_a_changed_file_is_refused_on_resume_naming_it(prefix, which):
    loader = _loader(prefix, 0)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    if which == ".bin":   # the same size and index, other tokens
        data = bytearray(open(prefix + which, "rb").read())
        data[0] ^= 0xFF
        open(prefix + which, "wb").write(bytes(data))
    else:   # the same sequences, one split into two documents otherwise
        write_megatron(prefix, [[s] for d in corpus() for s in d])
    with pytest.raises(ValueError, match=r"'files\[0\]' does not match .*megatron\(.*file \d, corpus_text_document"
                       + which.replace(".", r"\.")):
        _loader(prefix, 0).load_state_dict(state)


def test_a_file_changed_after_the_source_was_built_raises_at_read_time_naming_it(prefix):
    src = seqloader.megatron(prefix)
    src[0]
    with open(prefix + ".bin", "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(RuntimeError, match=r"corpus_text_document\.bin changed since it was indexed"):
        src[1]


def test_truncated_and_foreign_files_are_refused_naming_them(prefix, tmp_path):
    idx = open(prefix + ".idx", "rb").read()
    bin_size = os.path.getsize(prefix + ".bin")
    with open(prefix + ".bin", "r+b") as f:
        f.truncate(bin_size - 2)
    with pytest.raises(ValueError, match=r"corpus_text_document\.bin has \d+ bytes, but its index .*\.idx says "
                                         r"sequence \d+ ends at byte \d+; the \.bin is truncated"):
        seqloader.megatron(prefix)
    cases = {
        idx[:-8]: r"\.idx is truncated: its header describes \d+ sequences",
        idx[:20]: r"\.idx is truncated: 20 bytes, shorter than the 34-byte header",
        b"": r"\.idx is not a Megatron index \(magic b''",
        b"PAR1" + idx[4:]: r"\.idx is not a Megatron index \(magic b'PAR1",
        idx[:9] + struct.pack("<Q", 2) + idx[17:]: r"\.idx: index version 2; only version 1",
        idx[:17] + b"\x09" + idx[18:]: r"\.idx: unknown dtype code 9",
        idx + b"\0" * 3: r"\.idx is not the size its header says",
    }
    for data, message in cases.items():
        open(prefix + ".idx", "wb").write(data)
        with pytest.raises(ValueError, match=r"megatron\('.*corpus_text_document'\): .*corpus_text_document" +
                           message):
            seqloader.megatron(prefix)
    bad = str(tmp_path / "bad")
    write_megatron(bad, [[[1, 2]], [[3]]])
    raw = bytearray(open(bad + ".idx", "rb").read())
    raw[-8:] = struct.pack("<q", 1)   # document indices [0, 1, 1]: they must end at the sequence count
    open(bad + ".idx", "wb").write(bytes(raw))
    with pytest.raises(ValueError, match=r"bad\.idx is corrupt: its document indices \[0, 1, 1\]"):
        seqloader.megatron(bad)
    with pytest.raises(FileNotFoundError, match=r"megatron: no such file"):
        seqloader.megatron(str(tmp_path / "nope"))


def test_arguments_and_urls():
    with pytest.raises(TypeError, match=r"megatron: prefix must be a path"):
        seqloader.megatron(3)
    with pytest.raises(ValueError, match=r"megatron: s3://b/corpus is a URL, but this source memory-maps local"):
        seqloader.megatron("s3://b/corpus")


def test_the_path_of_either_file_names_the_dataset_and_an_empty_one_is_empty(prefix, tmp_path):
    assert repr(seqloader.megatron(prefix + ".bin")) == repr(seqloader.megatron(prefix))
    empty = str(tmp_path / "empty")
    write_megatron(empty, [])
    src = seqloader.megatron(empty)
    assert len(src) == 0 and src.lengths.size == 0 and src.blocks().size == 0 and list(src) == []


def test_pickles_without_its_memory_maps_and_the_copy_reads_the_same(prefix):
    src = seqloader.megatron(prefix)
    src[0]
    data = pickle.dumps(src)
    assert len(data) < 4000   # no index, no mapping
    copy = pickle.loads(data)
    assert repr(copy) == repr(src) and copy.files() == src.files() and copy.fingerprint() == src.fingerprint()
    for i in (0, 7, len(src) - 1):
        np.testing.assert_array_equal(copy[i], src[i])
    np.testing.assert_array_equal(copy.lengths, src.lengths)
    names = [f[0] for f in src.files()]
    assert names == ["corpus_text_document.bin", "corpus_text_document.idx"]
    assert src.files()[1][2].startswith("index:") and src.files()[0][2].startswith("tokens:uint16+data:")


def test_a_copy_elsewhere_fingerprints_the_same_and_resumes(prefix, tmp_path):
    import shutil

    copy = str(tmp_path / "elsewhere" / "corpus_text_document")
    os.makedirs(os.path.dirname(copy))
    for ext in (".bin", ".idx"):
        shutil.copy(prefix + ext, copy + ext)
    assert seqloader.megatron(copy).fingerprint() == seqloader.megatron(prefix).fingerprint()
    loader = _loader(prefix, 0)
    it = iter(loader)
    next(it)
    want = next(it)
    loader = _loader(prefix, 0)
    it = iter(loader)
    next(it)
    state_after_one = loader.state_dict()
    moved = _loader(copy, 0)
    moved.load_state_dict(state_after_one)
    assert torch.equal(next(iter(moved)), want)
