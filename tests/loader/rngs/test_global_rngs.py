"""Raw snapshots of the global RNGs restore exactly what the public ``get_state`` APIs would.

``seqloader.loader.rngs.snapshots`` copies the states' bytes (found by probing, see its docstring)
instead of going through ``numpy.random.get_state``/``random.getstate``; each test compares
with the public APIs, including the cached Gaussians both generators keep beside their words.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seqloader import DataLoader
from seqloader.loader.rngs import snapshots as global_rngs
from seqloader.loader.rngs.snapshots import Snapshot


def public_states():
    np_state = np.random.get_state()
    return (np_state[0], np_state[1].tolist(), *np_state[2:]), random.getstate(), torch.get_rng_state()


def assert_same(a, b):
    assert a[0] == b[0]
    assert a[1] == b[1]
    assert torch.equal(a[2], b[2])


def draw(kind: int, seed: int) -> None:
    """Move the three generators in one of several ways, including the cached Gaussians."""
    if kind == 0:
        np.random.seed(seed % 2**32)
        random.seed(seed)
        torch.manual_seed(seed)
    elif kind == 1:
        np.random.randn(seed % 5 + 1)       # an odd count leaves a cached Gaussian
        random.gauss(0, 1)                   # sets or uses gauss_next
    elif kind == 2:
        np.random.randint(0, 100, size=seed % 700)  # crosses a 624-word refill sometimes
        random.random()
    else:
        torch.rand(seed % 9 + 1)
        np.random.rand()


def test_this_build_takes_the_fast_path():
    """CI's Python and numpy: the raw layout is found (a numpy upgrade that breaks it shows here)."""
    assert global_rngs.layout() is not None


@settings(max_examples=40)
@given(before=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2**40)), max_size=6),
       inside=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2**40)), min_size=1, max_size=6),
       fast=st.booleans())
def test_restore_puts_back_exactly_the_public_state(before, inside, fast):
    with pytest.MonkeyPatch.context() as mp:
        if not fast:  # the public-API path, used where the layout is not found
            mp.setattr(global_rngs, "layout", lambda: None)
        check_round_trip(before, inside)


def check_round_trip(before, inside):
    for kind, seed in before:
        draw(kind, seed)
    want = public_states()
    snap = Snapshot()
    for kind, seed in inside:
        draw(kind, seed)
    snap.restore()
    assert_same(public_states(), want)
    # and the next draws are the ones the saved state gives, cached Gaussians first
    got = (np.random.randn(3).tolist(), random.gauss(0, 1), torch.rand(2))
    np.random.set_state(want[0][:1] + (np.array(want[0][1], dtype=np.uint32),) + want[0][2:])
    random.setstate(want[1])
    torch.set_rng_state(want[2])
    assert got[:2] == (np.random.randn(3).tolist(), random.gauss(0, 1))
    assert torch.equal(got[2], torch.rand(2))


class Draws(torch.utils.data.Dataset):
    """Items drawn from the three global RNGs, Gaussians included."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return torch.tensor([float(np.random.randn()), random.gauss(0, 1), float(torch.randn(()))])


def test_the_callers_states_with_cached_gaussians_are_untouched_by_each_batch():
    np.random.seed(1)
    np.random.randn()          # numpy now holds a cached second Gaussian
    random.seed(2)
    random.gauss(0, 1)         # and random its gauss_next
    torch.manual_seed(3)
    it = iter(DataLoader(Draws(), batch_size=5, shuffle=True, seed=0))
    batches = []
    while True:
        before = public_states()
        try:
            batches.append(next(it))
        except StopIteration:
            break
        assert_same(public_states(), before)
    want = public_states()
    again = list(DataLoader(Draws(), batch_size=5, shuffle=True, seed=0))
    assert_same(public_states(), want)
    assert all(torch.equal(a, b) for a, b in zip(batches, again))  # batches do not depend on the caller


def test_the_raw_views_follow_a_replaced_bit_generator_and_step_aside_for_another_kind():
    """``np.random.set_bit_generator`` swaps the global RandomState's bit generator: the views are
    made again over the new MT19937, and a generator of another kind takes the public route."""
    original = np.random.get_bit_generator()
    views = global_rngs.raw_views()
    assert views is None or global_rngs.raw_views() is views   # made once
    try:
        for replacement in (np.random.MT19937(5), np.random.PCG64(5)):
            np.random.set_bit_generator(replacement)
            np.random.rand(3)
            before = np.random.get_state(legacy=False)
            snap = Snapshot()
            np.random.seed(11) if isinstance(replacement, np.random.MT19937) else np.random.rand(7)
            snap.restore()
            assert repr(np.random.get_state(legacy=False)) == repr(before)
            again = global_rngs.raw_views()
            if isinstance(replacement, np.random.MT19937):
                assert again is None or again.bit_generator is replacement
            else:
                assert again is None and global_rngs.numpy_state() == repr(np.random.get_state(legacy=False))
    finally:
        np.random.set_bit_generator(original)
    assert views is None or global_rngs.raw_views().bit_generator is original


class _Draws(torch.utils.data.Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.tensor([float(i), random.random(), float(np.random.rand()), float(torch.rand(()))],
                            dtype=torch.float64)


def test_tiny_items_at_zero_workers_give_the_pinned_batches_and_leave_the_callers_states():
    """The per-batch seeding and the raw snapshots at ``num_workers=0`` (made cheaper in issue 37:
    views instead of ctypes calls, a cached hash prefix) give the draws pinned before that change,
    and the caller's generators continue as if no batch had been computed."""
    random.seed(1); np.random.seed(1); torch.manual_seed(1)
    loader = DataLoader(_Draws(), batch_size=8, shuffle=True, seed=7)
    out = [b for _ in range(2) for b in loader]
    assert out[0][0].tolist() == [15.0, 0.7260940511911348, 0.7805723612866897, 0.9617650508880615]
    assert out[-1][-1].tolist() == [29.0, 0.7812821267785609, 0.13428639319608926, 0.732358455657959]
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == (
        0.13436424411240122, 0.417022004702574, 0.7576315999031067)   # as right after seeding with 1


# -- the one seeder and the one draw check (seqloader/loader/rngs/generators.py, issue 42) ---------------------------


def test_the_one_seeder_is_what_the_public_seed_calls_do():
    """``seed_generators`` on the globals (both torch routes) and on a thread worker's own three."""
    from seqloader.loader.rngs.generators import seed_generators
    from seqloader.loader.torch_compat import numpy_worker_seed, thread_generators

    with global_rngs_kept():
        for accelerators in (False, True):
            random.gauss(0, 1); np.random.randn(1)   # cached Gaussians, which seeding drops
            seed_generators(2**64 - 3, [1, 2, 3, 4], 2**62 + 5, accelerators=accelerators)
            got = public_states()
            random.seed(2**64 - 3); np.random.seed([1, 2, 3, 4]); torch.manual_seed(2**62 + 5)
            assert_same(got, public_states())
    own, want = thread_generators(11), (random.Random(11), np.random.RandomState(numpy_worker_seed(11, 0)))
    assert own.random_generator.getstate() == want[0].getstate()
    assert own.numpy_generator.get_state()[1].tolist() == want[1].get_state()[1].tolist()
    assert own.torch_generator.initial_seed() == 11


def global_rngs_kept():
    from seqloader.loader.rngs.seeding import preserved_globals

    return preserved_globals()


@pytest.mark.parametrize("plain", [False, True], ids=["raw", "plain snapshots"])
def test_the_draw_check_names_the_generators_that_moved_and_tells_seqloaders_settings_apart(plain):
    from seqloader.loader.plain_routes import using_plain_routes
    from seqloader.loader.rngs.generators import DrawCheck, seed_generators

    with using_plain_routes("snapshots" if plain else ""), global_rngs_kept():
        for kind, moved in ((1, ("random", "numpy.random")), (3, ("numpy.random", "torch"))):
            check = DrawCheck()
            draw(kind, 5)
            assert check.moved() == check.drawn() == moved
        random.gauss(0, 1)   # leaves a cached Gaussian, which is state too:
        check = DrawCheck()
        random.gauss(0, 1)   # this one uses it, and only gauss_next moves
        assert check.moved() == ("random",)
        check = DrawCheck(("torch",))
        draw(1, 0)
        assert check.moved() == ()
        check = DrawCheck()
        seed_generators(1, 1, 1)
        assert check.moved() == ("random", "numpy.random", "torch") and check.drawn() == ()
