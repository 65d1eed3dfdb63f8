"""L3: the ``positions`` entry of the loader's state: what decides which sample a position is.

A state says "position 40960 of epoch 3"; that is exact only if position 40960 means the same
sample when it is loaded. :func:`record_positions` walks the dataset (the one walk,
:func:`seqloader.sequences.describe.walk`, through lazy sequences and torch ``Dataset`` objects)
and records, for every stage that describes its positions (``keep``, ``pack``, ``mix``,
``shuffle``, ``shard``, ``batch``, slices, ``concatenate``, ``repeat``, ``cycle``, ``split``,
``interleave``, ``block_shuffle``, the sources, and torch's ``Subset``), its name and the
parameters that decide which sample of its inputs a position is::

    {"digest": "<16 hex digits>", "stages": ['shuffle{"seed":3}',
     'keep{"kept":"<12 hex>","predicate":"m.even","window":4096}', 'parquet{}']}

Each stage is one string, its name then its parameters as JSON (a list of str: checkpointers
such as ``torch.distributed.checkpoint``, which flatten nested dicts, store it as it is).

Not the values: ``smap``'s function, ``rng_map``'s function and seed, ``pack``'s ``pad_id`` and
``dtype``, a source's ``transform=`` are not recorded, so a fixed augmentation resumes. A
parameter whose JSON is longer than :data:`LONG` characters is recorded as a digest, and when the
stages take more than :data:`BUDGET` bytes each is recorded as one digest of its parameters (the
message then names the stage but not the parameter), and beyond that runs of consecutive stages
(at most :data:`GROUPS` entries, ``"chunk"`` stages each: the message names the run), so the entry
stays small whatever the pipeline.
Nothing is read to build it: ``keep`` and ``pack`` give a digest of the index they hold already.

:func:`check_positions` compares a saved record with the loader's dataset and raises
``ValueError`` naming the stage (its place, name and the parameter that differs) and the
override, the one that covers files too: ``load_state_dict(..., check_files=False)``.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import torch.utils.data

from seqloader.loader.state.state import STAGE, shown
from seqloader.sequences.describe import digest, walk

__all__ = ["BUDGET", "GROUPS", "LONG", "OVERRIDE", "check_positions", "record_positions"]

#: A parameter's JSON longer than this is recorded as ``"#<digest>"``.
LONG = 48
#: The most bytes of JSON the stages may take before each is recorded as one digest.
BUDGET = 600
#: What a refusal says the user can do.
OVERRIDE = ("to resume on this pipeline deliberately (you know its positions mean the same samples), call "
            "load_state_dict(state_dict, check_files=False)")


def _is_dataset(obj: Any) -> bool:
    return isinstance(obj, torch.utils.data.Dataset)


def _compact(params: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in params.items():
        text = json.dumps(v, sort_keys=True, default=repr)
        out[k] = v if len(text) <= LONG and json.loads(text) == v else "#" + digest(v, 12)
    return out


def _stages(dataset: Any) -> list[tuple[str, dict[str, Any]]]:
    stages: list[tuple[str, dict[str, Any]]] = []
    for node in walk(dataset, enter=_is_dataset):
        if node.stage is not None:
            if _transparent(node.stage):
                continue  # item i is a function of its input's item i: adding or removing it moves nothing
            stages.append((node.stage.name, _compact(node.stage.params)))
        elif isinstance(node.obj, torch.utils.data.Subset):  # torch's own index map
            stages.append(("Subset", _compact({"indices": [int(i) for i in node.obj.indices]})))
    return stages


def _transparent(stage: Any) -> bool:
    """A stage that maps position ``i`` to its one input's position ``i`` and decides nothing else
    (``smap`` or ``rng_map`` of one sequence, ``starmap``, ``add_cache``): values only, so it is not
    recorded, and wrapping a pipeline in a new augmentation still resumes."""
    return not stage.params and len(stage.children) == 1 and not stage.source


def _text(name: str, params: dict[str, Any]) -> str:
    return name + json.dumps(params, sort_keys=True, separators=(",", ":"))


def _parse(entry: str) -> tuple[str, Any]:
    """``(name, params dict)`` of ``'shuffle{"seed":3}'``, or ``(name, digest str)`` of ``'shuffle#9d6f2b98'``."""
    cut = min((k for k in (entry.find("{"), entry.find("#")) if k >= 0), default=len(entry))
    name, rest = entry[:cut], entry[cut:]
    if rest.startswith("{"):
        try:
            params = json.loads(rest)
        except ValueError:
            return name, rest
        return name, params if isinstance(params, dict) else rest
    return name, rest


def record_positions(dataset: Any) -> dict[str, Any]:
    """The ``positions`` entry of a state for the loader's ``dataset`` (see the module docstring).

    Args:
        dataset: the loader's dataset.

    Returns:
        ``{"digest": hex, "stages": ['name{params as JSON}', ...]}`` in walk order (a stage
        before its inputs; a list of str, which every checkpointer stores as it is);
        ``stages`` is ``[]`` when no stage describes itself (a list).

    Example:
        >>> import seqloader
        >>> record_positions(seqloader.shuffle(list(range(10)), seed=3))["stages"]
        ['shuffle{"seed":3}']
        >>> record_positions(seqloader.smap(str, list(range(10))))["stages"]   # a function: values only
        []
    """
    stages = _stages(dataset)
    out: dict[str, Any] = {"digest": digest([[name, params] for name, params in stages]),
                           "stages": [_text(name, params) for name, params in stages]}
    chunk = 1
    while len(json.dumps(out["stages"], separators=(",", ":"))) > BUDGET:
        out["stages"] = _digested(stages, chunk)
        if chunk > 1:
            out["chunk"] = chunk
        chunk = max(2, -(-len(stages) // GROUPS)) if chunk == 1 else chunk * 2
    return out


#: The most entries of a long pipeline's record (runs of consecutive stages beyond).
GROUPS = 24


def _digested(stages: list[tuple[str, dict[str, Any]]], chunk: int) -> list[str]:
    """Runs of ``chunk`` consecutive stages, each as ``'names#<digest of the run>'``."""
    out = []
    for k in range(0, len(stages), chunk):
        run = stages[k:k + chunk]
        names = run[0][0] if len(run) == 1 else f"{run[0][0]}..{run[-1][0]}"
        out.append(f"{names}#{digest(run[0][1] if chunk == 1 else [list(r) for r in run], 8)}")
    return out


def _where(k: int, stages: list[tuple[str, Any]], chunk: int = 1) -> str:
    if chunk == 1:
        return f"stage {k} of {len(stages)} ({stages[k][0]})"
    return f"stages {k * chunk}..{k * chunk + chunk - 1} ({stages[k][0]})"


def check_positions(saved: Optional[dict[str, Any]], dataset: Any, check_files: bool = True) -> None:
    """Raise ``ValueError`` unless ``saved`` (a state's ``positions``) describes the positions of
    the loader's ``dataset``.

    Args:
        saved: the validated ``positions`` entry of a state, or ``None`` (not recorded: a state
            of version 4 or older; nothing to check).
        dataset: the loader's dataset.
        check_files: ``load_state_dict``'s override: ``False`` checks nothing.

    Raises:
        ValueError: a stage that differs, named with its place, its name and (when recorded) the
            parameter, with both values, and the override.

    Example:
        >>> import seqloader
        >>> saved = record_positions(seqloader.shuffle(list(range(10)), seed=3))
        >>> check_positions(saved, seqloader.shuffle(list(range(10)), seed=3))
        >>> check_positions(saved, seqloader.shuffle(list(range(10)), seed=4))
        Traceback (most recent call last):
        ValueError: load_state_dict: 'positions' differ: stage 0 of 1 (shuffle): 'seed' is 3 in the state_dict but 4 in this loader's dataset; a position would be another sample; to resume on this pipeline deliberately (you know its positions mean the same samples), call load_state_dict(state_dict, check_files=False)
        >>> check_positions(saved, seqloader.shuffle(list(range(10)), seed=4), check_files=False)
    """
    if saved is None or not check_files:
        return
    now = record_positions(dataset)
    if now["digest"] == saved["digest"]:
        return
    chunk = saved.get("chunk", 1)
    full = _stages(dataset)
    old = [_parse(e) for e in saved["stages"]]
    digested = chunk > 1 or any(isinstance(p, str) for _, p in old)
    new = [_parse(e) for e in _digested(full, chunk)] if digested else full
    why = f"the stages differ (digest {saved['digest']} in the state_dict, {now['digest']} now)"
    for k, (a, b) in enumerate(zip(old, new)):
        if tuple(a) == tuple(b):
            continue
        if a[0] != b[0]:
            why = f"stage {k} is {a[0]} in the state_dict but {b[0]} in this loader's dataset"
        elif isinstance(a[1], dict) and isinstance(b[1], dict):
            keys = [key for key in list(b[1]) + [x for x in a[1] if x not in b[1]] if a[1].get(key) != b[1].get(key)]
            key, also = keys[0], "".join(f", and {x!r}" for x in keys[1:])  # the op's own order
            why = (f"{_where(k, old, chunk)}: {key!r} is {shown(a[1].get(key))} in the state_dict but "
                   f"{shown(b[1].get(key))} in this loader's dataset{also}")
        else:
            why = f"{_where(k, old, chunk)}: its parameters differ ({a[1]} in the state_dict, {b[1]} now)"
        break
    else:
        if len(old) != len(new):
            k = min(len(old), len(new))
            extra = (f"{_where(k, old, chunk)} is not in this loader's dataset" if len(old) > k else
                     f"stage {k} ({new[k][0]}) of this loader's dataset is not in the state_dict")
            why = f"{len(old)} stages in the state_dict but {len(new)} in this loader's dataset; {extra}"
    raise ValueError(f"{STAGE}: 'positions' differ: {why}; a position would be another sample; {OVERRIDE}")
