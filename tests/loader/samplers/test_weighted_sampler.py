"""WeightedSampler: draws follow the weights, are a pure function of (seed, epoch, position), change
only from a reweight on, resume from a small JSON state with a fingerprint check, and validate input."""

from __future__ import annotations

import json
import pickle
import re

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import seqloader
from seqloader.loader.samplers.weighted import WeightedOrder, WeightedSampler, fingerprint

seeds = st.integers(0, 2**64 - 1)


def draws(sampler: WeightedSampler, epoch: int, positions) -> list:
    return sampler.order(epoch).lookup(np.asarray(positions, dtype=np.int64))


def chi_square(counts: np.ndarray, weights: np.ndarray) -> float:
    expected = counts.sum() * weights / weights.sum()
    keep = expected > 0
    return float((((counts - expected) ** 2)[keep] / expected[keep]).sum())


# -- the draws -------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2**64 - 1])
def test_draws_follow_the_weights(seed):
    w = np.array([1.0, 2.0, 3.0, 0.0, 4.0, 0.5])
    s = WeightedSampler(w, num_samples=200_000, seed=seed)
    counts = np.bincount(np.array(list(s)), minlength=len(w))
    assert counts[3] == 0
    # 4 degrees of freedom (5 positive weights): P(chi2 > 40) is about 4e-8; the seeds are fixed
    assert chi_square(counts, w) < 40
    epoch1 = np.bincount(np.array(draws(s, 1, np.arange(200_000))), minlength=len(w))
    assert chi_square(epoch1, w) < 40 and not np.array_equal(epoch1, counts)


def test_per_sample_weights_of_a_million_indices():
    rng = np.random.default_rng(0)
    w = rng.random(10**6)
    w[w < 0.5] = 0
    s = WeightedSampler(w, num_samples=100_000, seed=3)
    picked = np.array(draws(s, 0, np.arange(100_000)))
    assert (w[picked] > 0).all() and len(np.unique(picked)) > 80_000
    assert abs(np.mean(picked < 500_000) - w[:500_000].sum() / w.sum()) < 0.01


@given(seeds, st.integers(0, 5), st.lists(st.integers(0, 999), min_size=1, max_size=50))
def test_a_position_draws_the_same_index_whatever_the_read_order(seed, epoch, positions):
    w = [0.5, 0, 2, 1, 0, 3]
    s = WeightedSampler(w, 1000, seed=seed)
    order = s.order(epoch)
    got = order.lookup(np.array(positions, dtype=np.int64))
    assert got == [order.lookup(np.array([p]))[0] for p in positions]
    assert got == [x for p in reversed(positions) for x in order.run(p, 1, 1)][::-1]
    fresh = pickle.loads(pickle.dumps(WeightedSampler(w, 1000, seed=seed)))
    assert got == draws(fresh, epoch, positions)
    assert all(w[i] > 0 for i in got)
    first = positions[0]
    assert order.run(first, 4, 3) == draws(s, epoch, [first, first + 3, first + 6, first + 9])


def test_iteration_follows_the_epoch_and_torch_can_use_it():
    s = WeightedSampler([1, 1, 1, 1], 50, seed=4)
    e0 = list(s)
    s.set_epoch(1)
    assert list(s) == draws(s, 1, range(50)) and list(s) != e0 and len(s) == 50
    data = torch.arange(4) * 10
    batches = list(torch.utils.data.DataLoader(data, sampler=s, batch_size=10))
    assert torch.cat(batches).tolist() == [10 * i for i in draws(s, 1, range(50))]


def test_golden_draws():
    # Pinned on purpose: changing the hash changes what a saved position names.
    s = WeightedSampler([1, 2, 3, 4], 12, seed=7)
    assert list(s) == GOLDEN
    s.reweight([0, 0, 1, 1], epoch=0, position=6)
    assert s.order(0).run(6, 6, 1) == GOLDEN_AFTER


GOLDEN = [3, 3, 2, 3, 2, 3, 1, 2, 2, 0, 3, 3]
GOLDEN_AFTER = [2, 2, 3, 3, 2, 3]


# -- reweighting -----------------------------------------------------------------------------------

def test_a_reweight_changes_only_positions_at_and_after_it():
    w1, w2 = np.array([1.0, 1, 1, 1]), np.array([0.0, 0, 5, 1])
    s = WeightedSampler(w1, 1000, seed=11)
    before = s.order(0)
    old = before.lookup(np.arange(1000))
    s.reweight(w2, epoch=0, position=400)
    after = s.order(0)
    new = after.lookup(np.arange(400, 1000))
    assert before.lookup(np.arange(1000)) == old, "an order built before a reweight keeps its weights"
    assert old[:400] == draws(WeightedSampler(w1, 1000, seed=11), 0, range(400))
    assert set(new) <= {2, 3} and new != old[400:]
    assert np.mean(np.array(new) == 2) > 0.75
    assert after.lookup(np.arange(400)) == old[:400]
    assert set(draws(s, 1, range(1000))) <= {2, 3}, "later epochs use the new weights"


def test_reweights_in_later_epochs_and_replacing_the_last_one():
    s = WeightedSampler([1, 1, 1], 100, seed=2)
    s.reweight([1, 0, 0], epoch=2, position=0)
    assert s.order(1).run(0, 100, 1) == draws(WeightedSampler([1, 1, 1], 100, seed=2), 1, range(100))
    assert set(draws(s, 2, range(100))) == {0}
    s.reweight([0, 1, 0], epoch=3, position=50)
    s.reweight([0, 0, 1], epoch=3, position=50)  # the same pair replaces the last change
    assert [c[:2] for c in s.changes] == [(0, 0), (2, 0), (3, 50)]
    assert set(draws(s, 3, range(50, 100))) == {2} and set(draws(s, 4, range(100))) == {2}
    assert set(draws(s, 3, range(50))) == {0}
    assert len(s._held) == 3, "the replaced weights are dropped"


def test_a_reweight_draws_fresh_uniforms():
    """Segment ``c`` keys its own uniforms: the same weights after a reweight draw anew."""
    w = np.ones(1000)
    s = WeightedSampler(w, 1000, seed=5)
    old = draws(s, 0, range(1000))
    s.reweight(w, epoch=0, position=0)  # replaces the initial weights: the same draws
    assert draws(s, 0, range(1000)) == old
    s.reweight(w, epoch=0, position=1)
    assert np.mean(np.array(draws(s, 0, range(1, 1000))) == np.array(old[1:])) < 0.01


# -- state -------------------------------------------------------------------------------------------

def test_state_round_trips_as_small_json_and_resumes():
    w1, w2, w3 = np.ones(10**5), np.arange(10**5, dtype=float), np.arange(10**5, 0, -1, dtype=float)
    s = WeightedSampler(w1, 5000, seed=42)
    s.reweight(w2, epoch=0, position=1000)
    s.reweight(w3, epoch=1, position=64)
    state = s.state_dict()
    assert json.loads(json.dumps(state)) == state and len(json.dumps(state)) < 1024
    assert state == {"seed": 42, "num_samples": 5000, "num_weights": 10**5,
                     "changes": [[0, 0, fingerprint(w1)], [0, 1000, fingerprint(w2)], [1, 64, fingerprint(w3)]]}
    resumed = WeightedSampler(w3, 5000, seed=0)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert resumed.state_dict() == state
    assert draws(resumed, 1, range(64, 5000)) == draws(s, 1, range(64, 5000))
    assert draws(resumed, 2, range(5000)) == draws(s, 2, range(5000))
    with pytest.raises(ValueError, match=re.escape(
            "WeightedSampler: position 63 of epoch 1 draws with the weights of the change at (epoch 0, position "
            "1000), which this sampler does not hold (a loaded state has their fingerprint, not the weights); "
            "read from its last change (epoch 1, position 64) on")):
        draws(resumed, 1, [63, 64])
    s.reweight(w1, epoch=3, position=0)
    resumed = WeightedSampler(w1, 5000, seed=0)
    resumed.load_state_dict(s.state_dict())
    assert draws(resumed, 0, range(1000)) == draws(s, 0, range(1000)), "the first stretch used an equal array"


def test_resuming_with_other_weights_raises_and_changes_nothing():
    s = WeightedSampler([1, 2, 3], 10, seed=1)
    s.reweight([3, 2, 1], epoch=0, position=5)
    state = s.state_dict()
    other = WeightedSampler([1, 2, 3], 10, seed=9)
    with pytest.raises(ValueError, match=re.escape(
            f"WeightedSampler.load_state_dict: the weights' fingerprint is {fingerprint([1, 2, 3])} but the "
            f"state's last change (epoch 0, position 5) has {fingerprint([3, 2, 1])}; build the sampler with "
            "the weights in force when the state was saved")):
        other.load_state_dict(state)
    assert other.seed == 9 and len(other.changes) == 1
    for key, value, msg in [("num_samples", 11, "'num_samples' is 11 in the state but this sampler has 10"),
                            ("num_weights", 4, "'num_weights' is 4 in the state but this sampler has 3"),
                            ("changes", [], "'changes' must be a non-empty list"),
                            ("changes", [[0, 1, "x"]], "'changes'[0] must be [epoch, position, fingerprint]"),
                            ("changes", [[0, 0, "x"], [0, 0, "y"]], "'changes'[1] must be")]:
        with pytest.raises(ValueError, match=re.escape(msg)):
            other.load_state_dict({**state, key: value})


def test_with_seqloader_dataloader_resume_is_exact():
    data = list(range(200))
    w = np.linspace(0, 1, 200)
    loader = seqloader.DataLoader(data, batch_size=16, sampler=WeightedSampler(w, 160, seed=3))
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = loader.state_dict()
    rest = [b.tolist() for b in it]
    again = seqloader.DataLoader(data, batch_size=16, sampler=WeightedSampler(w, 160, seed=0))
    again.load_state_dict(state)
    assert [b.tolist() for b in again] == rest and 0 not in sum(rest, [])


# -- validation ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("weights, num_samples, exc, msg", [
    ([1, -1], 5, ValueError, "WeightedSampler: weights must be >= 0 (weights[1] is -1)"),
    ([1, float("nan")], 5, ValueError, "WeightedSampler: weights must be finite (weights[1] is nan)"),
    ([float("inf"), 1], 5, ValueError, "WeightedSampler: weights must be finite (weights[0] is inf)"),
    ([0, 0.0], 5, ValueError, "WeightedSampler: weights are all 0; at least one must be > 0"),
    ([], 5, ValueError, "WeightedSampler: weights must not be empty"),
    ([1e308, 1e308], 5, ValueError, "WeightedSampler: weights sum to inf"),
    ([[1, 2]], 5, TypeError, "WeightedSampler: weights must be a 1-D sequence of numbers"),
    (["a"], 5, TypeError, "WeightedSampler: weights must be a 1-D sequence of numbers"),
    ([True, False], 5, TypeError, "WeightedSampler: weights must be a 1-D sequence of numbers"),
    ([1, 2], 0, ValueError, "WeightedSampler: num_samples must be a positive int (got 0)"),
    ([1, 2], 2.0, TypeError, "WeightedSampler: num_samples must be an int (got float 2.0)"),
])
def test_bad_arguments_name_the_argument(weights, num_samples, exc, msg):
    with pytest.raises(exc, match="^" + re.escape(msg)):
        WeightedSampler(weights, num_samples, seed=0)


def test_bad_reweights_name_the_argument():
    s = WeightedSampler([1, 2, 3], 10, seed=0)
    s.reweight([1, 1, 1], epoch=1, position=5)
    for kwargs, exc, msg in [
        ({"weights": [1, 1], "epoch": 2, "position": 0}, ValueError,
         "WeightedSampler.reweight: weights has 2 entries but the sampler has 3"),
        ({"weights": [0, 0, 0], "epoch": 2, "position": 0}, ValueError,
         "WeightedSampler.reweight: weights are all 0"),
        ({"weights": [1, -2, 0], "epoch": 2, "position": 0}, ValueError,
         "WeightedSampler.reweight: weights must be >= 0"),
        ({"weights": [1, 1, 1], "epoch": 1, "position": 4}, ValueError,
         "WeightedSampler.reweight: (epoch=1, position=4) is before the last change at (epoch=1, position=5)"),
        ({"weights": [1, 1, 1], "epoch": 2, "position": 11}, ValueError,
         "WeightedSampler.reweight: position must be <= num_samples (10) (got 11)"),
        ({"weights": [1, 1, 1], "epoch": -1, "position": 0}, ValueError,
         "WeightedSampler.reweight: epoch must be a non-negative int (got -1)"),
    ]:
        with pytest.raises(exc, match="^" + re.escape(msg)):
            s.reweight(**kwargs)
    assert len(s.changes) == 2


def test_tensors_are_accepted_and_the_order_is_an_order():
    s = WeightedSampler(torch.tensor([0.0, 1.0, 1.0]), 6, seed=1)
    o = s.order(0)
    assert isinstance(o, WeightedOrder) and isinstance(o, seqloader.orders.orders.Order) and o.n == 6
    assert 0 not in o.run(0, 6, 1)
    assert repr(s) == "WeightedSampler(num_weights=3, num_samples=6, changes=0, seed=1)"
