"""The state dict: JSON types, small, same keys at all times, validated before anything changes."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import Sampler

import seqloader
from seqloader import BijectiveShuffleSampler, DataLoader
from seqloader.loader.state import state as state_mod
from seqloader.loader.state.state import KEYS, LoaderState

from seqloader.testing import json_round_trip


def make(**kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("shuffle", True)
    return DataLoader(list(range(10)), seed=3, **kw)


def states_over_an_epoch(loader):
    """The state before the epoch, after each batch, and after StopIteration."""
    out = [loader.state_dict()]
    for _ in loader:
        out.append(loader.state_dict())
    out.append(loader.state_dict())
    return out


@pytest.mark.parametrize("kw", [{}, {"shuffle": False, "drop_last": True}, {"batch_size": None}])
def test_json_small_and_same_keys_and_types_before_mid_and_after(kw):
    states = states_over_an_epoch(make(**kw))
    for sd in states:
        assert list(sd) == list(KEYS)
        assert json_round_trip(sd) == sd
        assert len(json.dumps(sd).encode()) < 1024
        assert {k: type(v) for k, v in sd.items()} == {k: type(v) for k, v in states[0].items()}
    assert [(s["epoch"], s["position"]) for s in states][:2] == [(0, 0), (0, 4 if kw.get("batch_size", 4) else 1)]
    end = 8 if kw.get("drop_last") else 10
    assert (states[-2]["epoch"], states[-2]["position"]) == (0, end)  # after the last batch
    assert (states[-1]["epoch"], states[-1]["position"]) == (1, 0)    # after StopIteration


def test_state_values():
    sd = make().state_dict()
    assert sd == {"format": "seqloader.DataLoader", "version": 5, "seed": 3, "epoch": 0, "position": 0,
                  "ahead": [], "step": 0, "dataset_len": 10, "batch_size": 4, "drop_last": False, "shuffle": True,
                  "derivation": 2, "sampler_len": None, "sampler_epoch": None,
                  "sampler": None, "dataset": None, "iterable": None, "recipe": None, "files": [],
                  "positions": {"digest": "4f53cda18c2baa0c", "stages": []},  # a list: no stage describes itself
                  "saved_with": {"num_workers": 0, "world_size": 1, "seqloader": seqloader.__version__}}


def test_saved_with_is_ignored_and_the_seed_comes_from_the_state():
    a = make()
    it = iter(a)
    next(it)
    sd = a.state_dict()
    b = DataLoader(list(range(10)), batch_size=4, shuffle=True, seed=99)
    b.load_state_dict({**sd, "saved_with": {"num_workers": 8, "world_size": 64}})
    assert b.seed == 3
    assert [x.tolist() for x in b] == [x.tolist() for x in it]


@pytest.mark.parametrize("key, value, match", [
    ("dataset_len", 11, "'dataset_len' is 11 in the state_dict but len\\(dataset\\) is 10"),
    ("batch_size", 0, "'batch_size' must be None or a positive int"),
    ("drop_last", True, "'drop_last' is True in the state_dict but this loader has drop_last=False"),
    ("shuffle", False, "'shuffle' is False in the state_dict but this loader has shuffle=True"),
    ("sampler", {"x": 1}, "'sampler' holds a state in the state_dict but this loader's sampler has no state"),
    ("format", "torchdata", "unknown format 'torchdata'"),
    ("version", 6, "version 6, newer than this seqloader's version 5"),
    ("step", -1, "'step' must be a non-negative int"),
    ("recipe", {"weights": [[0, 0]]}, "'recipe.weights\\[0\\]' must be \\[step, epoch or None"),
    ("files", {"files": 3}, "'files' must be None or a list of file-list descriptions"),
    ("files", [{"files": 3}], "'files\\[0\\]' must be a dict with the keys \\['files', 'fingerprint'\\]"),
    ("files", [{"files": "3", "fingerprint": "ab"}], "'files\\[0\\].files' must be a non-negative int < 2\\*\\*63"),
    ("files", [{"files": 3, "fingerprint": "ab"}], "'files' describes 1 source\\(s\\) of files but this loader's "
                                                   "dataset reads 0 \\(none\\).*check_files=False"),
    ("derivation", 3, "'derivation' must be one of \\[1, 2\\]"),
    ("sampler_epoch", "1", "'sampler_epoch' must be None or an int"),
    ("version", "1", "'version' must be a positive int"),
    ("epoch", -1, "'epoch' must be a non-negative int < 2\\*\\*63 \\(got -1\\)"),
    ("position", 1.5, "'position' must be a non-negative int"),
    ("seed", 2**64, "'seed' must be an int in \\[0, 2\\*\\*64\\)"),
    ("drop_last", 0, "'drop_last' must be a bool"),
    ("iterable", {"workers": []}, "'iterable.workers' must be a non-empty list"),
    ("iterable", {"workers": [], "next_worker": 0}, "'iterable' must be None or a dict with the key 'workers'"),
    ("extra", 1, "unknown keys \\['extra'\\]"),
    ("position", 11, "'position' is 11 in the state_dict but an epoch of this loader has 10 samples"),
])
def test_mismatch_or_malformed_raises_and_leaves_the_loader_untouched(key, value, match):
    loader = make()
    it = iter(loader)
    next(it)
    before = loader.state_dict()
    sd = dict(make().state_dict(), **{key: value})
    with pytest.raises(ValueError, match=match):
        loader.load_state_dict(sd)
    assert loader.state_dict() == before
    assert len(list(it)) == 2  # the live iterator was not disturbed


def test_missing_key_and_not_a_dict():
    sd = make().state_dict()
    del sd["position"]
    with pytest.raises(ValueError, match="missing keys \\['position'\\]"):
        make().load_state_dict(sd)
    with pytest.raises(TypeError, match="expected a dict"):
        make().load_state_dict([1])


def test_migrations_upgrade_one_version_at_a_time(monkeypatch):
    """Pretend the current version is 6: a version-1 state goes through _MIGRATIONS[1], [2], [3], [4] then [5]."""
    calls = []

    full = make().state_dict()

    def step(v):
        def migrate(d):
            calls.append(v)
            return dict({**full, **d}, version=v + 1, position=d["position"] + 1)
        return migrate

    sd = {**{k: v for k, v in full.items() if k in state_mod.KEYS_OF_VERSION[1]}, "version": 1}
    monkeypatch.setattr(state_mod, "VERSION", 6)
    for v in (1, 2, 3, 4, 5):
        monkeypatch.setitem(state_mod._MIGRATIONS, v, step(v))
    assert LoaderState.from_dict(sd).position == 5 and calls == [1, 2, 3, 4, 5]
    assert state_mod._MIGRATIONS is not None


def test_the_real_migration_from_version_1_keeps_every_meaning_and_names_derivation_1():
    v4 = make().state_dict()
    v1 = {k: v for k, v in v4.items() if k not in ("derivation", "sampler_epoch", "ahead", "step", "recipe", "files",
                                                   "positions")}
    v1["version"] = 1
    migrated = LoaderState.from_dict(v1).to_dict()
    # files: not recorded before version 3, positions before version 5 (None: not checked)
    assert migrated == {**v4, "derivation": 1, "sampler_epoch": None, "ahead": [], "files": None, "positions": None}


def test_the_migration_from_version_2_counts_the_steps_before_the_position():
    loader = make()
    it = iter(loader)
    next(it), next(it)
    v4 = loader.state_dict()
    v2 = {k: v for k, v in v4.items() if k not in ("step", "recipe", "files", "positions")}
    v2["version"] = 2
    assert LoaderState.from_dict(v2).to_dict() == {**v4, "files": None, "positions": None} and v4["step"] == 2
    resumed = make()
    resumed.load_state_dict(v2)
    assert [b.tolist() for b in resumed] == [b.tolist() for b in it]


def test_stateful_sampler_substate_is_verbatim():
    class Counter(Sampler):
        def __init__(self):
            self.epochs = 0

        def __iter__(self):
            self.epochs += 1
            return iter(range(6))

        def __len__(self):
            return 6

        def state_dict(self):
            return {"epochs": self.epochs}

        def load_state_dict(self, sd):
            self.epochs = sd["epochs"]

    loader = DataLoader(list(range(6)), batch_size=2, sampler=Counter(), seed=0)
    assert loader.state_dict()["sampler"] == {"epochs": 0}
    it = iter(loader)
    next(it)
    assert loader.state_dict()["sampler"] == {"epochs": 0}  # as of the start of the epoch
    list(it)
    assert loader.state_dict()["sampler"] == {"epochs": 1}  # the next epoch starts from here


def test_bijective_sampler_state_and_size():
    n = 10**10
    loader = DataLoader(range(n), batch_size=4, sampler=BijectiveShuffleSampler(range(n), seed=5), seed=0)
    it = iter(loader)
    first = next(it)
    sd = loader.state_dict()
    assert sd["sampler"] == {"seed": 5} and len(json.dumps(sd)) < 1024
    resumed = DataLoader(range(n), batch_size=4, sampler=BijectiveShuffleSampler(range(n), seed=1), seed=0)
    resumed.load_state_dict(sd)
    assert next(iter(resumed)).tolist() == next(it).tolist()
    assert first.min() >= 0 and first.max() < n


def test_a_custom_sampler_of_another_length_is_refused():
    from torch.utils.data import DistributedSampler

    def loader(world):
        return DataLoader(list(range(12)), batch_size=2,
                          sampler=DistributedSampler(range(12), num_replicas=world, rank=0, shuffle=False))

    saved = loader(2)
    it = iter(saved)
    next(it)
    sd = saved.state_dict()
    assert sd["sampler_len"] == 6
    fresh = loader(3)
    with pytest.raises(ValueError, match=r"'sampler_len' is 6 in the state_dict but this loader's sampler has len 4"):
        fresh.load_state_dict(sd)
    assert fresh.state_dict()["position"] == 0  # untouched
    same = loader(2)
    same.load_state_dict(sd)
    assert [b.tolist() for b in same] == [b.tolist() for b in it]


class _Augmented(torch.utils.data.Dataset):
    """Item ``i`` and a draw from torch's global RNG (seeded per batch by the loader)."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return torch.tensor([i, int(torch.randint(0, 1000, ()))])


#: Written by seqloader 0.1 (commit 1c5827e) for DataLoader(_Augmented(), batch_size=3,
#: shuffle=True, seed=7) after one batch, with the batches 0.1 yielded after it: the rest of the
#: epoch and the next epoch (shuffled order and torch draws both came from derivation 1).
V1_STATE = {"format": "seqloader.DataLoader", "version": 1, "seed": 7, "epoch": 0, "position": 3,
            "dataset_len": 12, "batch_size": 3, "drop_last": False, "shuffle": True, "sampler_len": None,
            "sampler": None, "dataset": None, "iterable": None,
            "saved_with": {"num_workers": 0, "world_size": 1}}
V1_REST = [[[1, 105], [6, 61], [2, 17]], [[8, 623], [9, 358], [0, 0]], [[7, 434], [11, 609], [5, 401]]]
V1_NEXT = [[[8, 988], [6, 734], [11, 212]], [[1, 338], [10, 758], [3, 430]], [[4, 788], [9, 515], [0, 321]],
           [[7, 116], [2, 611], [5, 206]]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_version_1_state_resumes_exactly_as_seqloader_0_1_did(num_workers):
    loader = DataLoader(_Augmented(), batch_size=3, shuffle=True, seed=7, num_workers=num_workers)
    loader.load_state_dict(V1_STATE)
    assert loader.state_dict()["derivation"] == 1 and loader.state_dict()["version"] == 5
    assert [b.tolist() for b in loader] == V1_REST
    assert [b.tolist() for b in loader] == V1_NEXT  # later epochs keep the state's derivation


def test_new_states_use_derivation_2_whose_torch_seeds_fit_a_signed_64_bit_int():
    class Seeds(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return torch.tensor(torch.initial_seed())  # raises on overflow past 2**63 - 1

    seeds = torch.cat(list(DataLoader(Seeds(), batch_size=1, shuffle=True, seed=2**64 - 1)))
    assert len(set(seeds.tolist())) == 64


#: shuffle=True, seed=0, epoch 0 of range(10) under derivation 2 (a Feistel bijection keyed by
#: derive_seed(0, "shuffle", 0)); changing it means a new derivation and a state version bump.
GOLDEN_ORDER = [3, 4, 7, 2, 8, 6, 5, 0, 9, 1]


def test_the_default_shuffle_is_the_o1_bijection_pinned():
    loader = DataLoader(list(range(10)), batch_size=None, shuffle=True, seed=0)
    assert [int(x) for x in loader] == GOLDEN_ORDER


def test_derivation_constants_agree():
    from seqloader.loader.rngs.seeding import DERIVATION
    from seqloader.loader.state.state import DERIVATIONS, LoaderState
    assert DERIVATION == max(DERIVATIONS) == LoaderState(0, 0, 0, 1, 1, False, False).derivation


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_a_current_state_whose_version_was_edited_is_refused_naming_version(version):
    """An upgrade would overwrite what the state holds (1 -> 2 sets derivation 1, 4 -> 5 marks the
    fingerprints as version 4's): a state with the keys of a later version than it claims is refused."""
    sd = {**make().state_dict(), "version": version}
    with pytest.raises(ValueError, match=rf"^load_state_dict: 'version' is {version} in the state_dict, but it has "
                                         rf"the keys \[.*'positions'.*\] of version-5 states.*was 'version' edited\?"):
        LoaderState.from_dict(sd)


def test_a_version_4_state_called_version_3_is_refused_naming_version():
    sd = {k: v for k, v in make().state_dict().items() if k != "positions"}
    assert isinstance(sd["files"], list)
    LoaderState.from_dict({**sd, "version": 4})   # what it is: loads
    with pytest.raises(ValueError, match=r"'version' is 3 in the state_dict, but its 'files' is a list"):
        LoaderState.from_dict({**sd, "version": 3})


@pytest.mark.parametrize("key", ["files", "positions"])
def test_a_current_state_without_its_records_is_refused_naming_the_key(key):
    """``None`` means "not recorded, not checked" only for a state upgraded from before the record."""
    sd = make().state_dict()
    with pytest.raises(ValueError, match=rf"^load_state_dict: '{key}' must be a .* in a version-5 state_dict"):
        LoaderState.from_dict({**sd, key: None})
    with pytest.raises(ValueError, match=rf"missing keys \['{key}'\]"):
        LoaderState.from_dict({k: v for k, v in sd.items() if k != key})


def test_an_iterable_datasets_state_records_no_positions():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(8))

    loader = seqloader.DataLoader(Stream(), batch_size=2)
    it = iter(loader)
    next(it)
    sd = loader.state_dict()
    assert sd["positions"] is None and sd["iterable"] is not None
    assert LoaderState.from_dict(sd).to_dict() == sd


def test_torchdatas_iterator_finished_key_that_accelerate_adds_is_accepted_and_checked():
    """accelerate's stateful path adds ``_iterator_finished`` to the state it keeps and hands back."""
    make_loader = lambda: seqloader.DataLoader(range(10), batch_size=2, shuffle=True, seed=1)  # noqa: E731
    reference = make_loader()
    it = iter(reference)
    first = [next(it) for _ in range(2)]
    mid = json_round_trip(reference.state_dict())
    rest = list(it)
    after = json_round_trip(reference.state_dict())   # after StopIteration: the next epoch's start
    nxt = list(reference)
    resumed = make_loader()
    resumed.load_state_dict({**mid, "_iterator_finished": False})
    assert [b.tolist() for b in resumed] == [b.tolist() for b in rest] and len(first) == 2
    resumed.load_state_dict({**after, "_iterator_finished": True})
    assert [b.tolist() for b in resumed] == [b.tolist() for b in nxt]
    with pytest.raises(ValueError, match=r"'_iterator_finished' is True \(the epoch ended\) but 'position' is 4"):
        resumed.load_state_dict({**mid, "_iterator_finished": True})
    with pytest.raises(ValueError, match=r"'_iterator_finished' must be a bool"):
        resumed.load_state_dict({**mid, "_iterator_finished": "yes"})
    assert "_iterator_finished" not in resumed.state_dict()
