"""``seqloader.token_windows``: fixed windows over flat token files (raw binary or ``.npy``)."""

from __future__ import annotations

import functools
import os
import pickle

import numpy as np
import pytest
import torch

import seqloader
from seqloader.testing import assert_batches_equal, assert_resumes_exactly, json_round_trip, run_saving_after


@pytest.fixture
def files(tmp_path):
    """Three token files: raw uint16 of 100 and 37 tokens, a .npy of 64 (raw and .npy in one list)."""
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 50000, n).astype(np.uint16) for n in (100, 37, 64)]
    paths = [str(tmp_path / "tok" / name) for name in ("a.bin", "b.bin", "c.npy")]
    os.makedirs(os.path.dirname(paths[0]))
    arrays[0].tofile(paths[0])
    arrays[1].tofile(paths[1])
    np.save(paths[2], arrays[2])
    return paths, arrays


def expected(arrays, length, stride):
    return [a[s:s + length] for a in arrays for s in range(0, len(a) - length + 1, stride)]


@pytest.mark.parametrize("length,stride", [(9, 8), (8, None), (16, 5), (37, 1), (101, None)])
def test_items_are_numpy_slices_of_their_file_and_never_cross_files(files, length, stride):
    paths, arrays = files
    src = seqloader.token_windows(paths, length, dtype=np.uint16, stride=stride)
    want = expected(arrays, length, stride or length)
    assert len(src) == len(want) and src.dtype == np.uint16
    for i, w in enumerate(want):
        got = src[i]
        assert got.dtype == np.uint16 and got.shape == (length,) and got.flags.writeable
        np.testing.assert_array_equal(got, w)
    if want:
        picks = [len(want) - 1, 0, len(want) // 2, 0, -1]
        for g, p in zip(src.__getitems__(picks), picks):
            np.testing.assert_array_equal(g, want[p])
    counts = [0 if len(a) < length else (len(a) - length) // (stride or length) + 1 for a in arrays]
    assert src.blocks().tolist() == np.cumsum(counts).tolist()


def test_the_dropped_tail_is_said_in_the_repr_and_npy_needs_no_dtype(files):
    paths, arrays = files
    src = seqloader.token_windows(paths[2], 10)
    assert len(src) == 6 and src.dtype == np.uint16
    assert repr(src) == "token_windows(files=1, length=10, stride=10, dtype=uint16, len=6, dropped=4 tail tokens)"
    np.testing.assert_array_equal(src[5], arrays[2][50:60])
    exact = seqloader.token_windows(paths[2], 8)
    assert "dropped" not in repr(exact) and len(exact) == 8


def test_inputs_and_shifted_labels_cover_every_token_once(files):
    paths, arrays = files
    L = 8
    src = seqloader.token_windows(paths[0], L + 1, dtype=np.uint16, stride=L)
    labels = np.concatenate([src[i][1:] for i in range(len(src))])
    np.testing.assert_array_equal(labels, arrays[0][1:1 + len(labels)])
    assert all(np.array_equal(src[i][:-1], arrays[0][i * L:(i + 1) * L]) for i in range(len(src)))


def test_argument_errors_name_the_argument(files, tmp_path):
    paths, _ = files
    with pytest.raises(ValueError, match=r"^token_windows: length must be a positive int \(got 0\)$"):
        seqloader.token_windows(paths, 0, dtype=np.uint16)
    with pytest.raises(TypeError, match=r"token_windows: length must be an int"):
        seqloader.token_windows(paths, 2.5, dtype=np.uint16)
    with pytest.raises(ValueError, match=r"token_windows: stride must be a positive int \(got -1\)"):
        seqloader.token_windows(paths, 4, dtype=np.uint16, stride=-1)
    with pytest.raises(ValueError, match=r"token_windows: .*a\.bin is a raw token file \(no \.npy header\); pass "
                                         r"dtype="):
        seqloader.token_windows(paths, 4)
    with pytest.raises(ValueError, match=r"token_windows: dtype must be an integer dtype for token ids \(got float32"):
        seqloader.token_windows(paths, 4, dtype=np.float32)
    with pytest.raises(ValueError, match=r"c\.npy holds uint16 tokens but dtype=int32 was given"):
        seqloader.token_windows(paths[2], 4, dtype=np.int32)
    with pytest.raises(ValueError, match=r"b\.bin has 74 bytes, not a multiple of the size of dtype=int32 \(4 bytes\)"):
        seqloader.token_windows(paths[1], 4, dtype=np.int32)
    np.save(str(tmp_path / "wide.npy"), np.arange(10, dtype=np.int32))
    with pytest.raises(ValueError, match=r"the files hold different dtypes \(.*c\.npy: uint16, .*wide\.npy: int32\)"):
        seqloader.token_windows([paths[2], str(tmp_path / "wide.npy")], 4)
    np.save(str(tmp_path / "grid.npy"), np.zeros((2, 3), np.int32))
    with pytest.raises(ValueError, match=r"grid\.npy must hold a 1-D array of integer token ids \(got shape \(2, 3\)"):
        seqloader.token_windows(str(tmp_path / "grid.npy"), 2)
    with pytest.raises(ValueError, match=r"token_windows: s3://b/t\.bin is a URL"):
        seqloader.token_windows(["s3://b/t.bin"], 2, dtype=np.uint16)
    with pytest.raises(FileNotFoundError, match=r"token_windows: no such file"):
        seqloader.token_windows(str(tmp_path / "nope.bin"), 2, dtype=np.uint16)


def _loader(paths, num_workers):
    src = seqloader.token_windows(paths, 9, dtype=np.uint16, stride=8)
    return seqloader.DataLoader(src, batch_size=4, shuffle=True, num_workers=num_workers, seed=0)


def test_a_loader_resumes_mid_epoch_exactly(files):
    paths, arrays = files
    whole, state = run_saving_after(_loader(paths, 0), 2)   # (seqloader.testing, as test_megatron.py)
    assert all(b.dtype == torch.uint16 and b.shape[1] == 9 for b in whole)
    state = json_round_trip(state)
    assert state["files"][0]["files"] == 3
    resumed = _loader(paths, 0)
    resumed.load_state_dict(state)
    assert_batches_equal(whole[:3] + list(resumed), whole)
    got = sorted(tuple(r.tolist()) for b in whole for r in b)
    assert got == sorted(tuple(w.tolist()) for w in expected(arrays, 9, 8))


@pytest.mark.mp
def test_two_worker_processes_give_the_batches_of_none_and_resume_exactly(files):
    assert_resumes_exactly(functools.partial(_loader, files[0]), stops=[2, -1])


def test_a_changed_file_is_refused_on_resume_naming_it(files):
    paths, arrays = files
    loader = _loader(paths, 0)
    next(iter(loader))
    state = loader.state_dict()
    changed = arrays[1].copy()
    changed[0] ^= 1
    changed.tofile(paths[1])   # the same size, another first token
    with pytest.raises(ValueError, match=r"'files\[0\]' does not match .*token_windows\(files=3.*file 1, b\.bin"):
        _loader(paths, 0).load_state_dict(state)


def test_another_window_of_the_same_len_is_refused_on_resume(files):
    paths, _ = files
    loader = _loader(paths[0], 0)
    next(iter(loader))
    state = loader.state_dict()
    other = seqloader.DataLoader(seqloader.token_windows(paths[0], 10, dtype=np.uint16, stride=8), batch_size=4,
                                 shuffle=True, num_workers=0, seed=0)
    assert len(other.dataset) == state["dataset_len"] == 12
    with pytest.raises(ValueError, match=r"stage 0 of 1 \(token_windows\): 'length' is 9 in the state_dict but 10"):
        other.load_state_dict(state)


def test_a_file_changed_after_the_source_was_built_raises_at_read_time_naming_it(files):
    paths, _ = files
    src = seqloader.token_windows(paths, 9, dtype=np.uint16, stride=8)
    src[0]
    with open(paths[0], "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(RuntimeError, match=r"a\.bin changed since it was indexed"):
        src[1]


def test_pickles_without_its_memory_maps_and_the_copy_reads_the_same(files):
    paths, _ = files
    src = seqloader.token_windows(paths, 9, dtype=np.uint16, stride=8)
    src[0]
    data = pickle.dumps(src)
    assert len(data) < 4000
    copy = pickle.loads(data)
    assert repr(copy) == repr(src) and copy.files() == src.files()
    assert [f[0] for f in src.files()] == ["a.bin", "b.bin", "c.npy"]
    for i in (0, 5, len(src) - 1):
        np.testing.assert_array_equal(copy[i], src[i])


def test_reading_draws_no_global_rng_so_the_loader_skips_seeding_them(files):
    from seqloader.loader.rngs.draws import batch_draws_globals
    from torch.utils.data import default_collate

    src = seqloader.token_windows(files[0][:2], 9, dtype=np.uint16, stride=8)
    assert batch_draws_globals(src, default_collate) is False
    np.random.seed(3)
    want = np.random.random()
    np.random.seed(3)
    assert len(list(seqloader.DataLoader(src, batch_size=4, shuffle=True, seed=0))) > 0
    assert np.random.random() == want  # the caller's generator is where it was
