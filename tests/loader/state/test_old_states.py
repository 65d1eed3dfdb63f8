"""A state saved by any earlier release resumes exactly, or is refused naming both versions.

``old_states/`` holds states written by the releases themselves: each release's tree, taken from
git history, was run with the venv's torch and numpy and saved its state mid-epoch (after epoch 0
and 6 batches of epoch 1, ``batch_size=4``, ``shuffle=True``, ``seed=1234``, ``num_workers=0``).
:data:`CASES` says which release wrote each file and over which dataset. A state that loads must
give, batch by batch (``torch.equal``), what an uninterrupted run gives from its position: the rest
of its epoch and the next epoch. An uninterrupted run uses the state's derivation of orders and
seeds, which a loaded state keeps (version 1 meant derivation 1: 0.1's numpy permutation and
64-bit torch seeds). A state that cannot resume must raise ``ValueError`` naming its version and
this seqloader's, and leave the loader as it was.

The files are read relative to this file, as is ``CHANGELOG.md`` (three folders up): the tests may run
from a copy of the checkout without ``seqloader/``, against an installed wheel.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import torch

import seqloader
from seqloader import DataLoader
from seqloader.loader.state.state import VERSION, LoaderState
from seqloader.testing import assert_batches_equal

OLD_STATES = Path(__file__).resolve().parent / "old_states"
CHANGELOG = Path(__file__).resolve().parents[3] / "CHANGELOG.md"


class Items(torch.utils.data.Dataset):
    """Item ``i`` and a draw from torch's global generator (seeded per batch by the loader, so the
    derivation decides the draws as well as the order)."""

    def __len__(self):
        return 100

    def __getitem__(self, i):
        return torch.tensor([i, int(torch.randint(0, 1000, ()))])


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(100))


def items(tmp_path: Path) -> DataLoader:
    return DataLoader(Items(), batch_size=4, shuffle=True, seed=1234, num_workers=0)


def stream(tmp_path: Path) -> DataLoader:
    return DataLoader(Stream(), batch_size=4, seed=1234, num_workers=0)


def parquet_ids(tmp_path: Path) -> DataLoader:
    """A bare Parquet source of ids 0-99 (2 files of 50 rows, one row group each), laid out as the
    folder the version-3 state was saved over."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    folder = tmp_path / "ids"
    if not folder.exists():
        folder.mkdir()
        for k in range(2):
            ids = torch.arange(50 * k, 50 * (k + 1), dtype=torch.int64).numpy()
            pq.write_table(pa.table({"id": ids}), folder / f"part-{k:03d}.parquet", row_group_size=50)
    return DataLoader(seqloader.parquet(str(folder)), batch_size=4, shuffle=True, seed=1234, num_workers=0)


@dataclasses.dataclass(frozen=True)
class Case:
    """How an old state was written, and what loading it does now."""

    #: the release (and its commit) whose tree wrote the file, and the loader it was saved from
    saved_by: str
    #: the same loader, made now (``tmp_path`` -> a fresh loader with the same dataset and arguments)
    make: Callable[[Path], DataLoader]
    #: ``None``: it loads; else the refusal's match (it must also name both versions, see below)
    refused: Optional[str] = None
    #: the arguments with which a refused state loads anyway, at the user's word (then it must resume exactly)
    override: Optional[dict[str, Any]] = None


#: file name (without ``.json``) -> how it was written and what loading it does now
CASES = {
    "v1": Case("seqloader 0.1 (1c5827e), Items", items),
    # an IterableDataset on torch's workers, with other random streams and stream states
    "v1_iterable": Case("seqloader 0.1 (1c5827e), Stream, after 6 batches of epoch 0", stream,
                        refused=r"version-1 state_dict was saved for an IterableDataset"),
    "v2": Case("seqloader 0.1, the drop-in release (8002e98), Items", items),
    # 'files' of a bare source: 0.2's fingerprint of absolute paths and modification times
    "v3": Case("seqloader 0.2 (8c3dde0), a bare parquet() source", parquet_ids,
               refused=r"'files\[0\]' was saved by an older seqloader \(state version 3\).*check_files=False",
               override={"check_files": False}),
    # 'files' null: the dataset was not a source, nothing was fingerprinted
    "v3_no_source": Case("seqloader 0.2 (8c3dde0), Items", items),
    "v4": Case("seqloader 0.3 (8cb47e0), Items", items),
    "v5": Case("seqloader 0.4.0 (issue 36: 'positions'), Items", items),
}


def read(name: str) -> dict:
    return json.loads((OLD_STATES / f"{name}.json").read_text(encoding="utf-8"))


def assert_names_both_versions(message: str, saved: int) -> None:
    """The state's version, this seqloader's version and its release."""
    assert re.search(rf"\bversion[- ]{saved}\b", message), f"the state's version {saved} is not named: {message}"
    assert re.search(rf"\bversions? (\d+-)?{VERSION}\b", message), f"this version {VERSION} is not named: {message}"
    assert f"seqloader {seqloader.__version__}" in message, f"this release is not named: {message}"


def uninterrupted(make: Callable[[Path], DataLoader], state: dict, tmp_path: Path) -> tuple[list, list]:
    """The batches an uninterrupted run yields from the state's position: the rest of its epoch and
    the next epoch, with the state's derivation (a fresh loader's, unless it is the old one)."""
    loader = make(tmp_path)
    start = LoaderState.from_dict(state).to_dict()
    if start["derivation"] != loader.state_dict()["derivation"]:   # the old state itself, at the epochs' start
        loader.load_state_dict({**state, **{k: v for k, v in {"epoch": 0, "position": 0, "step": 0, "ahead": []}.items()
                                            if k in state}})
    epochs = [list(loader) for _ in range(state["epoch"] + 2)]
    assert state["position"] % state["batch_size"] == 0
    return epochs[-2][state["position"] // state["batch_size"]:], epochs[-1]


def test_every_state_version_has_a_file_and_every_file_a_case():
    names = sorted(p.stem for p in OLD_STATES.glob("*.json"))
    assert names == sorted(CASES), f"old_states/ holds {names}; CASES describes {sorted(CASES)}"
    assert sorted({read(n)["version"] for n in names}) == list(range(1, VERSION + 1))


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.refused is None or c.override is not None])
def test_an_old_state_resumes_exactly(name, tmp_path):
    case, state = CASES[name], read(name)
    rest, nxt = uninterrupted(case.make, state, tmp_path)
    loader = case.make(tmp_path)
    loader.load_state_dict(state, **(case.override or {}))
    now = loader.state_dict()
    assert (now["version"], now["epoch"], now["position"]) == (VERSION, state["epoch"], state["position"])
    assert now["derivation"] == state.get("derivation", 1)  # version 1 meant derivation 1; a loaded state keeps its own
    assert len(rest) == 19
    assert_batches_equal(list(loader), rest, f"{name}: the rest of epoch {state['epoch']}")
    assert_batches_equal(list(loader), nxt, f"{name}: epoch {state['epoch'] + 1}")


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.refused is not None])
def test_an_old_state_that_cannot_resume_is_refused_naming_both_versions(name, tmp_path):
    case, state = CASES[name], read(name)
    loader = case.make(tmp_path)
    before = loader.state_dict()
    with pytest.raises(ValueError, match=case.refused) as refused:
        loader.load_state_dict(state)
    assert_names_both_versions(str(refused.value), state["version"])
    assert loader.state_dict() == before


def test_a_state_of_a_newer_version_is_refused_naming_both_versions(tmp_path):
    newer = {**read("v4"), "version": VERSION + 1}
    loader = items(tmp_path)
    before = loader.state_dict()
    with pytest.raises(ValueError, match=rf"this state_dict has version {VERSION + 1}, newer than") as refused:
        loader.load_state_dict(newer)
    assert_names_both_versions(str(refused.value), VERSION + 1)
    assert loader.state_dict() == before


def test_a_state_names_the_release_that_saved_it_and_loading_ignores_it(tmp_path):
    loader = items(tmp_path)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert state["saved_with"]["seqloader"] == seqloader.__version__
    resumed = items(tmp_path)
    resumed.load_state_dict({**state, "saved_with": {**state["saved_with"], "seqloader": "9.9"}})
    assert resumed.state_dict()["saved_with"]["seqloader"] == seqloader.__version__  # saved again: by this release
    assert_batches_equal(list(resumed), list(it))
    old = items(tmp_path)
    old.load_state_dict(read("v4"))  # 0.3 did not record its release
    assert old.state_dict()["saved_with"]["seqloader"] == seqloader.__version__
    with pytest.raises(ValueError, match=r"'saved_with.seqloader' must be a str"):
        items(tmp_path).load_state_dict({**state, "saved_with": {"seqloader": 4}})


def test_the_changelog_s_newest_entry_is_this_release():
    if not CHANGELOG.is_file():
        pytest.fail(f"CHANGELOG.md not found at {CHANGELOG} (the repository root, three folders above this test): "
                    "every release is recorded there, newest first")
    text = CHANGELOG.read_text(encoding="utf-8")
    entries = re.split(r"^## ", text, flags=re.M)[1:]
    if entries and entries[0].split()[0] == "Unreleased":   # what main holds beyond the last release
        assert "State format:" in entries[0], "the Unreleased entry does not say which state format it saves"
        coming = re.match(r"Unreleased \((\S+)\)", entries[0])
        assert coming, "the Unreleased entry does not name the release it prepares: '## Unreleased (X.Y.Z)'"
        assert re.fullmatch(rf"{re.escape(coming.group(1))}\.dev\d+", seqloader.__version__), (
            f"CHANGELOG.md's Unreleased entry prepares {coming.group(1)}, but seqloader.__version__ is "
            f"{seqloader.__version__}: main's version is that release's development version "
            f"({coming.group(1)}.devN), so that a state saved with main's changes says so")
        assert f"State format: {VERSION} " in entries[0], f"the Unreleased entry does not name state format {VERSION}"
        return
    assert entries, "CHANGELOG.md has no release entry ('## <version> ...')"
    newest = entries[0].split()[0]
    assert newest == seqloader.__version__, (f"CHANGELOG.md's newest entry is {newest}, but seqloader.__version__ is "
                                             f"{seqloader.__version__}: record the release (or fix the version)")
    assert f"State format: {VERSION} " in entries[0], f"the newest entry does not name state format {VERSION}"
