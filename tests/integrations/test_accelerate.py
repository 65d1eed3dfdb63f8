"""accelerate: ``prepare_loader`` + ``save_state``/``load_state`` resume exactly; ``prepare(loader)`` is refused.

The training runs are real accelerate loops in fresh interpreters (``_accelerate_run.py``; two
processes through ``python -m torch.distributed.run``, gloo on the CPU): an uninterrupted run, a
run that saves with ``accelerator.save_state`` and dies with ``os._exit`` mid-epoch, and a fresh
run that ``accelerator.load_state``\\ s a checkpoint; every resumed step (sample indices,
augmentation bytes drawn from torch's global RNG, loss) must equal the uninterrupted run's.
"""

from __future__ import annotations

import pytest
import torch

from tests.integrations import _common

accelerate = pytest.importorskip("accelerate")

import seqloader  # noqa: E402
from seqloader.integrations.accelerate import AcceleratedLoader, prepare_loader  # noqa: E402

SCRIPT = "_accelerate_run.py"
TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def _run(tmp_path, argv=None, expect_rc=0, **config):
    config = {"epochs": 2, "num_workers": 0, **config, "out": str(tmp_path / config["out"])}
    return _common.run_script(SCRIPT, config, tmp_path, argv=argv, expect_rc=expect_rc)


@pytest.mark.timeout(240)
def test_one_process_resumes_exactly_mid_epoch_and_at_an_epoch_end(tmp_path):
    ckpt = tmp_path / "ckpt"
    _run(tmp_path, mode="ref", out="ref")
    # 25 steps per epoch: checkpoints every 5 steps, killed before step 33 (epoch 1)
    _run(tmp_path, mode="crash", out="crash", crash_at=33, ckpt_every=5, ckpt_dir=str(ckpt), num_workers=2,
         expect_rc=_common.CRASH_RC)
    reference = _common.read_records(tmp_path / "ref.0.jsonl")
    _common.assert_same_steps(_common.read_records(tmp_path / "crash.0.jsonl"), reference[:33],
                              what="the run that crashed")
    for step, workers in ((30, 0), (25, 2)):  # mid-epoch 1; right after epoch 0's last batch
        out = f"resumed{step}"
        _run(tmp_path, mode="resume", out=out, ckpt=str(ckpt / f"step_{step}"), num_workers=workers)
        resumed = _common.read_records(tmp_path / f"{out}.0.jsonl")
        assert resumed[0]["step"] == step
        _common.assert_same_steps(resumed, reference, what=f"resumed from step {step}")


@pytest.mark.timeout(300)
def test_two_processes_resume_exactly(tmp_path):
    ckpt = tmp_path / "ckpt"
    _run(tmp_path, argv=TORCHRUN, mode="ref", out="ref", num_workers=2)
    # 13 steps per epoch and process: checkpoints at steps 9 and 18, killed before step 20
    _run(tmp_path, argv=TORCHRUN, mode="crash", out="crash", crash_at=20, ckpt_every=9, ckpt_dir=str(ckpt),
         expect_rc=1)  # torchrun reports a worker that died with exit code 1
    _run(tmp_path, argv=TORCHRUN, mode="resume", out="resumed", ckpt=str(ckpt / "step_18"), num_workers=2)
    for rank in range(2):
        reference = _common.read_records(tmp_path / f"ref.{rank}.jsonl")
        _common.assert_same_steps(_common.read_records(tmp_path / f"crash.{rank}.jsonl"), reference[:20],
                                  what=f"rank {rank} that crashed")
        resumed = _common.read_records(tmp_path / f"resumed.{rank}.jsonl")
        assert resumed[0]["step"] == 18 and resumed[0]["epoch"] == 1
        _common.assert_same_steps(resumed, reference, what=f"resumed rank {rank}")
    both = [i for rank in range(2) for r in _common.read_records(tmp_path / f"ref.{rank}.jsonl")
            if r["epoch"] == 1 for i in r["index"]]
    assert sorted(set(both)) == list(range(_common.N))  # the ranks split each epoch


@pytest.fixture(scope="module")
def accelerator():
    return accelerate.Accelerator(cpu=True)


def _loader(**kw):
    return seqloader.DataLoader(list(range(20)), batch_size=4, shuffle=True, seed=3, **kw)


def test_the_wrapper_yields_the_loaders_batches_and_tells_accelerate_where_the_epoch_stands(accelerator):
    loader = _loader()
    want = [b.tolist() for b in _loader()]
    train = prepare_loader(accelerator, loader)
    assert isinstance(train, AcceleratedLoader) and train.loader is loader and len(train) == 5
    seen, ends, positions = [], [], []
    for batch in train:
        seen.append(batch.tolist())
        ends.append(accelerator.gradient_state.end_of_dataloader)
        positions.append(train.state_dict()["position"])
        assert accelerator.gradient_state.remainder == -1  # gather_for_metrics must not cut padding off
    assert seen == want
    assert ends == [False, False, False, False, True]
    # the state of the batches handed out, though the wrapper has read one batch ahead
    assert positions == [4, 8, 12, 16, 0]  # after the last batch: epoch 1, position 0
    assert not accelerator.gradient_state.in_dataloader
    assert train.state_dict() == loader.state_dict() and loader.state_dict()["epoch"] == 1
    assert train.batch_size == 4 and train.seed == 3  # other attributes are the loader's


def test_a_state_taken_mid_epoch_resumes_exactly_in_a_new_wrapper(accelerator):
    train = prepare_loader(accelerator, _loader(), register=False)
    it = iter(train)
    head = [next(it).tolist() for _ in range(2)]
    state = train.state_dict()
    rest = [b.tolist() for b in it]
    resumed = prepare_loader(accelerator, _loader(num_workers=2), register=False)
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == rest and len(head + rest) == 5


def test_prepare_on_a_wrapped_loader_raises_and_prepare_on_the_wrapper_is_a_no_op(accelerator):
    loader = _loader()
    train = prepare_loader(accelerator, loader, register=False)
    with pytest.raises(TypeError, match=r"accelerator.prepare\(\) was given a seqloader.DataLoader"):
        accelerator.prepare(loader)
    with pytest.raises(TypeError, match="accelerator.prepare"):
        accelerator.prepare(torch.nn.Linear(1, 1), loader)
    assert accelerator.prepare(train) is train


def test_documented_failure_modes_without_prepare_loader(accelerator):
    """What docs/integrations.md says happens when the loader goes through accelerate anyway."""
    loader = _loader()
    prepared = accelerator.prepare(loader)  # never wrapped: accelerate rebuilds it from torch's classes
    assert type(prepared).__name__ == "DataLoaderShard" and not isinstance(prepared, seqloader.DataLoader)
    assert [b.tolist() for b in prepared] != [b.tolist() for b in _loader()]  # not seqloader's order
    with pytest.raises(TypeError, match="this is the loader accelerator.prepare"):
        prepare_loader(accelerator, prepared)
    skipped = accelerator.skip_first_batches(loader, 1)  # a plain torch DataLoader
    assert type(skipped) is torch.utils.data.DataLoader
    train = prepare_loader(accelerator, _loader(), register=False)
    with pytest.raises(AttributeError, match="skip_first_batches"):
        accelerator.skip_first_batches(train, 1)


def test_arguments_are_checked(accelerator):
    with pytest.raises(TypeError, match="loader must be a seqloader.DataLoader"):
        prepare_loader(accelerator, torch.utils.data.DataLoader(list(range(4))))
    with pytest.raises(TypeError, match="accelerator must be an accelerate.Accelerator"):
        prepare_loader("cpu", _loader())

    with pytest.raises(ValueError, match="split_batches=True"):
        prepare_loader(accelerate.Accelerator(cpu=True, dataloader_config=accelerate.DataLoaderConfiguration(
            split_batches=True)), _loader())


def test_without_accelerate_the_import_error_names_the_extra(monkeypatch):
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, "accelerate", None)  # what a missing package looks like to import
    monkeypatch.delitem(sys.modules, "seqloader.integrations.accelerate")
    with pytest.raises(ImportError, match=r"pip install seqloader\[accelerate\]"):
        importlib.import_module("seqloader.integrations.accelerate")
