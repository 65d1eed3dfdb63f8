"""The state's ``files``: the file list of every source in the pipeline, checked on load.

Parquet files written with pyarrow: folder ``A`` and folder ``B`` hold the same number of rows in
the same layout with other ids, so a state saved over ``A`` that loaded onto ``B`` would read B's
ids at the same positions. Through every op between the files and the loader (``smap``,
``rng_map``, ``mix``, slices, ``concatenate``, torch's ``Subset`` and a user's Dataset holding a
source) such a state is refused, naming the source and the file; the same files resume exactly,
and ``check_files=False`` resumes on other files deliberately.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

import seqloader
from seqloader import DataLoader
from seqloader.testing import assert_resumes_exactly, json_round_trip

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

ROWS = 24


def write_ids(folder, first_id, files=2, rows=ROWS // 2, row_group=4):
    """``files`` Parquet files of ``rows`` rows each (ids from ``first_id``), in row groups."""
    os.makedirs(folder, exist_ok=True)
    for k in range(files):
        ids = np.arange(first_id + k * rows, first_id + (k + 1) * rows, dtype=np.int64)
        pq.write_table(pa.table({"id": ids}), os.path.join(folder, f"part-{k:03d}.parquet"), row_group_size=row_group)
    return str(folder)


@pytest.fixture
def folders(tmp_path):
    return write_ids(tmp_path / "A", 0), write_ids(tmp_path / "B", 1000)


def ident(row):
    return row["id"]


def noisy(row, rng):
    return row["id"] * 10 + int(rng.integers(0, 10))


class Holder(torch.utils.data.Dataset):
    """A user's Dataset class holding a source in an attribute."""

    def __init__(self, folder):
        self.rows = seqloader.parquet(folder)
        self.scale = 2

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]["id"] * self.scale


#: pipeline name -> build(folder, other_folder): every op between the files and the loader.
PIPELINES = {
    "smap": lambda f, g: seqloader.smap(ident, seqloader.parquet(f)),
    "rng_map": lambda f, g: seqloader.rng_map(noisy, seqloader.parquet(f), seed=3),
    "mix": lambda f, g: seqloader.smap(ident, seqloader.mix([seqloader.parquet(f), seqloader.parquet(g)],
                                                            weights=[1, 1], length=ROWS)),
    "slice": lambda f, g: seqloader.smap(ident, seqloader.parquet(f)[2:20]),
    "concatenate": lambda f, g: seqloader.smap(ident, seqloader.concatenate([seqloader.parquet(f)[:6],
                                                                             seqloader.parquet(g)[6:]])),
    "subset": lambda f, g: torch.utils.data.Subset(seqloader.smap(ident, seqloader.parquet(f)), list(range(3, 20))),
    "user_class": lambda f, g: Holder(f),
}


def make_loader(dataset, num_workers=0):
    return DataLoader(dataset, batch_size=3, shuffle=True, seed=5, num_workers=num_workers)


def without_positions(state: dict) -> dict:
    """A current state cut to an older version's keys (``positions`` came with version 5)."""
    return {k: v for k, v in state.items() if k != "positions"}


def saved_mid_epoch(dataset):
    loader = make_loader(dataset)
    it = iter(loader)
    next(it), next(it)
    return json_round_trip(loader.state_dict())


@pytest.mark.parametrize("name", list(PIPELINES))
def test_a_state_is_refused_on_other_files_through_any_op_and_resumes_on_the_same(folders, tmp_path, name):
    a, b = folders
    build = PIPELINES[name]
    sd = saved_mid_epoch(build(a, a))
    assert isinstance(sd["files"], list) and len(sd["files"]) >= 1 and len(json.dumps(sd)) < 2048
    other = make_loader(build(b, b))
    before = other.state_dict()
    with pytest.raises(ValueError, match=r"^load_state_dict: 'files\[0\]' does not match source 0 of \d+ in the "
                                         r"pipeline, parquet\(files=2.*part-000\.parquet.*check_files=False\)"):
        other.load_state_dict(sd)
    assert other.state_dict() == before  # untouched
    same = make_loader(build(a, a))
    same.load_state_dict(sd)  # the same files: accepted
    assert same.state_dict()["position"] == 6


@pytest.mark.parametrize("name", ["smap", "mix", "user_class"])
def test_the_same_files_resume_exactly(folders, name):
    a, _ = folders

    def make(num_workers):
        return make_loader(PIPELINES[name](a, a), num_workers)

    assert_resumes_exactly(make, stops=[0, 3, -1], workers=(0, 2))


def test_smap_over_b_reads_bs_ids_only_with_check_files_false(folders):
    a, b = folders
    sd = saved_mid_epoch(PIPELINES["smap"](a, a))
    with pytest.raises(ValueError, match="check_files=False"):
        make_loader(PIPELINES["smap"](b, b)).load_state_dict(sd)
    forced = make_loader(PIPELINES["smap"](b, b))
    forced.load_state_dict(sd, check_files=False)
    reference = make_loader(PIPELINES["smap"](a, a))
    want = list(reference)[2:]
    got = list(forced)
    assert [t.tolist() for t in got] == [[x + 1000 for x in t.tolist()] for t in want]  # B's ids, at A's positions
    with pytest.raises(TypeError, match="check_files must be a bool"):
        forced.load_state_dict(sd, check_files="no")


def test_every_source_is_described_in_pipeline_order_and_a_swap_names_its_place(folders):
    a, b = folders
    mixed = PIPELINES["mix"](a, b)
    sd = saved_mid_epoch(mixed)
    assert len(sd["files"]) == 2 and sd["files"][0] != sd["files"][1]
    with pytest.raises(ValueError, match=r"'files\[0\]' does not match source 0 of 2 in the pipeline.*part-000.parquet \(size \d+, footer:"):
        make_loader(PIPELINES["mix"](b, a)).load_state_dict(sd)
    with pytest.raises(ValueError, match=r"'files' describes 2 source\(s\) of files but this loader's dataset reads 1 "
                                         r"\(parquet\(files=2.*\)\); the state was saved for another pipeline"):
        make_loader(PIPELINES["smap"](a, a)).load_state_dict(sd)


def test_a_state_without_sources_is_refused_by_a_pipeline_with_one_and_old_states_say_what_they_lack(folders):
    a, _ = folders
    plain = make_loader(list(range(ROWS)))
    sd = json_round_trip(plain.state_dict())
    assert sd["files"] == []
    with pytest.raises(ValueError, match=r"'files' describes 0 source\(s\) of files but this loader's dataset reads 1"):
        make_loader(PIPELINES["smap"](a, a)).load_state_dict(sd)
    # a version-3 state had "files": null for a wrapped source (not recorded): not checked
    v3 = {**without_positions(saved_mid_epoch(PIPELINES["smap"](a, a))), "version": 3, "files": None}
    make_loader(PIPELINES["smap"](a, a)).load_state_dict(v3)
    # a version-3 state of a bare source held its description, a fingerprint of absolute paths and
    # modification times: it cannot be compared with a fingerprint of content, so it is refused,
    # naming the override, which resumes it
    bare = saved_mid_epoch(seqloader.parquet(a))
    v3_bare = {**without_positions(bare), "version": 3, "files": {**bare["files"][0], "fingerprint": "0123456789abcdef"}}
    loader = make_loader(seqloader.parquet(a))
    with pytest.raises(ValueError, match=r"'files\[0\]' was saved by an older seqloader \(state version 3\).*"
                                         r"check_files=False"):
        loader.load_state_dict(v3_bare)
    loader.load_state_dict(v3_bare, check_files=False)
    assert loader.state_dict()["files"] == bare["files"]
