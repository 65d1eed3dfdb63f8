"""The state dict: JSON types, small, same keys at all times, validated before anything changes."""

from __future__ import annotations

import json

import pytest
from torch.utils.data import Sampler

from seqloader import BijectiveShuffleSampler, DataLoader
from seqloader.loader import state as state_mod
from seqloader.loader.state import KEYS, LoaderState

from seqloader.testing import json_round_trip


def make(**kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("shuffle", True)
    return DataLoader(list(range(10)), seed=3, **kw)


def states_over_an_epoch(loader):
    out = [loader.state_dict()]
    for _ in loader:
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
    assert (states[-1]["epoch"], states[-1]["position"]) == (1, 0)


def test_state_values():
    sd = make().state_dict()
    assert sd == {"format": "seqloader.DataLoader", "version": 1, "seed": 3, "epoch": 0, "position": 0,
                  "dataset_len": 10, "batch_size": 4, "drop_last": False, "shuffle": True, "sampler_len": None,
                  "sampler": None, "dataset": None, "iterable": None,
                  "saved_with": {"num_workers": 0, "world_size": 1}}


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
    ("batch_size", 5, "'batch_size' is 5 in the state_dict but this loader has batch_size=4"),
    ("drop_last", True, "'drop_last' is True in the state_dict but this loader has drop_last=False"),
    ("shuffle", False, "'shuffle' is False in the state_dict but this loader has shuffle=True"),
    ("sampler", {"x": 1}, "'sampler' holds a state in the state_dict but this loader's sampler has no state"),
    ("format", "torchdata", "unknown format 'torchdata'"),
    ("version", 2, "version 2, newer than this seqloader's version 1"),
    ("version", "1", "'version' must be a positive int"),
    ("epoch", -1, "'epoch' must be a non-negative int \\(got -1\\)"),
    ("position", 1.5, "'position' must be a non-negative int"),
    ("seed", 2**64, "'seed' must be an int in \\[0, 2\\*\\*64\\)"),
    ("drop_last", 0, "'drop_last' must be a bool"),
    ("iterable", {"workers": []}, "'iterable' must be None or a dict"),
    ("extra", 1, "unknown keys \\['extra'\\]"),
    ("position", 10, "'position' is 10 in the state_dict but an epoch of this loader has 10 samples"),
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
    """Pretend the current version is 3: a version-1 state goes through _MIGRATIONS[1] then [2]."""
    calls = []

    def step(v):
        def migrate(d):
            calls.append(v)
            return dict(d, version=v + 1, position=d["position"] + 1)
        return migrate

    sd = make().state_dict()
    monkeypatch.setattr(state_mod, "VERSION", 3)
    monkeypatch.setitem(state_mod._MIGRATIONS, 1, step(1))
    monkeypatch.setitem(state_mod._MIGRATIONS, 2, step(2))
    assert LoaderState.from_dict(sd).position == 2 and calls == [1, 2]
    assert state_mod._MIGRATIONS is not None


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
