"""``seqloader.integrations.torchtitan.ParallelAwareDataloader`` against torchtitan 0.3.0's own classes.

Ranks are simulated in one process (one loader per ``dp_rank``: the loader takes its rank and
degree as arguments, so no process group is needed), except for one real 2-rank gloo world that
saves with ``torch.distributed.checkpoint``. The resume 2 ranks -> 4 ranks -> 1 rank is checked
batch by batch with ``torch.equal`` against the global order of an uninterrupted run.
"""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch

pytest.importorskip("torchtitan", reason="the torchtitan extra (see setup.cfg) is not installed")

from torch.distributed.checkpoint.stateful import Stateful  # noqa: E402
from torchtitan.components import dataloader as titan  # noqa: E402

import seqloader  # noqa: E402
from seqloader.integrations.torchtitan import ParallelAwareDataloader  # noqa: E402
from seqloader.testing import run_distributed  # noqa: E402

L = 8          # tokens per input; windows hold L + 1
N = 37         # windows in the file
BATCH = 2
SEED = 7


def _tokens_file(tmp_path) -> str:
    """A raw uint16 file of N windows of L + 1 tokens at stride L; the first token of window i is unique."""
    tokens = ((np.arange(N * L + 1) * 7919) % 65521).astype(np.uint16)
    path = str(tmp_path / "train.bin")
    tokens.tofile(path)
    return path


def _windows(path):
    return seqloader.token_windows(path, L + 1, dtype=np.uint16, stride=L)


def _loader(path, rank, size, **kwargs):
    return ParallelAwareDataloader(_windows(path), rank, size, batch_size=BATCH, shuffle=True, seed=SEED, **kwargs)


def _global_order(path) -> torch.Tensor:
    """The uninterrupted run's windows in the epoch's global order (one rank, one batch)."""
    loader = seqloader.DataLoader(_windows(path), batch_size=N, shuffle=True, seed=SEED)
    (batch,) = list(loader)
    return batch


def _expected(order, position, rank, size, step):
    """Rank ``rank`` of ``size``'s batch ``step`` from global ``position`` (the DistributedSampler layout)."""
    start = position + step * BATCH * size
    rows = [start + rank + size * j for j in range(BATCH) if start + rank + size * j < N]
    return order[rows]


def _check_steps(ranks, order, position, steps):
    """Read ``steps`` steps on every rank, each batch equal to the uninterrupted order's; return the
    windows' ids (first token) read."""
    iters = [iter(r) for r in ranks]
    seen = []
    for step in range(steps):
        for rank, it in enumerate(iters):
            inputs, labels = next(it)
            want = _expected(order, position, rank, len(ranks), step)
            assert torch.equal(inputs["input"], want[:, :-1]), (rank, step)
            assert torch.equal(labels, want[:, 1:]), (rank, step)
            seen += inputs["input"][:, 0].tolist()
    return seen


def _loaded(path, rank, size, state):
    loader = _loader(path, rank, size)
    loader.load_state_dict(state)
    return loader


def _merged(ranks):
    """What DCP's checkpoint holds: the ranks' ``dp_rank_<r>`` keys side by side."""
    merged = {}
    for r in ranks:
        merged.update(r.state_dict())
    return merged


def test_it_is_torchtitans_base_dataloader_with_torchtitans_state_layout(tmp_path):
    loader = _loader(_tokens_file(tmp_path), 1, 2)
    assert isinstance(loader, titan.BaseDataLoader) and isinstance(loader, Stateful)
    assert len(loader) == -(-((N + 1) // 2) // BATCH)
    inputs, labels = next(iter(loader))
    assert set(inputs) == {"input"} and inputs["input"].shape == (BATCH, L) and labels.shape == (BATCH, L)
    assert torch.equal(inputs["input"][:, 1:], labels[:, :-1])  # labels are the inputs shifted by one
    state = loader.state_dict()
    assert sorted(state) == ["dp_rank_1", "world_size"] and state["world_size"] == 2
    assert isinstance(state["dp_rank_1"], bytes)
    assert json.loads(state["dp_rank_1"])["position"] == BATCH * 2  # the global position: one step of 2 ranks


@pytest.mark.parametrize("last_workers", [0, 2])
def test_resume_two_ranks_then_four_then_one_reads_the_uninterrupted_order(tmp_path, last_workers):
    path = _tokens_file(tmp_path)
    order = _global_order(path)
    two = [_loader(path, r, 2) for r in range(2)]
    seen = _check_steps(two, order, 0, 3)                               # positions [0, 12)
    state = _merged(two)
    assert sorted(state) == ["dp_rank_0", "dp_rank_1", "world_size"]

    four = [_loader(path, r, 4) for r in range(4)]
    for r in four:
        r.load_state_dict(state)                                        # ranks 2, 3 have no entry of their own
    rests = [len(list(_loaded(path, r, 4, state))) for r in range(4)]
    assert rests == [-(-(-(-(N - 12) // 4)) // BATCH)] * 4                 # equal steps to the epoch's end
    seen += _check_steps(four, order, 12, 2)                            # positions [12, 28)
    state = _merged(four)

    one = _loader(path, 0, 1, num_workers=last_workers)
    one.load_state_dict(state)
    rest = list(one)
    assert len(rest) == -(-(N - 28) // BATCH)
    for step, (inputs, labels) in enumerate(rest):
        want = _expected(order, 28, 0, 1, step)
        assert torch.equal(inputs["input"], want[:, :-1]) and torch.equal(labels, want[:, 1:])
        seen += inputs["input"][:, 0].tolist()
    assert sorted(seen) == sorted(order[:, 0].tolist())                  # every window read once
    assert len(set(seen)) == N


def test_same_degree_resume_equals_the_uninterrupted_run(tmp_path):
    path = _tokens_file(tmp_path)
    reference = [[(x["input"], y) for x, y in _loader(path, r, 2)] for r in range(2)]
    first = [_loader(path, r, 2) for r in range(2)]
    its = [iter(r) for r in first]
    for it in its:
        next(it), next(it)
    state = _merged(first)
    for r in range(2):
        resumed = _loader(path, r, 2)
        resumed.load_state_dict({f"dp_rank_{r}": state[f"dp_rank_{r}"], "world_size": 2})  # its own key only
        rest = list(resumed)
        assert len(rest) == len(reference[r]) - 2
        for (x, y), (want_x, want_y) in zip(rest, reference[r][2:]):
            assert torch.equal(x["input"], want_x) and torch.equal(y, want_y)


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(torch.arange(10))


def test_a_state_of_torchtitans_own_loader_is_refused_naming_it(tmp_path):
    theirs = titan.ParallelAwareDataloader(_Stream(), dp_rank=0, dp_world_size=2, batch_size=2)
    next(iter(theirs))
    saved = theirs.state_dict()
    assert sorted(saved) == ["dp_rank_0", "world_size"] and isinstance(saved["dp_rank_0"], bytes)
    ours = _loader(_tokens_file(tmp_path), 0, 2)
    with pytest.raises(ValueError, match="torchtitan's own ParallelAwareDataloader .* not translated"):
        ours.load_state_dict(saved)
    ours.load_state_dict({})  # empty: a fresh start, as torchtitan's


def test_states_that_disagree_or_lack_rank_entries_are_refused(tmp_path):
    path = _tokens_file(tmp_path)
    a, b = _loader(path, 0, 2), _loader(path, 1, 2)
    next(iter(a))
    with pytest.raises(ValueError, match="'dp_rank_1' and 'dp_rank_0' hold different states .*position"):
        _loader(path, 0, 1).load_state_dict({**a.state_dict(), **b.state_dict()})
    with pytest.raises(ValueError, match="no 'dp_rank_<r>' entry"):
        a.load_state_dict({"world_size": 2})
    with pytest.raises(ValueError, match="not a seqloader state"):
        a.load_state_dict({"dp_rank_0": b"{not json", "world_size": 2})
    with pytest.raises(ValueError, match="holds a pickle"):
        a.load_state_dict({"dp_rank_0": pickle.dumps({"format": "seqloader.DataLoader"}), "world_size": 2})
    with pytest.raises(ValueError, match=r"dp_rank 2 out of range \[0, 2\)"):
        ParallelAwareDataloader(_windows(path), 2, 2)


def test_a_collate_fn_that_returns_torchtitans_pair_passes_through(tmp_path):
    def collate(windows):
        x = torch.from_numpy(np.stack(windows)).long()
        return {"input": x[:, :-1], "mask": torch.ones(len(windows), L)}, x[:, 1:]

    inputs, labels = next(iter(_loader(_tokens_file(tmp_path), 0, 1, collate_fn=collate)))
    assert set(inputs) == {"input", "mask"} and labels.dtype == torch.int64
    with pytest.raises(TypeError, match="a batch must be a 2-D tensor of windows or an"):
        next(iter(_loader(_tokens_file(tmp_path), 0, 1, collate_fn=lambda w: len(w))))


def _save_with_dcp(rank, world_size, path, ckpt):
    """A real DP world of 2: three steps, then ``dcp.save`` of the loader as torchtitan's Checkpointer does."""
    import torch.distributed.checkpoint as dcp

    loader = ParallelAwareDataloader(_windows(path), rank, world_size, batch_size=BATCH, shuffle=True)  # seed=None
    it = iter(loader)
    ids = [next(it)[0]["input"][:, 0].tolist() for _ in range(3)]
    dcp.save({"dataloader": loader}, checkpoint_id=ckpt)
    return ids, loader.loader.seed


@pytest.mark.timeout(180)
def test_a_dcp_checkpoint_of_two_gloo_ranks_resumes_four_ranks(tmp_path):
    import torch.distributed.checkpoint as dcp

    path, ckpt = _tokens_file(tmp_path), str(tmp_path / "ckpt")
    saved = run_distributed(_save_with_dcp, 2, (path, ckpt), workdir=tmp_path, timeout=120)
    assert saved[0][1] == saved[1][1]  # seed=None: one seed, broadcast from rank 0
    # DCP merged the ranks' keys; every rank's entry holds the global state, so rank 0's key is read
    # (a rank of the new world that did not exist before has no key of its own to ask DCP for)
    template = {"dataloader": {"dp_rank_0": None, "world_size": None}}
    dcp.load(template, checkpoint_id=ckpt)
    assert template["dataloader"]["world_size"] == 2
    four = []
    for r in range(4):
        loader = ParallelAwareDataloader(_windows(path), r, 4, batch_size=BATCH, shuffle=True)
        loader.load_state_dict(template["dataloader"])
        four.append(loader)
    assert len({r.loader.seed for r in four} | {saved[0][1]}) == 1  # the saved seed is loaded
    order = seqloader.DataLoader(_windows(path), batch_size=N, shuffle=True, seed=saved[0][1])
    (order,) = list(order)
    before = [i for ids, _ in saved for batch in ids for i in batch]
    after = _check_steps(four, order, 12, 3)                              # positions [12, 36)
    assert sorted(before) == sorted(order[:12, 0].tolist())
    assert sorted(after) == sorted(order[12:36, 0].tolist())


def test_torchtitans_trainer_builds_the_token_windows_loader_from_its_config(tmp_path):
    from seqloader.integrations.torchtitan import TokenWindowsDataLoader

    path = _tokens_file(tmp_path)
    config = TokenWindowsDataLoader.Config(dataset_path=path, seed=SEED)
    assert isinstance(config, titan.BaseDataLoader.Config)
    order = _global_order(path)
    # the call of torchtitan 0.3.0's Trainer.__init__ ("build dataloader")
    ranks = [config.build(dp_world_size=2, dp_rank=r, tokenizer=None, seq_len=L, local_batch_size=BATCH,
                          snapshot_every_n_steps=None) for r in range(2)]
    assert all(isinstance(r, titan.BaseDataLoader) for r in ranks)
    _check_steps(ranks, order, 0, 2)
    with pytest.raises(ValueError, match="Config.dataset_path must name the token files"):
        TokenWindowsDataLoader.Config().build(dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=L,
                                              local_batch_size=BATCH)
