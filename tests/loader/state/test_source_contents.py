"""Files whose index matches but whose data differs are told apart (issue 36), and the same bytes elsewhere resume.

Two Parquet files of the same row count written without statistics, with plain encoding and no
compression, have byte-identical footers; two Arrow IPC files of the same schema and batch sizes
too; two tar shards with the same member names and sizes have the same member table. A file's
content in a state also covers its first and last bytes (``seqloader/sources/_sample.py``), so a
state saved over one is refused on the other, naming the file, bare, under ``smap`` and under
``mix``; ``check_files=False`` overrides it; the same bytes copied to another folder resume exactly.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile

import numpy as np
import pytest
import torch

import seqloader
from seqloader import DataLoader
from seqloader.testing import assert_batches_equal, json_round_trip

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

ROWS = 24


def write_parquet(folder, first):
    os.makedirs(folder, exist_ok=True)
    table = pa.table({"id": np.arange(first, first + ROWS, dtype=np.int64)})
    pq.write_table(table, os.path.join(folder, "p.parquet"), write_statistics=False, use_dictionary=False,
                   compression="NONE", row_group_size=8)


def write_arrow(folder, first):
    os.makedirs(folder, exist_ok=True)
    table = pa.table({"id": np.arange(first, first + ROWS, dtype=np.int64)})
    with pa.OSFile(os.path.join(folder, "t.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        for k in range(0, ROWS, 8):
            w.write_table(table.slice(k, 8))


def write_tar(folder, first):
    os.makedirs(folder, exist_ok=True)
    with tarfile.open(os.path.join(folder, "shard-000000.tar"), "w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(ROWS):
            data = f"{first + i:08d}".encode()  # the same size whatever the value
            info = tarfile.TarInfo(f"{i:06d}.txt")
            info.size, info.mtime = len(data), 0
            tf.addfile(info, io.BytesIO(data))


def parquet_ids(folder):
    return seqloader.parquet(folder)


def arrow_ids(folder):
    return seqloader.arrow_ipc(folder)


def tar_ids(folder):
    return seqloader.tar_shards(folder)


def ident(row):
    if isinstance(row, int):
        return row
    return int(row["id"]) if "id" in row else int(row["txt"].decode())


FORMATS = {"parquet": (write_parquet, parquet_ids, "p.parquet"), "arrow": (write_arrow, arrow_ids, "t.arrow"),
           "tar": (write_tar, tar_ids, "shard-000000.tar")}

PIPELINES = {
    "smap": lambda src: seqloader.smap(ident, src),
    "mix": lambda src: seqloader.smap(ident, seqloader.mix([src, list(range(-ROWS, 0))], weights=[1, 1], length=ROWS)),
}


@pytest.fixture
def folders(tmp_path):
    return str(tmp_path / "A"), str(tmp_path / "B"), str(tmp_path / "C")


def as_list(batch):
    return batch


def loader_of(dataset, num_workers=0):
    tar = type(dataset).__name__ == "_TarShards"
    return DataLoader(dataset, batch_size=4, shuffle=True, seed=3, num_workers=num_workers,
                      collate_fn=as_list if tar else None)  # a bare tar source yields dicts of bytes


def saved_after(dataset, batches=2):
    loader = loader_of(dataset)
    it = iter(loader)
    for _ in range(batches):
        next(it)
    return json_round_trip(loader.state_dict())


def make(kind, folders):
    write, source, name = FORMATS[kind]
    a, b, _ = folders
    write(a, 0)
    write(b, 1000)
    return source, name


@pytest.mark.parametrize("kind", list(FORMATS))
def test_the_index_of_the_two_files_is_the_same_and_their_content_is_not(kind, folders):
    source, name = make(kind, folders)
    a, b, _ = folders
    if kind != "tar":
        with open(os.path.join(a, name), "rb") as fa, open(os.path.join(b, name), "rb") as fb:
            ta, tb = fa.read(), fb.read()
        assert len(ta) == len(tb) and ta[-2000:] == tb[-2000:] or ta != tb  # the same layout
    fa_, fb_ = source(a).files()[0], source(b).files()[0]
    assert fa_[:2] == fb_[:2]
    assert fa_[2].split("+data:")[0] == fb_[2].split("+data:")[0]  # what 0.3 compared: the same
    assert fa_[2] != fb_[2]


@pytest.mark.parametrize("pipeline", ["bare", "smap", "mix"])
@pytest.mark.parametrize("kind", list(FORMATS))
def test_a_state_of_a_is_refused_on_b_naming_the_file_and_the_override_loads(kind, pipeline, folders):
    source, name = make(kind, folders)
    a, b, _ = folders
    build = (lambda src: src) if pipeline == "bare" else PIPELINES[pipeline]
    state = saved_after(build(source(a)))
    other = loader_of(build(source(b)))
    before = other.state_dict()
    with pytest.raises(ValueError, match=rf"'files\[0\]' does not match source 0 of \d+ in the pipeline.*"
                                         rf"{name}.*check_files=False") as refused:
        other.load_state_dict(state)
    assert "load_state_dict(state_dict, check_files=False)" in str(refused.value)
    assert other.state_dict() == before
    other.load_state_dict(state, check_files=False)  # at the user's word: B's rows at A's positions
    assert other.state_dict()["position"] == 8


@pytest.mark.parametrize("pipeline", ["smap", "mix"])
@pytest.mark.parametrize("kind", list(FORMATS))
def test_the_same_bytes_at_another_path_resume_exactly(kind, pipeline, folders):
    source, _ = make(kind, folders)
    a, _, c = folders
    shutil.copytree(a, c)
    state = saved_after(PIPELINES[pipeline](source(a)))
    reference = loader_of(PIPELINES[pipeline](source(a)))
    epoch0, epoch1 = list(reference), list(reference)
    resumed = loader_of(PIPELINES[pipeline](source(c)))
    resumed.load_state_dict(state)
    rest, nxt = list(resumed), list(resumed)
    assert_batches_equal(rest, epoch0[2:], "the rest of epoch 0")
    assert_batches_equal(nxt, epoch1, "epoch 1")
    assert all(isinstance(t, torch.Tensor) for t in rest)


def test_a_version_4_state_compares_the_files_as_version_4_did(folders):
    """A version-4 state's fingerprint covers footers only: it loads onto the same files (and onto
    B, which version 4 could not tell apart: the new check needs a new state)."""
    from seqloader.sources.fingerprint import describe_files

    source, _ = make("parquet", folders)
    a, b, _ = folders
    state = saved_after(PIPELINES["smap"](source(a)))
    v4_files = [describe_files([[n, s, c.split("+data:")[0]] for n, s, c in source(a).files()])]
    v4 = {**{k: v for k, v in state.items() if k != "positions"}, "version": 4, "files": v4_files}
    loader_of(PIPELINES["smap"](source(a))).load_state_dict(json.loads(json.dumps(v4)))
    loader_of(PIPELINES["smap"](source(b))).load_state_dict(v4)
    other = [[n, s + 1, c] for n, s, c in source(a).files()]
    v4_other = {**v4, "files": [describe_files([[n, s, c.split("+data:")[0]] for n, s, c in other])]}
    with pytest.raises(ValueError, match=r"'files\[0\]' does not match"):
        loader_of(PIPELINES["smap"](source(a))).load_state_dict(v4_other)
