"""L3: the ``files`` entry of the loader's state: which files every source of the pipeline read.

:func:`describe_pipeline` describes the file list of each source :func:`~seqloader.loader.pipeline.walk.pipeline_sources`
finds in the dataset (``seqloader.sources.fingerprint.describe_files``: a count and digests, < 450
bytes per source), in pipeline order; :func:`check_pipeline_files` compares a saved list with the
loader's pipeline and raises ``ValueError`` naming the source (its place in the pipeline and its
``repr``) and the first file that differs, and the override: ``load_state_dict(...,
check_files=False)`` resumes on other files deliberately (the same data copied elsewhere), at the
user's word. ``seqloader.sources`` is imported only when a source is found.
"""

from __future__ import annotations

import reprlib
from typing import Any, Optional

from seqloader.loader.pipeline.walk import pipeline_sources
from seqloader.loader.state.state import LEGACY_FINGERPRINT, STAGE, V4_FINGERPRINT, VERSION, reader

__all__ = ["OVERRIDE", "check_pipeline_files", "describe_pipeline"]

#: What every refusal says the user can do.
OVERRIDE = ("to resume on these files deliberately (the same data copied or downloaded again), call "
            "load_state_dict(state_dict, check_files=False)")

_short = reprlib.Repr()
_short.maxother = _short.maxstring = 160


def describe_pipeline(dataset: Any) -> list[dict]:
    """The ``files`` entry of a state: one file-list description per source of ``dataset``.

    Args:
        dataset: the loader's dataset.

    Returns:
        ``[describe_files(source), ...]`` in pipeline order; ``[]`` when it reads no source.

    Example:
        >>> describe_pipeline(list(range(10)))
        []
    """
    sources = pipeline_sources(dataset)
    if not sources:
        return []
    from seqloader.sources.fingerprint import describe_files  # only when there are sources

    return [describe_files(s) for s in sources]


def _named(k: int, sources: list[Any]) -> str:
    return f"source {k} of {len(sources)} in the pipeline, {_short.repr(sources[k])}"


def check_pipeline_files(saved: Optional[list[dict]], dataset: Any, check_files: bool = True) -> None:
    """Raise ``ValueError`` unless ``saved`` (a state's ``files``) describes the files of every
    source of ``dataset``, in order.

    Args:
        saved: the validated ``files`` entry of a state (a list of descriptions), or ``None``
            (not recorded: nothing to check).
        dataset: the loader's dataset.
        check_files: ``load_state_dict``'s override: ``False`` checks nothing.

    Raises:
        TypeError: ``check_files`` is not a bool.
        ValueError: another number of sources, or a source whose files differ; the message names
            the source and (``check_same_files``) the first file that differs, and the override.

    Example:
        >>> check_pipeline_files([], list(range(10)))
        >>> check_pipeline_files([{"files": 1, "fingerprint": "00"}], list(range(10)))
        Traceback (most recent call last):
        ValueError: load_state_dict: 'files' describes 1 source(s) of files but this loader's dataset reads 0 (none); the state was saved for another pipeline; to resume on these files deliberately (the same data copied or downloaded again), call load_state_dict(state_dict, check_files=False)
    """
    if not isinstance(check_files, bool):
        raise TypeError(f"{STAGE}: check_files must be a bool (got {type(check_files).__name__})")
    if saved is None or not check_files:
        return
    sources = pipeline_sources(dataset)
    if len(saved) != len(sources):
        names = ", ".join(_short.repr(s) for s in sources[:4]) + (", ..." if len(sources) > 4 else "")
        raise ValueError(f"{STAGE}: 'files' describes {len(saved)} source(s) of files but this loader's dataset "
                         f"reads {len(sources)} ({names or 'none'}); the state was saved for another pipeline; "
                         f"{OVERRIDE}")
    if not sources:
        return
    from seqloader.sources.fingerprint import check_same_files  # only when there are sources

    for k, (description, source) in enumerate(zip(saved, sources)):
        if str(description.get("fingerprint", "")).startswith(LEGACY_FINGERPRINT):
            raise ValueError(f"{STAGE}: 'files[{k}]' was saved by an older seqloader (state version 3), whose "
                             "fingerprint of the files (absolute paths and modification times) cannot be compared "
                             f"with version {VERSION}'s (of the files' content: {reader()}) for {_named(k, sources)}; "
                             f"{OVERRIDE}")
        current: Any = source
        if str(description.get("fingerprint", "")).startswith(V4_FINGERPRINT):  # version 4 saw no data bytes
            description = {**description, "fingerprint": description["fingerprint"][len(V4_FINGERPRINT):]}
            current = [[name, size, str(content).split("+data:", 1)[0]] for name, size, content in source.files()]
        try:
            check_same_files(description, current)
        except ValueError as e:
            raise ValueError(f"{STAGE}: 'files[{k}]' does not match {_named(k, sources)}: {e}; or, {OVERRIDE}") from e
